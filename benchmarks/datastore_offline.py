"""How much could a draft datastore draft, before any model runs? Simulates greedy verified decoding (k = 3, two
drafts per step) on the self-distilled greedy answers of prompts held out of the datastore: a draft counts when it
equals the answer's next tokens, which is what verification would accept, since the answers are the model's greedy
output. Compares context lookup alone, the datastore alone and both (lookup first), at several minimum counts.

    python benchmarks/datastore_offline.py --cache outputs/smollm2-self-distill-gpu.jsonl --sampled-rounds 4

The cache files are what `transformers-mtp train --preset smollm2-135m-gpu` writes (data_cache and its .sampled
twin). No heads are involved: their drafts need the model, see compare_heads.py.
"""

import argparse
import json
import random
from pathlib import Path

import torch

from transformers_mtp.draft_datastore import build_draft_datastore
from transformers_mtp.generation_draft_sources import context_continuation, datastore_continuation


def simulate(answers, draft, drafts_per_step=2):
    """Tokens per verify step when `draft(context, count)` proposes the drafts."""
    tokens = steps = 0
    for answer in answers:
        ids, t = answer["input_ids"], answer["prompt_length"]
        while t < len(ids):  # a step verifies the drafts after ids[t] and emits ids[t] plus the accepted drafts
            drafts = draft(torch.tensor(ids[: t + 1]), drafts_per_step).tolist()
            accepted = 0
            while accepted < len(drafts) and t + 1 + accepted < len(ids) and drafts[accepted] == ids[t + 1 + accepted]:
                accepted += 1
            t, tokens, steps = t + 1 + accepted, tokens + 1 + accepted, steps + 1
    return tokens / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default="outputs/smollm2-self-distill-gpu.jsonl")
    parser.add_argument("--sampled-rounds", type=int, default=4)
    parser.add_argument("--held-out", type=int, default=200, help="prompts left out of the datastore")
    parser.add_argument("--vocab-size", type=int, default=49152)
    args = parser.parse_args()
    cache = Path(args.cache)
    greedy = [json.loads(line) for line in cache.read_text().splitlines() if line.strip()]
    sampled_file = cache.with_suffix(".sampled.jsonl")
    sampled = [json.loads(line) for line in sampled_file.read_text().splitlines() if line.strip()] \
        if sampled_file.is_file() else []
    sampled = sampled[: args.sampled_rounds * len(greedy)]
    order = list(range(len(greedy)))
    random.Random(0).shuffle(order)
    held = {greedy[i]["prompt"] for i in order[: args.held_out]}
    store_answers = [a for a in greedy + sampled if a["prompt"] not in held]
    test_answers = [a for a in greedy if a["prompt"] in held]

    def lookup(context, count):
        return context_continuation(context, count, 3)

    print(f"{len(store_answers)} answers in the datastore, {len(test_answers)} held-out greedy answers")
    print(f"context lookup alone: {simulate(test_answers, lookup):.3f} tokens per step")
    for min_count in (1, 2, 3):
        store = build_draft_datastore(store_answers, vocab_size=args.vocab_size, length=2, max_entries=10**7,
                                      min_count=min_count)

        def from_store(context, count, store=store):
            return datastore_continuation(context, count, store, args.vocab_size)

        def both(context, count, store=store):
            copied = lookup(context, count)
            return copied if copied.shape[0] else from_store(context, count)

        print(f"min_count {min_count} ({store[0].shape[0]} contexts): datastore alone "
              f"{simulate(test_answers, from_store):.3f}, lookup then datastore {simulate(test_answers, both):.3f}")


if __name__ == "__main__":
    main()
