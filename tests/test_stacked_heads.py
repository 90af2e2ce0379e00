"""The drafting fast path: independent query-extension heads run as one (`StackedHeads`) compute what the per-head
loop computes, and every head setup it cannot run falls back to the loop."""

import pytest
import torch
from conftest import VOCAB, randomize_heads, tiny_base, tiny_mtp

import transformers_mtp
from transformers_mtp.generation_cache import cache_layer_keys_values
from transformers_mtp.modeling_stacked_heads import StackedHeads


def head_states(model, ids, attention_mask=None, stacked=False, num_heads=None):
    """Every head's normed state at every position of `ids` from the trunk's cache, as drafting reads them."""
    with torch.no_grad():
        normed, layer_input, out = model._trunk_forward(ids, attention_mask=attention_mask, use_cache=True)
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0) if attention_mask is not None else \
            torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1)
        next_tokens = torch.randint(3, VOCAB, ids.shape, generator=torch.Generator().manual_seed(1))
        return model._head_states(
            normed=normed, layer_input=layer_input, next_token_ids=next_tokens, position_ids=positions,
            key_padding_mask=attention_mask, base_kv=cache_layer_keys_values(out.cache, -1), num_heads=num_heads,
            stacked=StackedHeads.of(model, model.config.num_heads - 1) if stacked else None)[0]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("head_input", ["feature", "feature_and_token"])
def test_stacked_heads_compute_what_the_loop_computes(arch, head_input):
    model = tiny_mtp(arch, "query_extension", num_heads=4, head_input=head_input)
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    assert StackedHeads.of(model, 3) is not None
    for attention_mask in (None, mask):
        loop = head_states(model, ids, attention_mask)
        stacked = head_states(model, ids, attention_mask, stacked=True)
        assert loop.shape == stacked.shape == (2, 7, 3, model.config.hidden_size)
        torch.testing.assert_close(stacked, loop, rtol=1e-5, atol=1e-5)
        # fewer heads (a shallower tree, the end of the token budget)
        torch.testing.assert_close(head_states(model, ids, attention_mask, stacked=True, num_heads=3), loop[:, :, :2],
                                   rtol=1e-5, atol=1e-5)


def test_stacked_heads_follow_weight_changes():
    model = tiny_mtp("llama", "query_extension", num_heads=4, head_input="feature_and_token")
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    first = StackedHeads.of(model, 3)
    assert StackedHeads.of(model, 3) is first  # built once while no weight changes
    with torch.no_grad():
        model.mtp_heads[1].mlp.down_proj.weight.mul_(2)  # in place, as an optimizer step or load_state_dict
    assert StackedHeads.of(model, 3) is not first
    torch.testing.assert_close(head_states(model, ids, stacked=True), head_states(model, ids), rtol=1e-5, atol=1e-5)
    model.to(torch.float64)  # new storages
    assert StackedHeads.of(model, 3).q.dtype == torch.float64
    torch.testing.assert_close(head_states(model, ids.clone(), stacked=True), head_states(model, ids),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("arch,head_type,extra", [
    ("qwen3", "query_extension", {}),  # per-head q_norm / k_norm
    ("gemma2", "query_extension", {}),  # (1 + weight) norms, soft-capped attention
    ("gpt2", "query_extension", {}),  # LayerNorm, fused c_attn
    ("llama", "query_extension", {"head_share_kv": False}),  # own keys and values
    ("llama", "query_extension", {"head_input": "sequential"}),  # each head reads the draft before it
    ("llama", "resblock", {}),
])
def test_heads_that_cannot_run_stacked_take_the_loop(arch, head_type, extra):
    model = tiny_mtp(arch, head_type, num_heads=4, **extra)
    assert StackedHeads.of(model, 3) is None


def test_heads_with_peft_layers_attached_take_the_loop():
    from peft import get_peft_model

    from transformers_mtp.training import lora_config_for

    model = randomize_heads(transformers_mtp.convert(tiny_base("llama"), num_heads=4, head_type="query_extension",
                                                     head_input="feature_and_token"), 0)
    assert StackedHeads.of(model, 3) is not None
    peft_model = get_peft_model(model, lora_config_for(model, 4))
    assert StackedHeads.of(peft_model.base_model.model, 3) is None
    assert StackedHeads.of(peft_model.merge_and_unload(), 3) is not None


def test_stacked_heads_never_run_with_gradients(monkeypatch):
    model = tiny_mtp("llama", "query_extension", num_heads=4)
    ids = torch.randint(3, VOCAB, (1, 6))
    calls, original = [], StackedHeads.__call__
    monkeypatch.setattr(StackedHeads, "__call__", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    normed, layer_input, out = model._trunk_forward(ids, use_cache=True)
    model._head_states(normed=normed, layer_input=layer_input, next_token_ids=ids, position_ids=torch.arange(6)[None],
                       base_kv=cache_layer_keys_values(out.cache, -1), stacked=StackedHeads.of(model, 3))
    assert calls == []  # grad enabled: the loop, whose weights train
    head_states(model, ids, stacked=True)
    assert calls == [1]
