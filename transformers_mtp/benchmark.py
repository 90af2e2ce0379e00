# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Side-by-side decoding benchmark, in one process, interleaved (the mode order rotates from prompt to prompt), after
a warm-up:

- greedy modes: plain greedy, verified and unverified multi-token (optionally with a draft-confidence threshold and
  context lookup drafts),
  and transformers' prompt-lookup decoding;
- sampling modes: plain sampling and multi-token speculative sampling, with the same settings and seed;
- batches: plain batched greedy against batched verified multi-token decoding at several batch sizes.

Absolute times on shared machines are noise, so everything is reported as a ratio against the plain mode of the same
prompt (greedy, or sampling for the sampling modes), measured back to back.
"""

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.generation.streamers import BaseStreamer

from .precision import NEAR_TIE_MARGIN, divergence, greedy_logits

MODES = ("greedy", "verified", "unverified", "prompt_lookup", "sample", "verified_sample")
MULTI_TOKEN_BENCH_MODES = ("verified", "unverified", "verified_sample")
SAMPLING_MODES = ("sample", "verified_sample")
# The sampling settings of the benchmark: the usual chat settings (SmolLM2's card suggests temperature 0.2 - 0.7).
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 50}


def load_prompts(path=None):
    """The shipped prompt set (code and chat, tagged by kind), or a JSONL file of {"prompt", "kind", "id"}."""
    from .training.data import read_jsonl

    path = Path(path) if path else Path(__file__).with_name("bench_prompts.jsonl")
    prompts = []
    for number, item in read_jsonl(path):
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ValueError(f'{path}:{number} needs a "prompt" string, e.g. {{"prompt": "...", "kind": "code"}}.')
        prompts.append({"id": str(item.get("id", f"prompt-{number}")), "kind": item.get("kind", "chat"),
                        "prompt": item["prompt"]})
    if not prompts:
        raise ValueError(f"{path} holds no prompts; write one JSON object per line.")
    return prompts


def baseline_mode(mode):
    """The plain mode a mode is compared with."""
    return "sample" if mode in SAMPLING_MODES else "greedy"


@dataclass
class RunRecord:
    """One prompt decoded in one mode."""

    prompt_id: str
    kind: str
    mode: str
    k: int
    threshold: float  # draft_confidence_threshold (multi-token modes; 0 = always draft k - 1 tokens)
    lookup: int  # draft_lookup_ngram (multi-token modes; 0 = drafts from the heads only)
    new_tokens: int
    seconds: float
    ttft: float  # seconds to the first new token
    tpot: float  # seconds per new token after the first
    forward_passes: int  # base (trunk) forward passes, counted by a hook
    identical: bool | None = None  # output equal to plain greedy's (None for sampling modes)
    head_proposed: list[int] = field(default_factory=list)
    head_accepted: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)
    memory_bytes: int = 0  # CUDA: peak allocated; CPU: parameters + the KV cache at the end
    datastore: bool | None = None  # draft_datastore (multi-token modes; None = the model's default)
    tree_size: int = 0  # draft_tree_size (verified greedy mode; 0 = one chain of drafts per step)
    dtype: str = ""  # the model's dtype, e.g. "bfloat16" (each mode is compared with plain greedy of its own dtype)
    # where a greedy-mode output parted from plain greedy's (reduced precision): the new-token index, greedy's top-two
    # logit margin there, and that margin's rank among greedy's margins at every position (precision.Divergence)
    divergence_position: int | None = None
    divergence_margin: float | None = None
    divergence_rank: float | None = None
    # how many times the prompt ran in this variant (`repeats`); seconds, ttft and tpot are the medians of those runs
    repeats: int = 1
    seconds_per_run: list[float] = field(default_factory=list)

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


def generate_kwargs(mode, k, threshold=0.0, lookup=0, datastore=None, tree_size=0, options=None):
    """`generate()` arguments of a benchmark mode (`options`: more multi-token options by name, e.g. `draft_dtype`,
    `certified_argmax`, `onednn_verify`, for the multi-token modes only;
    None: the model's defaults)."""
    kwargs = {"do_sample": mode in SAMPLING_MODES, **(SAMPLING if mode in SAMPLING_MODES else {})}
    if mode in ("verified", "verified_sample"):
        kwargs.update(multi_token_mode=True, num_predict_heads=k, draft_confidence_threshold=threshold,
                      draft_lookup_ngram=lookup)
    elif mode == "unverified":
        kwargs.update(multi_token_mode="unverified", num_predict_heads=k, draft_confidence_threshold=threshold,
                      draft_lookup_ngram=lookup)
    elif mode == "prompt_lookup":
        kwargs.update(prompt_lookup_num_tokens=k - 1)
    elif mode not in ("greedy", "sample"):
        raise ValueError(f"mode={mode!r} is not one of {list(MODES)}.")
    if datastore is not None and mode in MULTI_TOKEN_BENCH_MODES:
        kwargs.update(draft_datastore=datastore)
    if mode == "verified":
        kwargs.update(draft_tree_size=tree_size)
    if mode in MULTI_TOKEN_BENCH_MODES:
        kwargs.update({name: value for name, value in (options or {}).items() if value is not None})
    return kwargs


@torch.inference_mode()
def run_one(model, input_ids, *, mode, k, max_new_tokens, threshold=0.0, lookup=0, datastore=None, tree_size=0, seed=0,
            prompt_id="", kind="", options=None):
    """Decode `input_ids` [1, T] in `mode` with `k` tokens per step; returns (sequences, RunRecord). Sampling modes
    draw with `torch.manual_seed(seed)`."""
    kwargs = dict(max_new_tokens=max_new_tokens, return_dict_in_generate=True, **generate_kwargs(mode, k, threshold, lookup, datastore, tree_size, options))
    torch.manual_seed(seed)
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
        prompt_id=prompt_id, kind=kind, mode=mode, k=1 if mode in ("greedy", "sample") else k,
        threshold=threshold if mode in MULTI_TOKEN_BENCH_MODES else 0.0,
        lookup=lookup if mode in MULTI_TOKEN_BENCH_MODES else 0, new_tokens=new_tokens,
        seconds=seconds, ttft=ttft, tpot=(seconds - ttft) / max(new_tokens - 1, 1), forward_passes=counter.count,
        head_proposed=list(stats.head_proposed) if stats else [], head_accepted=list(stats.head_accepted) if stats else [],
        accepted_per_step=list(stats.accepted_per_step) if stats else [], memory_bytes=memory,
        datastore=datastore if mode in MULTI_TOKEN_BENCH_MODES else None,
        tree_size=tree_size if mode == "verified" else 0, dtype=str(model.dtype).removeprefix("torch."),
    )
    return out.sequences, record


