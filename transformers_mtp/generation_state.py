# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The state of one multi-token decoding run, and what it returns.

`DecodingState` holds a batch of rows sharing one KV cache and the operations on them that every step loop uses: a
trunk pass (a chain block or a draft tree), the logits processors row by row, emitting tokens with the stopping
criteria checked after each, and rolling the cache back. It knows nothing of where drafts come from (see
generation_proposers.py) or how they are accepted (generation_acceptance.py).

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

import contextlib
from dataclasses import dataclass, field

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .generation_cache import crop_cache, is_static_cache
from .generation_certified_argmax import CertifiedArgmax
from .generation_onednn import OneDNNLinear
from .generation_processors import processors_per_row


@dataclass
class MultiTokenStats:
    """Decoding statistics of one multi-token `generate()` call (summed over the rows of a batch)."""

    num_predict_heads: int
    verified: bool
    forward_passes: int = 0  # base (trunk) forward passes, prefill included
    new_tokens: int = 0  # over all rows, up to each row's end (padding after EOS not counted)
    head_proposed: list[int] = field(default_factory=list)  # [i - 1]: row-steps in which head i's draft was checked
    head_accepted: list[int] = field(default_factory=list)  # [i - 1]: ... and the base model kept it
    accepted_per_step: list[int] = field(default_factory=list)  # tokens each row kept per verify pass (drafts + 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.forward_passes, 1)

    @property
    def head_acceptance(self) -> list[float]:
        """Per head i = 1..k-1, the share of its checked drafts that the base model accepted (in unverified mode:
        agreed with the base model's argmax given the appended prefix)."""
        return [a / p if p else 0.0 for a, p in zip(self.head_accepted, self.head_proposed)]

    def count_step(self, proposed, accepted):
        """One row's verify pass: `proposed` drafts checked, the first `accepted` of them kept."""
        for j in range(proposed):
            self.head_proposed[j] += 1
            self.head_accepted[j] += int(j < accepted)
        self.accepted_per_step.append(accepted + 1)

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


@dataclass
class VerifyPass:
    """What one trunk pass leaves for drafting: the states at the block's positions and each row's last kept one."""

    normed: torch.Tensor  # [B, T, H] the final norm's output
    layer_input: torch.Tensor | None  # [B, T, H] the last decoder layer's input (query-extension heads), else None
    next_tokens: torch.Tensor  # [B, T] the token after each position (where it was kept)
    positions: torch.Tensor  # [B, T]
    last: torch.Tensor  # [B] index of each row's last accepted position (positions after it are masked out)


