# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Side-by-side decoding benchmark: plain greedy, verified and unverified multi-token, and transformers' prompt-lookup
decoding, in one process, interleaved (the mode order rotates from prompt to prompt), after a warm-up.

Absolute times on shared machines are noise, so everything is reported as a ratio against plain greedy decoding of
the same prompt, measured back to back.
"""

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.generation.streamers import BaseStreamer

MODES = ("greedy", "verified", "unverified", "prompt_lookup")


@dataclass
class RunRecord:
    """One prompt decoded in one mode."""

    prompt_id: str
    kind: str
    mode: str
    k: int
    new_tokens: int
    seconds: float
    ttft: float  # seconds to the first new token
    tpot: float  # seconds per new token after the first
    forward_passes: int  # base (trunk) forward passes, counted by a hook
    identical: bool = False  # output equal to plain greedy's
    head_proposed: list[int] = field(default_factory=list)
    head_accepted: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)
    memory_bytes: int = 0  # CUDA: peak allocated; CPU: parameters + the KV cache at the end

    @property
    def tokens_per_forward(self):
        return self.new_tokens / max(self.forward_passes, 1)


class _FirstTokenTimer(BaseStreamer):
    """`generate()` puts the prompt first, then new tokens: the time of the second `put` is the first token's."""

    def __init__(self):
        self.start, self.first_token_at, self.puts = time.perf_counter(), None, 0

    def put(self, value):
        self.puts += 1
        if self.puts == 2:
            self.first_token_at = time.perf_counter()

    def end(self):
        pass


class _ForwardCounter:
    """Counts the base model's trunk passes in every mode, ours and transformers' alike."""

    def __init__(self, model):
        self.count = 0
        self.handle = model._parts()[0].register_forward_hook(self._hook)

    def _hook(self, *args):
        self.count += 1


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cache_bytes(cache):
    if cache is None:
        return 0
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)


@torch.inference_mode()
def run_one(model, input_ids, *, mode, k, max_new_tokens, prompt_id="", kind=""):
    """Decode `input_ids` [1, T] in `mode` with `k` tokens per step; returns (sequences, RunRecord)."""
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True)
    if mode == "verified":
        kwargs.update(multi_token_mode=True, num_predict_heads=k)
    elif mode == "unverified":
        kwargs.update(multi_token_mode="unverified", num_predict_heads=k)
    elif mode == "prompt_lookup":
        kwargs.update(prompt_lookup_num_tokens=k - 1)
    elif mode != "greedy":
        raise ValueError(f"mode={mode!r} is not one of {list(MODES)}.")
    device = input_ids.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    counter, timer = _ForwardCounter(model), _FirstTokenTimer()
    try:
        _synchronize(device)
        start = time.perf_counter()
        timer.start = start
        out = model.generate(input_ids, streamer=timer, **kwargs)
        _synchronize(device)
        seconds = time.perf_counter() - start
    finally:
        counter.handle.remove()
    new_tokens = out.sequences.shape[1] - input_ids.shape[1]
    ttft = (timer.first_token_at or start + seconds) - start
    if device.type == "cuda":
        memory = torch.cuda.max_memory_allocated(device)
    else:
        memory = sum(p.numel() * p.element_size() for p in model.parameters()) + _cache_bytes(out.cache)
    stats = getattr(out, "multi_token_stats", None)
    record = RunRecord(
        prompt_id=prompt_id, kind=kind, mode=mode, k=1 if mode == "greedy" else k, new_tokens=new_tokens,
        seconds=seconds, ttft=ttft, tpot=(seconds - ttft) / max(new_tokens - 1, 1), forward_passes=counter.count,
        head_proposed=list(stats.head_proposed) if stats else [], head_accepted=list(stats.head_accepted) if stats else [],
        accepted_per_step=list(stats.accepted_per_step) if stats else [], memory_bytes=memory,
    )
    return out.sequences, record


def run_benchmark(model, prompts, *, modes=MODES, ks=None, max_new_tokens=128, warmup=True, progress=True):
    """
    prompts: dicts with `id`, `kind` and `input_ids` [1, T]. ks: tokens per step to measure for the multi-token and
    prompt-lookup modes (default: the generation config's num_predict_heads). Returns a JSON-ready dict.
    """
    default_k = getattr(model.generation_config, "num_predict_heads", None) or model.config.num_heads
    ks = list(ks or [default_k])
    runs = [("greedy", 1)] + [(mode, k) for mode in modes if mode != "greedy" for k in ks]
    if warmup:  # one-time costs (allocator growth, kernel choice) land outside the timing
        for mode, k in runs:
            run_one(model, prompts[0]["input_ids"], mode=mode, k=k, max_new_tokens=8)
    records = []
    bar = tqdm(total=len(prompts) * len(runs), desc="bench", disable=not progress)
    for index, prompt in enumerate(prompts):
        order = runs[index % len(runs):] + runs[: index % len(runs)]  # rotate which mode runs first
        outputs = {}
        for mode, k in order:
            sequences, record = run_one(model, prompt["input_ids"], mode=mode, k=k, max_new_tokens=max_new_tokens,
                                        prompt_id=prompt["id"], kind=prompt["kind"])
            outputs[(mode, k)] = (sequences, record)
            bar.update()
        greedy_sequences, greedy_record = outputs[("greedy", 1)]
        for (mode, k), (sequences, record) in outputs.items():
            record.identical = bool(torch.equal(sequences, greedy_sequences))
            records.append(record)
        verified = [r for (m, _), (_, r) in outputs.items() if m == "verified"]
        if verified:
            bar.set_postfix(speedup=f"{greedy_record.seconds / verified[0].seconds:.2f}x",
                            tau=f"{verified[0].tokens_per_forward:.2f}")
    bar.close()
    return {"max_new_tokens": max_new_tokens, "records": [asdict(r) for r in records],
            "summary": summarize(records)}


