"""Where a verified decoding step's time goes, per drafter: the verify pass, the drafting, the rest.

Each entry (as in drafter_race.py: 'default', 'default:chained', a checkpoint folder, with @tree=N / @k=N /
@draft=DTYPE) decodes the first `--code` code and `--chat` chat benchmark prompts, 128 new tokens, float32, after one
warm-up run each, `--rounds` rounds with the entries' order reversed every other round. Timers wrap the decoding
loop's stages (`DecodingState.forward_tree` / `forward`: the trunk pass that verifies; `Drafter.propose`: every
draft source, the heads' part in `HeadProposer.propose_chain_tree` for the chained drafter); each is reported in ms
per verify pass, with the tokens kept per pass.

    python benchmarks/step_split.py default default:chained@tree=8 default:chained@tree=8@draft=float32
"""

import argparse
import collections
import functools
import time

import torch
from drafter_race import parse_entry

from transformers_mtp import generation_proposers, generation_state
from transformers_mtp.benchmark import load_prompts, run_one
from transformers_mtp.cli import load_model_and_tokenizer
from transformers_mtp.training.data import chat_input_ids

STAGES = [(generation_state.DecodingState, "forward_tree", "verify (tree)"),
          (generation_state.DecodingState, "forward", "verify (chain)"),
          (generation_proposers.Drafter, "propose", "drafting"),
          (generation_proposers.HeadProposer, "propose_chain_tree", "of it, the chained drafter's tree")]


def add_timers(seconds):
    """Wrap each stage's method so that its wall time adds up in `seconds[stage]`."""
    for owner, name, stage in STAGES:
        method = getattr(owner, name)

        def timed(*args, __method=method, __stage=stage, **kwargs):
            start = time.perf_counter()
            try:
                return __method(*args, **kwargs)
            finally:
                seconds[__stage] += time.perf_counter() - start

        setattr(owner, name, functools.wraps(method)(timed))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("entries", nargs="+")
    parser.add_argument("--code", type=int, default=2)
    parser.add_argument("--chat", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    entries = [parse_entry(e) for e in args.entries]
    models, tokenizer = {}, None
    for _, path, _ in entries:
        if path not in models:
            models[path], tokenizer = load_model_and_tokenizer(None if path == "default" else path, dtype=torch.float32)
    prompts = load_prompts()
    prompts = [p for p in prompts if p["kind"] == "code"][: args.code] + [p for p in prompts if p["kind"] == "chat"][: args.chat]
    seconds = collections.defaultdict(float)
    add_timers(seconds)

    def run(label, path, overrides, ids):
        return run_one(models[path], ids, mode="verified", k=overrides.get("k"), threshold=None, lookup=None,
                       tree_size=overrides.get("tree_size"), max_new_tokens=128,
                       options={"draft_dtype": overrides.get("draft_dtype")})[1]

    warm = chat_input_ids(tokenizer, prompts[0]["prompt"])
    for entry in entries:
        run(*entry, warm)
    totals = {label: collections.defaultdict(float) for label, _, _ in entries}
    for round_ in range(args.rounds):
        for prompt in prompts:
            ids = chat_input_ids(tokenizer, prompt["prompt"])
            for label, path, overrides in entries if round_ % 2 == 0 else entries[::-1]:
                seconds.clear()
                record = run(label, path, overrides, ids)
                total = totals[label]
                total["step"] += record.seconds
                total["passes"] += record.forward_passes
                total["tokens"] += record.new_tokens
                for stage, value in seconds.items():
                    total[stage] += value
    stages = [stage for _, _, stage in STAGES]
    print("| drafter | tokens per pass | ms per pass | " + " | ".join(stages) + " |")
    print("|---|---|---|" + "---|" * len(stages))
    for label, total in totals.items():
        per_pass = {stage: 1e3 * total[stage] / total["passes"] for stage in stages}
        print(f"| {label} | {total['tokens'] / total['passes']:.2f} | {1e3 * total['step'] / total['passes']:.1f} | "
              + " | ".join(f"{per_pass[stage]:.1f}" for stage in stages) + " |")


if __name__ == "__main__":
    main()
