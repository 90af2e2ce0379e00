# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Multi-token greedy decoding: draft with the heads, verify with the base model, keep what it agrees with.

`multi_token_decoding` is handed to `GenerationMixin.generate(custom_generate=...)`, so input preparation (attention
mask, position ids, `max_new_tokens` -> `max_length`, EOS and stop criteria, logits processors, the cache, the
streamer's prompt) is transformers' own and means exactly what it means for plain greedy decoding.

Why not transformers' `_assisted_decoding` with a `CandidateGenerator`: it checks stopping criteria once per block
(a stop string inside an accepted block would be overrun), it re-prepares model inputs every step, and the heads need
the verify pass's hidden states, which that loop does not hand to a candidate generator.

Each step (gpt-fast style, one stage per function):
    verify: one trunk pass over [last token, d_1 .. d_{k-1}]
    accept: the longest prefix of drafts equal to the base model's argmax, plus the base model's next token
    emit:   token by token, with the stopping criteria checked after each, exactly as plain greedy does
    roll back: crop the KV cache to the accepted tokens
    draft:  heads at the last accepted position -> next k-1 drafts (no extra trunk pass)

Copied next to the weights by `save_pretrained`: imports only torch, transformers and `from .module import Name`.
"""

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.utils import GenerateDecoderOnlyOutput

MULTI_TOKEN_MODES = ("verified", "unverified")
_IGNORED_MODEL_KWARGS = ("use_cache", "logits_to_keep")


@dataclass
class MultiTokenStats:
    """Decoding statistics of one multi-token `generate()` call."""

    num_predict_heads: int
    verified: bool
    forward_passes: int = 0  # base (trunk) forward passes, prefill included
    new_tokens: int = 0
    head_proposed: list[int] = field(default_factory=list)  # [i - 1]: steps in which head i's draft was checked
    head_accepted: list[int] = field(default_factory=list)  # [i - 1]: ... and equalled the base model's argmax
    accepted_per_step: list[int] = field(default_factory=list)  # tokens each verify pass accepted (drafts + 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.forward_passes, 1)

    @property
    def head_acceptance(self) -> list[float]:
        """Per head i = 1..k-1, the share of its checked drafts that the base model accepted (in unverified mode:
        agreed with the base model's argmax given the appended prefix)."""
        return [a / p if p else 0.0 for a, p in zip(self.head_accepted, self.head_proposed)]

    def to_dict(self) -> dict:
        return {
            "num_predict_heads": self.num_predict_heads,
            "verified": self.verified,
            "forward_passes": self.forward_passes,
            "new_tokens": self.new_tokens,
            "tokens_per_forward": self.tokens_per_forward,
            "head_proposed": self.head_proposed,
            "head_accepted": self.head_accepted,
            "head_acceptance": self.head_acceptance,
            "accepted_per_step": self.accepted_per_step,
        }


@dataclass
class MultiTokenGenerateOutput(GenerateDecoderOnlyOutput):
    r"""
    multi_token_stats ([`MultiTokenStats`]): base forward passes, tokens per forward pass and per-head acceptance.
    """

    multi_token_stats: MultiTokenStats | None = None


def resolve_num_predict_heads(model, num_predict_heads, generation_config=None):
    """`num_predict_heads`, else the generation config's, else `config.num_heads`; checked against `num_heads`."""
    limit = model.config.num_heads
    if num_predict_heads is None:
        config = generation_config if generation_config is not None else model.generation_config
        num_predict_heads = getattr(config, "num_predict_heads", None) or limit
    if isinstance(num_predict_heads, bool) or not isinstance(num_predict_heads, int) or num_predict_heads < 1:
        raise ValueError(f"num_predict_heads={num_predict_heads!r} must be an integer from 1 to num_heads={limit}.")
    if num_predict_heads > limit:
        raise ValueError(
            f"num_predict_heads={num_predict_heads} exceeds the model's num_heads={limit}; pass at most {limit}."
        )
    return num_predict_heads


def _check_supported(model, input_ids, generation_config, model_kwargs):
    """Combinations that would silently change the output raise instead."""
    if generation_config.do_sample:
        raise ValueError(
            "multi_token_mode decodes greedily; do_sample=True is not supported yet. Pass do_sample=False, or drop "
            "multi_token_mode to sample with plain generate()."
        )
    if generation_config.num_beams > 1:
        raise ValueError(
            f"multi_token_mode does not support beam search (num_beams={generation_config.num_beams}); pass "
            "num_beams=1, or drop multi_token_mode for plain beam search."
        )
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"multi_token_mode supports batch size 1 (got {input_ids.shape[0]} sequences, counting "
            "num_return_sequences); call generate() once per prompt, or drop multi_token_mode for batched decoding."
        )
    if generation_config.output_attentions or generation_config.output_hidden_states:
        raise ValueError("multi_token_mode cannot return attentions or hidden states; drop output_attentions / "
                         "output_hidden_states.")
    unknown = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _IGNORED_MODEL_KWARGS)
    if unknown:
        raise ValueError(f"multi_token_mode does not support the generate() inputs {unknown}; pass input_ids instead.")
    max_positions = getattr(model.config, "n_positions", None)  # GPT-2's learned positions end here
    if max_positions is not None and generation_config.max_length > max_positions:
        raise ValueError(
            f"max_length={generation_config.max_length} (prompt + max_new_tokens) exceeds the model's "
            f"n_positions={max_positions}; shorten the prompt or lower max_new_tokens."
        )


