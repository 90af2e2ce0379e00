# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Draft trees: the candidates one verify pass checks, and how the heads' most probable continuations fill them.

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

import heapq
from dataclasses import dataclass

import torch

# candidates each head offers a draft tree (EAGLE-2 expands the top 10 of each node, Medusa's trees use up to the top
# 10 of the first head and fewer of later ones). Simulated for the shipped heads and a tree of 8
# (benchmarks/tree_policy_sim.py, benchmarks/README.md "How the draft tree is grown"): 2 / 3 / 4 / 6 / 8 kept 1.80 /
# 1.87 / 1.89 / 1.91 / 1.90 tokens per pass on the benchmark's chat prompts, heads only; 4 stays
DRAFT_TREE_BRANCHING = 4


@dataclass
class DraftTree:
    """
    The tokens one verify pass checks, as a tree rooted at the row's last token (node 0, not a draft). Nodes are
    numbered in the order they were added, so a parent always comes before its children; node i is block position i.
    """

    tokens: list[int]
    parents: list[int]  # -1 for the root
    depths: list[int]  # the root is at depth 0
    children: list[dict[int, int]]  # per node: token -> child node

    @classmethod
    def rooted_at(cls, token):
        return cls(tokens=[token], parents=[-1], depths=[0], children=[{}])

    @property
    def num_drafts(self):
        return len(self.tokens) - 1

    def add(self, parent, token):
        """The child of `parent` that drafts `token`, added if new. Returns its node index."""
        node = self.children[parent].get(token)
        if node is None:
            node = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(parent)
            self.depths.append(self.depths[parent] + 1)
            self.children.append({})
            self.children[parent][token] = node
        return node

    def attention_mask(self, past_mask, dtype):
        """
        The verify pass's 4D additive mask: each node attends to the unmasked past and to its own ancestors (itself
        included), never to another branch. past_mask: [1, L] (1 = attend). Returns [1, 1, N, L + N].
        """
        n = len(self.tokens)
        visible = torch.zeros((n, n), dtype=torch.bool)
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                visible[node] = visible[parent]
            visible[node, node] = True
        allowed = torch.cat([past_mask[0].bool().cpu().expand(n, -1), visible], dim=1)
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        return mask[None, None].to(past_mask.device)


def grow_draft_tree(tree, top_tokens, top_probs, *, size, threshold=0.0):
    """
    Add the heads' most probable continuations to `tree` until it holds `size` drafts (EAGLE-2's dynamic draft tree).

    top_tokens / top_probs: [D][m] each head's m best tokens and their probabilities, D heads deep (lists). Heads that
    draft independently give a path d_1 .. d_j the score p_1(d_1) * ... * p_j(d_j), an estimate of the chance that
    verification keeps all of it; paths are taken best first, so a parent always precedes its children. A path
    already in the tree (from the context) costs nothing and is grown from. With `threshold`, a head's candidate below
    that probability is not drafted.
    """
    heap = [(-prob, 0, rank, 0) for rank, prob in enumerate(top_probs[0])] if top_probs else []
    heapq.heapify(heap)
    while heap and tree.num_drafts < size:
        score, slot, rank, parent = heapq.heappop(heap)  # score: minus the path's probability
        if top_probs[slot][rank] < threshold:
            continue
        node = tree.add(parent, top_tokens[slot][rank])
        if slot + 1 < len(top_probs):
            for child_rank, prob in enumerate(top_probs[slot + 1]):
                heapq.heappush(heap, (score * prob, slot + 1, child_rank, node))
    return tree
