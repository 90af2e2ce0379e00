"""How long loading the embedded default model takes: reading its GGUF file (what every load did before the cache)
against loading the dequantized copy that `load_default_base` caches, interleaved in one process.

    python benchmarks/default_model_load.py [--rounds 2]

The cached copy is written to a temporary folder (TRANSFORMERS_MTP_CACHE), so the user's cache is not touched.
"""

import argparse
import os
import shutil
import tempfile
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="mtp-load-bench-")
    os.environ["TRANSFORMERS_MTP_CACHE"] = cache
    from transformers import AutoTokenizer

    import transformers_mtp
    from transformers_mtp.conversion import load_base_model
    from transformers_mtp.default_model import default_gguf_path

    try:
        path = default_gguf_path()
        transformers_mtp.load_default_base()  # writes the cached copy (and warms the imports)
        gguf, cached = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            load_base_model(path)
            gguf.append(time.perf_counter() - start)
            start = time.perf_counter()
            transformers_mtp.load_default_base()
            cached.append(time.perf_counter() - start)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{torch.get_num_threads()} threads; seconds per load, each round: GGUF file "
          f"{' / '.join(f'{t:.1f}' for t in gguf)}, cached copy {' / '.join(f'{t:.1f}' for t in cached)}; "
          f"{min(gguf) / min(cached):.0f}x faster (best of each)")


if __name__ == "__main__":
    main()
