"""Which trained heads draft best? Tokens per forward pass and per-head acceptance of several head adapters (as
`transformers-mtp train` writes them into OUTPUT_DIR/adapter) on the 16 benchmark prompts, greedy verified decoding
at 128 new tokens, with and without context lookup (and the draft datastore), drafting a chain or a tree of
candidates per step (`--tree-sizes`); every output is checked against plain greedy.

Tokens per forward depend on the heads and the prompts only, not on the machine's load, so this compares heads
cheaply; speed is measured by `transformers-mtp bench` on the heads it picks.

    python benchmarks/compare_heads.py transformers_mtp/default_heads runs/smollm2/adapter --lookups 0 3
    python benchmarks/compare_heads.py transformers_mtp/default_heads --k 4 --lookups 3 --tree-sizes 0 8 16
"""

import argparse
import json
from pathlib import Path

import torch

import transformers_mtp
from transformers_mtp.benchmark import load_prompts
from transformers_mtp.training.data import chat_input_ids
from transformers_mtp.default_model import DEFAULT_HEADS_SETTINGS
from transformers_mtp.training import load_trained_heads


@torch.inference_mode()
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapters", nargs="+", help="adapter folders (with multi_token.json)")
    parser.add_argument("--lookups", nargs="+", type=int, default=[0, 3], help="draft_lookup_ngram values")
    parser.add_argument("--datastore", nargs="+", choices=["on", "off"], default=["on"],
                        help="draft datastore on / off (adapters that have one; others always run without)")
    parser.add_argument("--k", type=int, default=None, help="num_predict_heads (default: each adapter's)")
    parser.add_argument("--tree-sizes", nargs="+", type=int, default=[0],
                        help="draft_tree_size values (0: one chain of drafts per step)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--output", default=None, help="also write the results as JSON here")
    args = parser.parse_args()

    base, tokenizer = transformers_mtp.load_default_base()
    prompts = [dict(p, input_ids=chat_input_ids(tokenizer, p["prompt"])) for p in load_prompts()]
    greedy = [base.generate(p["input_ids"], max_new_tokens=args.max_new_tokens, do_sample=False) for p in prompts]
    results = []
    for folder in args.adapters:
        settings = json.loads((Path(folder) / DEFAULT_HEADS_SETTINGS).read_text())
        model = load_trained_heads(transformers_mtp.convert(base, **settings), folder).eval()
        has_datastore = settings.get("draft_datastore_size") is not None
        variants = [(n, d, t) for n in args.lookups for d in (args.datastore if has_datastore else ["off"])
                    for t in args.tree_sizes]
        for lookup, datastore, tree_size in variants:
            design = settings["head_type"] if settings["head_type"] == "chained" else settings["head_input"]
            row = {"adapter": folder, "head_input": design, "lookup": lookup, "datastore": datastore,
                   "tree_size": tree_size, "k": args.k or settings["num_predict_heads"]}
            for kind in ("code", "chat"):
                tokens = forwards = identical = 0
                proposed, accepted = [0] * 8, [0] * 8
                for prompt, expected in zip(prompts, greedy):
                    if prompt["kind"] != kind:
                        continue
                    out = model.generate(prompt["input_ids"], max_new_tokens=args.max_new_tokens, do_sample=False,
                                         multi_token_mode=True, num_predict_heads=row["k"],
                                         draft_lookup_ngram=lookup, draft_datastore=datastore == "on" and has_datastore,
                                         draft_tree_size=tree_size,
                                         return_dict_in_generate=True)
                    stats = out.multi_token_stats
                    tokens, forwards = tokens + stats.new_tokens, forwards + stats.forward_passes
                    identical += int(torch.equal(out.sequences, expected))
                    for j, (p, a) in enumerate(zip(stats.head_proposed, stats.head_accepted)):
                        proposed[j], accepted[j] = proposed[j] + p, accepted[j] + a
                row[kind] = {"tokens_per_forward": tokens / forwards, "identical": identical,
                             "head_acceptance": [a / p for a, p in zip(accepted, proposed) if p]}
            results.append(row)
            print(json.dumps(row), flush=True)
    print("\n| heads | k | lookup | datastore | tree size | tokens per forward, code / chat | head acceptance, code "
          "| head acceptance, chat | identical |\n|---|---|---|---|---|---|---|---|---|")
    for row in results:
        code, chat = row["code"], row["chat"]
        print(f"| {row['adapter']} ({row['head_input']}) | {row['k']} | {row['lookup']} | {row['datastore']} | "
              f"{row['tree_size']} | {code['tokens_per_forward']:.2f} / "
              f"{chat['tokens_per_forward']:.2f} | {' / '.join(f'{a:.2f}' for a in code['head_acceptance'])} | "
              f"{' / '.join(f'{a:.2f}' for a in chat['head_acceptance'])} | "
              f"{code['identical'] + chat['identical']} / {len(prompts)} |")
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
