"""How the independent heads' draft tree is grown, simulated offline: tokens per pass for tree policies.

Generating with every candidate policy is slow on a CPU; the tree a policy grows depends only on the heads' top
candidates at the verified position, and what verification keeps only on the base model's greedy text. So: greedy
text once per prompt (float32, the embedded model and its shipped heads), one forward over it with
`output_head_logits=True` (the heads at every position see what they see when decoding: the trunk's feature and the
verified token), then every policy builds its tree at every position from the same candidates and is scored by the
longest path greedy keeps (1 + that, averaged over positions: tokens per pass, the context branch left out).

Policies: `grow_draft_tree` (the shipped scoring: the product of the heads' probabilities along a path) with
`branching` candidates per head; heads 2.. with their probabilities raised to `power`; and `calibrated`: each head's
probability replaced by how often a candidate of that probability was right where its ancestors were (counted on
the other half of the prompts, so that a prompt never tunes its own score).

Prompts: held-out ShareGPT first turns (short ones, as the benchmark's chat questions) and HumanEval problems: never
in the shipped heads' training data (built-in templates) and disjoint from the benchmark prompts; then the benchmark
prompts themselves, reported apart.

    python benchmarks/tree_policy_sim.py --chat 48 --code 16 --output benchmarks/results/tree_policy_sim.json
"""

import argparse
import bisect
import itertools
import json
import statistics
import time

import torch

import transformers_mtp
from transformers_mtp.benchmark import load_prompts
from transformers_mtp.generation_draft_tree import DraftTree, grow_draft_tree
from transformers_mtp.training.data import chat_input_ids
from transformers_mtp.training.real_prompts import (
    first_user_turns,
    humaneval_prompts,
    sharegpt_conversations,
)

TOP = 8  # candidates kept per head and position (the largest branching simulated)
BINS = [0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.01]  # probability bins of the calibration


def _bin(prob):
    return bisect.bisect_right(BINS, prob) - 1


def tuning_prompts(num_chat, num_code, max_chars, skip):
    chat = itertools.islice((t for t in first_user_turns(sharegpt_conversations()) if len(t) <= max_chars), skip,
                            skip + num_chat)
    chat = [{"kind": "chat", "prompt": t} for t in chat]
    code = [{"kind": "code", "prompt": t} for t in humaneval_prompts()[::-1][:num_code]]
    return chat + code


@torch.no_grad()
def candidates(model, tokenizer, prompt, max_new_tokens):
    """Per generated position: the heads' TOP draft-vocabulary candidates [D, TOP] (tokens, probs) and the tokens
    greedy wrote after the verified one [D] (-1 past the end)."""
    ids = chat_input_ids(tokenizer, prompt)
    text = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    out = model(text, output_head_logits=True)
    _, draft_ids = model.draft_unembedding()
    head_logits = out.head_logits[0]  # [T, D, V]
    if draft_ids is not None:
        head_logits = head_logits[..., draft_ids]
    probs = torch.softmax(head_logits.float(), dim=-1)
    top_probs, top_index = probs.topk(TOP, dim=-1)
    top_tokens = draft_ids[top_index] if draft_ids is not None else top_index
    start, end = ids.shape[1] - 1, text.shape[1] - 1  # positions whose next token greedy wrote
    depth = top_tokens.shape[1]
    rows = []
    for t in range(start, end):  # state at t; the verified token is text[t + 1]; head j drafts text[t + 1 + j]
        truth = [int(text[0, t + 1 + j]) if t + 1 + j < text.shape[1] else -1 for j in range(1, depth + 1)]
        rows.append((top_tokens[t].tolist(), top_probs[t].tolist(), truth))
    return rows


def kept(tree, truth):
    node, length = 0, 0
    for token in truth:
        node = tree.children[node].get(token)
        if node is None:
            break
        length += 1
    return length


def calibration(rows):
    """P(candidate right | its ancestors right), per head and probability bin, from `rows` (add-one smoothed)."""
    depth = len(rows[0][0])
    hits = torch.ones(depth, len(BINS) - 1)
    counts = torch.full((depth, len(BINS) - 1), 2.0)
    for tokens, probs, truth in rows:
        for j in range(depth):
            if truth[j] < 0:
                break
            if j and truth[j - 1] not in tokens[j - 1]:
                break  # the ancestor path is not in any tree: this head's candidates are never verified there
            for token, prob in zip(tokens[j], probs[j]):
                counts[j, _bin(prob)] += 1
                hits[j, _bin(prob)] += token == truth[j]
    return (hits / counts).tolist()


