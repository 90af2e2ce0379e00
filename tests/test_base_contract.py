"""With multi_token_mode off our classes keep the base classes' contract: forward's arguments, cache, outputs, loss."""

import inspect

import pytest
import torch
from conftest import ARCHS, VOCAB, tiny_mtp
from transformers import GPT2LMHeadModel

from transformers_mtp.modeling_multi_token import MULTI_TOKEN_CLASSES

BASES = {ours: base for base, ours in MULTI_TOKEN_CLASSES.items()}
HEADS = [("resblock", {}), ("query_extension", {}), ("query_extension", {"head_input": "sequential"}),
         ("query_extension", {"head_share_kv": False})]
HEAD_IDS = ["resblock", "qext", "qext-sequential", "qext-ownkv"]


def ids(batch=2, length=10, seed=0):
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("ours,base", BASES.items(), ids=[base.__name__ for base in BASES.values()])
def test_forward_signature_is_the_base_classes(ours, base):
    """Same parameters in the same order (positional callers), plus output_head_logits before **kwargs."""
    ours_params = list(inspect.signature(ours.forward).parameters)
    base_params = list(inspect.signature(base.forward).parameters)
    assert ours_params[: len(base_params) - 1] == base_params[:-1]
    assert ours_params[-2:] == ["output_head_logits", base_params[-1]]


@pytest.mark.parametrize("arch", ARCHS)
def test_past_key_values_is_honoured(arch):
    model = tiny_mtp(arch)
    tokens = ids()
    full = model(tokens).logits[:, 6:]
    first = model(tokens[:, :6], use_cache=True)
    with pytest.warns(FutureWarning, match="past_key_values"):
        continued = model(tokens[:, 6:], past_key_values=first.cache).logits
    torch.testing.assert_close(continued, full, rtol=1e-5, atol=1e-5)
    # the heads path as well
    first = model(tokens[:, :6], use_cache=True)
    continued = model(tokens[:, 6:], past_key_values=first.cache, output_head_logits=True).logits
    torch.testing.assert_close(continued, full, rtol=1e-5, atol=1e-5)


def test_gpt2_positional_cache_and_token_type_ids():
    model = tiny_mtp("gpt2")
    base = GPT2LMHeadModel(model.config).eval()
    base.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mtp_heads.")})
    tokens, types = ids(), ids(seed=1)
    first, base_first = model(tokens[:, :6], use_cache=True), base(tokens[:, :6], use_cache=True)
    # positional: (input_ids, cache, attention_mask, token_type_ids)
    ours = model(tokens[:, 6:], first.cache, None, types[:, 6:]).logits
    theirs = base(tokens[:, 6:], base_first.cache, None, types[:, 6:]).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    # the heads path reads the trunk that saw the token types
    with_heads = model(tokens, token_type_ids=types, output_head_logits=True).logits
    torch.testing.assert_close(with_heads, base(tokens, token_type_ids=types).logits, rtol=0, atol=0)


@pytest.mark.parametrize("head_type,extra", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_states_and_attentions_on_the_heads_path(arch, head_type, extra):
    model = tiny_mtp(arch, head_type, **extra)
    model.set_attn_implementation("eager")
    tokens = ids()
    plain = model(tokens, output_hidden_states=True, output_attentions=True)
    with_heads = model(tokens, labels=tokens, output_hidden_states=True, output_attentions=True)
    assert len(with_heads.hidden_states) == len(plain.hidden_states) == model.config.num_hidden_layers + 1
    for ours, theirs in zip(with_heads.hidden_states + with_heads.attentions, plain.hidden_states + plain.attentions):
        torch.testing.assert_close(ours, theirs)
    assert model(tokens, labels=tokens).hidden_states is None


@pytest.mark.parametrize("head_type,extra", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_labels_with_return_dict_false(arch, head_type, extra):
    model = tiny_mtp(arch, head_type, **extra)
    tokens = ids()
    as_dict = model(tokens, labels=tokens)
    as_tuple = model(tokens, labels=tokens, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], as_dict.loss)
    torch.testing.assert_close(as_tuple[1], as_dict.logits)


@pytest.mark.parametrize("arch", ARCHS)
def test_shift_labels_are_used(arch):
    model = tiny_mtp(arch)
    tokens = ids()
    plain = model(tokens, labels=tokens)
    shifted = torch.nn.functional.pad(tokens[:, 1:], (0, 1), value=-100)
    same = model(tokens, labels=tokens, shift_labels=shifted)
    torch.testing.assert_close(same.head_losses, plain.head_losses)
    # shift_labels win over labels, as in transformers' causal-LM loss
    masked = shifted.clone()
    masked[:, :4] = -100
    out = model(tokens, labels=tokens, shift_labels=masked)
    manual = model(tokens, labels=torch.cat([tokens[:, :1], masked[:, :-1]], dim=1))  # the same targets, unshifted
    torch.testing.assert_close(out.head_losses, manual.head_losses)
    assert not torch.allclose(out.head_losses, plain.head_losses)
    # num_items_in_batch: the summed loss divided by it, as under the Trainer's gradient accumulation
    count = (shifted != -100).sum()
    summed = model(tokens, labels=tokens, num_items_in_batch=count * 2)
    torch.testing.assert_close(summed.head_losses[0], plain.head_losses[0] / 2)


@pytest.mark.parametrize("head_type,extra", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_gradient_checkpointing_with_labels(arch, head_type, extra):
    model = tiny_mtp(arch, head_type, **extra)
    tokens = ids()
    reference = model(tokens, labels=tokens).head_losses
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.activation_checkpointing_enable()
    out = model(tokens, labels=tokens)
    out.loss.backward()
    torch.testing.assert_close(out.head_losses, reference, rtol=1e-5, atol=1e-6)
    assert all(p.grad is not None for p in model.mtp_heads.parameters() if p.requires_grad)


def test_own_kv_heads_refuse_a_cache_in_forward():
    """Heads with their own keys and values keep no cache in forward(): continuing cached positions is an error
    naming the way out, never a crash or head logits that silently ignore the past."""
    model = tiny_mtp("llama", "query_extension", head_share_kv=False)
    tokens = ids()
    mask = torch.ones_like(tokens)
    mask[0, :2] = 0
    first = model(tokens[:, :6], attention_mask=mask[:, :6], use_cache=True)
    with pytest.raises(ValueError, match="head_share_kv=False.*without a cache"):
        model(tokens[:, 6:], cache=first.cache, attention_mask=mask, output_head_logits=True)
    # the base path continues as the base model does
    continued = model(tokens[:, 6:], cache=first.cache, attention_mask=mask).logits
    torch.testing.assert_close(continued, model(tokens, attention_mask=mask).logits[:, 6:], rtol=1e-5, atol=1e-5)
