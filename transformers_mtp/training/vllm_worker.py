# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The base model's answers written by vLLM: the worker that `distill_engine: vllm` runs in vLLM's own interpreter.

vLLM pins its own transformers, so it lives in a virtualenv of its own and this file is run there by path (it
imports only the standard library and vllm, never transformers_mtp):

    VLLM_PYTHON transformers_mtp/training/vllm_worker.py --model PLAIN_CHECKPOINT --requests IN.jsonl \\
        --output OUT.jsonl --max-tokens 160 [--temperature 0.7 --seed 0] [--dtype float32]

IN.jsonl holds one `{"prompt_ids": [...]}` per line (the chat template already applied, so both sides tokenise
alike); OUT.jsonl gets one `{"response_ids": [...]}` per request, in the same order, the EOS kept and nothing after
it. Request i of a sampled run is seeded with `seed + i`, so its answer does not depend on the batch it shared.
vLLM batches the requests itself (continuous batching, paged KV cache): on the CPU it writes several times the
answer tokens per second of batched `generate()` (docs/training.md). Written whole at the end (atomically).
"""

import argparse
import json
import os
from pathlib import Path


def engine_environment(kv_cache_gib):
    """vLLM's CPU back end: every core, a KV cache that fits next to the rest (PLATFORM_NOTES.md)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a plain transformers checkpoint folder (with its tokenizer)")
    parser.add_argument("--requests", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default: greedy)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-cache-gib", type=int, default=6)
    parser.add_argument("--eos-token-id", type=int, default=None)
    args = parser.parse_args()
    engine_environment(args.kv_cache_gib)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    requests = [json.loads(line)["prompt_ids"] for line in Path(args.requests).read_text().splitlines() if line.strip()]
    longest = max(len(ids) for ids in requests) + args.max_tokens
    # Sampled runs seed each request. When an engine step's token budget splits a prompt (chunked prefill), vLLM
    # 0.32 rewinds that request's generator with `set_offset`, which a CPU generator lacks ("CPU Generator does not
    # use offset"); without chunked prefill every prompt is scheduled whole, so the budget must hold the longest.
    max_model_len = max(longest, 256)
    chunked = {} if args.temperature is None else {"enable_chunked_prefill": False,
                                                   "max_num_batched_tokens": max(4096, max_model_len)}
    llm = LLM(model=args.model, dtype=args.dtype, seed=args.seed, max_model_len=max_model_len,
              enforce_eager=True, disable_log_stats=True, **chunked)
    if args.temperature is None:
        params = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens)] * len(requests)
    else:
        params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed + i)
                  for i in range(len(requests))]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in requests], params, use_tqdm=True)
    lines = []
    for output in outputs:
        response = list(output.outputs[0].token_ids)
        if args.eos_token_id is not None and args.eos_token_id in response:  # as self_distill: keep the EOS only
            response = response[: response.index(args.eos_token_id) + 1]
        lines.append(json.dumps({"response_ids": response}) + "\n")
    staging = Path(args.output).with_suffix(".tmp")
    staging.write_text("".join(lines))
    os.replace(staging, args.output)


if __name__ == "__main__":
    main()
