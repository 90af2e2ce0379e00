# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Multi-token decoding: draft with the heads, verify with the base model, keep what it would have produced itself.

`multi_token_decoding` is handed to `GenerationMixin.generate(custom_generate=...)`, so input preparation (attention
mask, position ids, `max_new_tokens` -> `max_length`, EOS and stop criteria, logits processors and warpers, the cache,
the streamer's prompt) is transformers' own and means exactly what it means for plain `generate()`.

Why not transformers' `_assisted_decoding` with a `CandidateGenerator`: it checks stopping criteria once per block
(a stop string inside an accepted block would be overrun), it re-prepares model inputs every step, it supports batch
size 1 only, and the heads need the verify pass's hidden states, which that loop does not hand to a candidate
generator.

Each step (gpt-fast style, one stage per function; the loops below call them in this order):
    verify: one trunk pass over [last token, d_1 .. d_n] for every row of the batch
    accept: greedy: the longest prefix of drafts equal to the base model's argmax, plus the base model's next token;
            sampling: the speculative-sampling rule (Leviathan et al. 2023, Chen et al. 2023): draft d_j is kept
            with probability min(1, p_j(d_j) / q_j(d_j)); the first rejected one is replaced by a sample of
            norm(max(p_j - q_j, 0)); when all are kept, one more token is sampled from p. The output distribution
            is exactly plain sampling's.
    emit:   token by token, with the stopping criteria checked after each, exactly as plain decoding does
    roll back: crop the KV cache to the longest row's accepted tokens; the other rows' rejected positions are
            masked out of the attention mask (rows accept different numbers of drafts)
    draft:  heads at each row's last accepted position -> its next drafts (no extra trunk pass); with
            `draft_confidence_threshold`, a row's drafts stop at the first one the head is unsure of; with
            `draft_lookup_ngram`, tokens that followed the row's last n-gram earlier in the row come first, else
            (with a draft datastore) the tokens that most often followed its last 3 tokens in the training answers

With `draft_tree_size=N` (greedy, batch size 1) a step drafts N tokens as a tree instead of one chain (Medusa's and
EAGLE-2's tree attention): the context / datastore continuation is one branch, and the heads' most probable
continuations (the product of their probabilities, EAGLE-2's dynamic tree) fill the rest. One trunk pass verifies
every branch under a tree-shaped attention mask; the walk from the root follows the base model's own argmax as long
as a child drafted it, and the KV cache keeps the accepted path's entries only.

Where each part lives (flat modules, all copied next to the weights by `save_pretrained`, importing only torch,
transformers and each other with `from .module import Name`):
    generation_options.py     the multi-token options, resolved and checked once (`MultiTokenOptions`)
    generation_checks.py      combinations that would change the output raise before decoding starts
    generation_state.py       `DecodingState`: the rows, the shared cache, trunk passes, emit, roll back, the outputs
    generation_proposers.py   draft sources behind one interface (heads, context lookup, datastore) and `Drafter`
    generation_acceptance.py  the acceptance rules: greedy, speculative sampling, the tree walk
    generation_certified_argmax.py  greedy verification's float32 argmax from a bfloat16 unembedding and its error bound
    generation_onednn.py      float32 trunk passes of several tokens on oneDNN's matrix products
    generation_draft_tree.py, generation_draft_sources.py, generation_processors.py, generation_cache.py: helpers
"""

import torch
from transformers.cache_utils import DynamicCache

from .generation_acceptance import accept_choices, accept_greedy, accept_speculative, accept_tree_walk
from .generation_cache import unslide_within_window
from .generation_checks import cache_positions_needed, check_supported, draft_tree_unsupported
from .generation_options import MULTI_TOKEN_OPTIONS, MultiTokenOptions
from .generation_proposers import ContextLookupProposer, DatastoreProposer, Drafter, HeadProposer
from .generation_state import DecodingState, MultiTokenGenerateOutput, MultiTokenStats, VerifyPass

__all__ = ["MultiTokenGenerateOutput", "MultiTokenStats", "multi_token_decoding"]


def multi_token_decoding(
    model,
    input_ids,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus=False,
    streamer=None,
    *,
    multi_token_streamer=None,
    options=None,
    **model_kwargs,
):
    """Multi-token decoding; see the module docstring. Called by `generate(custom_generate=...)` with the call's
    resolved `options` ([`MultiTokenOptions`]); a direct caller may pass the options by name instead (the model's
    defaults where not given)."""
    if options is None:
        given = {name: model_kwargs.pop(name) for name in MULTI_TOKEN_OPTIONS if name in model_kwargs}
        options = MultiTokenOptions.resolve(model, True, generation_config, **given)
    verify, tree_size = options.verify, options.draft_tree_size
    cache = model_kwargs.pop("cache", None)
    if cache is None:
        cache = DynamicCache(config=model.config)
    num_positions = cache_positions_needed(input_ids, generation_config.max_length, options)
    unslide_within_window(cache, num_positions)  # a sliding-window model whose text fits in the window
    attention_mask, position_ids = model_kwargs.pop("attention_mask", None), model_kwargs.pop("position_ids", None)
    streamer = multi_token_streamer if multi_token_streamer is not None else streamer
    batch_size = input_ids.shape[0]
    if options.draft_tree_from_config and draft_tree_unsupported(model, generation_config, batch_size, verify, cache):
        tree_size = 0
    check_supported(model, input_ids, generation_config, model_kwargs, verify=verify, streamer=streamer,
                    tree_size=tree_size, cache=cache, num_positions=num_positions)
    keep_scores = generation_config.return_dict_in_generate and (
        generation_config.output_scores or generation_config.output_logits
    )
    if keep_scores and not verify:
        raise ValueError("multi_token_mode='unverified' has no base-model scores for its drafted tokens; drop "
                         "output_scores / output_logits or use the verified mode.")
    # Continuing from a cache (as `generate()` does): the cache holds the text's first positions, and the call passes
    # either the whole text (its cached part is skipped) or only the new tokens with a mask over everything.
    past = int(cache.get_seq_length())
    mask_length = attention_mask.shape[1] if attention_mask is not None else getattr(
        generation_config, "_mask_length", input_ids.shape[1])
    prompt_cache_length = input_ids.shape[1] if mask_length == input_ids.shape[1] else past + input_ids.shape[1]
    if prompt_cache_length <= past:
        raise ValueError(
            f"The cache already holds {past} positions and the input has {input_ids.shape[1]} tokens, so there is "
            "nothing new to read; pass the cached text plus at least one new token."
        )
    pad = generation_config._pad_token_tensor
    state = DecodingState(
        model, input_ids, logits_processor=logits_processor, stopping_criteria=stopping_criteria, streamer=streamer,
        attention_mask=attention_mask, position_ids=position_ids, cache=cache, keep_scores=keep_scores,
        do_sample=generation_config.do_sample, pad_token_id=int(pad) if pad is not None else None,
        prompt_cache_length=prompt_cache_length, max_length=generation_config.max_length,
        certified_argmax=options.certified_argmax and verify, onednn_verify=options.onednn_verify,
    )
    drafter = build_drafter(model, options, state, tree_size)
    state.stats = MultiTokenStats(options.num_predict_heads, verified=verify,
                                  head_proposed=[0] * drafter.max_drafts, head_accepted=[0] * drafter.max_drafts)
    steps = tree_steps if tree_size else verified_steps if verify else unverified_steps
    steps(state, drafter)
    state.finalize_cache()
    if state.streamer is not None:
        state.streamer.end()
    sequences = state.sequences()
    if not generation_config.return_dict_in_generate:
        return sequences
    return MultiTokenGenerateOutput(
        sequences=sequences,
        scores=tuple(state.scores) if generation_config.output_scores else None,
        logits=tuple(state.raw_logits) if generation_config.output_logits else None,
        cache=state.cache,
        multi_token_stats=state.stats,
    )


def build_drafter(model, options, state, tree_size):
    """The draft sources `options` enable: context lookup, then the datastore, before the heads."""
    heads = HeadProposer(model, options.num_predict_heads, threshold=options.draft_confidence_threshold,
                         past_length=state.past_length, draft_dtype=options.draft_dtype)
    sources = []
    if options.draft_lookup_ngram and options.draft_lookup_num_tokens:
        sources.append(ContextLookupProposer(options.draft_lookup_ngram, options.draft_lookup_num_tokens))
    if options.draft_datastore is not None:
        sources.append(DatastoreProposer(options.draft_datastore, model.config.vocab_size, heads.max_drafts))
    return Drafter(heads, sources, tree_size)


# --- stages ----------------------------------------------------------------------------------------------------------
def prefill(state, drafter):
    """Prompt pass: emits each row's first token and returns the first drafts."""
    prompt, positions = state.uncached_prompt, state.prompt_positions  # [B, P] each
    logits, normed, layer_input = state.forward(prompt, positions, new_mask=False, last_logits_only=True)
    first = []
    for i in range(state.batch_size):
        token, scores, _ = accept_row(state, i, logits[i, -1:], prompt.new_empty(0), None)  # no drafts yet
        state.emit(i, token, scores, logits[i, -1:])
        first.append(token)
    next_tokens = torch.cat([prompt[:, 1:], torch.stack(first)], dim=1)  # [B, P]
    last = torch.full((state.batch_size,), prompt.shape[1] - 1, device=prompt.device)
    return drafter.propose(state, VerifyPass(normed, layer_input, next_tokens, positions, last))


def chain_block(state, drafts):
    """[B, 1 + max d_i]: each row's last token then its drafts (padded); and the mask of its real positions."""
    width = 1 + max(d.shape[0] for d in drafts.tokens)
    block = state.rows[0].new_full((state.batch_size, width), state.pad_token_id or 0)
    real = torch.zeros_like(block, dtype=torch.bool)
    for i, (row, row_drafts) in enumerate(zip(state.rows, drafts.tokens)):
        block[i, 0] = row[-1]
        block[i, 1 : 1 + row_drafts.shape[0]] = row_drafts
        real[i, : 1 + row_drafts.shape[0]] = state.unfinished[i]
    return block, real


def accept_row(state, row, logits, drafts, draft_probs):
    """Row `row`'s kept tokens from one verify pass (the accepted drafts, then one of the base model's own) and
    their scores. logits: [1 + d, V] over [last token, drafts [d]] (with a certified argmax: the base model's argmax
    ids [1 + d], and the scores are None); draft_probs: [d, V] (sampling) or None."""
    if state.certified is not None:
        tokens, n = accept_choices(logits, drafts)
        return tokens, None, n
    scores = state.processed_scores(row, logits, drafts)  # [1 + d, V]
    if state.do_sample:
        tokens, n = accept_speculative(scores, drafts, draft_probs)
    else:
        tokens, n = accept_greedy(scores, drafts)
    return tokens, scores[: n + 1], n


def tree_choice(state, logits):
    """`accept_tree_walk`'s choose(walked, node) over one verify pass's logits [N, V] (or argmax ids [N])."""
    if state.certified is not None:
        ids = logits.tolist()
        return lambda walked, node: (ids[node], None)

    def choose(walked, node):
        scores = state.processed(0, walked, logits[node : node + 1])
        return int(scores.argmax(-1)), scores
    return choose


# --- step loops ------------------------------------------------------------------------------------------------------
def verified_steps(state, drafter):
    """Verified decoding of a batch of chains: verify, accept, emit, roll back, draft."""
    drafts = prefill(state, drafter)
    while any(state.unfinished):
        block, real = chain_block(state, drafts)  # [B, T]
        positions = state.last_position[:, None] + 1 + torch.arange(block.shape[1], device=block.device)
        cache_before = int(state.cache.get_seq_length())
        logits, normed, layer_input = state.forward(block, positions, real)  # verify: one pass, every row
        accepted = torch.zeros(state.batch_size, dtype=torch.long, device=block.device)  # [B]
        next_tokens = block.roll(-1, dims=1)  # the token after each block position, where it was kept
        for i in range(state.batch_size):
            if not real[i, 0] or not state.unfinished[i]:  # ended before this pass, or by a row before it in it
                continue
            d = drafts.tokens[i].shape[0]
            tokens, scores, n = accept_row(state, i, logits[i, : d + 1], drafts.tokens[i],
                                           drafts.probs[i] if drafts.probs is not None else None)
            state.stats.count_step(d, n)
            accepted[i], next_tokens[i, n] = n, tokens[-1]
            state.emit(i, tokens, scores, logits[i, : n + 1])  # token by token, as plain decoding would
        if not any(state.unfinished):
            break
        # roll back: every row keeps [last token, its n accepted drafts]; positions after them are masked out
        kept = torch.arange(block.shape[1], device=block.device)[None] <= accepted[:, None]
        state.attention_mask[:, cache_before:] *= (kept & real).to(state.attention_mask.dtype)
        state.last_position = state.last_position + torch.where(real[:, 0], accepted + 1, 0)
        # draft from each row's last accepted position; its next token is the one just emitted
        drafts = drafter.propose(state, VerifyPass(normed, layer_input, next_tokens, positions, accepted))
        keep = cache_before + int(accepted.max()) + 1
        state.roll_back(keep)
        drafter.roll_back(keep)


def tree_steps(state, drafter):
    """Verified greedy decoding of one row with a draft tree per step (`draft_tree_size`)."""
    tree = prefill(state, drafter)
    while state.unfinished[0]:
        cache_before = int(state.cache.get_seq_length())
        logits, normed, layer_input = state.forward_tree(tree)  # verify: one pass over every node
        path, tokens, scores = accept_tree_walk(tree, tree_choice(state, logits), state.rows[0].device)
        n = len(path) - 1
        state.stats.count_step(max(tree.depths), n)
        state.emit(0, tokens, scores, logits[path])
        state.keep_path(cache_before, path)  # roll back: the cache keeps the accepted path only
        if not state.unfinished[0]:
            break
        positions = state.last_position[:, None] + 1 + torch.arange(n + 1, device=tokens.device)[None]
        state.last_position = state.last_position + n + 1
        # draft from the last accepted node; its next token is the one just emitted
        normed, layer_input = (x[:, path] if x is not None else None for x in (normed, layer_input))
        last = torch.full((1,), n, device=tokens.device)
        tree = drafter.propose(state, VerifyPass(normed, layer_input, tokens[None], positions, last))


def unverified_steps(state, drafter):
    """The articles' mode: every draft is appended unchecked; one trunk pass per k tokens. Not greedy-identical.
    Batch size 1, greedy only (checked before decoding starts)."""
    drafts = prefill(state, drafter).tokens[0]
    while state.unfinished[0]:
        block = torch.cat([state.rows[0][-1:], drafts])[None]  # [1, 1 + d]
        state.emit(0, drafts)
        positions = state.last_position[:, None] + 1 + torch.arange(block.shape[1], device=block.device)
        if not state.unfinished[0]:
            if drafts.shape[0]:  # the appended drafts still go into the cache, for a call that continues from it
                state.forward(block, positions)
            break
        logits, normed, layer_input = state.forward(block, positions)
        scores = state.processed_scores(0, logits[0], drafts)
        choices = scores.argmax(-1)
        d = drafts.shape[0]
        for i in range(d):  # how often the base model would have agreed, for the benchmark
            state.stats.head_proposed[i] += 1
            state.stats.head_accepted[i] += int(bool((drafts[: i + 1] == choices[: i + 1]).all()))
        following = choices[-1:]
        state.emit(0, following, scores[-1:], logits[0, -1:])
        if not state.unfinished[0]:
            break
        state.last_position = positions[:, -1]
        next_tokens = torch.cat([drafts, following])[None]
        last = torch.full((1,), d, device=block.device)
        drafts = drafter.propose(state, VerifyPass(normed, layer_input, next_tokens, positions, last)).tokens[0]
