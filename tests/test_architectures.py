"""What sets the Llama family's other members apart: Mistral's and Gemma's sliding windows, and the error for the
rest.

Conversion, the heads, the parity matrix, portability, training and transformers' own suites run on every
architecture (conftest.ALL_ARCHS) in their own files; this file holds what only some architectures have.
"""

import pytest
import torch
from conftest import LLAMA_FAMILY, VOCAB, tiny_base, tiny_mtp
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
    OPTConfig,
    OPTForCausalLM,
)
from transformers.cache_utils import DynamicCache, StaticCache

import transformers_mtp


def mistral(window, head_type="query_extension", arch="mistral", **extra):
    """A tiny Mistral (every layer sliding), Gemma 2 (sliding and full layers alternate) or Gemma 3 (a full layer,
    then a sliding one) with this window."""
    torch.manual_seed(0)
    config_class, model_class, extra_config = {
        "mistral": (MistralConfig, MistralForCausalLM, {}),
        "gemma2": (Gemma2Config, Gemma2ForCausalLM, {}),
        "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, {"layer_types": ["full_attention", "sliding_attention"]}),
    }[arch]
    config = config_class(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=8, vocab_size=VOCAB, max_position_embeddings=256,
                          bos_token_id=0, eos_token_id=1, pad_token_id=2, sliding_window=window, **extra_config)
    return transformers_mtp.convert(model_class(config).eval(), num_heads=4, head_type=head_type, **extra)


PROMPT = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])


@pytest.mark.parametrize("mode", ["chain", "tree", "batch", "sample"])
def test_sliding_window_model_within_its_window_is_greedy(mode):
    """max_length == the window (one row), or the window holds a batch's gaps too: no cached position is a window
    away from another, so the sliding layers become full ones that can be rolled back, and the output is plain
    generate()'s (which keeps its sliding cache)."""
    model = mistral(16 + 3 * 10 + 4 if mode == "batch" else 16)  # a batch: max_length + (k - 1) x new + k
    prompt = PROMPT if mode == "batch" else PROMPT[1:]
    kwargs = {"attention_mask": MASK} if mode == "batch" else {}
    if mode == "tree":
        kwargs["draft_tree_size"] = 6
    if mode == "sample":  # at a temperature near 0 sampling is greedy, and so is speculative sampling
        kwargs.update(do_sample=True, temperature=1e-4, top_k=0)
    plain = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=2,
                           **{k: v for k, v in kwargs.items() if k == "attention_mask"})
    out = model.generate(prompt, max_new_tokens=10, pad_token_id=2, multi_token_mode=True,
                         return_dict_in_generate=True, **{"do_sample": False, **kwargs})
    assert torch.equal(out.sequences, plain)
    assert out.multi_token_stats.forward_passes > 1


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gemma3"])
def test_one_sequence_past_the_window_is_greedy(arch, monkeypatch):
    """One row decodes at any length: its sliding layers keep every position (so rejected drafts roll back) and
    transformers' mask applies the window. The drafts are oracle continuations with errors, so rollbacks happen."""
    from test_generation import OracleDrafts, use_drafts

    model, prompt = mistral(8, arch=arch), PROMPT[1:]
    plain = model.generate(prompt, max_new_tokens=24, do_sample=False)
    # the window matters for this text: with a window past its end the same weights say something else
    assert not torch.equal(mistral(64, arch=arch).generate(prompt, max_new_tokens=24, do_sample=False), plain)
    use_drafts(monkeypatch, OracleDrafts(plain, 0.3, seed=1))
    out = model.generate(prompt, max_new_tokens=24, do_sample=False, multi_token_mode=True,
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    stats = out.multi_token_stats
    assert stats.tokens_per_forward > 1.5 and any(n < 4 for n in stats.accepted_per_step)  # partial acceptance
    # a tree's mask is built by the decode loop, not by transformers, and does not apply the window: refused
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"within the model's sliding window \(sliding_window=8, max_length=30\)"):
        model.generate(prompt, max_new_tokens=24, do_sample=False, multi_token_mode=True, draft_tree_size=6)
    model.generation_config.draft_tree_size = 6  # a configured tree size falls back to chains there
    assert torch.equal(model.generate(prompt, max_new_tokens=24, do_sample=False, multi_token_mode=True), plain)


def test_batch_whose_gaps_could_pass_the_window_raises():
    """Rows of a batch accept different numbers of drafts and leave masked gaps in the shared cache, and the window
    counts cache positions: a batch needs room for the gaps too."""
    model = mistral(16)
    with pytest.raises(ValueError, match=r"a batch decodes while the window spans .* = 50 here"):
        model.generate(PROMPT, attention_mask=MASK, max_new_tokens=10, do_sample=False, pad_token_id=2,
                       multi_token_mode=True)
    out = model.generate(PROMPT[1:], max_new_tokens=10, do_sample=False, multi_token_mode=True)  # one row fits
    assert torch.equal(out, model.generate(PROMPT[1:], max_new_tokens=10, do_sample=False))