class _Decoder:
    """State of one multi-token decoding run (batch size 1)."""

    def __init__(self, model, sequence, *, logits_processor, stopping_criteria, streamer, num_predict_heads,
                 attention_mask, position_ids, cache, keep_scores):
        self.model = model
        self.sequence = sequence  # [1, L]: prompt + emitted tokens
        self.logits_processor = logits_processor
        self.stopping_criteria = stopping_criteria
        self.streamer = streamer
        self.k = num_predict_heads
        self.attention_mask = attention_mask  # [1, cache length] or None when there is no padding
        self.prompt_positions = position_ids  # as generate() computed them (cumsum of the mask under padding)
        self.last_position = -1
        self.cache = cache
        self.head_past = None  # own keys/values of `share_kv=False` heads, accepted positions only
        # computed once per call: the unembedding rows drafts are chosen from (all of them, or the draft vocabulary)
        self.draft_weight, self.draft_ids = model.draft_unembedding()
        self.scores = [] if keep_scores else None
        self.raw_logits = [] if keep_scores else None
        self.stats = MultiTokenStats(num_predict_heads, verified=True,
                                     head_proposed=[0] * (self.k - 1), head_accepted=[0] * (self.k - 1))

    # --- stages -------------------------------------------------------------------------------------------------
    def forward(self, tokens, positions, *, extend_mask=True):
        """One trunk pass over `tokens` [1, T] at `positions` [1, T]; returns (logits [1,T,V], normed, layer input)."""
        if self.attention_mask is not None and extend_mask:
            self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(tokens.shape)], dim=1)
        normed, layer_input, _ = self.model._trunk_forward(
            tokens, attention_mask=self.attention_mask, position_ids=positions, cache=self.cache, use_cache=True,
        )
        self.stats.forward_passes += 1
        return self.model.lm_head(normed), normed, layer_input

    def base_choices(self, logits, drafts):
        """Greedy choice of the base model at each block position, after the logits processors, as plain greedy.

        logits: [1, T, V]; drafts: [1, T-1] (the block's tokens after the first). Returns (tokens [1, T], scores).
        """
        if len(self.logits_processor) == 0:
            return logits.argmax(-1), logits
        scores = logits.clone().float()
        for j in range(logits.shape[1]):
            prefix = torch.cat([self.sequence, drafts[:, :j]], dim=1)
            scores[:, j] = self.logits_processor(prefix, scores[:, j])
        return scores.argmax(-1), scores

    def emit(self, tokens, scores=None, logits=None):
        """Append tokens one at a time, checking the stopping criteria after each. Returns True when stopped."""
        for j in range(tokens.shape[1]):
            token = tokens[:, j : j + 1]
            self.sequence = torch.cat([self.sequence, token], dim=1)
            self.stats.new_tokens += 1
            if self.scores is not None:
                self.scores.append(scores[:, j])
                self.raw_logits.append(logits[:, j])
            if self.streamer is not None:
                self.streamer.put(token[0].cpu())
            if self.stopping_criteria(self.sequence, tuple(self.scores) if self.scores is not None else None).all():
                return True
        return False

    def roll_back(self, keep):
        """Crop the KV cache (and mask) to its first `keep` positions; `crop(-n)` removes n tokens."""
        self.cache.crop(keep - self.cache.get_seq_length())
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask[:, :keep]

    def draft(self, normed, layer_input, next_tokens, positions, num_drafts):
        """
        Drafts for the tokens after `next_tokens[:, -1]`, from the heads at the last accepted position.

        normed / layer_input: [1, m, H] at the m newly accepted positions; next_tokens, positions: [1, m].
        Returns [1, num_drafts]. Drafting costs the heads plus one unembedding multiply over num_drafts rows (3 ms for
        3 rows of the full 49K vocabulary on a 2-core CPU; about 0.5 ms with an 8K draft vocabulary). A separate
        multiply costs about what folding the draft rows into the verify multiply would, and unlike it also serves
        heads that read the next token, which is known only after verification.
        """
        if num_drafts == 0:
            return next_tokens.new_empty((1, 0))
        model = self.model
        base_kv = head_past = None
        if model.uses_layer_input and model.config.head_share_kv:
            last = self.cache.layers[-1]
            base_kv = (last.keys, last.values)
            layer_input, next_tokens, positions = layer_input[:, -1:], next_tokens[:, -1:], positions[:, -1:]
        elif model.uses_layer_input:
            head_past = self.head_past
        states, new_kv = model._head_states(
            normed=normed[:, -1:], layer_input=layer_input, next_token_ids=next_tokens, position_ids=positions,
            key_padding_mask=self.attention_mask, base_kv=base_kv, head_past=head_past, num_heads=num_drafts + 1,
        )
        if new_kv is not None:
            # Heads beyond num_drafts were skipped; their caches are stale, but num_drafts only shrinks near the end
            # of the budget, so they are never read again.
            self.head_past = list(new_kv) + (self.head_past or [])[len(new_kv):]
        # states: [1, m', num_drafts, H] -> drafts of the last position: [1, num_drafts]
        choice = (states[:, -1] @ self.draft_weight.T).argmax(-1)
        return choice if self.draft_ids is None else self.draft_ids[choice]

    def remaining(self, max_length):
        return max_length - self.sequence.shape[1]


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
    num_predict_heads,
    verify=True,
    **model_kwargs,
):
    """Greedy multi-token decoding; see the module docstring. Called by `generate(custom_generate=...)`."""
    cache = model_kwargs.pop("cache", None) or DynamicCache(config=model.config)
    attention_mask, position_ids = model_kwargs.pop("attention_mask", None), model_kwargs.pop("position_ids", None)
    _check_supported(model, input_ids, generation_config, model_kwargs)
    keep_scores = generation_config.return_dict_in_generate and (
        generation_config.output_scores or generation_config.output_logits
    )
    if keep_scores and not verify:
        raise ValueError("multi_token_mode='unverified' has no base-model scores for its drafted tokens; drop "
                         "output_scores / output_logits or use the verified mode.")
    decoder = _Decoder(
        model, input_ids, logits_processor=logits_processor, stopping_criteria=stopping_criteria,
        streamer=multi_token_streamer if multi_token_streamer is not None else streamer,
        num_predict_heads=num_predict_heads, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
        keep_scores=keep_scores,
    )
    decoder.stats.verified = verify
    max_length = generation_config.max_length
    step = _verified_steps if verify else _unverified_steps
    step(decoder, input_ids, max_length)
    if decoder.streamer is not None:
        decoder.streamer.end()
    if not generation_config.return_dict_in_generate:
        return decoder.sequence
    return MultiTokenGenerateOutput(
        sequences=decoder.sequence,
        scores=tuple(decoder.scores) if generation_config.output_scores else None,
        logits=tuple(decoder.raw_logits) if generation_config.output_logits else None,
        cache=decoder.cache,
        multi_token_stats=decoder.stats,
    )


