"""Float32 `linear` on this CPU: torch's default kernel (MKL on x86 builds) against oneDNN's, for SmolLM2's weight
shapes and the row counts of a verify pass (generation_onednn.py decides from these figures which products to
route). Weights are hot in cache, as in a decode loop that reuses them; medians of repeated calls.

    python benchmarks/linear_kernels.py [--rows 1 2 3 5 9 17 40] [--output results/linear_kernels.json]
"""

import argparse
import json
import statistics
import time

import torch

from transformers_mtp.generation_onednn import onednn_float32_linear, onednn_linear_unavailable

SHAPES = [(49152, 576), (1536, 576), (576, 1536), (576, 576), (192, 576)]  # SmolLM2: lm_head, up / gate, down, q / o, k / v


def microseconds(function, calls=200, rounds=5):
    for _ in range(10):
        function()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 5, 9, 17, 40])
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    reason = onednn_linear_unavailable()
    if reason:
        raise SystemExit(f"oneDNN float32 linear is unavailable here: {reason}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| weight (out x in) | rows | torch default (us) | oneDNN (us) | default / oneDNN | max abs difference |")
    print("|---|---|---|---|---|---|")
    results = []
    generator = torch.Generator().manual_seed(0)
    for out_features, in_features in SHAPES:
        weight = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
        calls = max(10, min(200, 300_000_000 // weight.numel()))  # about the same time per shape
        for rows in args.rows:
            x = torch.randn(rows, in_features, generator=generator)
            with torch.no_grad():
                default = microseconds(lambda: torch.nn.functional.linear(x, weight), calls)
                onednn = microseconds(lambda: onednn_float32_linear(x, weight), calls)
                difference = float((torch.nn.functional.linear(x, weight) - onednn_float32_linear(x, weight))
                                   .abs().max())
            results.append({"weight": [out_features, in_features], "rows": rows, "default_us": default,
                            "onednn_us": onednn, "max_abs_difference": difference})
            print(f"| {out_features} x {in_features} | {rows} | {default:.1f} | {onednn:.1f} | {default / onednn:.2f} "
                  f"| {difference:.1e} |")
    if args.output:
        with open(args.output, "w") as handle:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "results": results}, handle,
                      indent=1)


if __name__ == "__main__":
    main()
