# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Drafts that do not come from the heads: the row's own context (prompt lookup) and the draft datastore.

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

import torch

DATASTORE_NGRAM = 3  # the draft datastore is keyed by a row's last 3 tokens
DATASTORE_EMPTY_KEY = 2**62  # an unused datastore entry: above any real key (vocab_size**3 < 2**62 up to 1.6M tokens)


def context_continuation(tokens, count, max_ngram):
    """
    Prompt-lookup drafting: the `count` tokens that followed the most recent earlier occurrence of the row's last n
    tokens with `count` tokens after it (else the earliest occurrence), trying n = max_ngram down to 2 (a single
    matching token says little). tokens: [L]. Returns [<= count].

    Written here rather than reusing transformers' `PromptLookupCandidateGenerator`, which belongs to the assisted-
    decoding loop (batch size 1, one call per step with its own stopping logic) and takes the first match in the
    context; the latest match is the one that tends to repeat in code and lists.
    """
    for n in range(min(max_ngram, tokens.shape[0] - 1), min(2, max_ngram) - 1, -1):
        windows = tokens[:-1].unfold(0, n, 1)  # every n-gram that ends before the last token
        starts = (windows == tokens[-n:]).all(1).nonzero()[:, 0] + n
        if starts.shape[0]:
            # the latest match that has `count` tokens after it; else the earliest, which has the most
            full = starts[tokens.shape[0] - starts >= count]
            start = int(full[-1]) if full.shape[0] else int(starts[0])
            return tokens[start : start + count]
    return tokens[:0]


def datastore_key(ngrams, vocab_size):
    """One int64 key per 3-token context: `ngrams` [..., 3] -> [...] (a base-`vocab_size` number)."""
    ngrams = ngrams.long()
    return (ngrams[..., 0] * vocab_size + ngrams[..., 1]) * vocab_size + ngrams[..., 2]


def datastore_continuation(tokens, count, datastore, vocab_size):
    """
    Retrieval drafting (as REST, He et al. 2024): the first `count` of the tokens that most often followed the row's
    last 3 tokens in the model's own training answers. tokens: [L]; datastore: (sorted keys [M], tokens [M, n]).
    Returns [<= count] (empty when the context is not in the datastore).
    """
    keys, table = datastore
    if count <= 0 or tokens.shape[0] < DATASTORE_NGRAM:
        return tokens[:0]
    key = datastore_key(tokens[-DATASTORE_NGRAM:], vocab_size).to(keys.device)
    index = int(torch.searchsorted(keys, key[None]))
    if index >= keys.shape[0] or int(keys[index]) != int(key):
        return tokens[:0]
    return table[index, :count].to(tokens.device, tokens.dtype)
