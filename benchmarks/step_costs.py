"""Where a multi-token decoding step's time goes, on the embedded default model (fp32, this machine's CPU).

Measures, each as the median of 30 runs after warm-up, on top of a cache holding a chat prompt:
  - the trunk pass over T = 1..6, 8, 12 and 16 new tokens (what verifying k = T tokens, or a draft tree of T - 1
    tokens, costs; trees pass a 4D mask, which costs the same as the causal one),
  - the lm_head multiply over 1..16 rows,
  - one verified step with freshly converted heads, split into trunk+lm_head and drafting.

    python benchmarks/step_costs.py
"""

import statistics
import time

import torch

import transformers_mtp
from transformers_mtp.training.data import chat_input_ids


def median_ms(fn, runs=30):
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


@torch.inference_mode()
def main():
    base, tokenizer = transformers_mtp.load_default_base()
    model = transformers_mtp.convert(base, num_heads=4).eval()
    ids = chat_input_ids(tokenizer, "Write a Python function that checks whether a string is a palindrome.")
    cache = base(ids, use_cache=True).cache
    length = cache.get_seq_length()
    print(f"torch threads: {torch.get_num_threads()}, prompt: {length} tokens")

    one = None
    for tokens in (1, 2, 3, 4, 5, 6, 8, 12, 16):
        new = torch.randint(0, 1000, (1, tokens))
        positions = torch.arange(length, length + tokens)[None]

        def trunk():
            base.model(new, cache=cache, use_cache=True, position_ids=positions)
            cache.crop(-tokens)

        ms = median_ms(trunk)
        one = one or ms
        print(f"trunk pass over {tokens} token(s): {ms:6.1f} ms  ({ms / one:.2f}x one token)")

    weight = base.lm_head.weight
    for rows in (1, 3, 4, 8, 12, 16):
        hidden = torch.randn(rows, weight.shape[1])
        print(f"lm_head over {rows:2d} row(s): {median_ms(lambda: hidden @ weight.T):6.1f} ms")

    normed = torch.randn(1, 1, weight.shape[1])
    drafting = median_ms(lambda: model.lm_head(model._head_states(
        normed=normed, layer_input=None, next_token_ids=None, position_ids=None)[0][:, -1]).argmax(-1))
    print(f"drafting 3 tokens with {model.config.head_type} heads (heads + lm_head over 3 rows): {drafting:6.1f} ms")


if __name__ == "__main__":
    main()
