"""How many tokens should a step copy from the context? Plain greedy against verified multi-token decoding with
`draft_lookup_num_tokens` = 2 (the default at k = 3), 4 and 5, on the 16 benchmark prompts, 128 new tokens,
interleaved in one process after a warm-up; every output is checked against greedy.

    python benchmarks/lookup_length.py
"""

import statistics
import time

import torch

import transformers_mtp
from transformers_mtp.benchmark import load_prompts
from transformers_mtp.training.data import chat_input_ids

VARIANTS = {
    "greedy": {},
    "lookup 2": dict(multi_token_mode=True, draft_lookup_num_tokens=2),
    "lookup 4": dict(multi_token_mode=True, draft_lookup_num_tokens=4),
    "lookup 5": dict(multi_token_mode=True, draft_lookup_num_tokens=5),
}


@torch.inference_mode()
def main():
    model, tokenizer = transformers_mtp.load_default()
    ratios = {name: {"code": [], "chat": []} for name in VARIANTS}
    tokens_per_forward = {name: {"code": [], "chat": []} for name in VARIANTS}
    warm = chat_input_ids(tokenizer, "Hi")
    for kwargs in VARIANTS.values():
        model.generate(warm, max_new_tokens=8, do_sample=False, **kwargs)
    for index, prompt in enumerate(load_prompts()):
        ids = chat_input_ids(tokenizer, prompt["prompt"])
        names = list(VARIANTS)
        names = names[index % len(names):] + names[: index % len(names)]  # rotate which runs first
        seconds, outputs = {}, {}
        for name in names:
            start = time.perf_counter()
            outputs[name] = model.generate(ids, max_new_tokens=128, do_sample=False, return_dict_in_generate=True,
                                           **VARIANTS[name])
            seconds[name] = time.perf_counter() - start
        for name in VARIANTS:
            assert torch.equal(outputs[name].sequences, outputs["greedy"].sequences), (prompt["id"], name)
            ratios[name][prompt["kind"]].append(seconds["greedy"] / seconds[name])
            stats = getattr(outputs[name], "multi_token_stats", None)
            if stats is not None:
                tokens_per_forward[name][prompt["kind"]].append(stats.tokens_per_forward)
    print("| variant | tokens/s vs greedy, median (code / chat) | tokens per forward, mean (code / chat) |")
    print("|---|---|---|")
    for name in VARIANTS:
        speed = " / ".join(f"{statistics.median(ratios[name][kind]):.2f}x" for kind in ("code", "chat"))
        tau = " / ".join(f"{statistics.mean(tokens_per_forward[name][kind]):.2f}" if tokens_per_forward[name][kind]
                         else "1.00" for kind in ("code", "chat"))
        print(f"| {name} | {speed} | {tau} |")


if __name__ == "__main__":
    main()
