"""Which drafter is fastest? Several multi-token models (the same base, different heads) against plain greedy, in one
process, interleaved prompt by prompt after a warm-up: `transformers-mtp bench` measures one model, and two bench
runs on a shared machine differ by more than the drafters do (benchmarks/README.md, "One round is not enough").

Each round of a prompt runs plain greedy and then every entry's verified decoding at its own generation-config
defaults (k, draft tree, lookup, datastore), in an order that rotates from round to round; each time is the median of
its rounds, and speed is the prompt's greedy median over the entry's median (same tokens: every output is checked
against greedy).

    python benchmarks/drafter_race.py default runs/chained/merged runs/chained/merged@tree=8 --repeats 3 \\
        --output benchmarks/results/drafter_race.json

An entry is a converted checkpoint folder or `default` (the shipped heads), optionally with `@tree=N` (draft tree
size), `@k=N` (num_predict_heads), `@draft=bfloat16` (draft_dtype), `@certified=0` / `@certified=1`
(certified_argmax) and `@onednn=0` / `@onednn=1` (onednn_verify) overriding its defaults. The entry
`greedy@onednn=1` is a stronger baseline: plain greedy with its one-row unembedding (49,152 x 576, where oneDNN wins at
one row too: benchmarks/results/linear_kernels.json) computed by oneDNN.
"""

import argparse
import contextlib
import json
import statistics
from pathlib import Path

import torch

from transformers_mtp.benchmark import load_prompts, run_one
from transformers_mtp.cli import load_model_and_tokenizer
from transformers_mtp.generation_onednn import ONE_ROW_MIN_WEIGHT_NUMEL, OneDNNLinear
from transformers_mtp.training.data import chat_input_ids


