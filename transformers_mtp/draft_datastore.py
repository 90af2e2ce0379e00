# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Build the draft datastore: what the model itself most often writes after each 3-token context.

At generation (`generation_draft_sources.datastore_continuation`), when a row's own context offers nothing to copy, its
last 3 tokens are looked up here and the stored continuation is drafted (REST, He et al. 2024, with the model's own
answers as the corpus). Verification keeps the output exact; the datastore only changes how often drafts land.

Written with `collections.Counter` rather than a suffix array (REST's): the corpus is a few million tokens, and a
sorted table of fixed-length contexts is a few MB, ships inside a checkpoint as two buffers and is searched with one
`torch.searchsorted` call per step.
"""

from collections import Counter, defaultdict

import torch

from .generation_draft_sources import DATASTORE_NGRAM, datastore_key


def build_draft_datastore(sequences, *, vocab_size, length, max_entries, min_count=2):
    """
    sequences: dicts with `input_ids` and `prompt_length` (self-distilled answers; only continuations inside the
    answer are counted, contexts may reach back into the prompt's last tokens). For every 3-token context, the
    `length`-token continuation that followed it most often; kept when seen at least `min_count` times (a context
    seen once says little), the `max_entries` most frequent first. Returns (sorted keys [M], tokens [M, length]).
    """
    if min_count < 1 or max_entries < 1:
        raise ValueError(f"min_count={min_count} and max_entries={max_entries} must be positive.")
    continuations = defaultdict(Counter)
    for sequence in sequences:
        ids, start = sequence["input_ids"], max(sequence["prompt_length"], DATASTORE_NGRAM)
        for t in range(start, len(ids) - length + 1):
            continuations[tuple(ids[t - DATASTORE_NGRAM : t])][tuple(ids[t : t + length])] += 1
    entries = []
    for context, counter in continuations.items():
        # the most frequent continuation; ties go to the smallest, so the result does not depend on data order
        tokens, count = min(counter.items(), key=lambda item: (-item[1], item[0]))
        if count >= min_count:
            entries.append((count, context, tokens))
    entries.sort(key=lambda entry: (-entry[0], entry[1]))
    entries = entries[:max_entries]
    if not entries:
        return torch.zeros(0, dtype=torch.long), torch.zeros((0, length), dtype=torch.long)
    keys = datastore_key(torch.tensor([context for _, context, _ in entries]), vocab_size)
    tokens = torch.tensor([continuation for _, _, continuation in entries])
    order = keys.argsort()
    return keys[order], tokens[order]
