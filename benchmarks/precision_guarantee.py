"""What reduced precision does to "the text of plain greedy": where outputs part, how close a call it was, and whether
the text got any worse.

The embedded default model and its shipped heads, the benchmark prompts, 128 new tokens, 2 threads. For each dtype
(default: bfloat16), per prompt: plain greedy of that dtype (keeping its logits), verified multi-token decoding at the
shipped defaults and transformers' prompt-lookup decoding. Reported:

- how many outputs are identical to greedy's;
- for the others, greedy's top-two logit margin at the first token where they part, and the rank of that margin among
  greedy's margins at every position (a near-tie ranks near 0; a defect that changed tokens at random would rank
  anywhere, median about 0.5);
- every emitted token is the argmax of the logits of the pass that verified it (checked, for our mode);
- quality: teacher-forced in one float32 pass, the fraction of new tokens that are the float32 model's own argmax and
  their mean float32 log-likelihood, for greedy's, our and prompt lookup's outputs.

    python benchmarks/precision_guarantee.py [--dtype bfloat16] [--limit N] [--output results.json]
"""

import argparse
import json
import statistics

import torch

import transformers_mtp
from transformers_mtp.benchmark import load_prompts
from transformers_mtp.precision import NEAR_TIE_MARGIN, agreement_with, divergence, top2_margins
from transformers_mtp.training.data import chat_input_ids

NEW_TOKENS = 128


@torch.inference_mode()
def measure(model, tokenizer, reference, prompts, *, new_tokens=NEW_TOKENS):
    rows = []
    for prompt in prompts:
        ids = chat_input_ids(tokenizer, prompt["prompt"])
        start = ids.shape[1]
        greedy = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True,
                                output_logits=True)
        greedy_logits = torch.cat(greedy.logits)
        ours = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, multi_token_mode=True,
                              return_dict_in_generate=True, output_logits=True)
        verified_argmax = bool(torch.equal(torch.cat(ours.logits).argmax(-1), ours.sequences[0, start:]))
        lookup = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, prompt_lookup_num_tokens=3)
        row = {"id": prompt["id"], "kind": prompt["kind"], "verified_tokens_are_argmax": verified_argmax,
               "greedy_median_margin": float(top2_margins(greedy_logits).median())}
        for name, sequences in (("greedy", greedy.sequences), ("verified", ours.sequences), ("prompt_lookup", lookup)):
            agree, log_likelihood = agreement_with(reference, sequences, start)
            row[name] = {"fp32_argmax_rate": agree, "fp32_log_likelihood": log_likelihood}
            if name != "greedy":
                found = divergence(greedy.sequences[0, start:], greedy_logits, sequences[0, start:])
                row[name]["identical"] = bool(torch.equal(sequences, greedy.sequences))
                row[name]["divergence"] = found.__dict__ if found else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def report(rows):
    lines = []
    for name in ("verified", "prompt_lookup"):
        for kind in ("code", "chat", "all"):
            group = [r for r in rows if kind == "all" or r["kind"] == kind]
            parted = [r[name]["divergence"] for r in group if r[name]["divergence"]]
            margins = [d["margin"] for d in parted]
            lines.append(
                f"{name:13s} {kind:4s}: identical {sum(r[name]['identical'] for r in group)}/{len(group)}; parted at a "
                f"near-tie (margin <= {NEAR_TIE_MARGIN}) {sum(m <= NEAR_TIE_MARGIN for m in margins)}/{len(parted)}; "
                f"margin there max {max(margins, default=0):.3f}, median {statistics.median(margins or [0]):.3f}; "
                f"its rank median {statistics.median([d['rank'] for d in parted] or [0]):.3f}; fp32 argmax rate "
                f"{statistics.mean(r[name]['fp32_argmax_rate'] for r in group):.3f} vs greedy "
                f"{statistics.mean(r['greedy']['fp32_argmax_rate'] for r in group):.3f}; fp32 log-likelihood per "
                f"token {statistics.mean(r[name]['fp32_log_likelihood'] for r in group):.3f} vs greedy "
                f"{statistics.mean(r['greedy']['fp32_log_likelihood'] for r in group):.3f}")
    lines.append(f"greedy's median top-two margin over all positions: "
                 f"{statistics.median(r['greedy_median_margin'] for r in rows):.3f}; every verified token the argmax "
                 f"of its verify pass: {all(r['verified_tokens_are_argmax'] for r in rows)}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--output", default=None, help="write the per-prompt rows and the report here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer = transformers_mtp.load_default(dtype=getattr(torch, args.dtype))
    reference, _ = transformers_mtp.load_default_base()  # float32
    rows = measure(model, tokenizer, reference, load_prompts()[: args.limit])
    text = report(rows)
    print(text)
    if args.output:
        with open(args.output, "w") as handle:
            json.dump({"dtype": args.dtype, "new_tokens": NEW_TOKENS, "rows": rows, "report": text}, handle, indent=2)
