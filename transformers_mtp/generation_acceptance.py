# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Acceptance rules: which drafts a verify pass keeps, and the base model's own token after them.

Each rule takes the base model's scores at the block's positions (after the logits processors, as plain decoding
computes them) and returns tensors; none of them touches the cache or the rows.

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

import torch


def accept_greedy(scores, drafts):
    """
    Greedy: the longest prefix of drafts equal to the base model's argmax, then the base model's next token.

    scores: [1 + d, V] over [last token, drafts]; drafts: [d]. Returns (tokens [n + 1], n accepted drafts).
    """
    return accept_choices(scores.argmax(-1), drafts)


def accept_choices(choices, drafts):
    """`accept_greedy` from the base model's argmax itself: choices [1 + d] (token ids), drafts [d]."""
    d = drafts.shape[0]
    n = int((drafts == choices[:d]).int().cumprod(0).sum()) if d else 0
    return torch.cat([drafts[:n], choices[n : n + 1]]), n


def accept_speculative(scores, drafts, draft_probs):
    """
    Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): the output has exactly plain sampling's
    distribution p, whatever the drafter's q.

    scores: [1 + d, V] warped scores; drafts: [d]; draft_probs: [d, V] the q each draft was sampled from (one-hot for
    a draft copied from the context). Returns (tokens [n + 1], n accepted drafts).
    """
    probs = torch.softmax(scores.float(), dim=-1)  # p at each block position: [1 + d, V]
    d = drafts.shape[0]
    for j in range(d):
        token = drafts[j]
        p, q = probs[j, token], draft_probs[j, token]
        if torch.rand((), device=probs.device) * q < p:  # kept with probability min(1, p / q)
            continue
        # rejected: resample from the residual norm(max(p - q, 0)), which restores p exactly
        residual = (probs[j] - draft_probs[j]).clamp_min(0)
        if residual.sum() <= 0:  # p <= q everywhere means p == q: a rejection had probability 0
            residual = probs[j]
        return torch.cat([drafts[:j], torch.multinomial(residual / residual.sum(), 1)]), j
    return torch.cat([drafts, torch.multinomial(probs[d], 1)]), d  # every draft kept: one more token from p


def accept_tree_walk(tree, choose, device):
    """
    Greedy over a draft tree: walk from the root while a child drafted the base model's own choice.

    tree: a `DraftTree`; choose(walked, node) -> (the base model's token id at `node`, its scores there [1, V] or
    None), with the walked drafts (a list of token ids) as the text before the node (for the logits processors).
    Returns (path: node indices from the root, tokens [n + 1] (the accepted drafts, then the base model's next token),
    scores [n + 1, V], or None where `choose` gives none).
    """
    path, scores, node = [], [], 0
    while True:
        path.append(node)
        choice, node_scores = choose([tree.tokens[i] for i in path[1:]], node)
        scores.append(node_scores)
        node = tree.children[node].get(choice)
        if node is None:
            break
    tokens = torch.tensor([tree.tokens[i] for i in path[1:]] + [choice], device=device)
    return path, tokens, None if scores[0] is None else torch.cat(scores)