def locate_divergences(model, input_ids, greedy_sequences, parted, max_new_tokens):
    """Fill in where each (sequences, record) in `parted` left plain greedy's output, and how close greedy's top two
    logits were there: plain greedy runs once more, untimed, keeping its logits (it must give the same tokens)."""
    logits = greedy_logits(model, input_ids, greedy_sequences, max_new_tokens)  # [N, V]
    if logits is None:
        raise RuntimeError("plain greedy decoding gave two different outputs for one prompt; the benchmark cannot "
                           "tell where the other modes part from it (is another process changing the thread count?)")
    start = input_ids.shape[1]
    for sequences, record in parted:
        found = divergence(greedy_sequences[0, start:], logits, sequences[0, start:])
        if found is not None:  # None: one output is a prefix of the other (a stop came earlier)
            record.divergence_position, record.divergence_margin, record.divergence_rank = (
                found.position, found.margin, found.rank)


def benchmark_runs(modes, ks, thresholds=(0.0,), lookups=(0,), datastores=(None,), tree_sizes=(0,)):
    """(mode, k, threshold, lookup, datastore, tree_size) of every measured variant, baselines first."""
    runs = [("greedy", 1, 0.0, 0, None, 0)]
    if any(mode in SAMPLING_MODES for mode in modes):
        runs.append(("sample", 1, 0.0, 0, None, 0))
    for mode in modes:
        if mode in ("greedy", "sample"):
            continue
        for k in ks:
            multi = mode in ("verified", "verified_sample")
            for threshold in (thresholds if multi else (0.0,)):
                for lookup in (lookups if multi else (0,)):
                    for datastore in (datastores if mode in MULTI_TOKEN_BENCH_MODES else (None,)):
                        for tree_size in (tree_sizes if mode == "verified" else (0,)):
                            runs.append((mode, k, threshold, lookup, datastore, tree_size))
    return runs


