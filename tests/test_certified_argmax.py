"""certified_argmax: greedy verification of a float32 model takes the argmax from a bfloat16 unembedding and a
rigorous error bound (generation_certified_argmax.py). The argmax must be the float32 one on every row, including
near-ties that bfloat16 alone gets wrong, and verified output stays plain greedy's."""

import pytest
import torch
from conftest import ALL_ARCHS, HEAD_IDS, HEAD_SETUPS, VOCAB, randomize_heads, tiny_base

import transformers_mtp
from transformers_mtp.generation_certified_argmax import CertifiedArgmax, error_bound_constants
from transformers_mtp.generation_options import resolve_certified_argmax


def converted(arch, head_type="query_extension", extra=None, seed=0):
    model = transformers_mtp.convert(tiny_base(arch, seed), num_heads=4, head_type=head_type, **(extra or {}))
    return randomize_heads(model, seed, 0.1).eval()


def prompts():
    return [torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(length)) for length in (1, 5, 11)]


class Unembedding(torch.nn.Module):
    """The parts of a model CertifiedArgmax reads: lm_head (and dtype, device, config for the checks)."""

    def __init__(self, weight):
        super().__init__()
        self.lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(weight)


def near_tie_unembedding(vocab=512, hidden=64, seed=0):
    """Rows in pairs whose float32 logits differ by far less than bfloat16 resolves (w and w + a 1e-4 nudge), and
    states that point at the pairs: the bfloat16 argmax alone is wrong on many of them."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(vocab // 2, hidden, generator=g)
    nudged = base + 1e-4 * torch.randn(vocab // 2, hidden, generator=g)
    weight = torch.stack([base, nudged], dim=1).reshape(vocab, hidden)  # row 2i and its near copy 2i + 1
    states = base[torch.randint(0, vocab // 2, (400,), generator=g)] * 3 + 0.3 * torch.randn(400, hidden, generator=g)
    return Unembedding(weight), states


def plain_decoding_argmax(model, states):
    """The argmax of float32 logits as plain decoding computes them: one position's unembedding at a time."""
    return torch.cat([model.lm_head(state[None]).argmax(-1) for state in states])


def test_the_certified_argmax_is_the_float32_argmax_where_bfloat16_alone_is_not():
    model, states = near_tie_unembedding()
    exact = plain_decoding_argmax(model, states)
    bf16_only = torch.nn.functional.linear(states.bfloat16(), model.lm_head.weight.bfloat16()).float().argmax(-1)
    assert (bf16_only != exact).sum() >= 20  # the case is hard: a bfloat16 argmax would change the text
    assert torch.equal(CertifiedArgmax(model)(states), exact)
    assert torch.equal(CertifiedArgmax(model)(states.reshape(20, 20, -1)), exact.reshape(20, 20))  # any leading shape


def test_exact_ties_go_to_the_lowest_token_id_as_torch_argmax():
    weight = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    weight[40] = weight[7]  # two identical rows: every state ties them exactly
    states = weight[7][None] * torch.linspace(0.5, 2.0, 8)[:, None]
    model = Unembedding(weight)
    assert torch.equal(CertifiedArgmax(model)(states), torch.full((8,), 7))


def test_the_error_bound_holds_on_the_real_size_of_the_rows_and_is_not_vacuous():
    g = torch.Generator().manual_seed(2)
    weight, states = torch.randn(4096, 576, generator=g) * 0.05, torch.randn(64, 576, generator=g) * 2
    z = states @ weight.T
    low = (states.bfloat16() @ weight.bfloat16().T).float()
    c1, c2 = error_bound_constants(576)
    eps = torch.outer(states.norm(dim=-1) * c1, weight.norm(dim=-1)) + low.abs() * c2
    ratio = ((z - low).abs() / eps).max()
    assert ratio < 1  # the bound holds
    assert ratio > 0.01  # and is tight enough to mean something (not a bound that admits every token)


def test_non_finite_logits_fall_back_to_the_float32_product():
    model, states = near_tie_unembedding(vocab=32, hidden=8)
    states[3, 0] = float("inf")
    assert torch.equal(CertifiedArgmax(model)(states), plain_decoding_argmax(model, states))