def _prefill(decoder, prompt, max_length):
    """Prompt pass: emits the first token and returns (stopped, drafts)."""
    positions = decoder.prompt_positions
    if positions is None:
        positions = torch.arange(prompt.shape[1], device=prompt.device)[None]
    logits, normed, layer_input = decoder.forward(prompt, positions, extend_mask=False)
    first, scores = decoder.base_choices(logits[:, -1:], prompt.new_empty((1, 0)))
    decoder.last_position = int(positions[0, -1])
    if decoder.emit(first, scores, logits[:, -1:]):
        return True, None
    next_tokens = torch.cat([prompt[:, 1:], first], dim=1)
    num_drafts = min(decoder.k - 1, decoder.remaining(max_length) - 1)
    return False, decoder.draft(normed, layer_input, next_tokens, positions, num_drafts)


def _verified_steps(decoder, prompt, max_length):
    stopped, drafts = _prefill(decoder, prompt, max_length)
    stats = decoder.stats
    while not stopped:
        # verify: one trunk pass over [last token, drafts]
        block = torch.cat([decoder.sequence[:, -1:], drafts], dim=1)  # [1, 1 + d]
        positions = _positions(decoder, block.shape[1])
        cache_before = decoder.cache.get_seq_length()
        logits, normed, layer_input = decoder.forward(block, positions)
        choices, scores = decoder.base_choices(logits, drafts)  # [1, 1 + d]
        # accept: drafts up to the first disagreement, then the base model's own token
        d = drafts.shape[1]
        agree = (drafts == choices[:, :d])[0].int()
        n = int(agree.cumprod(0).sum()) if d else 0
        for i in range(d):
            stats.head_proposed[i] += 1
            stats.head_accepted[i] += int(i < n)
        stats.accepted_per_step.append(n + 1)
        accepted = torch.cat([drafts[:, :n], choices[:, n : n + 1]], dim=1)  # [1, n + 1]
        # emit, token by token, as plain greedy would
        if decoder.emit(accepted, scores[:, : n + 1], logits[:, : n + 1]):
            break
        # roll back: the cache keeps [last token, d_1 .. d_n]; drafts d_{n+1}.. are dropped
        decoder.roll_back(cache_before + n + 1)
        decoder.last_position = int(positions[0, n])
        # draft from the last accepted position; its next token is the one just emitted
        num_drafts = min(decoder.k - 1, decoder.remaining(max_length) - 1)
        drafts = decoder.draft(normed[:, : n + 1], layer_input[:, : n + 1] if layer_input is not None else None,
                               accepted, positions[:, : n + 1], num_drafts)


