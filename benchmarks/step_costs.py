"""Where a multi-token decoding step's time goes, on the embedded default model (fp32, this machine's CPU).

Measures, each as the median of 30 runs after warm-up, on top of a cache holding a chat prompt:
  - the trunk pass over T = 1..6, 8, 12 and 16 new tokens (what verifying k = T tokens, or a draft tree of T - 1
    tokens, costs; trees pass a 4D mask, which costs the same as the causal one),
  - the lm_head multiply over 1..16 rows,
  - one verified step with freshly converted heads, split into trunk+lm_head and drafting,
  - the shipped heads drafting from one position, one head after another and stacked (`StackedHeads`, the decode
    loop's path), in the dtype given (default float32).

    python benchmarks/step_costs.py [float32|bfloat16]
"""

import copy
import statistics
import sys
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


def shipped_heads_drafting(dtype):
    """Median ms of the shipped heads' states from the last position of a chat prompt: the loop and stacked."""
    from transformers_mtp.generation_cache import cache_layer_keys_values
    from transformers_mtp.modeling_stacked_heads import StackedHeads

    model, tokenizer = transformers_mtp.load_default(dtype=dtype)
    ids = chat_input_ids(tokenizer, "Write a Python function that checks whether a string is a palindrome.")
    normed, layer_input, out = model._trunk_forward(ids, use_cache=True)
    kwargs = dict(normed=normed[:, -1:], layer_input=layer_input[:, -1:], next_token_ids=ids[:, -1:],
                  position_ids=torch.tensor([[ids.shape[1] - 1]]), base_kv=cache_layer_keys_values(out.cache, -1))
    loop = model._head_states(**kwargs)[0]
    heads = StackedHeads.of(model, model.config.num_heads - 1)
    stacked = model._head_states(**kwargs, stacked=heads)[0]
    print(f"{dtype}: shipped heads' states, largest difference loop vs stacked: "
          f"{(loop.float() - stacked.float()).abs().max().item():.3g}")
    # the general tool, for comparison: torch.func.vmap over the heads' stacked parameters
    _, _, final_norm, embed_tokens, rotary = model._parts()
    params, buffers = torch.func.stack_module_state(list(model.mtp_heads))
    template = copy.deepcopy(model.mtp_heads[0]).to("meta")
    inputs = dict(attn_mask=None, position_embeddings=rotary(kwargs["layer_input"], kwargs["position_ids"]),
                  token_embeds=embed_tokens(kwargs["next_token_ids"]), past_kv=kwargs["base_kv"])
    one_head = torch.func.vmap(lambda p, b: torch.func.functional_call(
        template, (p, b), (kwargs["layer_input"],), inputs)[0])

    def vmapped():
        return final_norm(one_head(params, buffers))

    print(f"{dtype}: vmap's states, largest difference from the loop's: "
          f"{(vmapped()[:, 0, 0].float() - loop[0, 0].float()).abs().max().item():.3g}")
    for _ in range(2):
        print(f"{dtype}: 3 shipped heads from one position: loop {median_ms(lambda: model._head_states(**kwargs), 200):.2f}"
              f" ms, torch.func.vmap {median_ms(vmapped, 200):.2f} ms, stacked "
              f"{median_ms(lambda: model._head_states(**kwargs, stacked=heads), 200):.2f} ms")


@torch.inference_mode()
def main():
    shipped_heads_drafting(sys.argv[1] if len(sys.argv) > 1 else "float32")
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