def _median_of_runs(runs):
    """One record from the repeated runs of a variant on a prompt: the first's counts, the medians of the timings."""
    record = runs[0]
    record.seconds_per_run = [r.seconds for r in runs]
    record.repeats = len(runs)
    for name in ("seconds", "ttft", "tpot"):
        setattr(record, name, statistics.median(getattr(r, name) for r in runs))
    return record


def run_benchmark(model, prompts, *, modes=MODES, ks=None, thresholds=None, lookups=None, datastores=None,
                  tree_sizes=None, max_new_tokens=128, repeats=1, warmup=True, progress=True):
    """
    prompts: dicts with `id`, `kind` and `input_ids` [1, T]. repeats: rounds per prompt, every variant once per round
    (the order rotating from round to round); each variant's times are the median of its rounds, which damps the
    bursts of a shared machine (a single round's ratios moved by 10-30% from run to run). ks: tokens per step to
    measure for the multi-token and
    prompt-lookup modes (default: the generation config's num_predict_heads). thresholds: draft-confidence thresholds
    and lookups: context-lookup n-gram sizes of the verified modes (default: the
    generation config's); datastores: draft datastore on / off (True / False) of the multi-token modes (default: the
    model's default); tree_sizes: draft tree sizes of the verified greedy mode (default: the generation config's).
    Returns a JSON-ready dict.
    """
    default_k = getattr(model.generation_config, "num_predict_heads", None) or model.config.num_heads
    ks = list(ks or [default_k])
    config = model.generation_config
    thresholds = list(thresholds or [getattr(config, "draft_confidence_threshold", None) or 0.0])
    lookups = list(lookups or [getattr(config, "draft_lookup_ngram", None) or 0])
    tree_sizes = list(tree_sizes or [getattr(config, "draft_tree_size", None) or 0])
    runs = benchmark_runs(modes, ks, thresholds, lookups, list(datastores or [None]), tree_sizes)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be a whole number >= 1 (rounds per prompt).")
    if warmup:  # one-time costs (allocator growth, kernel choice) land outside the timing
        for mode, k, threshold, lookup, datastore, tree_size in runs:
            run_one(model, prompts[0]["input_ids"], mode=mode, k=k, threshold=threshold, lookup=lookup,
                    datastore=datastore, tree_size=tree_size, max_new_tokens=8)
    records = []
    bar = tqdm(total=len(prompts) * len(runs) * repeats, desc="bench", disable=not progress)
    for index, prompt in enumerate(prompts):
        timed = {}  # variant -> (sequences, [records])
        for round_ in range(repeats):
            shift = (index * repeats + round_) % len(runs)
            for variant in runs[shift:] + runs[:shift]:  # rotate which mode runs first
                mode, k, threshold, lookup, datastore, tree_size = variant
                sequences, record = run_one(model, prompt["input_ids"], mode=mode, k=k, threshold=threshold,
                                            lookup=lookup, datastore=datastore, tree_size=tree_size,
                                            max_new_tokens=max_new_tokens, seed=index, prompt_id=prompt["id"],
                                            kind=prompt["kind"])
                if variant in timed and not torch.equal(timed[variant][0], sequences):
                    raise RuntimeError(
                        f"{variant_label(*variant)} gave two different outputs for prompt {prompt['id']!r} with the "
                        "same seed; repeated rounds must decode the same text (is another process changing the "
                        "thread count?)")
                timed.setdefault(variant, (sequences, []))[1].append(record)
                bar.update()
        outputs = {variant: (sequences, _median_of_runs(records)) for variant, (sequences, records) in timed.items()}
        greedy_sequences, greedy_record = outputs[("greedy", 1, 0.0, 0, None, 0)]
        for (mode, *_), (sequences, record) in outputs.items():
            if mode not in SAMPLING_MODES:
                record.identical = bool(torch.equal(sequences, greedy_sequences))
            records.append(record)
        parted = [(s, r) for (m, *_), (s, r) in outputs.items() if m not in SAMPLING_MODES and not r.identical]
        if parted:
            locate_divergences(model, prompt["input_ids"], greedy_sequences, parted, max_new_tokens)
        verified = [r for (m, *_), (_, r) in outputs.items() if m == "verified"]
        if verified:
            bar.set_postfix(speedup=f"{greedy_record.seconds / verified[0].seconds:.2f}x",
                            tau=f"{verified[0].tokens_per_forward:.2f}")
    bar.close()
    return {"max_new_tokens": max_new_tokens, "repeats": repeats, "sampling": SAMPLING,
            "records": [asdict(r) for r in records], "summary": summarize(records)}


