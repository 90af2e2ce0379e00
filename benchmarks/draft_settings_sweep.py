"""Draft settings against plain greedy of one dtype: tokens/s ratio and tokens per forward pass, per prompt kind.

The embedded default model and its shipped heads, the benchmark prompts (the first N of each kind), 128 new tokens,
2 threads. Per prompt, after a warm-up: plain greedy once, then each setting (in an order that rotates from prompt to
prompt), back to back in one process; medians of the per-prompt ratios. A quick sweep, not the benchmark
(`transformers-mtp bench`).

    python benchmarks/draft_settings_sweep.py bfloat16 '[{"draft_tree_size": 8}, {"draft_tree_size": 8, "draft_lookup_num_tokens": 8}]' 8
"""

import json
import statistics
import sys
import time

import torch

import transformers_mtp
from transformers_mtp.benchmark import load_prompts
from transformers_mtp.training.data import chat_input_ids


def main(dtype_name, configs, per_kind):
    torch.set_num_threads(2)
    prompts = load_prompts()
    prompts = [p for p in prompts if p["kind"] == "code"][:per_kind] + [p for p in prompts if p["kind"] != "code"][:per_kind]
    model, tokenizer = transformers_mtp.load_default(dtype=getattr(torch, dtype_name))
    warm = chat_input_ids(tokenizer, "Hi")
    model.generate(warm, max_new_tokens=8, do_sample=False)
    for config in configs:
        model.generate(warm, max_new_tokens=8, do_sample=False, multi_token_mode=True, **config)
    results = {i: [] for i in range(len(configs))}
    for index, prompt in enumerate(prompts):
        ids = chat_input_ids(tokenizer, prompt["prompt"])
        order = list(range(len(configs)))
        order = order[index % len(order):] + order[: index % len(order)]
        start = time.perf_counter()
        greedy = model.generate(ids, max_new_tokens=128, do_sample=False)
        greedy_s = time.perf_counter() - start
        for i in order:
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=128, do_sample=False, multi_token_mode=True,
                                 return_dict_in_generate=True, **configs[i])
            seconds = time.perf_counter() - start
            ratio = greedy_s / seconds * (out.sequences.shape[1] - ids.shape[1]) / (greedy.shape[1] - ids.shape[1])
            results[i].append((prompt["kind"], ratio, out.multi_token_stats.tokens_per_forward,
                               torch.equal(out.sequences, greedy)))
    for i, config in enumerate(configs):
        for kind in ("code", "chat"):
            rows = [r for r in results[i] if (r[0] == "code") == (kind == "code")]
            print(f"{dtype_name} {config} {kind}: speedup median {statistics.median(r[1] for r in rows):.2f}x  "
                  f"tokens per forward {statistics.median(r[2] for r in rows):.2f}  "
                  f"identical {sum(r[3] for r in rows)}/{len(rows)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 8)
