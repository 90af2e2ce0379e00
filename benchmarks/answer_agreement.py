"""How often a self-distillation cache's answer tokens are the float32 base model's own argmax (teacher-forced).

Answers written in bfloat16 (`distill_dtype: bfloat16`) part from float32 greedy at near-ties; at those positions the
text's next token is not the target the heads learn, and a `feature_and_token` head is fed a token that float32
decoding would not have produced. This measures how many positions that is.

    python benchmarks/answer_agreement.py outputs/smollm2-self-distill-real.jsonl [num_answers]
"""

import json
import statistics
import sys

import torch

import transformers_mtp


@torch.inference_mode()
def main():
    path, limit = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 128
    answers = [json.loads(line) for line in open(path) if line.strip()][:limit]
    base, _ = transformers_mtp.load_default_base()
    scored = agreed = whole = 0
    first = []
    for answer in answers:
        ids, start = torch.tensor([answer["input_ids"]]), answer["prompt_length"]
        argmax = base(ids).logits[0].argmax(-1)[start - 1 : -1]  # the float32 choice for each answer token
        same = argmax == ids[0, start:]
        scored, agreed, whole = scored + same.numel(), agreed + int(same.sum()), whole + int(bool(same.all()))
        if not same.all():
            first.append(int((~same).nonzero()[0]))
    print(f"{len(answers)} answers, {scored} answer tokens: the float32 argmax is the text's token at "
          f"{agreed / scored:.4f} of positions; {whole} answers agree everywhere; the first disagreement at token "
          f"{statistics.median(first) if first else '-'} (median)")


if __name__ == "__main__":
    main()
