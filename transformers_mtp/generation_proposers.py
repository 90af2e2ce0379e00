# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Draft sources behind one interface: the heads, the row's own context (prompt lookup) and the draft datastore.

Every source is a `DraftProposer` (as transformers' `CandidateGenerator`: the decode loop never knows which one it
holds): `propose(state, verified, budgets, prefix)` returns each row's drafts and, when sampling, the distribution q
each was drawn from; `roll_back(keep)` hears that the cache was cropped. `Drafter` composes them into one step's
drafts: a context continuation first (lookup, else datastore), then the heads' drafts after it, or a draft tree.

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

from dataclasses import dataclass

import torch

from .generation_cache import cache_layer_keys_values
from .generation_draft_sources import context_continuation, datastore_continuation
from .generation_draft_tree import DRAFT_TREE_BRANCHING, DraftTree, grow_draft_tree
from .generation_draft_precision import DraftingCopy
from .modeling_stacked_heads import StackedHeads


@dataclass
class Drafts:
    """One step's drafts: per row, the tokens [d_i] and (sampling only) the distributions q [d_i, V] they came from."""

    tokens: list[torch.Tensor]
    probs: list[torch.Tensor] | None = None

    @classmethod
    def copied(cls, state, tokens):
        """Drafts copied from somewhere (a context, a table): when sampling, each with its one-hot q."""
        return cls(tokens, [one_hot_probs(state, t) for t in tokens] if state.do_sample else None)


def _at_positions(x, index):
    """[B, T, ...] -> [B, 1, ...] at position index[i] of each row (None stays None)."""
    if x is None:
        return None
    return x[torch.arange(x.shape[0], device=x.device), index][:, None]


def one_hot_probs(state, tokens):
    """q of drafts copied from somewhere (a context, a table): one-hot [d, V]; None when greedy."""
    if not state.do_sample:
        return None
    return torch.nn.functional.one_hot(tokens, state.model.lm_head.weight.shape[0]).float()


class DraftProposer:
    """The interface every draft source implements."""

    max_drafts = 0  # the most drafts it offers a row per step

    def propose(self, state, verified, budgets, prefix=None) -> Drafts:
        """Per row i, at most `budgets[i]` drafts for the tokens after row i's last, from the verify pass `verified`
        (a `VerifyPass`; sources that read only the rows ignore it); `prefix` (`Drafts`): tokens another source
        drafted first, which a source that can continue them drafts after."""
        raise NotImplementedError

    def roll_back(self, keep):
        """The cache was cropped to its first `keep` positions."""


class ContextLookupProposer(DraftProposer):
    """Prompt lookup: the tokens that followed the row's last n-gram earlier in the row (n = `ngram` down to 2)."""

    def __init__(self, ngram, max_drafts):
        self.ngram, self.max_drafts = ngram, max_drafts

    def propose(self, state, verified, budgets, prefix=None):
        return Drafts.copied(state, [context_continuation(row, budget, self.ngram) if budget else row[:0]
                                     for row, budget in zip(state.rows, budgets)])


class DatastoreProposer(DraftProposer):
    """Retrieval: the tokens that most often followed the row's last 3 tokens in the model's own training answers."""

    def __init__(self, datastore, vocab_size, max_drafts):
        self.datastore, self.vocab_size, self.max_drafts = datastore, vocab_size, max_drafts

    def propose(self, state, verified, budgets, prefix=None):
        return Drafts.copied(state, [datastore_continuation(row, budget, self.datastore, self.vocab_size)
                                     for row, budget in zip(state.rows, budgets)])