def _spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None


def summarize(records):
    """Per mode / k and per prompt kind: ratios against greedy on the same prompt, acceptance, exact matches."""
    greedy = {r.prompt_id: r for r in records if r.mode == "greedy"}
    groups = {}
    for record in records:
        for kind in ("all", record.kind):
            groups.setdefault((record.mode, record.k, kind), []).append(record)
    summary = []
    for (mode, k, kind), group in sorted(groups.items(), key=lambda item: (MODES.index(item[0][0]), item[0][1:])):
        base = [greedy[r.prompt_id] for r in group]
        proposed = [sum(r.head_proposed[i] for r in group if len(r.head_proposed) > i)
                    for i in range(max((len(r.head_proposed) for r in group), default=0))]
        accepted = [sum(r.head_accepted[i] for r in group if len(r.head_accepted) > i) for i in range(len(proposed))]
        summary.append({
            "mode": mode, "k": k, "kind": kind, "prompts": len(group),
            "tokens_per_s": statistics.median(r.new_tokens / r.seconds for r in group),
            "speedup": _spread([b.seconds / r.seconds * r.new_tokens / max(b.new_tokens, 1) for r, b in zip(group, base)]),
            "ttft_ratio": statistics.median(r.ttft / b.ttft for r, b in zip(group, base)),
            "tpot_ratio": statistics.median(r.tpot / b.tpot for r, b in zip(group, base)),
            "tokens_per_forward": sum(r.new_tokens for r in group) / max(sum(r.forward_passes for r in group), 1),
            "head_acceptance": [a / p if p else 0.0 for a, p in zip(accepted, proposed)],
            "exact_match_rate": sum(r.identical for r in group) / len(group),
            "memory_mb": max(r.memory_bytes for r in group) / 2**20,
        })
    return summary


def markdown_table(summary):
    lines = ["| mode | k | prompts | speedup vs greedy (median [min, max]) | TTFT ratio | TPOT ratio | tokens / forward "
             "| head acceptance | identical to greedy | memory (MB) |", "|" + "---|" * 10]
    for row in summary:
        s = row["speedup"]
        acceptance = " / ".join(f"{a:.2f}" for a in row["head_acceptance"]) or "-"
        lines.append(
            f"| {row['mode']} ({row['kind']}) | {row['k']} | {row['prompts']} | {s['median']:.2f}x [{s['min']:.2f}, "
            f"{s['max']:.2f}] | {row['ttft_ratio']:.2f} | {row['tpot_ratio']:.2f} | {row['tokens_per_forward']:.2f} | "
            f"{acceptance} | {row['exact_match_rate']:.0%} | {row['memory_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def write_report(result, output_dir, *, environment=None):
    """bench.json, bench.md and PNG plots (per-head acceptance, speedup per prompt, tokens-per-forward histogram)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    result = {**result, "environment": environment or {}}
    (output_dir / "bench.json").write_text(json.dumps(result, indent=2))
    (output_dir / "bench.md").write_text(markdown_table(result["summary"]))
    records = result["records"]
    multi = sorted({(r["mode"], r["k"]) for r in records if r["mode"] != "greedy"})

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, k in multi:
        row = next(s for s in result["summary"] if (s["mode"], s["k"], s["kind"]) == (mode, k, "all"))
        if row["head_acceptance"]:
            ax.plot(range(1, len(row["head_acceptance"]) + 1), row["head_acceptance"], marker="o", label=f"{mode} k={k}")
    ax.set(xlabel="head i (drafts token t+1+i)", ylabel="acceptance rate", title="Per-head acceptance", ylim=(0, 1))
    ax.legend()
    fig.savefig(output_dir / "head_acceptance.png", dpi=120, bbox_inches="tight")

    fig, ax = plt.subplots(figsize=(max(7, len(records) / 6), 4))
    greedy = {r["prompt_id"]: r for r in records if r["mode"] == "greedy"}
    prompt_ids = list(greedy)
    width = 0.8 / max(len(multi), 1)
    for j, (mode, k) in enumerate(multi):
        by_prompt = {r["prompt_id"]: r for r in records if (r["mode"], r["k"]) == (mode, k)}
        ratios = [greedy[p]["seconds"] / by_prompt[p]["seconds"] for p in prompt_ids]
        ax.bar([i + j * width for i in range(len(prompt_ids))], ratios, width, label=f"{mode} k={k}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(prompt_ids))], prompt_ids, rotation=60, ha="right")
    ax.set(ylabel="tokens/s vs plain greedy", title="Speedup per prompt")
    ax.legend()
    fig.savefig(output_dir / "speedup_per_prompt.png", dpi=120, bbox_inches="tight")

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, k in multi:
        steps = [n for r in records if (r["mode"], r["k"]) == (mode, k) for n in r["accepted_per_step"]]
        if steps:
            ax.hist(steps, bins=range(1, max(steps) + 2), alpha=0.6, align="left", label=f"{mode} k={k}")
    ax.set(xlabel="tokens accepted per verify pass", ylabel="steps", title="Tokens per forward pass")
    ax.legend()
    fig.savefig(output_dir / "tokens_per_forward.png", dpi=120, bbox_inches="tight")
    plt.close("all")
    return output_dir