def parse_entry(text):
    """'PATH[@tree=N][@k=N][@draft=DTYPE][@certified=0|1][@onednn=0|1]' -> (label, path, {'tree_size': N, 'k': N,
    'draft_dtype': DTYPE, 'certified_argmax': bool, 'onednn_verify': bool})."""
    path, *options = text.split("@")
    overrides = {}
    for option in options:
        name, _, value = option.partition("=")
        if name in ("tree", "k") and value.isdigit():
            overrides["tree_size" if name == "tree" else "k"] = int(value)
        elif name == "draft" and value in ("float32", "bfloat16", "float16"):
            overrides["draft_dtype"] = value
        elif name in ("certified", "onednn") and value in ("0", "1"):
            overrides["certified_argmax" if name == "certified" else "onednn_verify"] = value == "1"
        else:
            raise SystemExit(f"entry {text!r}: options are @tree=N, @k=N, @draft=DTYPE, @certified=0|1 and "
                             f"@onednn=0|1, got {option!r}")
    return text, path, overrides


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("entries", nargs="+", help="checkpoint folders or 'default', each optionally @tree=N / @k=N")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="every model's dtype (bfloat16: against bfloat16 greedy; identity is then not promised)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    entries, models, tokenizer = [parse_entry(e) for e in args.entries], {}, None
    for _, path, _ in entries:
        if path not in models and path != "greedy":
            models[path], tokenizer = load_model_and_tokenizer(None if path == "default" else path, dtype=dtype)
    if not models:
        models["default"], tokenizer = load_model_and_tokenizer(None, dtype=dtype)
    greedy_model = next(iter(models.values()))  # multi_token_mode off: the base model's own greedy decoding
    prompts = load_prompts()[: args.limit]
    runs = {}  # (prompt id, label) -> [seconds], plus the label's records

    def run(label, path, overrides, prompt, ids):
        plain = label == "greedy" or path == "greedy"
        model = greedy_model if plain else models[path]
        mode = "greedy" if plain else "verified"
        # greedy@onednn=1: oneDNN for the one-row unembedding only (the trunk's one-row products lose there)
        kernels = OneDNNLinear(model, min_weight_numel=ONE_ROW_MIN_WEIGHT_NUMEL) if path == "greedy" and overrides.get(
            "onednn_verify") else contextlib.nullcontext()
        with kernels:
            sequences, record = run_one(model, ids, mode=mode, k=overrides.get("k"), threshold=None, lookup=None,
                                        tree_size=overrides.get("tree_size"), max_new_tokens=args.max_new_tokens,
                                        options=None if plain else {name: overrides.get(name) for name in
                                                                    ("draft_dtype", "certified_argmax", "onednn_verify")},
                                        prompt_id=prompt["id"], kind=prompt["kind"])
        return sequences, record

    warm = chat_input_ids(tokenizer, prompts[0]["prompt"])
    for label, path, overrides in [("greedy", None, {})] + entries:  # warm-up: one short run of each
        run(label, path, overrides, {"id": "warm-up", "kind": "warm-up"}, warm)
    lineup = [("greedy", None, {})] + entries
    for prompt in prompts:
        ids = chat_input_ids(tokenizer, prompt["prompt"])
        expected = None
        for round_ in range(args.repeats):
            shift = round_ % len(lineup)
            for label, path, overrides in lineup[shift:] + lineup[:shift]:
                sequences, record = run(label, path, overrides, prompt, ids)
                if label == "greedy":
                    expected = sequences if expected is None else expected
                slot = runs.setdefault((prompt["id"], label), {"seconds": [], "record": record, "sequences": []})
                slot["seconds"].append(record.seconds)
                slot["sequences"].append(sequences)
        for label, _, _ in entries:  # checked once greedy has run in every round
            slot = runs[(prompt["id"], label)]
            slot["identical"] = all(torch.equal(s, expected) for s in slot["sequences"])
        print(prompt["id"], " ".join(f"{label}: {statistics.median(runs[(prompt['id'], 'greedy')]['seconds']) / statistics.median(runs[(prompt['id'], label)]['seconds']):.2f}x"
                                     for label, _, _ in entries), flush=True)

    report = {"repeats": args.repeats, "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "entries": {}}
    kinds = [kind for kind in ("code", "chat") if any(p["kind"] == kind for p in prompts)]
    for label, _, _ in entries:
        row = {}
        for kind in kinds:
            ours = [p for p in prompts if p["kind"] == kind]
            speed = [statistics.median(runs[(p["id"], "greedy")]["seconds"])
                     / statistics.median(runs[(p["id"], label)]["seconds"]) for p in ours]
            records = [runs[(p["id"], label)]["record"] for p in ours]
            row[kind] = {"speed_vs_greedy_median": statistics.median(speed), "speed_min": min(speed),
                         "speed_max": max(speed),
                         "tokens_per_forward": sum(r.new_tokens for r in records) / sum(r.forward_passes for r in records),
                         "identical": sum(runs[(p["id"], label)]["identical"] for p in ours), "prompts": len(ours)}
        report["entries"][label] = row
    # per prompt, so that any entry can be compared with any other (e.g. against greedy@onednn=1)
    report["median_seconds"] = {p["id"]: {label: statistics.median(runs[(p["id"], label)]["seconds"])
                                          for label, _, _ in lineup} for p in prompts}
    print(f"\n| drafter | speed vs greedy, median [min, max] ({' / '.join(kinds)}) | tokens per forward | identical |")
    print("|---|---|---|---|")
    for label, row in report["entries"].items():
        speed = " / ".join(f"{row[k]['speed_vs_greedy_median']:.2f}x [{row[k]['speed_min']:.2f}, {row[k]['speed_max']:.2f}]"
                           for k in kinds)
        kept = " / ".join(f"{row[k]['tokens_per_forward']:.2f}" for k in kinds)
        print(f"| {label} | {speed} | {kept} | "
              f"{sum(row[k]['identical'] for k in kinds)} / {sum(row[k]['prompts'] for k in kinds)} |")
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
