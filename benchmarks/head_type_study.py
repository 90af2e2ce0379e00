"""Head-type study on the embedded default model: every head type trained on the same self-distilled data with the
same budget, then measured offline (held-out top-1 agreement per head) and online (tokens per forward pass and
speed against plain greedy on benchmark prompts, which the training prompts never reuse).

    python benchmarks/head_type_study.py --epochs 2 --output-dir outputs/head-type-study

Needs the self-distilled data of the preset (`transformers-mtp train` or this script generates it once into
outputs/smollm2-self-distill.jsonl). Writes results.json and results.md into --output-dir.
"""

import argparse
import json
import time
from pathlib import Path


import transformers_mtp
from transformers_mtp.benchmark import run_benchmark
from transformers_mtp.benchmark import load_prompts
from transformers_mtp.training.data import chat_input_ids
from transformers_mtp.presets import TRAIN_DATA_KEYS, load_preset
from transformers_mtp.training import HeadTrainingConfig, train_heads, training_sequences
from transformers_mtp.training.data import cache_trunk_features, check_sequences

HEAD_TYPES = {  # name -> convert() settings beyond the preset's
    "linear": {"head_type": "linear", "head_input": "feature"},
    "resblock": {"head_type": "resblock", "head_input": "feature"},
    "query_extension": {"head_type": "query_extension", "head_input": "feature"},
    "query_extension+token": {"head_type": "query_extension", "head_input": "feature_and_token"},
    "query_extension+sequential": {"head_type": "query_extension", "head_input": "sequential"},
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--learning-rate", type=float, default=None, help="default: the preset's")
    parser.add_argument("--types", nargs="+", default=list(HEAD_TYPES), choices=list(HEAD_TYPES))
    parser.add_argument("--bench-prompts", type=int, default=8, help="benchmark prompts for the online measure")
    parser.add_argument("--k", type=int, default=3, help="tokens per step for the online measure")
    parser.add_argument("--num-prompts", type=int, default=None, help="default: the preset's (the first prompts "
                        "of the built-in set, so a smaller value reproduces an earlier study's data)")
    parser.add_argument("--output-dir", default="outputs/head-type-study")
    args = parser.parse_args()

    preset = load_preset(args.preset)
    settings = dict(preset["train"], num_train_epochs=args.epochs)
    if args.num_prompts is not None:
        settings["num_prompts"] = args.num_prompts
    if args.learning_rate is not None:
        settings["learning_rate"] = args.learning_rate
    head_settings = {k: v for k, v in preset.items() if k not in ("base", "train")}
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    base, tokenizer = transformers_mtp.load_default_base()
    base.eval()
    sequences = check_sequences(training_sequences(base, tokenizer, settings),
                                num_heads=head_settings["num_heads"], vocab_size=base.config.vocab_size)
    probe = transformers_mtp.convert(base, **head_settings)
    start = time.perf_counter()
    features = cache_trunk_features(probe, sequences, all_features=True)
    cache_minutes = (time.perf_counter() - start) / 60
    bench = load_prompts()
    code, chat = [p for p in bench if p["kind"] == "code"], [p for p in bench if p["kind"] == "chat"]
    half = args.bench_prompts // 2
    prompts = [dict(p, input_ids=chat_input_ids(tokenizer, p["prompt"])) for p in code[:half] + chat[:half]]

    results = {"cache_minutes": cache_minutes, "sequences": len(sequences),
               "response_tokens": sum(len(s["input_ids"]) - s["prompt_length"] for s in sequences),
               "epochs": args.epochs, "learning_rate": settings["learning_rate"], "k": args.k, "types": {}}
    for name in args.types:
        model = transformers_mtp.convert(base, **{**head_settings, **HEAD_TYPES[name]})
        config = HeadTrainingConfig(output_dir=str(output_dir / name), overwrite=True,
                                    **{k: v for k, v in settings.items() if k not in TRAIN_DATA_KEYS})
        start = time.perf_counter()
        merged, metrics = train_heads(model, sequences, config, tokenizer=tokenizer, features=features)
        train_minutes = (time.perf_counter() - start) / 60
        merged.generation_config.num_predict_heads = args.k
        online = run_benchmark(merged, prompts, modes=("verified",), ks=[args.k], max_new_tokens=128)
        rows = {(r["mode"], r["kind"]): r for r in online["summary"]}
        results["types"][name] = {
            "train_minutes": train_minutes,
            "trainable_parameters": sum(p.numel() for p in merged.mtp_heads.parameters()),
            "agreement": [metrics[k] for k in sorted(metrics) if k.startswith("eval_agree_head")],
            "online": {kind: {"tokens_per_forward": rows[("verified", kind)]["tokens_per_forward"],
                              "speedup": rows[("verified", kind)]["speedup"]["median"],
                              "head_acceptance": rows[("verified", kind)]["head_acceptance"],
                              "identical": rows[("verified", kind)]["exact_match_rate"]}
                       for kind in ("code", "chat", "all")},
        }
        (output_dir / "results.json").write_text(json.dumps(results, indent=2))
        print(json.dumps({name: results["types"][name]}, indent=2), flush=True)

    lines = [f"Same data ({results['sequences']} self-distilled sequences, {results['response_tokens']} response "
             f"tokens), {args.epochs} epochs at learning rate {settings['learning_rate']} each; online: k={args.k}, {len(prompts)} benchmark prompts, 128 new "
             "tokens, fp32 CPU.", "",
             "| head type | held-out top-1 agreement, heads 1/2/3 | tokens per forward (code / chat) | speed vs greedy "
             "(code / chat) | identical | train minutes |", "|---|---|---|---|---|---|"]
    for name, r in results["types"].items():
        on = r["online"]
        lines.append(f"| {name} | {' / '.join(f'{a:.3f}' for a in r['agreement'])} | "
                     f"{on['code']['tokens_per_forward']:.2f} / {on['chat']['tokens_per_forward']:.2f} | "
                     f"{on['code']['speedup']:.2f}x / {on['chat']['speedup']:.2f}x | {on['all']['identical']:.0%} | "
                     f"{r['train_minutes']:.1f} |")
    (output_dir / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
