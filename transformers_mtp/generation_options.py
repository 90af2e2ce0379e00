# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The multi-token settings of `generate()`: each read from the call, else the generation config, and checked.

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

from dataclasses import dataclass

import torch

from .generation_certified_argmax import auto_certified_argmax, certified_argmax_unsupported
from .generation_draft_precision import DRAFT_DTYPES, auto_draft_dtype
from .generation_onednn import auto_onednn_verify, onednn_verify_unsupported

MULTI_TOKEN_MODES = ("verified", "unverified")
MAX_DRAFT_TREE_SIZE = 64


def _generation_config_value(model, name, generation_config=None):
    """A multi-token setting from the generation config passed to `generate()`, else the model's (None if unset)."""
    config = generation_config if generation_config is not None else model.generation_config
    return getattr(config, name, None)


def resolve_num_predict_heads(model, num_predict_heads, generation_config=None):
    """`num_predict_heads`, else the generation config's, else `config.num_heads`; checked against `num_heads`."""
    limit = model.config.num_heads
    if num_predict_heads is None:
        num_predict_heads = _generation_config_value(model, "num_predict_heads", generation_config) or limit
    if isinstance(num_predict_heads, bool) or not isinstance(num_predict_heads, int) or num_predict_heads < 1:
        raise ValueError(f"num_predict_heads={num_predict_heads!r} must be an integer from 1 to num_heads={limit}.")
    if num_predict_heads > limit:
        raise ValueError(
            f"num_predict_heads={num_predict_heads} exceeds the model's num_heads={limit}; pass at most {limit}."
        )
    return num_predict_heads


def resolve_draft_confidence_threshold(model, threshold, generation_config=None):
    """`draft_confidence_threshold`, else the generation config's, else 0 (always draft num_predict_heads - 1)."""
    if threshold is None:
        threshold = _generation_config_value(model, "draft_confidence_threshold", generation_config) or 0.0
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold < 1.0:
        raise ValueError(
            f"draft_confidence_threshold={threshold!r} must be a probability in [0, 1): a head's draft is kept only "
            "if its top probability reaches it; 0 keeps every draft."
        )
    return float(threshold)


def resolve_draft_lookup_ngram(model, ngram, generation_config=None):
    """`draft_lookup_ngram`, else the generation config's, else 0 (drafts from the heads only)."""
    if ngram is None:
        ngram = _generation_config_value(model, "draft_lookup_ngram", generation_config) or 0
    if isinstance(ngram, bool) or not isinstance(ngram, int) or not 0 <= ngram <= 8:
        raise ValueError(
            f"draft_lookup_ngram={ngram!r} must be an integer from 0 to 8: the longest n-gram of the row's last tokens "
            "looked up in its earlier tokens (0 turns context drafting off)."
        )
    return ngram


def resolve_draft_datastore(model, use, generation_config=None):
    """The draft datastore to draft from, or None: `draft_datastore` (True / False), else the generation config's,
    else True whenever the model has one."""
    explicit = use is not None
    if use is None:
        use = _generation_config_value(model, "draft_datastore", generation_config)
        use = True if use is None else use
    if not isinstance(use, bool):
        raise ValueError(f"draft_datastore={use!r} must be True or False.")
    datastore = model.draft_datastore() if use else None
    if explicit and use and datastore is None:
        raise ValueError(
            "draft_datastore=True, but this model has no draft datastore (config.draft_datastore_size is None); "
            "train its heads with draft_datastore_size set, or leave draft_datastore unset."
        )
    return datastore


def resolve_draft_lookup_num_tokens(model, num_tokens, num_predict_heads, generation_config=None):
    """`draft_lookup_num_tokens`, else the generation config's, else num_predict_heads - 1 (as many as the heads)."""
    if num_tokens is None:
        num_tokens = _generation_config_value(model, "draft_lookup_num_tokens", generation_config) \
            or num_predict_heads - 1
    return check_draft_lookup_num_tokens(num_tokens)


def check_draft_lookup_num_tokens(num_tokens):
    """`num_tokens` if it is a valid draft_lookup_num_tokens, else a ValueError naming it (generate() and convert())."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 <= num_tokens <= 32:
        raise ValueError(
            f"draft_lookup_num_tokens={num_tokens!r} must be an integer from 0 to 32: the most drafts a step copies "
            "from the context when its last n-gram occurred earlier."
        )
    return num_tokens


def resolve_draft_tree_size(model, size, generation_config=None):
    """`draft_tree_size`, else the generation config's, else 0 (one chain of drafts per step)."""
    if size is None:
        size = _generation_config_value(model, "draft_tree_size", generation_config) or 0
    return check_draft_tree_size(size)


def check_draft_tree_size(size):
    """`size` if it is a valid draft tree size, else a ValueError naming it (shared by generate() and convert())."""
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_DRAFT_TREE_SIZE:
        raise ValueError(
            f"draft_tree_size={size!r} must be an integer from 0 to {MAX_DRAFT_TREE_SIZE}: the tokens drafted per "
            "verify pass as a tree of candidates (0 drafts one chain)."
        )
    return size


def resolve_draft_dtype(model, dtype, generation_config=None):
    """`draft_dtype`, else the generation config's: the torch dtype the heads draft in, or None for the model's own
    (also when it names the model's own dtype)."""
    if dtype is None:
        dtype = _generation_config_value(model, "draft_dtype", generation_config)
    if dtype is None:
        return None
    if dtype == "auto":
        return auto_draft_dtype(model)
    resolved = DRAFT_DTYPES.get(dtype) if isinstance(dtype, str) else dtype
    if resolved not in DRAFT_DTYPES.values():
        raise ValueError(
            f"draft_dtype={dtype!r} must be one of {['auto', *DRAFT_DTYPES]} (or that torch dtype): the precision "
            "the heads draft in ('auto': bfloat16 for a float32 model where the hardware computes it natively). "
            "Verification keeps the model's own dtype, so verified output does not depend on it."
        )
    return None if resolved == model.dtype else resolved