def ceiling(rows, *, size, branching):
    """Tokens per pass if the tree always held the longest path greedy keeps that the heads' `branching` best
    candidates offer (no scoring does better with these candidates; a path of 3 needs only 3 of the `size` drafts)."""
    total = 0
    for tokens, _, truth in rows:
        length = 0
        while length < min(len(truth), size) and truth[length] in tokens[length][:branching]:
            length += 1
        total += 1 + length
    return total / len(rows)


def score(rows, *, size, branching, power=1.0, table=None, oracle=False):
    if oracle:
        return ceiling(rows, size=size, branching=branching)
    total = 0
    for tokens, probs, truth in rows:
        tokens = [t[:branching] for t in tokens]
        probs = [p[:branching] for p in probs]
        if table is not None:
            probs = [[table[j][_bin(p)] for p in ps] for j, ps in enumerate(probs)]
        elif power != 1.0:
            probs = [probs[0]] + [[p**power for p in ps] for ps in probs[1:]]
        tree = grow_draft_tree(DraftTree.rooted_at(0), tokens, probs, size=size)
        total += 1 + kept(tree, truth)
    return total / len(rows)


def policies(size):
    yield "shipped (branching 4)", {"size": size, "branching": 4}
    for branching in (2, 3, 6, 8):
        yield f"branching {branching}", {"size": size, "branching": branching}
    for power in (0.5, 0.75, 1.5):
        yield f"heads 2.. power {power}", {"size": size, "branching": 4, "power": power}
    for branching in (4, 8):
        yield f"calibrated, branching {branching}", {"size": size, "branching": branching, "calibrated": True}
    for branching in (1, 4, 8):
        yield f"ceiling, branching {branching}", {"size": size, "branching": branching, "oracle": True}


def evaluate(groups, size, tables):
    """groups: {name: (rows per prompt, kind per prompt, half per prompt)}; tables: a calibration per half, each
    used for the prompts of the other half (for the benchmark prompts: the tuning prompts' tables)."""
    report = {}
    for label, policy in policies(size):
        policy = dict(policy)
        calibrated = policy.pop("calibrated", False)
        report[label] = {}
        for name, prompts in groups.items():
            for kind in ("code", "chat"):
                values = [score(rows, **policy, table=tables[name][half] if calibrated else None)
                          for rows, k, half in prompts if k == kind]
                if values:
                    report[label][f"{name} {kind}"] = round(statistics.mean(values), 3)
        print(label, report[label], flush=True)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chat", type=int, default=48)
    parser.add_argument("--code", type=int, default=16)
    parser.add_argument("--max-chars", type=int, default=200)
    parser.add_argument("--skip", type=int, default=4000, help="ShareGPT first turns skipped before the tuning ones")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--bench-limit", type=int, default=None, help="the first N benchmark prompts only")
    parser.add_argument("--size", type=int, default=8, help="drafts per tree (the shipped draft_tree_size)")
    parser.add_argument("--output")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer = transformers_mtp.load_default(dtype=torch.float32)
    started = time.perf_counter()
    tuning = tuning_prompts(args.chat, args.code, args.max_chars, args.skip)
    bench = load_prompts()[: args.bench_limit]
    groups = {"tuning": [], "benchmark": []}
    for name, prompts in (("tuning", tuning), ("benchmark", bench)):
        for index, prompt in enumerate(prompts):
            kind = "code" if prompt["kind"] == "code" else "chat"
            groups[name].append((candidates(model, tokenizer, prompt["prompt"], args.max_new_tokens), kind, index % 2))
        print(f"{name}: {len(prompts)} prompts, {time.perf_counter() - started:.0f} s", flush=True)
    halves = [[r for rows, _, half in groups["tuning"] if half == h for r in rows] for h in (0, 1)]
    # each tuning prompt is scored with the other half's table; the benchmark prompts with all tuning prompts'
    whole = calibration(halves[0] + halves[1])
    tables = {"tuning": [calibration(halves[1]), calibration(halves[0])], "benchmark": [whole, whole]}
    report = {"settings": vars(args), "calibration (tuning prompts)": whole, "bins": BINS,
              "tokens per pass": evaluate(groups, args.size, tables)}
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
