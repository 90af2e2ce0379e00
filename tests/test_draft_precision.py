"""generate(..., draft_dtype=...): the heads draft from a copy in another dtype, the model verifies in its own, so
verified output is unchanged (tests/test_generation.py's contract), and the drafts really come from the copy."""

import pytest
import torch
from conftest import ALL_ARCHS, HEAD_IDS, HEAD_SETUPS, VOCAB, randomize_heads, tiny_base

import transformers_mtp
from transformers_mtp.generation_draft_precision import DraftingCopy


def converted(arch, head_type, extra, seed=0):
    model = transformers_mtp.convert(tiny_base(arch, seed), num_heads=4, head_type=head_type, **extra)
    return randomize_heads(model, seed, 0.1).eval()


def prompts(count=3):
    return [torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))
            for length in (1, 5, 11)[:count]]


def drafted_dtypes(model, monkeypatch):
    """The dtypes of the states the heads' drafts are unembedded from (calls with a draft weight)."""
    seen = []
    unembed = model.unembed

    def spy(hidden, weight=None):
        if weight is not None:
            seen.append(hidden.dtype)
        return unembed(hidden, weight)

    monkeypatch.setattr(model, "unembed", spy)
    return seen


@pytest.mark.parametrize("head_type,extra", HEAD_SETUPS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_bfloat16_drafts_leave_float32_verified_output_identical_to_greedy(arch, head_type, extra, monkeypatch):
    model = converted(arch, head_type, {"draft_vocab_size": 40, **extra})
    seen = drafted_dtypes(model, monkeypatch)
    proposed = 0
    for prompt in prompts():
        expected = model.generate(prompt, do_sample=False, max_new_tokens=24)
        out = model.generate(prompt, do_sample=False, max_new_tokens=24, multi_token_mode=True,
                             draft_dtype="bfloat16", return_dict_in_generate=True)
        assert torch.equal(out.sequences, expected)
        proposed += sum(out.multi_token_stats.head_proposed)
    assert proposed > 0
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the model itself is untouched


@pytest.mark.parametrize("arch", ALL_ARCHS)
@pytest.mark.parametrize("head_type,extra", [("query_extension", {"head_input": "feature_and_token"}), ("chained", {})],
                         ids=["qext-token", "chained"])
def test_bfloat16_draft_trees_and_batches_stay_greedy(arch, head_type, extra, monkeypatch):
    model = converted(arch, head_type, extra)
    seen = drafted_dtypes(model, monkeypatch)
    for prompt in prompts():
        expected = model.generate(prompt, do_sample=False, max_new_tokens=20)
        tree = model.generate(prompt, do_sample=False, max_new_tokens=20, multi_token_mode=True, draft_tree_size=6,
                              draft_dtype=torch.bfloat16)
        assert torch.equal(tree, expected)
    batch = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(7))
    expected = model.generate(batch, do_sample=False, max_new_tokens=16)
    out = model.generate(batch, do_sample=False, max_new_tokens=16, multi_token_mode=True, draft_dtype="bfloat16")
    assert torch.equal(out, expected)
    assert seen and set(seen) == {torch.bfloat16}


def test_speculative_sampling_with_bfloat16_drafts_runs_and_draws_the_seeded_sample_of_its_own_drafts():
    model = converted("llama", "chained", {})
    prompt = prompts(1)[0]
    kwargs = dict(do_sample=True, temperature=0.9, max_new_tokens=16, multi_token_mode=True, draft_dtype="bfloat16")
    torch.manual_seed(3)
    first = model.generate(prompt, **kwargs)
    torch.manual_seed(3)
    assert torch.equal(model.generate(prompt, **kwargs), first)  # reproducible under a seed
    assert first.shape[1] == prompt.shape[1] + 16


