# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""`convert()`: add multi-token heads to a pretrained Llama-family or GPT-2 causal LM without touching its weights."""

import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.utils import logging

from .generation_options import check_draft_lookup_num_tokens, check_draft_tree_size, resolve_draft_dtype
from .modeling_multi_token import MULTI_TOKEN_CLASSES, MultiTokenPredictionMixin

logger = logging.get_logger(__name__)

# the base causal-LM classes convert() takes (the multi-token class of each: modeling_multi_token.MULTI_TOKEN_CLASSES;
# where its parts are: modeling_architectures.ARCHITECTURES)
SUPPORTED_ARCHITECTURES = tuple(MULTI_TOKEN_CLASSES)
# Keys of a loaded base config that must not be carried into the multi-token config: the GGUF/quantization marker
# (the weights are dense once loaded), and identity fields that the new config sets itself.
_DROPPED_CONFIG_KEYS = ("quantization_config", "model_type", "architectures", "transformers_version", "auto_map")


def load_base_model(path, *, dtype=torch.float32):
    """Load a local checkpoint folder or a GGUF file (dequantized, so it can be saved and trained). dtype: a
    torch.dtype, or a name: "float32", "bfloat16", "float16", or "auto" (bfloat16 where the CPU computes it natively,
    else float32; see precision.py)."""
    from .precision import resolve_dtype

    dtype, _ = resolve_dtype(dtype)
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        from transformers import GgufConfig

        return AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, quantization_config=GgufConfig(dequantize=True), dtype=dtype
        )
    if path.is_dir():
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    raise FileNotFoundError(
        f"{str(path)!r} is neither a checkpoint folder nor a .gguf file. convert() takes a loaded model, a local "
        "folder or a GGUF file; to convert a Hub model, load it with AutoModelForCausalLM.from_pretrained first."
    )


# Drafts copied from the context (the tokens that followed the last 3- or 2-gram earlier in the text) go first, the
# heads draft the rest: on the embedded model's code prompts this lifted tokens per forward pass from 1.37 to 1.59
# (6-prompt sweep, k = 3), and it never costs an extra pass.
DEFAULT_DRAFT_LOOKUP_NGRAM = 3


def convert(base, *, num_heads=4, head_type="resblock", num_predict_heads=None, dtype=torch.float32,
            draft_lookup_ngram=DEFAULT_DRAFT_LOOKUP_NGRAM, draft_tree_size=0, draft_lookup_num_tokens=None,
            draft_dtype=None, **head_config):
    r"""
    Add multi-token-prediction heads to a pretrained causal LM.

    Args:
        base (`LlamaForCausalLM`, `GPT2LMHeadModel`, `str` or `os.PathLike`):
            A loaded model, a local checkpoint folder, or a `.gguf` file.
        num_heads (`int`, *optional*, defaults to 4): tokens proposed per forward pass (head 0 is the base's own).
        head_type (`str`, *optional*, defaults to `"resblock"`): `"linear"`, `"resblock"`, `"query_extension"` or
            `"chained"` (one EAGLE-3-style draft layer for every depth; Llama, Mistral and Qwen2).
        num_predict_heads (`int`, *optional*): default tokens per step of `generate(multi_token_mode=True)`, saved in
            generation_config.json; defaults to `num_heads`.
        draft_lookup_ngram (`int`, *optional*, defaults to 3): default `generate(draft_lookup_ngram=...)`, saved in
            generation_config.json: context n-grams up to this size are looked up for drafts first; 0 turns it off.
        draft_tree_size (`int`, *optional*, defaults to 0): default `generate(draft_tree_size=...)`, saved in
            generation_config.json: greedy decoding drafts this many tokens per step as a tree of candidates; 0
            drafts one chain.
        draft_lookup_num_tokens (`int`, *optional*): default `generate(draft_lookup_num_tokens=...)`, saved in
            generation_config.json: the most drafts a step copies from the context; defaults to num_predict_heads - 1.
        draft_dtype (`str`, *optional*): default `generate(draft_dtype=...)`, saved in generation_config.json:
            `"auto"`, `"bfloat16"`, `"float16"` or `"float32"`, the dtype the heads draft in (verification keeps the
            model's); unset: the model's own dtype.
        dtype (`torch.dtype` or `str`, *optional*, defaults to `torch.float32`): dtype used when `base` is a path
            (a name such as `"bfloat16"`, or `"auto"`: see `load_base_model`).
        head_config: further multi-token config fields (`head_rank`, `head_input`, `head_share_kv`,
            `head_loss_weights`, `head_feature_layers`).

    Returns the multi-token model. It shares the base model's modules (no copy of the base weights), so its base
    logits are bit-identical to the base model's; the new heads start as identity maps / copies of the last layer.
    """
    if isinstance(base, (str, os.PathLike)):
        base = load_base_model(base, dtype=dtype)
    if isinstance(base, MultiTokenPredictionMixin):
        raise ValueError(
            f"This model is already a multi-token model (num_heads={base.config.num_heads}); convert the original "
            "base model instead, or load this one with from_pretrained."
        )
    if type(base) not in SUPPORTED_ARCHITECTURES:
        names = ", ".join(cls.__name__ for cls in SUPPORTED_ARCHITECTURES)
        raise ValueError(f"Unsupported architecture {type(base).__name__}; convert() supports {names}.")
    model_class = MULTI_TOKEN_CLASSES[type(base)]
    config_class, architecture = model_class.config_class, model_class.architecture
    base_config = {k: v for k, v in base.config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
    config = config_class(**{**base_config, "num_heads": num_heads, "head_type": head_type, **head_config})
    num_predict_heads = num_predict_heads or num_heads
    if not 1 <= num_predict_heads <= num_heads:
        raise ValueError(f"num_predict_heads={num_predict_heads} must be from 1 to num_heads={num_heads}.")
    check_draft_tree_size(draft_tree_size)
    if draft_lookup_num_tokens is not None:
        check_draft_lookup_num_tokens(draft_lookup_num_tokens)
    if draft_dtype is not None and not isinstance(draft_dtype, str):
        raise ValueError(f"draft_dtype={draft_dtype!r} is saved in generation_config.json, so it must be a name: "
                         "'auto', 'float32', 'bfloat16' or 'float16'.")
    if draft_dtype is not None:
        resolve_draft_dtype(base, draft_dtype)  # checked now, not at the first generate()

    # Build on the meta device (nothing allocated), then take the base model's own modules: the base weights are
    # reused, not copied, and only the heads get real memory.
    with torch.device("meta"):
        model = model_class(config)
    setattr(model, architecture.trunk, getattr(base, architecture.trunk))
    setattr(model, architecture.unembedding, getattr(base, architecture.unembedding))
    reference = getattr(base, architecture.unembedding).weight
    model.mtp_heads.to_empty(device=reference.device)
    model.mtp_heads.to(reference.dtype)
    model.reset_heads()
    model.train(base.training)

    generation = base.generation_config.to_dict()
    # A config built `_from_model_config` drops custom keys; one that is not keeps num_predict_heads across save/load.
    for key in ("transformers_version", "_from_model_config"):
        generation.pop(key, None)
    model.generation_config = GenerationConfig(
        **{**generation, "num_predict_heads": num_predict_heads, "draft_lookup_ngram": draft_lookup_ngram,
           "draft_tree_size": draft_tree_size,
           **({"draft_lookup_num_tokens": draft_lookup_num_tokens} if draft_lookup_num_tokens is not None else {}),
           **({"draft_dtype": draft_dtype} if draft_dtype is not None else {})}
    )
    return model