@pytest.mark.parametrize("head_type,extra", HEAD_SETUPS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_verified_output_with_a_certified_argmax_is_greedy_for_every_head_type(arch, head_type, extra):
    model = converted(arch, head_type, extra)
    for prompt in prompts():
        expected = model.generate(prompt, do_sample=False, max_new_tokens=24)
        for certified in (True, False):
            out = model.generate(prompt, do_sample=False, max_new_tokens=24, multi_token_mode=True,
                                 certified_argmax=certified)
            assert torch.equal(out, expected), certified


@pytest.mark.parametrize("arch", [a for a in ALL_ARCHS if a != "gemma2"])  # gemma2: soft-capped logits (below)
def test_certified_trees_and_batches_stay_greedy_and_skip_the_float32_unembedding(arch, monkeypatch):
    model = converted(arch, "query_extension", {"head_input": "feature_and_token"})
    calls = []
    monkeypatch.setattr(model, "unembed", lambda hidden, weight=None: calls.append(weight) or
                        type(model).unembed(model, hidden, weight))
    for prompt in prompts():
        expected = model.generate(prompt, do_sample=False, max_new_tokens=20)
        calls.clear()
        tree = model.generate(prompt, do_sample=False, max_new_tokens=20, multi_token_mode=True, draft_tree_size=6,
                              certified_argmax=True)
        assert torch.equal(tree, expected)
        assert calls and all(weight is not None for weight in calls)  # only the drafts' own unembedding ran
    batch = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(7))
    expected = model.generate(batch, do_sample=False, max_new_tokens=16)
    out = model.generate(batch, do_sample=False, max_new_tokens=16, multi_token_mode=True, certified_argmax=True)
    assert torch.equal(out, expected)


def test_scores_processors_and_sampling_take_the_float32_logits(monkeypatch):
    model = converted("llama")
    prompt = prompts()[2]
    kwargs = dict(do_sample=False, max_new_tokens=16, multi_token_mode=True, certified_argmax=True)
    out = model.generate(prompt, return_dict_in_generate=True, output_scores=True, output_logits=True, **kwargs)
    plain = model.generate(prompt, do_sample=False, max_new_tokens=16, return_dict_in_generate=True,
                           output_scores=True, output_logits=True)
    assert torch.equal(out.sequences, plain.sequences)
    assert len(out.logits) == 16 and torch.allclose(torch.cat(out.logits), torch.cat(plain.logits), atol=1e-5)
    penalised = model.generate(prompt, repetition_penalty=1.3, **kwargs)
    assert torch.equal(penalised, model.generate(prompt, do_sample=False, max_new_tokens=16, repetition_penalty=1.3))
    torch.manual_seed(0)
    sampled = model.generate(prompt, **{**kwargs, "do_sample": True})
    assert sampled.shape[1] == prompt.shape[1] + 16


def test_a_changed_unembedding_is_never_read_stale():
    model = converted("llama")
    prompt = prompts()[2]
    first = CertifiedArgmax.of(model)
    assert CertifiedArgmax.of(model) is first
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.5)  # every argmax moves (tied to the embedding: the trunk changes too)
    assert CertifiedArgmax.of(model) is not first
    out = model.generate(prompt, do_sample=False, max_new_tokens=16, multi_token_mode=True, certified_argmax=True)
    assert torch.equal(out, model.generate(prompt, do_sample=False, max_new_tokens=16))
    with torch.inference_mode():  # no version counter: a copy per call, never reused
        weight = model.lm_head.weight.detach().clone()
    model.lm_head.weight = torch.nn.Parameter(weight, requires_grad=False)
    assert CertifiedArgmax.of(model) is not CertifiedArgmax.of(model)


@pytest.mark.parametrize("value", ["yes", 1, "float32", torch.bfloat16])
def test_bad_certified_argmax_is_a_clear_error(value):
    model = converted("llama")
    with pytest.raises(ValueError, match=r"certified_argmax=.* must be 'auto', True or False"):
        model.generate(prompts()[0], max_new_tokens=4, multi_token_mode=True, certified_argmax=value)


def test_certified_argmax_where_the_bound_does_not_apply_says_why():
    with pytest.raises(ValueError, match=r"certified_argmax=True cannot be honoured: the model is torch.bfloat16"):
        converted("llama").to(torch.bfloat16).generate(prompts()[0], max_new_tokens=4, multi_token_mode=True,
                                                       certified_argmax=True)
    with pytest.raises(ValueError, match=r"cannot be honoured: its logits are soft-capped"):
        converted("gemma2").generate(prompts()[0], max_new_tokens=4, multi_token_mode=True, certified_argmax=True)
    with pytest.raises(ValueError, match="certified_argmax=True only applies with multi_token_mode=True"):
        converted("llama").generate(prompts()[0], max_new_tokens=4, certified_argmax=True)


def test_auto_certifies_only_a_float32_cpu_model_on_native_bfloat16(monkeypatch):
    import transformers_mtp.generation_draft_precision as draft_precision

    model = converted("llama")
    monkeypatch.setattr(draft_precision, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    assert resolve_certified_argmax(model, "auto") is True
    assert resolve_certified_argmax(model, None) is True  # the default
    assert resolve_certified_argmax(model.to(torch.bfloat16), "auto") is False
    assert resolve_certified_argmax(converted("gemma2"), "auto") is False
    monkeypatch.setattr(draft_precision, "cpu_bf16_flags", lambda: ())  # emulated bfloat16: no faster
    assert resolve_certified_argmax(model.to(torch.float32), "auto") is False
    assert resolve_certified_argmax(model, True) is True  # still exact, when asked for
    model.generation_config.certified_argmax = False
    monkeypatch.setattr(draft_precision, "cpu_bf16_flags", lambda: ("amx_bf16",))
    assert resolve_certified_argmax(model, None) is False  # the generation config's