def _spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None


def summarize(records):
    """Per mode / k and per prompt kind: ratios against greedy on the same prompt, acceptance, exact matches."""
    plain = {(r.dtype, r.mode, r.prompt_id): r for r in records if r.mode in ("greedy", "sample")}
    groups = {}
    for record in records:
        for kind in ("all", record.kind):
            groups.setdefault((record.dtype, record.mode, record.k, record.threshold, record.lookup, record.datastore,
                               record.tree_size, kind), []).append(record)
    summary = []
    dtypes = list(dict.fromkeys(r.dtype for r in records))  # in the order they ran

    def order(item):  # dtype, mode, then its settings; the model's default datastore (None) before on / off
        dtype, mode, k, threshold, lookup, datastore, tree_size, kind = item[0]
        return (dtypes.index(dtype), MODES.index(mode), k, threshold, lookup, {None: 0, True: 1, False: 2}[datastore],
                tree_size, kind)

    for (dtype, mode, k, threshold, lookup, datastore, tree_size, kind), group in sorted(groups.items(), key=order):
        base = [plain[(dtype, baseline_mode(mode), r.prompt_id)] for r in group]
        proposed = [sum(r.head_proposed[i] for r in group if len(r.head_proposed) > i)
                    for i in range(max((len(r.head_proposed) for r in group), default=0))]
        accepted = [sum(r.head_accepted[i] for r in group if len(r.head_accepted) > i) for i in range(len(proposed))]
        summary.append({
            "dtype": dtype, "mode": mode, "k": k, "threshold": threshold, "lookup": lookup, "datastore": datastore,
            "tree_size": tree_size, "kind": kind,
            "prompts": len(group),
            "baseline": baseline_mode(mode),
            "tokens_per_s": statistics.median(r.new_tokens / r.seconds for r in group),
            "speedup": _spread([b.seconds / r.seconds * r.new_tokens / max(b.new_tokens, 1) for r, b in zip(group, base)]),
            "ttft_ratio": statistics.median(r.ttft / b.ttft for r, b in zip(group, base)),
            "tpot_ratio": statistics.median(r.tpot / b.tpot for r, b in zip(group, base)),
            "tokens_per_forward": sum(r.new_tokens for r in group) / max(sum(r.forward_passes for r in group), 1),
            "head_acceptance": [a / p if p else 0.0 for a, p in zip(accepted, proposed)],
            "exact_match_rate": (None if mode in SAMPLING_MODES else sum(r.identical for r in group) / len(group)),
            **near_tie_summary(group),
            "memory_mb": max(r.memory_bytes for r in group) / 2**20,
        })
    return summary


def near_tie_summary(group):
    """Of the outputs that parted from plain greedy: how many, how many at a near-tie (greedy's top-two margin at
    most precision.NEAR_TIE_MARGIN), the largest margin and the median rank of the margins (see RunRecord)."""
    margins = [r.divergence_margin for r in group if r.divergence_margin is not None]
    return {"diverged": len(margins), "diverged_at_near_tie": sum(m <= NEAR_TIE_MARGIN for m in margins),
            "max_divergence_margin": max(margins) if margins else None,
            "median_divergence_rank": statistics.median(r.divergence_rank for r in group
                                                        if r.divergence_rank is not None) if margins else None}


def variant_label(mode, k, threshold=0.0, lookup=0, datastore=None, tree_size=0):
    label = mode if mode in ("greedy", "sample") else f"{mode} k={k}"
    return (label + (f" t={threshold:g}" if threshold else "") + (f" lookup={lookup}" if lookup else "")
            + ("" if datastore is None else f" datastore={'on' if datastore else 'off'}")
            + (f" tree={tree_size}" if tree_size else ""))


