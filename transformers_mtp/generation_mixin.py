# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""`generate(multi_token_mode=True)`: the multi-token options on top of transformers' own `generate()`.

Copied next to the weights by `save_pretrained` (through modeling_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

from functools import partial

from .generation_multi_token import multi_token_decoding
from .generation_options import MULTI_TOKEN_OPTIONS, MultiTokenOptions, check_no_options_without_mode


class MultiTokenGenerationMixin:
    """Adds `multi_token_mode` and the draft options to a causal LM's `generate()`; everything else is the base's."""

    def generate(self, *args, multi_token_mode=False, **kwargs):
        r"""
        `generate()` of the base model, plus multi-token decoding:

        - `multi_token_mode=True` (or `"verified"`): heads draft `num_predict_heads - 1` tokens, the base model verifies
          them in its next forward pass. Greedy (`do_sample=False`): the longest agreeing prefix is kept, and the
          output is token-for-token the output of `generate(do_sample=False)`. Sampling (`do_sample=True`, with
          temperature / top-k / top-p): speculative sampling, whose output distribution is exactly that of
          `generate(do_sample=True)` with the same settings. Batches (left padding) are supported: each row keeps
          its own number of drafts.
        - `multi_token_mode="unverified"`: the articles' append-every-draft mode. Faster, but its output is not the
          greedy output; opt-in only, greedy, batch size 1.
        - `num_predict_heads` (defaults to `generation_config.num_predict_heads`, else `config.num_heads`): tokens
          proposed per forward pass, at most `config.num_heads`.
        - `draft_confidence_threshold` (defaults to `generation_config.draft_confidence_threshold`, else 0): a row's
          drafts stop at the first one whose head gives its top token less than this probability (adaptive draft
          length; a verify pass over fewer tokens is cheaper).
        - `draft_lookup_ngram` (defaults to `generation_config.draft_lookup_ngram`, else 0): when the row's last n
          tokens (n from this value down to 2) occurred earlier in the row, the tokens that followed them are drafted
          first and the heads draft the rest (prompt lookup, folded into the same verify pass).
        - `draft_lookup_num_tokens` (defaults to `generation_config.draft_lookup_num_tokens`, else
          `num_predict_heads - 1`): the most tokens a step copies from the context; a repeated span is often right
          for many tokens, so it may be more than the heads draft.
        - `draft_datastore` (defaults to `generation_config.draft_datastore`, else True when the model has a draft
          datastore, see `config.draft_datastore_size`): when nothing was copied from the row's own context, the
          tokens that most often followed its last 3 tokens in the model's training answers are drafted first.
        - `draft_tree_size` (defaults to `generation_config.draft_tree_size`, else 0): greedy decoding of one
          sequence drafts this many tokens per step as a tree of candidates (the context / datastore continuation and
          the heads' most probable continuations), all verified in one pass; 0 drafts one chain. A size from the
          generation config applies where trees can be drafted, and sampling or batches then draft chains; a size
          passed here with them raises.
        - `draft_dtype` (defaults to `generation_config.draft_dtype`, else the model's dtype): "auto" (bfloat16 for a
          float32 model where the hardware computes it natively), "bfloat16", "float16"
          or "float32": the heads draft from a copy of themselves in this dtype while the model verifies in its own,
          so verified output is unchanged (a float32 model stays token for token greedy); cheaper drafts where the
          hardware computes the dtype natively. Unverified mode emits the drafts, so there it changes the text.
        - `certified_argmax` (defaults to `generation_config.certified_argmax`, else "auto"): greedy verification of
          a float32 model on CPU takes the base model's argmax from a bfloat16 unembedding plus a rigorous error
          bound, recomputing in float32 only the tokens the bound cannot rule out, instead of unembedding every
          verified position in float32; the tokens are the same. "auto": where the CPU computes bfloat16 natively;
          True / False to force it. With logits processors, `output_scores` / `output_logits` or sampling the float32
          logits are computed as before.
        - `onednn_verify` (defaults to `generation_config.onednn_verify`, else "auto"): a float32 model's trunk passes
          over several tokens (the prompt, each verify block) compute their matrix products with oneDNN instead of
          torch's default CPU kernel (MKL), which is half as fast for a few rows on some CPUs; both are float32 and
          the output is still greedy's. "auto": on x86 CPUs with AVX2 or AVX-512; True / False to force it.
        - Beam search (`num_beams > 1`) raises: the heads draft one continuation, not a beam.

        With `return_dict_in_generate=True` the output carries `multi_token_stats` (forward passes, tokens per
        forward pass, per-head acceptance).
        """
        given = {name: kwargs.pop(name) for name in MULTI_TOKEN_OPTIONS if name in kwargs}
        if not multi_token_mode:
            check_no_options_without_mode(given)
            return super().generate(*args, **kwargs)
        if kwargs.get("custom_generate") is not None or kwargs.get("assistant_model") is not None:
            raise ValueError("multi_token_mode cannot be combined with custom_generate or assistant_model.")
        options = MultiTokenOptions.resolve(self, multi_token_mode, kwargs.get("generation_config"), **given)
        # transformers (5.24) forwards neither `streamer` nor `tokenizer` to a callable `custom_generate`, so the
        # streamer is bound here and stop strings are turned into their stopping criterion here (the same
        # `StopStringCriteria` that `generate()` would build).
        decoding = partial(multi_token_decoding, multi_token_streamer=kwargs.get("streamer"), options=options)
        _move_stop_strings_into_criteria(self, kwargs)
        return super().generate(*args, custom_generate=decoding, **kwargs)


def _move_stop_strings_into_criteria(model, kwargs):
    """Build `generate()`'s own `StopStringCriteria` for `stop_strings` (see the note in `generate`)."""
    from transformers import GenerationConfig, StoppingCriteriaList, StopStringCriteria

    config = kwargs.get("generation_config") or model.generation_config
    stop_strings = kwargs.pop("stop_strings", None) or getattr(config, "stop_strings", None)
    tokenizer = kwargs.pop("tokenizer", None)
    if not stop_strings:
        return
    if tokenizer is None:
        raise ValueError(
            f"stop_strings={stop_strings!r} needs the tokenizer: pass tokenizer=... to generate(), as with plain "
            "generate()."
        )
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(stop_strings=stop_strings, tokenizer=tokenizer))
    kwargs["stopping_criteria"] = criteria
    if getattr(config, "stop_strings", None):  # keep generate() from building the criterion a second time
        kwargs["generation_config"] = GenerationConfig(**{**config.to_dict(), "stop_strings": None})
