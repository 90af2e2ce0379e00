# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""What multi-token decoding supports: combinations that would silently change the output raise before decoding.

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

from .generation_cache import is_static_cache, layers_that_cannot_roll_back

IGNORED_MODEL_KWARGS = ("use_cache", "logits_to_keep")  # generate() passes them; the decode loop sets its own


def draft_tree_unsupported(model, generation_config, batch_size, verify, cache=None):
    """Why this decoding cannot draft trees, or None when it can."""
    if not verify or generation_config.do_sample or batch_size != 1:
        mode = "verified" if verify else "unverified"
        return (f"verified greedy decoding of one sequence (got multi_token_mode={mode!r}, "
                f"do_sample={generation_config.do_sample}, batch size {batch_size})")
    if model.config.head_input == "sequential":
        return "heads that draft independently (these heads are chained: head_input='sequential')"
    if model.uses_layer_input and not model.config.head_share_kv and not model.drafts_with_one_layer:
        return "heads that share the base model's keys and values (these have their own: head_share_kv=False)"
    if is_static_cache(cache):
        # a tree's nodes are cached past the accepted path before it is known; a static cache has no room for them
        return f"a dynamic cache (got {type(cache).__name__}, e.g. from cache_implementation='static')"
    window = getattr(model.config, "sliding_window", None)
    if window is not None and generation_config.max_length > window:
        # the tree's attention mask is built here, not by transformers, and does not apply the window
        return (f"a text within the model's sliding window (sliding_window={window}, max_length="
                f"{generation_config.max_length})")
    return None


def check_supported(model, input_ids, generation_config, model_kwargs, *, verify, streamer, tree_size=0,
                     cache=None, num_positions=None):
    """Combinations that would silently change the output raise instead. `num_positions`: the cache positions the
    decoding may fill (`cache_positions_needed`)."""
    batch_size = input_ids.shape[0]
    if is_static_cache(cache) and batch_size > 1:
        # rows accept different numbers of drafts, so the cache grows faster than any row; a static cache sized for
        # max_length would overflow
        raise ValueError(
            f"batched multi_token_mode needs a dynamic cache (got {type(cache).__name__} with a batch of "
            f"{batch_size}); drop cache_implementation='static' or pass one prompt at a time."
        )
    if layers_that_cannot_roll_back(cache):
        window = getattr(model.config, "sliding_window", None)
        if batch_size > 1:
            need = (f"a batch decodes while the window spans every cache position it may fill: rows that accept "
                    "fewer drafts leave gaps, so max_length + (num_predict_heads - 1) x max_new_tokens + "
                    f"num_predict_heads = {num_positions} here (max_length={generation_config.max_length}). Pass one "
                    "prompt at a time (one row decodes at any length), shorten the text, or drop multi_token_mode.")
        else:
            need = ("one sequence decodes at any length with a dynamic cache that has dropped nothing yet (a static "
                    "cache: one no longer than the window). Start from an empty or shorter cache, or drop "
                    "multi_token_mode.")
        raise ValueError(
            f"multi_token_mode cannot roll back this sliding-window cache ({type(cache).__name__}, sliding_window="
            f"{window}): it drops positions that a rejected draft would need back. A sliding-window model: {need}"
        )
    if generation_config.num_beams > 1:
        raise ValueError(
            f"multi_token_mode does not support beam search (num_beams={generation_config.num_beams}): the heads "
            "draft one continuation, not a beam. Pass num_beams=1, or drop multi_token_mode for plain beam search."
        )
    if not verify and (generation_config.do_sample or batch_size != 1):
        raise ValueError(
            "multi_token_mode='unverified' decodes one greedy sequence at a time; use multi_token_mode=True "
            f"(verified) for do_sample=True or batches (got do_sample={generation_config.do_sample}, batch size "
            f"{batch_size})."
        )
    if batch_size > 1:
        if streamer is not None:
            raise ValueError(f"a streamer takes one sequence; got a batch of {batch_size}. Stream one prompt at a "
                             "time, or drop the streamer.")
        if generation_config.return_dict_in_generate and (
            generation_config.output_scores or generation_config.output_logits
        ):
            raise ValueError("multi_token_mode returns scores / logits for batch size 1 only (rows of a batch advance "
                             "by different numbers of tokens); drop output_scores / output_logits or pass one row.")
        if generation_config._pad_token_tensor is None:
            raise ValueError("batched multi_token_mode needs a pad token for finished rows; set pad_token_id (or "
                             "eos_token_id) in generate() or the generation config.")
    if tree_size:
        reason = draft_tree_unsupported(model, generation_config, batch_size, verify, cache)
        if reason is not None:
            raise ValueError(f"draft_tree_size={tree_size} drafts a tree of candidates, which needs {reason}; pass "
                             "draft_tree_size=0 to draft one chain.")
    if generation_config.output_attentions or generation_config.output_hidden_states:
        raise ValueError("multi_token_mode cannot return attentions or hidden states; drop output_attentions / "
                         "output_hidden_states.")
    unknown = sorted(k for k, v in model_kwargs.items() if v is not None and k not in IGNORED_MODEL_KWARGS)
    if unknown:
        raise ValueError(f"multi_token_mode does not support the generate() inputs {unknown}; pass input_ids instead.")
    max_positions = getattr(model.config, "n_positions", None)  # GPT-2's learned positions end here
    if max_positions is not None and generation_config.max_length > max_positions:
        raise ValueError(
            f"max_length={generation_config.max_length} (prompt + max_new_tokens) exceeds the model's "
            f"n_positions={max_positions}; shorten the prompt or lower max_new_tokens."
        )



def cache_positions_needed(input_ids, max_length, options):
    """
    How many cache positions a sliding window must span for it to count what it counts in plain decoding, or None
    when any window does. transformers applies a window over cache positions. One row: its cache positions are its
    text positions, as in plain decoding (rejected drafts are cropped every step), so any window works (None). A
    batch: rows accept different numbers of drafts and the cache keeps the longest row's, so each step may leave up
    to num_predict_heads - 1 masked gaps in the others; the window then must not bind at all.
    """
    if input_ids.shape[0] == 1:
        return None
    k = options.num_predict_heads
    return max_length + (k - 1) * (max_length - input_ids.shape[1]) + k