def test_the_model_dtype_needs_no_copy_and_a_changed_head_rebuilds_it():
    model = converted("llama", "query_extension", {"draft_vocab_size": 40})
    options = transformers_mtp.generation_options.MultiTokenOptions.resolve(model, True, draft_dtype="float32")
    assert options.draft_dtype is None  # float32 model: drafting as it is
    first = DraftingCopy.of(model, torch.bfloat16)
    assert DraftingCopy.of(model, torch.bfloat16) is first
    with torch.no_grad():
        model.mtp_heads[1].o_proj.weight.add_(1.0)
    rebuilt = DraftingCopy.of(model, torch.bfloat16)
    assert rebuilt is not first
    assert torch.equal(rebuilt.heads[1].o_proj.weight, model.mtp_heads[1].o_proj.weight.bfloat16())
    with torch.no_grad():  # a new draft vocabulary changes the drafting unembedding's rows
        model.set_draft_vocabulary(torch.arange(VOCAB - 40, VOCAB))
    assert torch.equal(DraftingCopy.of(model, torch.bfloat16).draft_weight,
                       model.draft_unembedding()[0].bfloat16())


@pytest.mark.parametrize("value", ["int8", "bf16", torch.int32, 16])
def test_bad_draft_dtype_is_a_clear_error(value):
    model = converted("llama", "resblock", {})
    with pytest.raises(ValueError, match=r"draft_dtype=.*must be one of \['auto', 'float32', 'bfloat16', 'float16'\]"):
        model.generate(prompts(1)[0], max_new_tokens=4, multi_token_mode=True, draft_dtype=value)


def test_draft_dtype_without_multi_token_mode_is_refused():
    model = converted("llama", "resblock", {})
    with pytest.raises(ValueError, match="draft_dtype=bfloat16 only applies with multi_token_mode=True"):
        model.generate(prompts(1)[0], max_new_tokens=4, draft_dtype="bfloat16")


def test_auto_drafts_in_bfloat16_only_where_a_float32_model_runs_on_native_bfloat16(monkeypatch):
    import transformers_mtp.generation_draft_precision as draft_precision
    from transformers_mtp.generation_options import resolve_draft_dtype

    model = converted("llama", "query_extension", {})
    monkeypatch.setattr(draft_precision, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    assert resolve_draft_dtype(model, "auto") == torch.bfloat16
    assert resolve_draft_dtype(model.to(torch.bfloat16), "auto") is None  # already drafting in bfloat16
    monkeypatch.setattr(draft_precision, "cpu_bf16_flags", lambda: ())  # emulated bfloat16 would be slower
    assert resolve_draft_dtype(model.to(torch.float32), "auto") is None
    model.generation_config.draft_dtype = "auto"  # from the generation config, as convert() would save it
    monkeypatch.setattr(draft_precision, "cpu_bf16_flags", lambda: ("amx_bf16",))
    assert resolve_draft_dtype(model, None) == torch.bfloat16


def test_convert_saves_the_draft_dtype_as_the_generate_default(tmp_path, monkeypatch):
    import transformers_mtp.generation_draft_precision as draft_precision

    monkeypatch.setattr(draft_precision, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="query_extension",
                                     draft_dtype="auto")
    model.save_pretrained(tmp_path / "saved")
    loaded = transformers_mtp.LlamaForMultiTokenPrediction.from_pretrained(tmp_path / "saved")
    assert loaded.generation_config.draft_dtype == "auto"
    seen = drafted_dtypes(loaded, monkeypatch)
    prompt = prompts(1)[0]
    out = loaded.generate(prompt, do_sample=False, max_new_tokens=12, multi_token_mode=True)
    assert torch.equal(out, loaded.generate(prompt, do_sample=False, max_new_tokens=12))
    assert seen and set(seen) == {torch.bfloat16}
    for bad in ("bf16", torch.bfloat16):
        with pytest.raises(ValueError, match="draft_dtype="):
            transformers_mtp.convert(tiny_base("llama"), num_heads=3, draft_dtype=bad)