def markdown_table(summary):
    """One row per dtype, mode, settings and prompt kind; each against the plain mode of its own dtype."""
    lines = ["| dtype | mode | prompts | speedup vs plain (median [min, max]) | TTFT ratio | TPOT ratio "
             "| tokens / forward | head acceptance | identical to greedy | diverged at a near-tie (largest margin) "
             "| memory (MB) |", "|" + "---|" * 11]
    for row in summary:
        s = row["speedup"]
        acceptance = " / ".join(f"{a:.2f}" for a in row["head_acceptance"]) or "-"
        identical = "-" if row["exact_match_rate"] is None else f"{row['exact_match_rate']:.0%}"
        diverged = row.get("diverged") or 0
        near_ties = (f"{row['diverged_at_near_tie']}/{diverged} ({row['max_divergence_margin']:.3f})" if diverged
                     else "-")
        label = variant_label(row["mode"], row["k"], row.get("threshold", 0.0), row.get("lookup", 0),
                              row.get("datastore"), row.get("tree_size", 0))
        lines.append(
            f"| {row.get('dtype', '')} | {label} ({row['kind']}) | {row['prompts']} | {s['median']:.2f}x [{s['min']:.2f}, {s['max']:.2f}] vs "
            f"{row.get('baseline', 'greedy')} | {row['ttft_ratio']:.2f} | {row['tpot_ratio']:.2f} | "
            f"{row['tokens_per_forward']:.2f} | {acceptance} | {identical} | {near_ties} | {row['memory_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


# --- batches ------------------------------------------------------------------------------------------------------
def left_pad(input_ids, pad_token_id):
    """[1, T_i] prompts -> (input_ids [B, T], attention_mask [B, T]), left-padded as decoder-only generation wants."""
    width = max(ids.shape[1] for ids in input_ids)
    batch = input_ids[0].new_full((len(input_ids), width), pad_token_id)
    mask = torch.zeros_like(batch)
    for i, ids in enumerate(input_ids):
        batch[i, width - ids.shape[1]:] = ids[0]
        mask[i, width - ids.shape[1]:] = 1
    return batch, mask


def _new_token_count(sequences, prompt_width, pad_token_id, eos_token_ids):
    """New tokens per row up to and including its EOS (the padding after it is not output)."""
    total = 0
    for row in sequences[:, prompt_width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos_token_ids), len(row))
        total += end
    return total


@torch.inference_mode()
def run_batched_benchmark(model, prompts, *, batch_sizes=(1, 4, 16), k=None, max_new_tokens=128, repeats=1,
                          progress=True):
    """
    Throughput of plain batched greedy `generate()` and batched verified multi-token decoding at each batch size, on
    the first `batch_size` prompts (cycled if there are fewer), interleaved, after a warm-up. Every row of the
    multi-token output is checked against the plain batched output.
    """
    config = model.generation_config
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    pad = pad[0] if isinstance(pad, list) else pad
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    k = k or getattr(config, "num_predict_heads", None) or model.config.num_heads
    modes = {"greedy": {}, "verified": {"multi_token_mode": True, "num_predict_heads": k}}
    rows = []
    bar = tqdm(total=len(batch_sizes) * repeats * 2, desc="batched bench", disable=not progress)
    for batch_size in batch_sizes:
        ids, mask = left_pad([prompts[i % len(prompts)]["input_ids"] for i in range(batch_size)], pad)
        for kwargs in modes.values():  # warm-up at this batch shape
            model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=pad, **kwargs)
        seconds = {name: [] for name in modes}
        outputs = {}
        for repeat in range(repeats):
            for name in (list(modes) if repeat % 2 == 0 else list(modes)[::-1]):
                start = time.perf_counter()
                out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=pad, return_dict_in_generate=True, **modes[name])
                seconds[name].append(time.perf_counter() - start)
                outputs[name] = out
                bar.update()
        plain, ours = outputs["greedy"].sequences, outputs["verified"].sequences
        tokens = _new_token_count(plain, ids.shape[1], pad, eos)
        plain_s, ours_s = statistics.median(seconds["greedy"]), statistics.median(seconds["verified"])
        stats = outputs["verified"].multi_token_stats
        rows.append({
            "batch_size": batch_size, "k": k, "new_tokens": tokens,
            "greedy_tokens_per_s": tokens / plain_s, "verified_tokens_per_s": tokens / ours_s,
            "speedup": plain_s / ours_s, "forward_passes": stats.forward_passes,
            "tokens_per_forward_per_row": stats.new_tokens / max(stats.forward_passes, 1) / batch_size,
            "head_acceptance": stats.head_acceptance,
            "identical_rows": int(sum(torch.equal(a, b) for a, b in zip(ours, plain))),
        })
    bar.close()
    return rows


