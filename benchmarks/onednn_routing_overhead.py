"""What routing float32 products to oneDNN costs per trunk pass, by how it is done: nothing routed, the per-layer
router of generation_onednn.py (`OneDNNLinear`), and a `TorchFunctionMode` doing the same routing (the first design,
kept here only as the comparison). One SmolLM2 pass (the unembedding of every row included) over 1 and 9 new tokens on
a cache holding a short prompt, the variants interleaved, medians.

    python benchmarks/onednn_routing_overhead.py [--rounds 25]
"""

import argparse
import contextlib
import statistics
import time

import torch
from torch.overrides import TorchFunctionMode

from transformers_mtp.cli import load_model_and_tokenizer
from transformers_mtp.generation_onednn import MIN_ROWS, MIN_WEIGHT_NUMEL, OneDNNLinear, onednn_float32_linear


class RoutingMode(TorchFunctionMode):
    """Every float32 `linear` of MIN_ROWS rows or more with MIN_WEIGHT_NUMEL weights or more to oneDNN."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if weight.numel() >= MIN_WEIGHT_NUMEL and x.numel() // x.shape[-1] >= MIN_ROWS:
                return onednn_float32_linear(x, weight, bias)
        return func(*args, **kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model, tokenizer = load_model_and_tokenizer(None, dtype=torch.float32)
    cache = model(tokenizer("def fib(n):\n    return", return_tensors="pt").input_ids, use_cache=True).past_key_values

    def one_pass(rows, context):
        length = cache.get_seq_length()
        with context:
            model(torch.randint(0, 1000, (1, rows)), cache=cache, use_cache=True)
        cache.crop(length - cache.get_seq_length())  # back to the prompt

    variants = {"plain": contextlib.nullcontext, "per-layer router, nothing routed":
                lambda: OneDNNLinear(model, min_weight_numel=2**62), "per-layer router": lambda: OneDNNLinear(model),
                "TorchFunctionMode": RoutingMode}
    for rows in (1, 9):
        seconds = {name: [] for name in variants}
        for round_ in range(args.rounds + 3):  # 3 warm-up rounds
            for name, make in variants.items():
                context = make()
                start = time.perf_counter()
                one_pass(rows, context)
                if round_ >= 3:
                    seconds[name].append(time.perf_counter() - start)
        print(f"{rows} new token(s): " + ", ".join(f"{name} {statistics.median(s) * 1000:.1f} ms"
                                                  for name, s in seconds.items()), flush=True)


if __name__ == "__main__":
    main()