def resolve_certified_argmax(model, value, generation_config=None):
    """`certified_argmax`, else the generation config's, else "auto": whether greedy verification takes the float32
    argmax from a bfloat16 unembedding and its error bound (generation_certified_argmax.py) instead of the float32
    unembedding. Its tokens are the same either way."""
    return _resolve_auto_flag(
        model, "certified_argmax", value, generation_config, auto_certified_argmax, certified_argmax_unsupported,
        "whether greedy verification of a float32 model finds its argmax through a bfloat16 unembedding with an error "
        "bound ('auto': where the CPU computes bfloat16 natively). The tokens are the same either way.")


def resolve_onednn_verify(model, value, generation_config=None):
    """`onednn_verify`, else the generation config's, else "auto": whether the float32 trunk passes of several tokens
    (the prompt, the verify blocks) compute their matrix products with oneDNN instead of torch's default CPU kernel
    (generation_onednn.py). Both are float32; the output is checked identical to plain greedy either way."""
    return _resolve_auto_flag(
        model, "onednn_verify", value, generation_config, auto_onednn_verify, onednn_verify_unsupported,
        "whether float32 trunk passes over several tokens use oneDNN's matrix products ('auto': on x86 CPUs with "
        "AVX2 or AVX-512, where they were measured faster).")


def _resolve_auto_flag(model, name, value, generation_config, auto, unsupported, meaning):
    """An option that is "auto" (decided by `auto(model)`), True (an error where `unsupported(model)` gives a reason)
    or False; unset, the generation config's."""
    if value is None:
        value = _generation_config_value(model, name, generation_config)
    if value is None or value == "auto":
        return auto(model)
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be 'auto', True or False: {meaning}")
    if value:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"{name}=True cannot be honoured: {reason}. Leave it 'auto' or pass False.")
    return value


# The multi-token options of `generate()`, in the order the docs list them
MULTI_TOKEN_OPTIONS = ("num_predict_heads", "draft_confidence_threshold", "draft_lookup_ngram",
                       "draft_lookup_num_tokens", "draft_datastore", "draft_tree_size", "draft_dtype",
                       "certified_argmax", "onednn_verify")


@dataclass(frozen=True)
class MultiTokenOptions:
    """
    The multi-token settings of one `generate()` call, resolved and checked once (`resolve`): each from the call,
    else the generation config, else its default. `draft_datastore` holds the datastore's tensors (or None);
    `draft_tree_from_config`: the tree size is the generation config's, not asked for in the call, so decoding that
    cannot draft trees (sampling, batches, a static cache) drafts chains instead of raising.
    """

    num_predict_heads: int
    verify: bool = True
    draft_confidence_threshold: float = 0.0
    draft_lookup_ngram: int = 0
    draft_lookup_num_tokens: int = 0
    draft_datastore: tuple | None = None
    draft_tree_size: int = 0
    draft_tree_from_config: bool = False
    draft_dtype: torch.dtype | None = None
    certified_argmax: bool = False
    onednn_verify: bool = False

    @classmethod
    def resolve(cls, model, multi_token_mode=True, generation_config=None, **given):
        """The options of a call with `multi_token_mode` (True, "verified" or "unverified") and the options `given`
        by name (None: not given). A bad name or value is a ValueError naming it."""
        unknown = sorted(set(given) - set(MULTI_TOKEN_OPTIONS))
        if unknown:
            raise ValueError(f"Unknown multi-token options {unknown}; the options are {list(MULTI_TOKEN_OPTIONS)}.")
        mode = "verified" if multi_token_mode is True else multi_token_mode
        if mode not in MULTI_TOKEN_MODES:
            raise ValueError(
                f"multi_token_mode={multi_token_mode!r} is not supported; pass True, 'verified' or 'unverified'."
            )
        num_predict_heads = resolve_num_predict_heads(model, given.get("num_predict_heads"), generation_config)
        return cls(
            num_predict_heads=num_predict_heads,
            verify=mode == "verified",
            draft_confidence_threshold=resolve_draft_confidence_threshold(
                model, given.get("draft_confidence_threshold"), generation_config),
            draft_lookup_ngram=resolve_draft_lookup_ngram(model, given.get("draft_lookup_ngram"), generation_config),
            draft_lookup_num_tokens=resolve_draft_lookup_num_tokens(
                model, given.get("draft_lookup_num_tokens"), num_predict_heads, generation_config),
            draft_datastore=resolve_draft_datastore(model, given.get("draft_datastore"), generation_config),
            draft_tree_size=resolve_draft_tree_size(model, given.get("draft_tree_size"), generation_config),
            draft_tree_from_config=given.get("draft_tree_size") is None,
            draft_dtype=resolve_draft_dtype(model, given.get("draft_dtype"), generation_config),
            certified_argmax=resolve_certified_argmax(model, given.get("certified_argmax"), generation_config),
            onednn_verify=resolve_onednn_verify(model, given.get("onednn_verify"), generation_config),
        )


def check_no_options_without_mode(given):
    """Multi-token options in a call without `multi_token_mode` are a mistake, not something to ignore."""
    for name in MULTI_TOKEN_OPTIONS:
        if given.get(name) is not None:
            raise ValueError(f"{name}={given[name]} only applies with multi_token_mode=True; pass both or neither.")
