"""Our own chain drafting with the heads alone (no context lookup, no datastore, no tree) on the benchmark prompts:
tokens kept per verify pass and acceptance by draft position, the figures vLLM's speculative-decoding counters give
(`benchmarks/vllm_serving.py`), so that an export can be checked against the model it came from.

    python benchmarks/chain_acceptance.py default                       # the shipped heads
    python benchmarks/chain_acceptance.py runs/smollm2-chained/merged --num-predict-heads 5 --output ours.json

Every output is checked against plain greedy (float32: identical token for token).
"""

import argparse
import json
from pathlib import Path

import torch

from transformers_mtp.cli import load_model_and_tokenizer
from transformers_mtp.training.data import chat_input_ids

PROMPTS = Path(__file__).resolve().parent.parent / "transformers_mtp" / "bench_prompts.jsonl"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="converted checkpoint folder, or 'default'")
    parser.add_argument("--num-predict-heads", type=int, default=None, help="k: drafts per pass + 1 (default: the model's)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    model, tokenizer = load_model_and_tokenizer(None if args.model == "default" else args.model)
    prompts = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()][: args.limit]
    kept, accepted, identical = {}, None, 0
    for prompt in prompts:
        ids = chat_input_ids(tokenizer, prompt["prompt"])
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, multi_token_mode=True,
                                 num_predict_heads=args.num_predict_heads, draft_tree_size=0, draft_lookup_ngram=0,
                                 draft_datastore=False, return_dict_in_generate=True)
            greedy = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
        identical += int(torch.equal(out.sequences, greedy))
        stats = out.multi_token_stats
        kept.setdefault(prompt["kind"], []).extend(stats.accepted_per_step)
        counts = torch.tensor(stats.head_accepted, dtype=torch.float64)
        accepted = counts if accepted is None else accepted + counts
    passes = [n for values in kept.values() for n in values]
    report = {"model": args.model, "prompts": len(prompts), "identical_to_greedy": identical,
              "mean_kept_per_verify": sum(passes) / len(passes),
              "mean_kept_per_verify_by_kind": {kind: sum(v) / len(v) for kind, v in kept.items()},
              # accepted at draft position j / verify passes: vLLM's accepted_per_pos / num_drafts
              "acceptance_per_position": (accepted / len(passes)).tolist()}
    print(json.dumps(report, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