def _unverified_steps(decoder, prompt, max_length):
    """The articles' mode: every draft is appended unchecked; one trunk pass per k tokens. Not greedy-identical."""
    stopped, drafts = _prefill(decoder, prompt, max_length)
    stats = decoder.stats
    while not stopped:
        block = torch.cat([decoder.sequence[:, -1:], drafts], dim=1)
        if decoder.emit(drafts):
            break
        positions = _positions(decoder, block.shape[1])
        logits, normed, layer_input = decoder.forward(block, positions)
        choices, scores = decoder.base_choices(logits, drafts)
        d = drafts.shape[1]
        for i in range(d):  # how often the base model would have agreed, for the benchmark
            stats.head_proposed[i] += 1
            stats.head_accepted[i] += int(bool((drafts[:, : i + 1] == choices[:, : i + 1]).all()))
        following = choices[:, -1:]
        if decoder.emit(following, scores[:, -1:], logits[:, -1:]):
            break
        decoder.last_position = int(positions[0, -1])
        num_drafts = min(decoder.k - 1, decoder.remaining(max_length) - 1)
        next_tokens = torch.cat([drafts, following], dim=1)
        drafts = decoder.draft(normed, layer_input, next_tokens, positions, num_drafts)


def _positions(decoder, length):
    """Positions of the next `length` tokens: [1, length]."""
    start = decoder.last_position + 1
    return torch.arange(start, start + length, device=decoder.sequence.device)[None]
