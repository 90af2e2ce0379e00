"""Where a decode step's time goes, plain greedy against verified multi-token decoding, per dtype and device: the
prepared profile for the GPU question of the precision issue (on an H200, bf16 verified decoding ran slower than bf16
greedy: TPOT ratio 1.17 against 0.74 in fp32). It runs on a CPU too.

The embedded default model and its shipped heads, the first `--limit` benchmark prompts. For each dtype and mode,
after a warm-up: the unprofiled wall time per step (median of `--repeats` runs), then one run under torch.profiler
(operator counts and times: `aten::_local_scalar_dense` is every `.item()` / `bool(tensor)` / `.tolist()`, a host
sync on a GPU; `aten::nonzero` syncs too; `aten::_to_copy` is every dtype or device cast; on CUDA also
`cudaStreamSynchronize` / `cudaDeviceSynchronize`) and one under cProfile (which of this package's functions the
time sits in: on a GPU a function that syncs is charged the wait for the kernels queued before it).

    python benchmarks/step_profile.py --device cuda --dtype bfloat16 float32 --output profile.json
    python benchmarks/step_profile.py --limit 1 --max-new-tokens 32     # CPU, quick
"""

import argparse
import cProfile
import json
import pstats
import statistics

import torch

from transformers_mtp.benchmark import load_prompts, run_one
from transformers_mtp.cli import load_model_and_tokenizer
from transformers_mtp.training.data import chat_input_ids

SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "cudaStreamSynchronize", "cudaDeviceSynchronize")
CAST_OPS = ("aten::_to_copy",)


def operator_table(profile, device_type):
    rows = []
    for event in profile.key_averages():
        device_us = getattr(event, "self_device_time_total", 0) if device_type == "cuda" else 0
        rows.append({"op": event.key, "count": event.count, "self_cpu_ms": event.self_cpu_time_total / 1e3,
                     "self_device_ms": device_us / 1e3})
    return rows


def python_table(profiler, top):
    """This package's functions by their own time plus that of the built-ins they call directly (tensor methods such
    as `.item()`, `torch.cat`, casts): where a host sync waits, and what the decode loop's own lines cost."""
    stats = pstats.Stats(profiler).stats
    rows = {}
    for (filename, line, name), (_, calls, tottime, cumtime, _) in stats.items():
        if "transformers_mtp" in filename:
            rows[(filename, line, name)] = {"function": f"{filename.split('transformers_mtp/')[-1]}:{line}:{name}",
                                            "calls": calls, "self_ms": tottime * 1e3, "with_builtins_ms": tottime * 1e3,
                                            "cumulative_ms": cumtime * 1e3}
    for (filename, _, _), (_, _, _, _, callers) in stats.items():
        if filename == "~":  # a built-in: charge its time to the package function that called it
            for caller, (_, _, tottime, _) in callers.items():
                if caller in rows:
                    rows[caller]["with_builtins_ms"] += tottime * 1e3
    return sorted(rows.values(), key=lambda row: -row["with_builtins_ms"])[:top]


def profile_mode(model, ids, mode, args):
    def once():
        return run_one(model, ids, mode=mode, k=None, threshold=None, lookup=None, tree_size=None,
                       max_new_tokens=args.max_new_tokens, options=None, prompt_id="profile", kind="profile")[1]

    once()  # warm-up
    records = [once() for _ in range(args.repeats)]
    steps = records[0].forward_passes
    seconds = statistics.median(r.seconds for r in records)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if ids.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        once()
    operators = operator_table(profile, ids.device.type)
    python = cProfile.Profile()
    python.enable()
    once()
    python.disable()

    def per_step(names):
        return sum(row["count"] for row in operators if row["op"] in names) / steps

    return {
        "mode": mode, "new_tokens": records[0].new_tokens, "forward_passes": steps,
        "tokens_per_forward": records[0].new_tokens / steps, "ms_per_step": 1e3 * seconds / steps,
        "seconds": seconds, "syncs_per_step": per_step(SYNC_OPS), "casts_per_step": per_step(CAST_OPS),
        "cast_ms_per_step": sum(row["self_cpu_ms"] for row in operators if row["op"] in CAST_OPS) / steps,
        "top_operators": sorted(operators, key=lambda row: -(row["self_device_ms"] or row["self_cpu_ms"]))[: args.top],
        "sync_operators": [row for row in operators if row["op"] in SYNC_OPS + CAST_OPS],
        "top_functions": python_table(python, args.top),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    parser.add_argument("--limit", type=int, default=2, help="the first N benchmark prompts (code first, then chat)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="unprofiled runs per mode; the median counts")
    parser.add_argument("--top", type=int, default=15, help="rows kept of each operator and function table")
    parser.add_argument("--output", default=None, help="write every table here (JSON)")
    args = parser.parse_args()
    if args.limit < 1 or args.repeats < 1:
        parser.error(f"--limit {args.limit} and --repeats {args.repeats} must both be at least 1.")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device} was given but no CUDA device is visible; use --device cpu.")
    prompts = load_prompts()
    chosen = ([p for p in prompts if p["kind"] == "code"][: (args.limit + 1) // 2]
              + [p for p in prompts if p["kind"] == "chat"][: args.limit // 2])
    results = []
    for dtype_name in args.dtype:
        model, tokenizer = load_model_and_tokenizer(None, dtype=getattr(torch, dtype_name))
        model.to(device)
        for prompt in chosen:
            ids = chat_input_ids(tokenizer, prompt["prompt"]).to(device)
            rows = {mode: profile_mode(model, ids, mode, args) for mode in ("greedy", "verified")}
            greedy, verified = rows["greedy"], rows["verified"]
            print(f"{dtype_name} {prompt['id']}: step {verified['ms_per_step']:.1f} ms vs greedy "
                  f"{greedy['ms_per_step']:.1f} ms ({verified['ms_per_step'] / greedy['ms_per_step']:.2f}x), "
                  f"{verified['tokens_per_forward']:.2f} tokens per step, TPOT ratio "
                  f"{verified['seconds'] / verified['new_tokens'] / (greedy['seconds'] / greedy['new_tokens']):.2f}; "
                  f"syncs per step {verified['syncs_per_step']:.1f} vs {greedy['syncs_per_step']:.1f}, casts "
                  f"{verified['casts_per_step']:.1f} vs {greedy['casts_per_step']:.1f}", flush=True)
            for row in verified["top_functions"][:6]:
                print(f"    {row['with_builtins_ms'] / verified['forward_passes']:7.2f} ms/step in  {row['function']}")
            results.append({"dtype": dtype_name, "device": str(device), "prompt_id": prompt["id"], **rows})
        del model
    if args.output:
        with open(args.output, "w") as handle:
            json.dump({"max_new_tokens": args.max_new_tokens, "results": results}, handle, indent=2)


if __name__ == "__main__":
    main()