def batched_markdown_table(rows):
    lines = ["| batch size | k | plain greedy tokens/s | verified tokens/s | speedup | tokens / forward / row "
             "| head acceptance | rows identical to plain batched greedy |", "|" + "---|" * 8]
    for row in rows:
        acceptance = " / ".join(f"{a:.2f}" for a in row["head_acceptance"]) or "-"
        lines.append(f"| {row['batch_size']} | {row['k']} | {row['greedy_tokens_per_s']:.1f} | "
                     f"{row['verified_tokens_per_s']:.1f} | {row['speedup']:.2f}x | "
                     f"{row['tokens_per_forward_per_row']:.2f} | {acceptance} | "
                     f"{row['identical_rows']}/{row['batch_size']} |")
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
    markdown = markdown_table(result["summary"])
    if result.get("batched"):
        markdown += "\n" + batched_markdown_table(result["batched"])
    (output_dir / "bench.md").write_text(markdown)
    records = result["records"]
    key = lambda r: (r.get("dtype", ""), r["mode"], r["k"], r.get("threshold", 0.0), r.get("lookup", 0),  # noqa: E731
                     r.get("datastore"), r.get("tree_size", 0))
    dtypes = list(dict.fromkeys(r.get("dtype", "") for r in records))
    multi = sorted({key(r) for r in records if r["mode"] not in ("greedy", "sample")},
                   key=lambda v: (dtypes.index(v[0]), MODES.index(v[1])))

    def label(variant):
        return (f"{variant[0]} " if len(dtypes) > 1 else "") + variant_label(*variant[1:])

    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in multi:
        row = next(s for s in result["summary"] if (*key(s), s["kind"]) == (*variant, "all"))
        if row["head_acceptance"]:
            ax.plot(range(1, len(row["head_acceptance"]) + 1), row["head_acceptance"], marker="o",
                    label=label(variant))
    ax.set(xlabel="head i (drafts token t+1+i)", ylabel="acceptance rate", title="Per-head acceptance", ylim=(0, 1))
    ax.legend()
    fig.savefig(output_dir / "head_acceptance.png", dpi=120, bbox_inches="tight")

    fig, ax = plt.subplots(figsize=(max(7, len(records) / 6), 4))
    plain = {(r.get("dtype", ""), r["mode"], r["prompt_id"]): r for r in records if r["mode"] in ("greedy", "sample")}
    prompt_ids = list(dict.fromkeys(p for _, m, p in plain if m == "greedy"))
    width = 0.8 / max(len(multi), 1)
    for j, variant in enumerate(multi):
        by_prompt = {r["prompt_id"]: r for r in records if key(r) == variant}
        ratios = []
        for p in prompt_ids:
            r, b = by_prompt[p], plain[(variant[0], baseline_mode(variant[1]), p)]
            ratios.append(b["seconds"] / r["seconds"] * r["new_tokens"] / max(b["new_tokens"], 1))
        ax.bar([i + j * width for i in range(len(prompt_ids))], ratios, width, label=label(variant))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(prompt_ids))], prompt_ids, rotation=60, ha="right")
    ax.set(ylabel="tokens/s vs plain (greedy or sampling)", title="Speedup per prompt")
    ax.legend()
    fig.savefig(output_dir / "speedup_per_prompt.png", dpi=120, bbox_inches="tight")

    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in multi:
        steps = [n for r in records if key(r) == variant for n in r["accepted_per_step"]]
        if steps:
            ax.hist(steps, bins=range(1, max(steps) + 2), alpha=0.6, align="left", label=label(variant))
    ax.set(xlabel="tokens accepted per verify pass", ylabel="steps", title="Tokens per forward pass")
    ax.legend()
    fig.savefig(output_dir / "tokens_per_forward.png", dpi=120, bbox_inches="tight")
    plt.close("all")
    return output_dir