def test_a_cache_that_dropped_positions_raises():
    model = mistral(8)
    cache = DynamicCache(config=model.config)
    text = torch.randint(3, VOCAB, (1, 12))
    model(text, cache=cache, use_cache=True)  # 12 positions through an 8-token window: the first ones are gone
    with pytest.raises(ValueError, match="cannot roll back this sliding-window cache"):
        model.generate(torch.cat([text, text[:, :1]], 1), past_key_values=cache, max_new_tokens=2, do_sample=False,
                       multi_token_mode=True)


def test_static_cache_larger_than_the_window_raises():
    model = mistral(8)
    cache = StaticCache(config=model.config, max_cache_len=32)  # its sliding layers wrap around past 8 positions
    with pytest.raises(ValueError, match="cannot roll back this sliding-window cache"):
        model.generate(PROMPT[1:], past_key_values=cache, max_new_tokens=4, do_sample=False, multi_token_mode=True)


def test_unsupported_architecture_error_lists_the_supported_ones():
    opt = OPTForCausalLM(OPTConfig(hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
                                   vocab_size=50, word_embed_proj_dim=16))
    with pytest.raises(ValueError) as error:
        transformers_mtp.convert(opt)
    for name in ("LlamaForCausalLM", "GPT2LMHeadModel", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        assert name in str(error.value)


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3", "gemma2", "gemma3"])
def test_auto_classes_resolve_the_new_configs(arch, tmp_path):
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    model = transformers_mtp.convert(tiny_base(arch), num_heads=3, head_type="resblock")
    model.save_pretrained(tmp_path / "m")
    config = AutoConfig.from_pretrained(tmp_path / "m")
    assert type(config) is type(model.config) and config.num_heads == 3
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "m")) is type(model)
    assert type(AutoModel.from_pretrained(tmp_path / "m")) is type(model)


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_trees_and_sampling_on_each_architecture(arch):
    """Draft trees (greedy) and speculative sampling (top_k=1: one token has all the probability, so it is greedy's)
    on randomised heads of each architecture: the same tokens as plain decoding, with drafts both kept and rejected."""
    model = tiny_mtp(arch, "query_extension", num_heads=4)
    prompt = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(7))
    plain = model.generate(prompt, max_new_tokens=20, do_sample=False)
    tree = model.generate(prompt, max_new_tokens=20, do_sample=False, multi_token_mode=True, draft_tree_size=6,
                          return_dict_in_generate=True)
    assert torch.equal(tree.sequences, plain)
    torch.manual_seed(0)
    sampled = model.generate(prompt, max_new_tokens=20, do_sample=True, top_k=1, multi_token_mode=True,
                             return_dict_in_generate=True)
    assert torch.equal(sampled.sequences, plain)
    for stats in (tree.multi_token_stats, sampled.multi_token_stats):
        assert 0 < sum(stats.head_accepted) < sum(stats.head_proposed)  # drafts both kept and rejected


def write_gguf(model, path, gguf_arch):
    """A float32 GGUF file of a tiny Llama-shaped model, its tensors named by gguf's own name map (as llama.cpp's
    converter names them; Qwen's q/k weights are stored unpermuted)."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), gguf_arch.name.lower())
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_embedding_length(config.hidden_size)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    names = gguf.get_tensor_name_map(gguf_arch, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        module, kind = name.rsplit(".", 1)
        writer.add_tensor(f"{names.get_name(module)}.{kind}", tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_gguf_file_converts(arch, tmp_path):
    """convert() takes a .gguf file of the new architectures as it takes the embedded Llama one (dequantized by
    transformers). transformers' GGUF reader takes Qwen3's head_dim as its default, 128, so this one has that."""
    import gguf
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if arch == "qwen2":
        base, gguf_arch = tiny_base("qwen2"), gguf.MODEL_ARCH.QWEN2
    else:
        torch.manual_seed(0)
        base = Qwen3ForCausalLM(Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                                            vocab_size=VOCAB, max_position_embeddings=256)).eval()
        gguf_arch = gguf.MODEL_ARCH.QWEN3
    write_gguf(base, tmp_path / f"tiny-{arch}.gguf", gguf_arch)
    model = transformers_mtp.convert(tmp_path / f"tiny-{arch}.gguf", num_heads=3, head_type="query_extension")
    assert type(model) is transformers_mtp.MULTI_TOKEN_CLASSES[type(base)]
    ids = torch.randint(3, VOCAB, (1, 7))
    assert torch.equal(model(ids).logits, base(ids).logits)
    assert torch.equal(model.generate(ids, max_new_tokens=8, do_sample=False, multi_token_mode=True),
                       base.generate(ids, max_new_tokens=8, do_sample=False))
