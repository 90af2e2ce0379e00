"""A learning-rate probe for a preset's heads: the first N answers of its cache, trunk features cached once, then a short
run per learning rate from the same fresh heads; prints the held-out top-1 agreement of each head per rate.

    python benchmarks/lr_probe.py configuration/smollm2-135m-chained.yaml --sequences 256 --steps 120 --lrs 1e-3 2e-3 5e-3

Reads the answers the preset's `data_cache` already holds (never generates them). Short runs favour larger rates, so
this only rules rates out (a diverging or stalled one); the winner is still checked by the full run.
"""

import argparse
import copy
import json
import tempfile
from pathlib import Path

import torch

import transformers_mtp
from transformers_mtp.presets import load_preset
from transformers_mtp.training import HeadTrainingConfig, train_heads
from transformers_mtp.training.data import cache_trunk_features, check_sequences


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset")
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 2e-3, 5e-3])
    args = parser.parse_args()

    preset = load_preset(args.preset)
    train = preset["train"]
    lines = Path(train["data_cache"]).read_text().splitlines()[: args.sequences]
    sequences = [json.loads(line) for line in lines]
    base, _ = transformers_mtp.load_default_base()
    head_settings = {k: v for k, v in preset.items() if k not in ("base", "train")}
    model = transformers_mtp.convert(base, **head_settings)
    usable = check_sequences(sequences, num_heads=model.config.num_heads, vocab_size=model.config.vocab_size)
    features = cache_trunk_features(model, usable)
    fresh = copy.deepcopy(model.mtp_heads.state_dict())
    results = {}
    for lr in args.lrs:
        model.mtp_heads.load_state_dict(fresh)
        with tempfile.TemporaryDirectory() as output_dir:
            config = HeadTrainingConfig(output_dir=output_dir, learning_rate=lr, max_steps=args.steps,
                                        per_device_train_batch_size=train.get("per_device_train_batch_size", 8),
                                        eval_fraction=0.1, eval_steps=args.steps, save_steps=10 * args.steps,
                                        logging_steps=args.steps, group_by_length=train.get("group_by_length", False))
            trained, metrics = train_heads(copy.deepcopy(model), usable, config, features=features, progress=False)
        results[lr] = {k: v for k, v in metrics.items() if k.startswith("eval_")}
        print(json.dumps({"learning_rate": lr, **results[lr]}), flush=True)
        del trained
    print("\n| learning rate | eval loss | held-out top-1 agreement per head |\n|---|---|---|")
    for lr, metrics in results.items():
        agree = " / ".join(f"{metrics[k]:.3f}" for k in sorted(metrics) if k.startswith("eval_agree_head"))
        print(f"| {lr:g} | {metrics['eval_loss']:.3f} | {agree} |")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
