# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Multi-token decoding: draft with the heads, verify with the base model, keep what it would have produced itself.

`multi_token_decoding` is handed to `GenerationMixin.generate(custom_generate=...)`, so input preparation (attention
mask, position ids, `max_new_tokens` -> `max_length`, EOS and stop criteria, logits processors and warpers, the cache,
the streamer's prompt) is transformers' own and means exactly what it means for plain `generate()`.

Why not transformers' `_assisted_decoding` with a `CandidateGenerator`: it checks stopping criteria once per block
(a stop string inside an accepted block would be overrun), it re-prepares model inputs every step, it supports batch
size 1 only, and the heads need the verify pass's hidden states, which that loop does not hand to a candidate
generator.

Each step (gpt-fast style, one stage per function):
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

Copied next to the weights by `save_pretrained`: imports only torch, transformers and `from .module import Name`.
"""

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .generation_cache import cache_layer_keys_values, crop_cache, is_static_cache
from .generation_draft_sources import context_continuation, datastore_continuation
from .generation_draft_tree import DRAFT_TREE_BRANCHING, DraftTree, grow_draft_tree
from .generation_options import MULTI_TOKEN_OPTIONS, MultiTokenOptions
from .generation_processors import processors_per_row

_IGNORED_MODEL_KWARGS = ("use_cache", "logits_to_keep")


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


def _draft_tree_unsupported(model, generation_config, batch_size, verify, cache=None):
    """Why this decoding cannot draft trees, or None when it can."""
    if not verify or generation_config.do_sample or batch_size != 1:
        mode = "verified" if verify else "unverified"
        return (f"verified greedy decoding of one sequence (got multi_token_mode={mode!r}, "
                f"do_sample={generation_config.do_sample}, batch size {batch_size})")
    if model.config.head_input == "sequential":
        return "heads that draft independently (these heads are chained: head_input='sequential')"
    if model.uses_layer_input and not model.config.head_share_kv:
        return "heads that share the base model's keys and values (these have their own: head_share_kv=False)"
    if is_static_cache(cache):
        # a tree's nodes are cached past the accepted path before it is known; a static cache has no room for them
        return f"a dynamic cache (got {type(cache).__name__}, e.g. from cache_implementation='static')"
    return None


def _check_supported(model, input_ids, generation_config, model_kwargs, *, verify, streamer, tree_size=0,
                     cache=None):
    """Combinations that would silently change the output raise instead."""
    batch_size = input_ids.shape[0]
    if is_static_cache(cache) and batch_size > 1:
        # rows accept different numbers of drafts, so the cache grows faster than any row; a static cache sized for
        # max_length would overflow
        raise ValueError(
            f"batched multi_token_mode needs a dynamic cache (got {type(cache).__name__} with a batch of "
            f"{batch_size}); drop cache_implementation='static' or pass one prompt at a time."
        )
    if getattr(cache, "is_sliding", None) is not None and any(cache.is_sliding):
        raise ValueError(f"multi_token_mode does not support sliding-window caches ({type(cache).__name__}); use the "
                         "default dynamic cache.")
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
        reason = _draft_tree_unsupported(model, generation_config, batch_size, verify, cache)
        if reason is not None:
            raise ValueError(f"draft_tree_size={tree_size} drafts a tree of candidates, which needs {reason}; pass "
                             "draft_tree_size=0 to draft one chain.")
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


def _at_positions(x, index):
    """[B, T, ...] -> [B, 1, ...] at position index[i] of each row (None stays None)."""
    if x is None:
        return None
    return x[torch.arange(x.shape[0], device=x.device), index][:, None]


class _Decoder:
    """State of one multi-token decoding run: a batch of rows sharing one KV cache."""

    def __init__(self, model, input_ids, *, logits_processor, stopping_criteria, streamer, num_predict_heads,
                 attention_mask, position_ids, cache, keep_scores, do_sample, pad_token_id, draft_threshold,
                 lookup_ngram=0, lookup_num_tokens=0, datastore=None, tree_size=0, prompt_cache_length=None,
                 max_length=None):
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
        self.k = num_predict_heads
        self.do_sample = do_sample
        self.pad_token_id = pad_token_id
        self.draft_threshold = draft_threshold
        self.lookup_ngram = lookup_ngram
        self.lookup_num_tokens = lookup_num_tokens if lookup_ngram else 0
        self.datastore = datastore
        self.tree_size = tree_size
        self.cache = cache
        past = int(cache.get_seq_length())
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
        # own keys/values of `share_kv=False` heads, for the cache positions from `head_past_start` on (the heads never
        # saw the positions of a cache that came with the call)
        self.head_past = None
        self.head_past_start = past
        # computed once per call: the unembedding rows drafts are chosen from (all of them, or the draft vocabulary)
        self.draft_weight, self.draft_ids = model.draft_unembedding()
        self.scores = [] if keep_scores else None
        self.raw_logits = [] if keep_scores else None
        max_drafts = max(self.k - 1, self.lookup_num_tokens)  # drafts copied from the context may outnumber heads
        self.stats = MultiTokenStats(num_predict_heads, verified=True,
                                     head_proposed=[0] * max_drafts, head_accepted=[0] * max_drafts)

    @property
    def batch_size(self):
        return len(self.rows)

    # --- stages -------------------------------------------------------------------------------------------------
    def forward(self, tokens, positions, new_mask=None, last_logits_only=False):
        """One trunk pass over `tokens` [B, T] at `positions` [B, T]; returns (logits [B,T,V], normed, layer input).
        `new_mask` [B, T]: which new positions later tokens may attend to (default: all). `last_logits_only`: logits
        of the last position only ([B, 1, V]), as transformers' prefill computes them (`logits_to_keep=1`)."""
        if new_mask is not False:
            if new_mask is None:
                new_mask = self.attention_mask.new_ones(tokens.shape)
            self.attention_mask = torch.cat([self.attention_mask, new_mask.to(self.attention_mask.dtype)], dim=1)
        normed, layer_input, _ = self.model._trunk_forward(
            tokens, attention_mask=self.attention_mask, position_ids=positions, cache=self.cache, use_cache=True,
        )
        self.stats.forward_passes += 1
        return self.model.lm_head(normed[:, -1:] if last_logits_only else normed), normed, layer_input

    def processed_scores(self, row, logits, drafts):
        """Row `row`'s scores at each block position after the logits processors (and warpers), as plain decoding
        computes them. logits: [T, V]; drafts: [T-1] (the block's tokens after the first). Returns [T, V]."""
        processors = self.logits_processor[row]
        if len(processors) == 0:
            return logits
        scores = logits.float().clone()
        for j in range(logits.shape[0]):
            prefix = torch.cat([self.rows[row], drafts[:j]])[None]
            scores[j] = processors(prefix, scores[j : j + 1])[0]
        return scores

    def accept(self, row, logits, drafts, draft_probs):
        """
        Tokens row `row` keeps from one verify pass: accepted drafts, then one token of the base model's own.

        logits: [1 + d, V] over [last token, drafts]; drafts: [d]; draft_probs: [d, V] (sampling) or None.
        Returns (tokens [n + 1], scores [n + 1, V], n accepted drafts).
        """
        scores = self.processed_scores(row, logits, drafts)
        d = drafts.shape[0]
        if not self.do_sample:
            choices = scores.argmax(-1)
            n = int((drafts == choices[:d]).int().cumprod(0).sum()) if d else 0
            return torch.cat([drafts[:n], choices[n : n + 1]]), scores[: n + 1], n
        probs = torch.softmax(scores.float(), dim=-1)
        for j in range(d):
            token = drafts[j]
            p, q = probs[j, token], draft_probs[j, token]
            if torch.rand((), device=probs.device) * q < p:  # kept with probability min(1, p / q)
                continue
            residual = (probs[j] - draft_probs[j]).clamp_min(0)
            if residual.sum() <= 0:  # p <= q everywhere means p == q: a rejection had probability 0
                residual = probs[j]
            replacement = torch.multinomial(residual / residual.sum(), 1)
            return torch.cat([drafts[:j], replacement]), scores[: j + 1], j
        return torch.cat([drafts, torch.multinomial(probs[d], 1)]), scores, d

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

    def roll_back(self, keep):
        """Crop the KV cache, the heads' own caches and the mask to their first `keep` positions."""
        crop_cache(self.cache, keep)
        if self.head_past is not None:
            own = keep - self.head_past_start
            self.head_past = [(k[:, :, :own], v[:, :, :own]) for k, v in self.head_past]
        self.attention_mask = self.attention_mask[:, :keep]

    def num_drafts(self, row, max_length, limit=None):
        """Drafts row `row` may send: at most `limit` (default k - 1), and none past `max_length`."""
        limit = self.k - 1 if limit is None else limit
        if self.end_length is not None:
            max_length = min(max_length, self.end_length)
        return max(0, min(limit, max_length - self.rows[row].shape[0] - 1)) if self.unfinished[row] else 0

    def context_drafts(self, counts, max_length):
        """Per row, the tokens drafted before the heads' (possibly none): what followed the row's last n-gram earlier
        in the row, else (with a draft datastore) what most often followed its last 3 tokens in the model's own
        training answers. counts: the heads' draft count per row. Returns a list of [c_i]."""
        contexts = [context_continuation(self.rows[i], self.num_drafts(i, max_length, self.lookup_num_tokens),
                                         self.lookup_ngram) if self.lookup_num_tokens and counts[i]
                    else self.rows[i][:0] for i in range(self.batch_size)]
        if self.datastore is not None:
            vocab_size = self.model.config.vocab_size
            contexts = [c if c.shape[0] else datastore_continuation(self.rows[i], counts[i], self.datastore, vocab_size)
                        for i, c in enumerate(contexts)]
        return contexts

    def head_inputs(self, normed, layer_input, next_tokens, positions, last):
        """
        What the heads read to draft from each row's last accepted position `last` [B]: (normed, layer_input,
        next_tokens, positions, base_kv, head_past, key_padding_mask). Heads with their own keys and values read every
        block position (the rejected ones are masked out and cropped with the cache) and their own past, which starts
        at `head_past_start`; the others read the last accepted position only, and query-extension heads that share
        keys and values attend to the base last layer's cache.
        """
        model = self.model
        if model.uses_layer_input and not model.config.head_share_kv:
            own_mask = self.attention_mask[:, self.head_past_start :]
            return normed, layer_input, next_tokens, positions, None, self.head_past, own_mask
        normed, layer_input, next_tokens, positions = (
            _at_positions(x, last) for x in (normed, layer_input, next_tokens, positions))
        base_kv = None
        if model.uses_layer_input:
            base_kv = cache_layer_keys_values(self.cache, -1)
        return normed, layer_input, next_tokens, positions, base_kv, None, self.attention_mask

    def draft(self, normed, layer_input, next_tokens, positions, last, max_length):
        """
        Each row's drafts for the tokens after `next_tokens[i, last[i]]`, from the heads at position `last[i]`.

        normed / layer_input: [B, T, H] at the block's positions; next_tokens, positions: [B, T] (the token after each
        position, and its position); last: [B] index of each row's last accepted position (positions after it are
        masked out). Returns (list of [d_i] drafts, list of [d_i, V] draft distributions or None when greedy); with
        `draft_tree_size`, (a `DraftTree`, None) instead.

        Drafting costs the heads plus one unembedding multiply over the drafted rows (3 ms for 3 rows of the full 49K
        vocabulary on a 2-core CPU; about 0.5 ms with an 8K draft vocabulary); chained heads need one multiply per
        head, since each reads the draft before it. A separate multiply costs about what folding the draft rows into
        the verify multiply would, and unlike it also serves heads that read the next token, which is known only
        after verification.
        """
        counts = [self.num_drafts(i, max_length) for i in range(self.batch_size)]
        contexts = self.context_drafts(counts, max_length)
        if self.tree_size:
            return self.draft_tree(normed, layer_input, next_tokens, positions, last, counts[0], contexts[0]), None
        width = max(counts)
        if width == 0:
            return [next_tokens.new_empty(0) for _ in counts], None
        model = self.model
        normed, layer_input, next_tokens, positions, base_kv, head_past, key_mask = self.head_inputs(
            normed, layer_input, next_tokens, positions, last)
        drafts = [[] for _ in counts]  # per row: [1] tensors
        probs = [[] for _ in counts] if self.do_sample else None
        wanted = list(counts)  # per row: head drafts still wanted (the confidence threshold may lower it)
        chosen_slots = 0

        def choose_token(slot, states=None, logits=None):
            """Each row's draft in position `slot`, from the head's state [B, 1, H] or its logits [B, V_draft]: copied
            from the context, else the head's own choice. Returns [B, 1] (what a chained head reads next), or None
            once no row wants more drafts."""
            nonlocal chosen_slots
            chosen_slots = slot + 1
            if logits is None:
                logits = states[:, 0] @ self.draft_weight.T  # [B, V_draft]
            chosen = []
            for i, from_context in enumerate(contexts):
                if slot < from_context.shape[0]:
                    token, q = from_context[slot : slot + 1], self.context_draft_probs(from_context[slot])
                else:
                    if self.draft_threshold > 0 and slot < wanted[i]:
                        if float(torch.softmax(logits[i].float(), -1).max()) < self.draft_threshold:
                            wanted[i] = slot
                    token, q = self.head_draft(i, logits[i], drafts[i])
                if slot < max(wanted[i], from_context.shape[0]):
                    drafts[i].append(token)
                    if probs is not None:
                        probs[i].append(q)
                chosen.append(token)
            if all(slot + 1 >= max(w, c.shape[0]) for w, c in zip(wanted, contexts)):
                return None
            return torch.cat(chosen)[:, None]

        chained = model.config.head_input == "sequential"  # each head reads the draft before it, chosen on the way
        states, new_kv = model._head_states(
            normed=normed, layer_input=layer_input,
            next_token_ids=next_tokens, position_ids=positions, key_padding_mask=key_mask, base_kv=base_kv, head_past=head_past, num_heads=width + 1, choose_token=choose_token if chained else None,
        )
        if new_kv is not None:
            # Heads beyond `width` were skipped; their caches are stale, but the width (set by the token budget, not by
            # the confidence threshold or the context lookup) only shrinks near the end, so they are never read again.
            self.head_past = list(new_kv) + (self.head_past or [])[len(new_kv):]
        if chained:  # the last head's draft feeds no further head, so it is chosen here
            for slot in range(chosen_slots, states.shape[2]):
                choose_token(slot, states[:, :, slot])
        else:  # independent heads: one unembedding multiply for all of them, then choose in order
            if states.shape[1] != 1:
                states = _at_positions(states, last)
            logits = states[:, 0] @ self.draft_weight.T  # [B, width, V_draft]
            for slot in range(logits.shape[1]):
                if choose_token(slot, logits=logits[:, slot]) is None:
                    break
        out, distributions = [], [] if probs is not None else None
        for i, from_context in enumerate(contexts):
            # the context may offer more tokens than there are heads (draft_lookup_num_tokens > k - 1)
            for slot in range(len(drafts[i]), from_context.shape[0]):
                drafts[i].append(from_context[slot : slot + 1])
                if probs is not None:
                    probs[i].append(self.context_draft_probs(from_context[slot]))
            out.append(torch.cat(drafts[i]) if drafts[i] else next_tokens.new_empty(0))
            if probs is not None:
                vocab = self.model.lm_head.weight.shape[0]
                distributions.append(torch.stack(probs[i]) if probs[i] else normed.new_empty((0, vocab)))
        return out, distributions

    def draft_tree(self, normed, layer_input, next_tokens, positions, last, depth, context):
        """
        The next verify pass's `DraftTree` (batch size 1, greedy): the context / datastore continuation `context` [c]
        as one branch, then the heads' most probable continuations, `depth` heads deep, up to `draft_tree_size`
        drafts. Arguments as `draft`'s; heads that draft independently (checked by `_check_supported`).
        """
        tree = DraftTree.rooted_at(int(self.rows[0][-1]))
        parent = 0
        for token in context.tolist()[: self.tree_size]:
            parent = tree.add(parent, token)
        if depth == 0 or tree.num_drafts >= self.tree_size:
            return tree
        normed, layer_input, next_tokens, positions, base_kv, _, key_mask = self.head_inputs(
            normed, layer_input, next_tokens, positions, last)
        states, _ = self.model._head_states(
            normed=normed, layer_input=layer_input, next_token_ids=next_tokens, position_ids=positions,
            key_padding_mask=key_mask, base_kv=base_kv, num_heads=depth + 1,
        )
        # states: [1, 1, depth, H] -> probs: [depth, V_draft]
        probs = torch.softmax((states[0, 0] @ self.draft_weight.T).float(), dim=-1)
        top_probs, top_index = probs.topk(min(DRAFT_TREE_BRANCHING, probs.shape[-1]), dim=-1)
        top_tokens = self.draft_ids[top_index] if self.draft_ids is not None else top_index
        return grow_draft_tree(tree, top_tokens.tolist(), top_probs.tolist(), size=self.tree_size,
                               threshold=self.draft_threshold)

    def forward_tree(self, tree):
        """One trunk pass over every node of `tree`, each at its depth's position and seeing only its ancestors.
        Returns (logits [N, V], normed [1, N, H], layer input [1, N, H] or None); the mask is not extended (see
        `keep_path`)."""
        tokens = torch.tensor(tree.tokens, device=self.rows[0].device)[None]
        positions = self.last_position[:, None] + 1 + torch.tensor(tree.depths, device=tokens.device)[None]
        dtype = self.model.lm_head.weight.dtype
        normed, layer_input, _ = self.model._trunk_forward(
            tokens, attention_mask=tree.attention_mask(self.attention_mask, dtype), position_ids=positions,
            cache=self.cache, use_cache=True,
        )
        self.stats.forward_passes += 1
        return self.model.lm_head(normed)[0], normed, layer_input

    def accept_tree(self, tree, logits):
        """
        Walk `tree` from the root while a child drafted the base model's own choice (after the logits processors,
        with the walked path as the prefix, as plain decoding computes it). logits: [N, V].
        Returns (path: node indices from the root, tokens [n + 1] (the accepted drafts, then the base model's next
        token), scores [n + 1, V]).
        """
        processors = self.logits_processor[0]
        path, scores, node = [], [], 0
        while True:
            path.append(node)
            row_scores = logits[node : node + 1]
            if len(processors):
                walked = torch.tensor([tree.tokens[i] for i in path[1:]], dtype=torch.long, device=logits.device)
                prefix = torch.cat([self.rows[0], walked])
                row_scores = processors(prefix[None], row_scores.float().clone())
            scores.append(row_scores)
            choice = int(row_scores.argmax(-1))
            node = tree.children[node].get(choice)
            if node is None:
                break
        tokens = torch.tensor([tree.tokens[i] for i in path[1:]] + [choice], device=self.rows[0].device)
        return path, tokens, torch.cat(scores)

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

    def context_draft_probs(self, token):
        """q of a draft copied from the context: one-hot (sampling only; None when greedy)."""
        if not self.do_sample:
            return None
        return torch.nn.functional.one_hot(token, self.model.lm_head.weight.shape[0]).float()

    def head_draft(self, row, logits, earlier):
        """
        Row `row`'s draft from a head's logits [V_draft], after its `earlier` drafts (list of [1] tensors).
        Greedy: the top token (q None). Sampling: a sample from the head's distribution q, warped as the base
        model's is (temperature, top-k, top-p), so the closer q is to p the more drafts are kept; tokens outside the
        draft vocabulary have q = 0. Returns ([1] token, [V] q or None).
        """
        if not self.do_sample:
            index = logits.argmax(-1, keepdim=True)
            return (self.draft_ids[index] if self.draft_ids is not None else index), None
        scores = logits.float()[None]
        if self.draft_ids is not None:
            full = scores.new_full((1, self.model.lm_head.weight.shape[0]), float("-inf"))
            full[:, self.draft_ids] = scores
            scores = full
        if len(self.logits_processor[row]):
            scores = self.logits_processor[row](torch.cat([self.rows[row], *earlier])[None], scores.clone())
        q = torch.softmax(scores[0], dim=-1)
        return torch.multinomial(q, 1), q

    def sequences(self):
        """The rows as one [B, L] tensor; rows that ended early are padded, as plain `generate()` pads them."""
        length = max(row.shape[0] for row in self.rows)
        out = self.rows[0].new_full((self.batch_size, length), self.pad_token_id if self.pad_token_id is not None else 0)
        for i, row in enumerate(self.rows):
            out[i, : row.shape[0]] = row
        return out


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
    verify, draft_tree_size = options.verify, options.draft_tree_size
    cache = model_kwargs.pop("cache", None)
    if cache is None:
        cache = DynamicCache(config=model.config)
    attention_mask, position_ids = model_kwargs.pop("attention_mask", None), model_kwargs.pop("position_ids", None)
    streamer = multi_token_streamer if multi_token_streamer is not None else streamer
    batch_size = input_ids.shape[0]
    if options.draft_tree_from_config and _draft_tree_unsupported(model, generation_config, batch_size, verify,
                                                                  cache):
        draft_tree_size = 0
    _check_supported(model, input_ids, generation_config, model_kwargs, verify=verify, streamer=streamer,
                     tree_size=draft_tree_size, cache=cache)
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
    decoder = _Decoder(
        model, input_ids, logits_processor=logits_processor, stopping_criteria=stopping_criteria, streamer=streamer,
        num_predict_heads=options.num_predict_heads, attention_mask=attention_mask, position_ids=position_ids,
        cache=cache, keep_scores=keep_scores, do_sample=generation_config.do_sample,
        pad_token_id=int(pad) if pad is not None else None, draft_threshold=options.draft_confidence_threshold,
        lookup_ngram=options.draft_lookup_ngram, lookup_num_tokens=options.draft_lookup_num_tokens,
        datastore=options.draft_datastore, tree_size=draft_tree_size, prompt_cache_length=prompt_cache_length,
        max_length=generation_config.max_length,
    )
    decoder.stats.verified = verify
    step = _tree_steps if draft_tree_size else _verified_steps if verify else _unverified_steps
    step(decoder, decoder.uncached_prompt, generation_config.max_length)
    decoder.finalize_cache()
    if decoder.streamer is not None:
        decoder.streamer.end()
    sequences = decoder.sequences()
    if not generation_config.return_dict_in_generate:
        return sequences
    return MultiTokenGenerateOutput(
        sequences=sequences,
        scores=tuple(decoder.scores) if generation_config.output_scores else None,
        logits=tuple(decoder.raw_logits) if generation_config.output_logits else None,
        cache=decoder.cache,
        multi_token_stats=decoder.stats,
    )


def _prefill(decoder, prompt, max_length):
    """Prompt pass: emits each row's first token and returns its first drafts."""
    positions = decoder.prompt_positions
    logits, normed, layer_input = decoder.forward(prompt, positions, new_mask=False, last_logits_only=True)
    no_drafts = prompt.new_empty(0)
    first = []
    for i in range(decoder.batch_size):
        token, scores, _ = decoder.accept(i, logits[i, -1:], no_drafts, None)
        decoder.emit(i, token, scores, logits[i, -1:])
        first.append(token)
    next_tokens = torch.cat([prompt[:, 1:], torch.stack(first)], dim=1)
    last = torch.full((decoder.batch_size,), prompt.shape[1] - 1, device=prompt.device)
    return decoder.draft(normed, layer_input, next_tokens, positions, last, max_length)


def _block(decoder, drafts):
    """[B, 1 + max d_i]: each row's last token then its drafts (padded); and the mask of its real positions."""
    width = 1 + max(d.shape[0] for d in drafts)
    block = decoder.rows[0].new_full((decoder.batch_size, width), decoder.pad_token_id or 0)
    real = torch.zeros_like(block, dtype=torch.bool)
    for i, (row, row_drafts) in enumerate(zip(decoder.rows, drafts)):
        block[i, 0] = row[-1]
        block[i, 1 : 1 + row_drafts.shape[0]] = row_drafts
        real[i, : 1 + row_drafts.shape[0]] = decoder.unfinished[i]
    return block, real


def _verified_steps(decoder, prompt, max_length):
    drafts, draft_probs = _prefill(decoder, prompt, max_length)
    stats = decoder.stats
    while any(decoder.unfinished):
        # verify: one trunk pass over [last token, drafts] for every row
        block, real = _block(decoder, drafts)
        positions = decoder.last_position[:, None] + 1 + torch.arange(block.shape[1], device=block.device)
        cache_before = int(decoder.cache.get_seq_length())
        logits, normed, layer_input = decoder.forward(block, positions, real)
        accepted = torch.zeros(decoder.batch_size, dtype=torch.long, device=block.device)
        next_tokens = block.roll(-1, dims=1)  # the token after each block position, where it was kept
        for i in range(decoder.batch_size):
            if not real[i, 0] or not decoder.unfinished[i]:  # ended before this pass, or by a row before it in it
                continue
            d = drafts[i].shape[0]
            # accept: the drafts the base model keeps, then a token of its own
            tokens, scores, n = decoder.accept(i, logits[i, : d + 1], drafts[i],
                                               draft_probs[i] if draft_probs is not None else None)
            for j in range(d):
                stats.head_proposed[j] += 1
                stats.head_accepted[j] += int(j < n)
            stats.accepted_per_step.append(n + 1)
            accepted[i] = n
            next_tokens[i, n] = tokens[-1]
            # emit, token by token, as plain decoding would
            decoder.emit(i, tokens, scores, logits[i, : n + 1])
        if not any(decoder.unfinished):
            break
        # roll back: every row keeps [last token, its n accepted drafts]; positions after them are masked out
        keep_width = int(accepted.max()) + 1
        kept = torch.arange(block.shape[1], device=block.device)[None] <= accepted[:, None]
        decoder.attention_mask[:, cache_before:] *= (kept & real).to(decoder.attention_mask.dtype)
        decoder.last_position = decoder.last_position + torch.where(real[:, 0], accepted + 1, 0)
        # draft from each row's last accepted position; its next token is the one just emitted
        drafts, draft_probs = decoder.draft(normed, layer_input, next_tokens, positions, accepted, max_length)
        decoder.roll_back(cache_before + keep_width)


def _tree_steps(decoder, prompt, max_length):
    """Verified greedy decoding of one row with a draft tree per step (`draft_tree_size`)."""
    tree, _ = _prefill(decoder, prompt, max_length)
    stats = decoder.stats
    while decoder.unfinished[0]:
        # verify: one trunk pass over every node of the tree
        cache_before = int(decoder.cache.get_seq_length())
        logits, normed, layer_input = decoder.forward_tree(tree)
        # accept: the path of drafts the base model keeps, then a token of its own
        path, tokens, scores = decoder.accept_tree(tree, logits)
        n = len(path) - 1
        for j in range(max(tree.depths)):
            stats.head_proposed[j] += 1
            stats.head_accepted[j] += int(j < n)
        stats.accepted_per_step.append(n + 1)
        # emit, token by token, as plain decoding would
        decoder.emit(0, tokens, scores, logits[path])
        # roll back: the cache keeps the accepted path only
        decoder.keep_path(cache_before, path)
        if not decoder.unfinished[0]:
            break
        positions = decoder.last_position[:, None] + 1 + torch.arange(n + 1, device=tokens.device)[None]
        decoder.last_position = decoder.last_position + n + 1
        # draft from the last accepted node; its next token is the one just emitted
        path_states = [x[:, path] if x is not None else None for x in (normed, layer_input)]
        last = torch.full((1,), n, device=tokens.device)
        tree, _ = decoder.draft(*path_states, tokens[None], positions, last, max_length)


def _unverified_steps(decoder, prompt, max_length):
    """The articles' mode: every draft is appended unchecked; one trunk pass per k tokens. Not greedy-identical.
    Batch size 1, greedy only (checked by `_check_supported`)."""
    drafts, _ = _prefill(decoder, prompt, max_length)
    stats = decoder.stats
    while decoder.unfinished[0]:
        row_drafts = drafts[0]
        block = torch.cat([decoder.rows[0][-1:], row_drafts])[None]
        decoder.emit(0, row_drafts)
        positions = decoder.last_position[:, None] + 1 + torch.arange(block.shape[1], device=block.device)
        if not decoder.unfinished[0]:
            if row_drafts.shape[0]:  # the appended drafts still go into the cache, for a call that continues from it
                decoder.forward(block, positions)
            break
        logits, normed, layer_input = decoder.forward(block, positions)
        scores = decoder.processed_scores(0, logits[0], row_drafts)
        choices = scores.argmax(-1)
        d = row_drafts.shape[0]
        for i in range(d):  # how often the base model would have agreed, for the benchmark
            stats.head_proposed[i] += 1
            stats.head_accepted[i] += int(bool((row_drafts[: i + 1] == choices[: i + 1]).all()))
        following = choices[-1:]
        decoder.emit(0, following, scores[-1:], logits[0, -1:])
        if not decoder.unfinished[0]:
            break
        decoder.last_position = positions[:, -1]
        next_tokens = torch.cat([row_drafts, following])[None]
        last = torch.full((1,), d, device=block.device)
        drafts, _ = decoder.draft(normed, layer_input, next_tokens, positions, last, max_length)