class DecodingState:
    """A batch of rows sharing one KV cache, as they are decoded."""

    def __init__(self, model, input_ids, *, logits_processor, stopping_criteria, streamer, attention_mask, position_ids,
                 cache, keep_scores, do_sample, pad_token_id, prompt_cache_length=None, max_length=None,
                 certified_argmax=False, onednn_verify=False):
        self.model = model
        self.rows = [row for row in input_ids]  # [L_i] each: prompt (with its padding) + emitted tokens
        self.unfinished = [True] * len(self.rows)  # still decoded
        # As plain `generate()`: with an EOS criterion a stopped row is padded from then on; without one it goes on
        # until every row has stopped, and then all rows end at the length where the last one stopped.
        self.pads_finished_rows = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
        self.stop_length = [None] * len(self.rows)  # per row: its length when a stopping criterion first fired
        self.end_length = None  # without an EOS criterion: the length every row ends at, once known
        self.max_length = max_length if max_length is not None else float("inf")
        self.logits_processor = processors_per_row(logits_processor, len(self.rows))  # [row]
        self.stopping_criteria = stopping_criteria
        self.streamer = streamer
        self.do_sample = do_sample
        self.pad_token_id = pad_token_id
        self.cache = cache
        self.past_length = past = int(cache.get_seq_length())  # positions the cache held when the call began
        # cache positions the prompt pass fills from: the cache may hold the start of the text (a continued chat)
        self.prompt_cache_length = past + input_ids.shape[1] if prompt_cache_length is None else prompt_cache_length
        new = self.prompt_cache_length - past
        self.prompt_width = input_ids.shape[1]  # the rows' tokens before the first emitted one
        # [B, cache length]; always kept, because rejected drafts stay in the cache, masked out, until roll_back
        if attention_mask is None:
            attention_mask = input_ids.new_ones((input_ids.shape[0], self.prompt_cache_length))
        if attention_mask.shape[1] != self.prompt_cache_length:
            raise ValueError(
                f"attention_mask covers {attention_mask.shape[1]} positions, but the cache holds {past} and the "
                f"prompt adds {new}; pass a mask over the cached and the new tokens."
            )
        self.attention_mask = attention_mask
        if position_ids is None:  # as generate() computes them: cumsum of the mask (the padding gets 0)
            position_ids = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
        self.prompt_positions = position_ids[:, -new:]  # [B, new]
        self.uncached_prompt = input_ids[:, input_ids.shape[1] - new :]  # [B, new]: what the prompt pass reads
        self.last_position = self.prompt_positions[:, -1].clone()  # [B]
        self.scores = [] if keep_scores else None
        self.raw_logits = [] if keep_scores else None
        self.stats = None  # set by the caller, which knows how many drafts a step may check
        # Greedy verification that needs no scores (no processors, none kept) needs only the base model's argmax: with
        # `certified_argmax` the trunk passes return that instead of the logits (generation_certified_argmax.py).
        argmax_only = not do_sample and not keep_scores and all(len(p) == 0 for p in self.logits_processor)
        self.certified = CertifiedArgmax.of(model) if certified_argmax and argmax_only else None
        # float32 trunk passes of several tokens on oneDNN (generation_onednn.py)
        self.onednn = OneDNNLinear(model) if onednn_verify else contextlib.nullcontext()

    @property
    def batch_size(self):
        return len(self.rows)

    def room(self, row):
        """Tokens row `row` may still take after its next one (0 once it is finished)."""
        end = self.max_length if self.end_length is None else min(self.max_length, self.end_length)
        return max(0, end - self.rows[row].shape[0] - 1) if self.unfinished[row] else 0

    # --- trunk passes ------------------------------------------------------------------------------------------------
    def forward(self, tokens, positions, new_mask=None, last_logits_only=False):
        """One trunk pass over `tokens` [B, T] at `positions` [B, T]; returns (verdict [B,T,V] or [B, T] (see
        `verdict`), normed, layer input).
        `new_mask` [B, T]: which new positions later tokens may attend to (default: all; False: the mask already
        covers them). `last_logits_only`: logits of the last position only ([B, 1, V]), as transformers' prefill
        computes them (`logits_to_keep=1`)."""
        if new_mask is not False:
            if new_mask is None:
                new_mask = self.attention_mask.new_ones(tokens.shape)
            self.attention_mask = torch.cat([self.attention_mask, new_mask.to(self.attention_mask.dtype)], dim=1)
        with self.onednn:
            normed, layer_input, _ = self.model._trunk_forward(
                tokens, attention_mask=self.attention_mask, position_ids=positions, cache=self.cache, use_cache=True,
            )
            self.stats.forward_passes += 1
            return self.verdict(normed[:, -1:] if last_logits_only else normed), normed, layer_input

    def forward_tree(self, tree):
        """One trunk pass over every node of `tree`, each at its depth's position and seeing only its ancestors.
        Returns (verdict [N, V] or [N], normed [1, N, H], layer input [1, N, H] or None); the mask is not extended
        (see `keep_path`)."""
        tokens = torch.tensor(tree.tokens, device=self.rows[0].device)[None]
        positions = self.last_position[:, None] + 1 + torch.tensor(tree.depths, device=tokens.device)[None]
        dtype = self.model.lm_head.weight.dtype
        with self.onednn:
            normed, layer_input, _ = self.model._trunk_forward(
                tokens, attention_mask=tree.attention_mask(self.attention_mask, dtype), position_ids=positions,
                cache=self.cache, use_cache=True,
            )
            self.stats.forward_passes += 1
            return self.verdict(normed)[0], normed, layer_input

    def verdict(self, normed):
        """What the base model says at each position of `normed` [..., H]: its logits [..., V], or with a certified
        argmax (`self.certified`) its argmax token ids [...] only."""
        if self.certified is not None:
            return self.certified(normed)
        return self.model.unembed(normed)

    # --- scores ------------------------------------------------------------------------------------------------------
    def processed(self, row, prefix, scores):
        """Row `row`'s scores [n, V] after the logits processors (and warpers), with `prefix` (tokens after the row's
        own: a [m] tensor, or a list of token ids or [1] tensors) as the text before them, as plain decoding computes
        them. Without processors the prefix is never built."""
        processors = self.logits_processor[row]
        if len(processors) == 0:
            return scores
        if not isinstance(prefix, torch.Tensor):
            prefix = torch.tensor([int(t) for t in prefix], dtype=torch.long, device=self.rows[row].device)
        return processors(torch.cat([self.rows[row], prefix])[None], scores.float().clone())

    def processed_scores(self, row, logits, drafts):
        """Row `row`'s scores at each block position: logits [T, V] over [last token, drafts [T-1]]. Returns [T, V]."""
        if len(self.logits_processor[row]) == 0:
            return logits
        return torch.cat([self.processed(row, drafts[:j], logits[j : j + 1]) for j in range(logits.shape[0])])

    # --- emit --------------------------------------------------------------------------------------------------------
    def emit(self, row, tokens, scores=None, logits=None):
        """Append tokens to row `row` one at a time, checking the stopping criteria after each. Returns the number
        appended (fewer than given when the row stopped)."""
        if not self.unfinished[row]:
            return 0
        for j in range(tokens.shape[0]):
            token = tokens[j : j + 1]
            self.rows[row] = torch.cat([self.rows[row], token])
            self.stats.new_tokens += 1
            if self.scores is not None:
                self.scores.append(scores[j : j + 1])
                self.raw_logits.append(logits[j : j + 1])
            if self.streamer is not None:
                self.streamer.put(token.cpu())
            length = self.rows[row].shape[0]
            if self.stop_length[row] is None:
                stop = self.stopping_criteria(self.rows[row][None],
                                              tuple(self.scores) if self.scores is not None else None)
                if stop.all():
                    self.stop_length[row] = length
                    if self.pads_finished_rows or self.batch_size == 1:
                        self.unfinished[row] = False
                        return j + 1
                    if all(n is not None for n in self.stop_length):
                        self.end_length = max(self.stop_length)
                        for other in range(self.batch_size):
                            self._end_at(other, self.end_length)
            if self.stop_length[row] is not None and length >= (self.end_length or self.max_length):
                self.unfinished[row] = False  # a stopped row that goes on (no EOS criterion) ends here
                return j + 1
        return tokens.shape[0]

    def _end_at(self, row, length):
        """Without an EOS criterion: end row `row` at `length` tokens (dropping what it decoded past it)."""
        extra = self.rows[row].shape[0] - length
        if extra >= 0:
            self.rows[row] = self.rows[row][:length]
            self.stats.new_tokens -= extra
            self.unfinished[row] = False

    # --- roll back ---------------------------------------------------------------------------------------------------
    def roll_back(self, keep):
        """Crop the KV cache and the mask to their first `keep` positions."""
        crop_cache(self.cache, keep)
        self.attention_mask = self.attention_mask[:, :keep]

    def keep_path(self, start, path):
        """After a tree's verify pass (its nodes cached from `start` on): keep the cache entries of the accepted
        `path`, in order, and drop every other branch."""
        n = len(path)
        if path != list(range(n)):  # a branch other than the first nodes: move its entries into place
            index = torch.tensor(path, device=self.rows[0].device) + start
            for layer in self.cache.layers:
                layer.keys[:, :, start : start + n] = layer.keys[:, :, index]
                layer.values[:, :, start : start + n] = layer.values[:, :, index]
        crop_cache(self.cache, start + n)
        self.attention_mask = torch.cat([self.attention_mask[:, :start], self.attention_mask.new_ones((1, n))], dim=1)

    def finalize_cache(self):
        """
        Leave the cache as plain `generate()` leaves it, so a later call can continue from it: every row's tokens but
        its last, at the positions of `sequences()`. Rejected drafts (rows of a batch accept different numbers, and
        the last pass is not rolled back) are dropped; a row that ended early repeats its last entry up to the
        longest row's length, where plain decoding would have cached its padding.
        """
        start = self.prompt_cache_length
        # all but the last of each row's generated tokens are cached
        keep = [max(row.shape[0] - self.prompt_width - 1, 0) for row in self.rows]
        length = start + max(keep)
        valid = self.attention_mask[:, start:].bool()
        index = []
        for i, count in enumerate(keep):
            positions = valid[i].nonzero()[:, 0][:count] + start
            row_index = torch.cat([torch.arange(start, device=positions.device), positions])
            if row_index.shape[0] < length:
                row_index = torch.cat([row_index, row_index[-1:].expand(length - row_index.shape[0])])
            index.append(row_index)
        index = torch.stack(index)  # [B, length]
        if bool((index == torch.arange(length, device=index.device)).all()):
            crop_cache(self.cache, length)
        else:
            if is_static_cache(self.cache):
                raise ValueError("a static cache cannot be compacted after batched decoding")
            for layer in self.cache.layers:
                gather = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
        self.attention_mask = self.attention_mask[:, :length]

    def sequences(self):
        """The rows as one [B, L] tensor; rows that ended early are padded, as plain `generate()` pads them."""
        length = max(row.shape[0] for row in self.rows)
        out = self.rows[0].new_full((self.batch_size, length), self.pad_token_id if self.pad_token_id is not None else 0)
        for i, row in enumerate(self.rows):
            out[i, : row.shape[0]] = row
        return out