class HeadProposer(DraftProposer):
    """
    The model's multi-token heads, drafting at each row's last accepted position (no extra trunk pass).

    Drafting costs the heads plus one unembedding multiply over the drafted rows (3 ms for 3 rows of the full 49K
    vocabulary on a 2-core CPU; about 0.5 ms with an 8K draft vocabulary); chained heads need one multiply per head,
    since each reads the draft before it. A separate multiply costs about what folding the draft rows into the verify
    multiply would, and unlike it also serves heads that read the next token, which is known only after verification.
    """

    def __init__(self, model, num_predict_heads, *, threshold, past_length, draft_dtype=None):
        self.model = model
        self.max_drafts = num_predict_heads - 1
        self.threshold = threshold  # a row's head drafts stop at the first one the head is less sure of than this
        # `draft_dtype`: the heads draft from a copy in that dtype (generation_draft_precision.py), which brings its
        # own unembedding rows and stacked heads; verification stays in the model's dtype
        self.drafting = DraftingCopy.of(model, draft_dtype) if draft_dtype is not None else None
        if self.drafting is not None:
            self.draft_weight, self.draft_ids = self.drafting.draft_weight, self.drafting.draft_ids
            self.stacked = self.drafting.stacked
        else:
            # the unembedding rows drafts are chosen from (all of them, or the draft vocabulary), once per call
            self.draft_weight, self.draft_ids = model.draft_unembedding()
            # independent Llama-family query-extension heads run as one (None where they cannot), built once
            self.stacked = StackedHeads.of(model, model.config.num_heads - 1)
        # own keys/values of `share_kv=False` heads, for the cache positions from `past_start` on (the heads never
        # saw the positions of a cache that came with the call)
        self.head_past = None
        self.past_start = past_length

    def roll_back(self, keep):
        if self.head_past is not None:
            own = keep - self.past_start
            self.head_past = [(k[:, :, :own], v[:, :, :own]) for k, v in self.head_past]

    def head_inputs(self, state, verified):
        """
        What the heads read to draft from each row's last accepted position: (normed, layer_input, next_tokens,
        positions, base_kv, head_past, key_padding_mask). Heads with their own keys and values read every block
        position (the rejected ones are masked out and cropped with the cache) and their own past; the others read
        the last accepted position only, and query-extension heads that share keys and values attend to the base
        last layer's cache.
        """
        v = verified
        if self.model.uses_layer_input and not self.model.config.heads_share_base_kv:
            own_mask = state.attention_mask[:, self.past_start :]
            return v.normed, v.layer_input, v.next_tokens, v.positions, None, self.head_past, own_mask
        normed, layer_input, next_tokens, positions = (
            _at_positions(x, v.last) for x in (v.normed, v.layer_input, v.next_tokens, v.positions))
        base_kv = cache_layer_keys_values(state.cache, -1) if self.model.uses_layer_input else None
        return normed, layer_input, next_tokens, positions, base_kv, None, state.attention_mask

    def head_draft(self, state, row, logits, earlier):
        """
        Row `row`'s draft from a head's logits [V_draft], after its `earlier` drafts (list of [1] tensors).
        Greedy: the top token (q None). Sampling: a sample from the head's distribution q, warped as the base
        model's is (temperature, top-k, top-p), so the closer q is to p the more drafts are kept; tokens outside the
        draft vocabulary have q = 0. Returns ([1] token, [V] q or None).
        """
        if not state.do_sample:
            index = logits.argmax(-1, keepdim=True)
            return (self.draft_ids[index] if self.draft_ids is not None else index), None
        scores = logits.float()[None]
        if self.draft_ids is not None:
            full = scores.new_full((1, self.model.lm_head.weight.shape[0]), float("-inf"))
            full[:, self.draft_ids] = scores
            scores = full
        q = torch.softmax(state.processed(row, earlier, scores)[0], dim=-1)
        return torch.multinomial(q, 1), q

    def propose(self, state, verified, budgets, prefix=None):
        """Per row, `prefix`'s tokens first (the heads may draft fewer than it offers; it is kept whole), then the
        heads' own drafts up to `budgets[i]`: a chained head reads the draft before it, whichever source drew it."""
        contexts = prefix.tokens if prefix is not None else [row[:0] for row in state.rows]
        context_probs = prefix.probs if prefix is not None else None
        width = max(budgets)
        if width == 0:
            return Drafts([verified.next_tokens.new_empty(0) for _ in budgets], None)
        normed, layer_input, next_tokens, positions, base_kv, head_past, key_mask = self.head_inputs(state, verified)
        drafts = [[] for _ in budgets]  # per row: [1] tensors
        probs = [[] for _ in budgets] if state.do_sample else None
        wanted = list(budgets)  # per row: head drafts still wanted (the confidence threshold may lower it)
        chosen_slots = 0

        def choose_token(slot, states=None, logits=None):
            """Each row's draft in position `slot`, from the head's state [B, 1, H] or its logits [B, V_draft]: copied
            from the context, else the head's own choice. Returns [B, 1] (what a chained head reads next), or None
            once no row wants more drafts."""
            nonlocal chosen_slots
            chosen_slots = slot + 1
            if logits is None:
                logits = self.model.unembed(states[:, 0], self.draft_weight)  # [B, V_draft]
            chosen = []
            for i, from_context in enumerate(contexts):
                if slot < from_context.shape[0]:
                    token = from_context[slot : slot + 1]
                    q = context_probs[i][slot] if context_probs is not None else None
                else:
                    if self.threshold > 0 and slot < wanted[i]:
                        if float(torch.softmax(logits[i].float(), -1).max()) < self.threshold:
                            wanted[i] = slot
                    token, q = self.head_draft(state, i, logits[i], drafts[i])
                if slot < max(wanted[i], from_context.shape[0]):
                    drafts[i].append(token)
                    if probs is not None:
                        probs[i].append(q)
                chosen.append(token)
            if all(slot + 1 >= max(w, c.shape[0]) for w, c in zip(wanted, contexts)):
                return None
            return torch.cat(chosen)[:, None]

        chained = self.model.drafts_in_chain  # each draft reads the draft before it
        states, new_kv = self.model._head_states(
            normed=normed, layer_input=layer_input, next_token_ids=next_tokens, position_ids=positions,
            key_padding_mask=key_mask, base_kv=base_kv, head_past=head_past, num_heads=width + 1,
            choose_token=choose_token if chained else None, stacked=self.stacked, last=verified.last,
            drafting=self.drafting,
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
                states = _at_positions(states, verified.last)
            logits = self.model.unembed(states[:, 0], self.draft_weight)  # [B, width, V_draft]
            for slot in range(logits.shape[1]):
                if choose_token(slot, logits=logits[:, slot]) is None:
                    break
        vocab = self.model.lm_head.weight.shape[0]
        for i, from_context in enumerate(contexts):
            # the context may offer more tokens than there are heads (draft_lookup_num_tokens > k - 1)
            for slot in range(len(drafts[i]), from_context.shape[0]):
                drafts[i].append(from_context[slot : slot + 1])
                if probs is not None:
                    probs[i].append(context_probs[i][slot])
        tokens = [torch.cat(d) if d else next_tokens.new_empty(0) for d in drafts]
        if probs is None:
            return Drafts(tokens, None)
        return Drafts(tokens, [torch.stack(p) if p else normed.new_empty((0, vocab)) for p in probs])

    def propose_tree(self, state, verified, depth, context, size):
        """
        A `DraftTree` for one row (greedy): `context` [c] as one branch, then the heads' most probable continuations,
        `depth` heads deep, `size` drafts more (heads that draft independently; checked before decoding starts).

        The context branch comes on top of the heads' `size` candidates, not out of them: when it filled the budget,
        a long lookup left the heads nothing, and a wrong lookup then cost the step. Measured on the benchmark's code
        prompts in bfloat16 (benchmarks/README.md, "Precision"): 8 head candidates plus up to 8 looked-up tokens gave
        2.64 tokens per pass, 8 in all 2.17-2.29; chat, which rarely finds its n-gram, was unchanged.
        """
        tree = DraftTree.rooted_at(int(state.rows[0][-1]))
        parent = 0
        for token in context.tolist():
            parent = tree.add(parent, token)
        size += tree.num_drafts
        if self.model.drafts_with_one_layer:
            return self.propose_chain_tree(state, verified, tree, depth, size)
        if depth == 0 or tree.num_drafts >= size:
            return tree
        normed, layer_input, next_tokens, positions, base_kv, _, key_mask = self.head_inputs(state, verified)
        states, _ = self.model._head_states(
            normed=normed, layer_input=layer_input, next_token_ids=next_tokens, position_ids=positions,
            key_padding_mask=key_mask, base_kv=base_kv, num_heads=depth + 1, stacked=self.stacked,
            drafting=self.drafting,
        )
        # states: [1, 1, depth, H] -> probs: [depth, V_draft]
        probs = torch.softmax(self.model.unembed(states[0, 0], self.draft_weight).float(), dim=-1)
        top_probs, top_index = probs.topk(min(DRAFT_TREE_BRANCHING, probs.shape[-1]), dim=-1)
        top_tokens = self.draft_ids[top_index] if self.draft_ids is not None else top_index
        return grow_draft_tree(tree, top_tokens.tolist(), top_probs.tolist(), size=size, threshold=self.threshold)

    def propose_chain_tree(self, state, verified, tree, depth, size):
        """
        The chained drafter's dynamic draft tree (EAGLE-2), grown on `tree` (the root and the context branch) to
        `size` drafts. Depth by depth, each of the `DRAFT_TREE_BRANCHING` best nodes of the last depth (by the
        product of the probabilities along its path, an estimate of the chance that verification keeps it) offers
        its `DRAFT_TREE_BRANCHING` most probable next tokens, and the best of those run the draft layer together,
        one step for the whole depth. Then the `size` best candidates of every depth make the tree: a parent scores
        at least its child, so they form one. The drafter's cache of the text is extended in every case (its first
        step runs over the accepted positions even when nothing is drafted).
        """
        normed, layer_input, next_tokens, positions, _, head_past, key_mask = self.head_inputs(state, verified)
        candidates = []  # (score, parent candidate or -1 for the root, token)
        frontier = [-1]  # the candidates whose states the layer's last step computed (-1: the text's own state)

        def expand(step, states):
            nonlocal frontier
            if tree.num_drafts >= size:
                return None
            probs = torch.softmax(self.model.unembed(states[0], self.draft_weight).float(), dim=-1)  # [M, V_draft]
            top_probs, top_index = probs.topk(min(DRAFT_TREE_BRANCHING, probs.shape[-1]), dim=-1)
            top_tokens = self.draft_ids[top_index] if self.draft_ids is not None else top_index
            offered = []
            for node, (node_tokens, node_probs) in enumerate(zip(top_tokens.tolist(), top_probs.tolist())):
                parent_score = candidates[frontier[node]][0] if frontier[node] >= 0 else 1.0
                for token, prob in zip(node_tokens, node_probs):
                    if prob >= self.threshold:
                        candidates.append((parent_score * prob, frontier[node], token))
                        offered.append((len(candidates) - 1, node))
            if step + 1 >= depth or not offered:
                return None
            offered.sort(key=lambda item: -candidates[item[0]][0])
            chosen = offered[:DRAFT_TREE_BRANCHING]
            frontier = [candidate for candidate, _ in chosen]
            parents = torch.tensor([node for _, node in chosen], device=states.device)
            return parents, torch.tensor([[candidates[c][2] for c in frontier]], device=states.device)

        _, new_kv = self.model._head_states(
            normed=normed, layer_input=layer_input, next_token_ids=next_tokens, position_ids=positions,
            key_padding_mask=key_mask, head_past=head_past, num_heads=depth + 2, expand=expand, last=verified.last,
            drafting=self.drafting,
        )  # depth + 1 steps: the text's, then one per depth whose candidates run (the last depth's only offer)
        self.head_past = list(new_kv)
        nodes = {}  # candidate -> tree node
        # best first; a parent (never scored below its children) comes before them, ties broken by creation order
        for index in sorted(range(len(candidates)), key=lambda c: (-candidates[c][0], c)):
            if tree.num_drafts >= size:
                break
            score, parent, token = candidates[index]
            if parent >= 0 and parent not in nodes:
                continue  # its parent did not make the tree
            nodes[index] = tree.add(nodes[parent] if parent >= 0 else 0, token)
        return tree


class Drafter:
    """One step's drafts from the sources a call enabled: the first context source with a continuation for the row
    (lookup, then datastore), then the heads after it; with `tree_size`, a draft tree instead of a chain."""

    def __init__(self, heads, context_sources=(), tree_size=0):
        self.heads, self.context_sources, self.tree_size = heads, list(context_sources), tree_size

    @property
    def max_drafts(self):  # drafts copied from the context may outnumber heads
        return max([self.heads.max_drafts] + [s.max_drafts for s in self.context_sources])

    def roll_back(self, keep):
        for source in (self.heads, *self.context_sources):
            source.roll_back(keep)

    def context(self, state, verified, counts):
        """Per row with head drafts to make, the first source's continuation that is not empty."""
        found = Drafts.copied(state, [row[:0] for row in state.rows])
        for source in self.context_sources:
            want = [i for i, c in enumerate(counts) if c and found.tokens[i].shape[0] == 0]
            if not want:
                break
            budgets = [min(source.max_drafts, state.room(i)) if i in want else 0 for i in range(len(counts))]
            offered = source.propose(state, verified, budgets)
            for i in want:
                found.tokens[i] = offered.tokens[i]
                if found.probs is not None:
                    found.probs[i] = offered.probs[i]
        return found

    def propose(self, state, verified):
        """Each row's next drafts (`Drafts`), or with `tree_size` the next `DraftTree` of row 0."""
        counts = [min(self.heads.max_drafts, state.room(i)) for i in range(state.batch_size)]
        context = self.context(state, verified, counts)
        if self.tree_size:
            return self.heads.propose_tree(state, verified, counts[0], context.tokens[0], self.tree_size)
        return self.heads.propose(state, verified, counts, context)
