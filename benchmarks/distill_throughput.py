"""How fast the base model writes training answers: `generate()` (`self_distill`, left-padded batches) per dtype and
batch size, and vLLM (`distill_engine: vllm`, `VLLMDistiller`) per dtype.

The same real prompts (ShareGPT openings and HumanEval, `mixed_prompts`) are answered in each setting, the settings
interleaved round by round after a warm-up; reported: answer tokens per second (median of the rounds) and how many
answers are token for token the first setting's. vLLM's time is the whole worker call, its start-up (about 30 s)
included, as training pays it once per cache chunk. Needs pip install 'transformers-mtp[data]', and for the vLLM
settings TRANSFORMERS_MTP_VLLM_PYTHON (docs/training.md).

    python benchmarks/distill_throughput.py --num-prompts 32 --max-new-tokens 96
    TRANSFORMERS_MTP_VLLM_PYTHON=vllm-venv/bin/python python benchmarks/distill_throughput.py --num-prompts 512 \\
        --max-new-tokens 160 --rounds 1 --settings transformers:bfloat16:16 vllm:float32 vllm:bfloat16
"""

import argparse
import json
import platform
import statistics
import time

import torch

import transformers_mtp
from transformers_mtp.training.data import self_distill
from transformers_mtp.training.real_prompts import mixed_prompts
from transformers_mtp.training.vllm_distill import VLLMDistiller


def parse_setting(text):
    """'transformers:DTYPE:BATCH' or 'vllm:DTYPE' -> (engine, dtype, batch)."""
    parts = text.split(":")
    if parts[0] == "transformers" and len(parts) == 3:
        return "transformers", parts[1], int(parts[2])
    if parts[0] == "vllm" and len(parts) == 2:
        return "vllm", parts[1], None
    raise argparse.ArgumentTypeError(f"{text!r}: write transformers:DTYPE:BATCH or vllm:DTYPE")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settings", nargs="+", type=parse_setting,
                        default=[parse_setting(s) for s in ("transformers:float32:16", "transformers:bfloat16:16",
                                                            "transformers:bfloat16:32")])
    parser.add_argument("--output", help="write the figures as JSON here")
    args = parser.parse_args()
    prompts = [p["prompt"] for p in mixed_prompts(["sharegpt", "humaneval"], limit=args.num_prompts)]
    writers = {}
    for engine, dtype, batch in args.settings:
        model, tokenizer = transformers_mtp.load_default_base(dtype="float32" if engine == "vllm" else dtype)
        if engine == "vllm":
            writer = VLLMDistiller(model.eval(), tokenizer, dtype=getattr(torch, dtype))
            writers[(engine, dtype, batch)] = lambda w=writer: w(prompts, max_new_tokens=args.max_new_tokens,
                                                                 progress=False)
        else:
            model = model.eval()
            self_distill(model, tokenizer, prompts[:batch], max_new_tokens=4, batch_size=batch, progress=False)
            writers[(engine, dtype, batch)] = lambda m=model, b=batch: self_distill(
                m, tokenizer, prompts, max_new_tokens=args.max_new_tokens, batch_size=b, progress=False)
    rates, answers = {s: [] for s in args.settings}, {}
    for _ in range(args.rounds):
        for setting in args.settings:
            start = time.perf_counter()
            out = writers[setting]()
            seconds = time.perf_counter() - start
            rates[setting].append(sum(len(s["input_ids"]) - s["prompt_length"] for s in out) / seconds)
            answers[setting] = out
    def name(setting):
        return ":".join(str(part) for part in setting if part is not None)

    first = args.settings[0]
    machine = f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    print(f"{machine}, {args.num_prompts} prompts, {args.max_new_tokens} new tokens at most, "
          f"median of {args.rounds} round(s)")
    report = []
    for setting in args.settings:
        rate = statistics.median(rates[setting])
        # answers compared with generate()'s in the same dtype (the first such setting), else with the first setting's
        reference = next((s for s in args.settings if s[0] == "transformers" and s[1] == setting[1]), first)
        same = sum(a["input_ids"] == b["input_ids"] for a, b in zip(answers[setting], answers[reference]))
        print(f"{name(setting):>26}: {rate:6.1f} answer tokens/s ({rate / statistics.median(rates[first]):.2f}x "
              f"{name(first)}), {same}/{args.num_prompts} answers identical to {name(reference)}'s")
        report.append({"setting": name(setting), "answer_tokens_per_s": rate, "rounds": rates[setting],
                       "identical_answers": same, "compared_with": name(reference)})
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"machine": machine, "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
                       "settings": report}, f, indent=2)


if __name__ == "__main__":
    main()
