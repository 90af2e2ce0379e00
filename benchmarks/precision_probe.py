"""A quick look at this machine: fp32 and bf16, plain greedy against multi-token decoding with the shipped defaults.

The embedded default model and its shipped heads, 4 code and 4 chat benchmark prompts, 96 new tokens, 2 threads. Per
dtype, after a warm-up, each prompt runs plain greedy then multi-token decoding of the same dtype, back to back in one
process; the medians of the per-prompt ratios are reported, with tokens per forward pass and how many outputs are
identical to that dtype's plain greedy. A probe, not the benchmark (`transformers-mtp bench`): use it to see which
precision pays on the processor a session got, since the machines change.

    python benchmarks/precision_probe.py
"""

import json
import statistics
import time
from importlib.resources import files

import torch

import transformers_mtp
from transformers_mtp.training.data import chat_ids

NEW_TOKENS = 96


def main():
    lines = files("transformers_mtp").joinpath("bench_prompts.jsonl").read_text().splitlines()
    prompts = [json.loads(line) for line in lines if line.strip()]
    prompts = [p for p in prompts if p["kind"] == "code"][:4] + [p for p in prompts if p["kind"] != "code"][:4]
    torch.set_num_threads(2)
    for dtype in (torch.float32, torch.bfloat16):
        model, tokenizer = transformers_mtp.load_default(dtype=dtype)
        warm = torch.tensor([chat_ids(tokenizer, "hello")])
        model.generate(warm, max_new_tokens=8, do_sample=False)
        model.generate(warm, max_new_tokens=8, do_sample=False, multi_token_mode=True)
        rows = []
        for prompt in prompts:
            ids = torch.tensor([chat_ids(tokenizer, prompt["prompt"])])
            start = time.perf_counter()
            greedy = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            greedy_s = time.perf_counter() - start
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, multi_token_mode=True,
                                 return_dict_in_generate=True)
            multi_s = time.perf_counter() - start
            rows.append({"kind": "code" if prompt["kind"] == "code" else "chat", "speedup": greedy_s / multi_s,
                         "tau": out.multi_token_stats.tokens_per_forward,
                         "identical": torch.equal(greedy, out.sequences),
                         "greedy_tps": (greedy.shape[1] - ids.shape[1]) / greedy_s})
        for kind in ("code", "chat"):
            group = [r for r in rows if r["kind"] == kind]
            print(f"{str(dtype):15s} {kind}: tokens/s vs greedy of the same dtype, median "
                  f"{statistics.median(r['speedup'] for r in group):.2f}x; tokens per forward "
                  f"{statistics.median(r['tau'] for r in group):.2f}; identical {sum(r['identical'] for r in group)}"
                  f"/{len(group)}; plain greedy {statistics.median(r['greedy_tps'] for r in group):.1f} tokens/s")


if __name__ == "__main__":
    main()
