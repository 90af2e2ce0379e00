"""Export to serving engines' formats (transformers_mtp.serving_export): the files an engine reads, recomputed here as the
engine computes them (vLLM's Eagle3LlamaForCausalLM and Medusa), must give our heads' own logits; tiny random
models on the CPU. The end-to-end run inside vLLM itself is tests/test_vllm_serving.py."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import VOCAB, tiny_base
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import transformers_mtp
from transformers_mtp.serving_export import export


def randomised(model, seed=1):
    """Every head weight random (fresh heads start as copies, zeros and identities, which hide mix-ups)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.mtp_heads.named_parameters():
            param.copy_(torch.randn_like(param) * (0.3 if param.dim() > 1 else 0.2) + (1.0 if "norm" in name else 0))
    return model.eval()


def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def eagle3_reference_logits(folder, base, input_ids, steps, layout="speculators"):
    """
    Draft logits [T, steps, V] as vLLM's EAGLE-3 drafter computes them from the exported files alone (`layout=
    "sglang"`: as SGLang's LlamaForCausalLMEagle3 reads its own layout, which computes the same layer): step 1 at
    every position t reads fc(taps at t) and the embedding of token t + 1; step j reads step j - 1's output before
    the final norm and the embedding of token t + j (the text's, as if every draft were accepted), at position
    t + j - 1, attending step 1's keys over positions <= t and its own chain's keys. -inf outside the draft vocab.
    """
    config = json.loads((folder / "config.json").read_text())
    w = load_file(folder / "model.safetensors")
    if layout == "sglang":  # a flat Llama config, the layer as `midlayer.*`, and SGLang captures tap id + 1
        layer_config = LlamaConfig(**{k: v for k, v in config.items() if k != "eagle_config"})
        tap_states = [i + 1 for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        w = {name.replace("midlayer.", "layers.0.", 1): t for name, t in w.items()}
    else:
        layer_config = LlamaConfig(**config["transformer_layer_config"])
        tap_states = config["eagle_aux_hidden_state_layer_ids"]
    eps, heads, kv_heads = layer_config.rms_norm_eps, layer_config.num_attention_heads, layer_config.num_key_value_heads
    head_dim = layer_config.head_dim
    rotary = LlamaRotaryEmbedding(layer_config)
    with torch.no_grad():
        out = base(input_ids, output_hidden_states=True)
    taps = torch.cat([out.hidden_states[i][0] for i in tap_states], dim=-1)
    embed = base.get_input_embeddings().weight
    length = input_ids.shape[1] - steps  # positions whose every step has a text token to read

    def layer(hidden, tokens, positions, keys_before):
        x = torch.cat([rms(embed[tokens], w["layers.0.input_layernorm.weight"], eps),
                       rms(hidden, w["layers.0.hidden_norm.weight"], eps)], dim=-1)
        residual = hidden  # norm_before_residual: false
        proj = {n: x @ w[f"layers.0.self_attn.{n}_proj.weight"].T + w.get(f"layers.0.self_attn.{n}_proj.bias", 0)
                for n in "qkv"}
        q = proj["q"].view(-1, heads, head_dim).transpose(0, 1)[None]
        k = proj["k"].view(-1, kv_heads, head_dim).transpose(0, 1)[None]
        v = proj["v"].view(-1, kv_heads, head_dim).transpose(0, 1)[None]
        cos, sin = rotary(x[None], positions[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v, residual

    def finish(q, keys, values, mask, residual):
        keys, values = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (keys, values))
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)[0].transpose(0, 1).reshape(q.shape[2], -1)
        hidden = residual + attn @ w["layers.0.self_attn.o_proj.weight"].T
        normed = rms(hidden, w["layers.0.post_attention_layernorm.weight"], eps)
        mlp = (F.silu(normed @ w["layers.0.mlp.gate_proj.weight"].T) * (normed @ w["layers.0.mlp.up_proj.weight"].T))
        prenorm = hidden + mlp @ w["layers.0.mlp.down_proj.weight"].T
        logits = rms(prenorm, w["norm.weight"], eps) @ w["lm_head.weight"].T
        full = torch.full((logits.shape[0], VOCAB), float("-inf"))
        targets = torch.arange(logits.shape[1]) + w["d2t"] if "d2t" in w else torch.arange(logits.shape[1])
        full[:, targets] = logits
        return prenorm, full

    total = input_ids.shape[1]
    q, k1, v1, residual = layer(taps[:-1] @ w["fc.weight"].T, input_ids[0, 1:], torch.arange(total - 1), None)
    causal = torch.ones(total - 1, total - 1, dtype=torch.bool).tril()
    prenorm, logits = finish(q, k1, v1, causal, residual)
    result = torch.empty(length, steps, VOCAB)
    for t in range(length):
        hidden, keys, values = prenorm[t : t + 1], k1[:, :, : t + 1], v1[:, :, : t + 1]
        result[t, 0] = logits[t]
        for j in range(1, steps):  # vLLM's drafting loop at position t
            q, k, v, residual = layer(hidden, input_ids[0, t + 1 + j : t + 2 + j], torch.tensor([t + j]), None)
            keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
            hidden, step_logits = finish(q, keys, values, None, residual)
            result[t, j] = step_logits[0]
    return result


CHAINED = [("llama", {}), ("llama", {"draft_vocab_size": 40}), ("qwen2", {"draft_vocab_size": 40}),
           ("mistral", {"head_feature_layers": [1, 0]})]


@pytest.mark.parametrize("arch,extra", CHAINED, ids=[f"{a}-{'-'.join(e) or 'full'}" for a, e in CHAINED])
def test_eagle3_export_computes_our_chained_drafter_as_vllm_reads_it(arch, extra, tmp_path):
    model = randomised(transformers_mtp.convert(tiny_base(arch), num_heads=4, head_type="chained", **extra))
    if "draft_vocab_size" in extra:
        model.set_draft_vocabulary(torch.randperm(VOCAB)[:40])  # unsorted: d2t must map each draft id back
    out = export(model, tmp_path / "out", format="eagle3")
    config = json.loads((out / "speculator" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    assert config["eagle_aux_hidden_state_layer_ids"] == sorted(model.config.head_feature_layers)
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    input_ids = torch.randint(3, VOCAB, (1, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(input_ids, output_head_logits=True).head_logits[0]  # [T, 3, V]
    verifier = AutoModelForCausalLM.from_pretrained(out / "verifier")
    reference = eagle3_reference_logits(out / "speculator", verifier, input_ids, steps=3)
    length = reference.shape[0]
    drafted = torch.zeros(VOCAB, dtype=torch.bool)  # the tokens the drafter may propose
    drafted[model.draft_unembedding()[1] if "draft_vocab_size" in extra else slice(None)] = True
    assert torch.equal(torch.isfinite(reference), drafted.expand_as(reference))
    torch.testing.assert_close(reference[..., drafted], ours[:length][..., drafted], rtol=1e-4, atol=1e-4)
    # these tiny models tap 2 states or the embeddings, which SGLang's EAGLE-3 cannot take: no layout for it
    assert not (out / "speculator-sglang").exists()
    assert "no SGLang layout was written" in (out / "README.md").read_text()


def test_eagle3_export_writes_sglangs_layout_where_sglang_can_read_it(tmp_path):
    """Three taps, none the embeddings (unsorted here): `speculator-sglang/` holds the drafter as SGLang's
    LlamaForCausalLMEagle3 loads it, and recomputed that way it gives our drafter's logits."""
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=0,
                         eos_token_id=1, pad_token_id=2)
    torch.manual_seed(0)
    model = randomised(transformers_mtp.convert(LlamaForCausalLM(config), num_heads=4, head_type="chained",
                                                head_feature_layers=[3, 1, 2], draft_vocab_size=40))
    model.set_draft_vocabulary(torch.randperm(VOCAB)[:40])
    out = export(model, tmp_path / "out", format="eagle3")
    sglang = out / "speculator-sglang"
    sglang_config = json.loads((sglang / "config.json").read_text())
    assert sglang_config["architectures"] == ["LlamaForCausalLMEagle3"] and sglang_config["num_hidden_layers"] == 1
    assert sglang_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # one lower than ours
    assert (sglang_config["draft_vocab_size"], sglang_config["target_hidden_size"]) == (40, 32)
    names = set(load_file(sglang / "model.safetensors"))
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.self_attn.q_proj.weight",
            "midlayer.hidden_norm.weight", "midlayer.mlp.down_proj.weight"} <= names
    assert not any(name.startswith("layers.") for name in names)
    readme = (out / "README.md").read_text()
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path speculator-sglang" in readme
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in readme
    input_ids = torch.randint(3, VOCAB, (1, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(input_ids, output_head_logits=True).head_logits[0]
    verifier = AutoModelForCausalLM.from_pretrained(out / "verifier")
    reference = eagle3_reference_logits(sglang, verifier, input_ids, steps=3, layout="sglang")
    drafted = torch.zeros(VOCAB, dtype=torch.bool)
    drafted[model.draft_unembedding()[1]] = True
    torch.testing.assert_close(reference[..., drafted], ours[: reference.shape[0]][..., drafted], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch,head_type", [("llama", "resblock"), ("gpt2", "resblock"), ("llama", "linear")])
def test_medusa_export_computes_our_heads_as_vllm_reads_them(arch, head_type, tmp_path):
    model = randomised(transformers_mtp.convert(tiny_base(arch), num_heads=4, head_type=head_type))
    out = export(model, tmp_path / "out", format="medusa")
    config = json.loads((out / "speculator" / "config.json").read_text())
    assert (config["model_type"], config["num_heads"], config["vocab_size"]) == ("medusa", 3, VOCAB)
    w = load_file(out / "speculator" / "model.safetensors")
    input_ids = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(0))
    verifier = AutoModelForCausalLM.from_pretrained(out / "verifier")
    with torch.no_grad():
        ours = model(input_ids, output_head_logits=True).head_logits[0]
        final = verifier(input_ids, output_hidden_states=True).hidden_states[-1][0]  # after the final norm
    for i in range(3):  # vLLM's ResidualBlock, then that head's own lm_head
        block = final + F.silu(final @ w[f"blocks.{i}.layers.0.weight"].T + w[f"blocks.{i}.layers.0.bias"])
        torch.testing.assert_close(block @ w[f"lm_heads.{i}.weight"].T, ours[:, i], rtol=1e-4, atol=1e-4)


def test_exported_verifier_is_the_plain_base_model(tmp_path):
    base = tiny_base("llama")
    model = randomised(transformers_mtp.convert(base, num_heads=3, head_type="chained"))
    out = export(model, tmp_path / "out", format="eagle3")
    verifier = AutoModelForCausalLM.from_pretrained(out / "verifier")  # no trust_remote_code: a transformers class
    assert type(verifier).__name__ == "LlamaForCausalLM" and not hasattr(verifier.config, "num_heads")
    ids = torch.randint(3, VOCAB, (1, 9))
    with torch.no_grad():
        assert torch.equal(verifier(ids).logits, base(ids).logits)
    assert "speculative_config" in (out / "README.md").read_text()


def test_export_refuses_what_no_format_expresses_and_keeps_existing_folders(tmp_path):
    query_extension = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="query_extension")
    with pytest.raises(ValueError, match="head_type='query_extension' cannot be exported as 'eagle3'.*medusa: head_type resblock"):
        export(query_extension, tmp_path / "a", format="eagle3")
    resblock = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock")
    with pytest.raises(ValueError, match="head_type='resblock' cannot be exported as 'eagle3'.*export it as 'medusa'"):
        export(resblock, tmp_path / "a", format="eagle3")
    with pytest.raises(ValueError, match="format='onnx' is not an export format"):
        export(resblock, tmp_path / "a", format="onnx")
    with pytest.raises(ValueError, match="num_speculative_tokens=0"):
        export(resblock, tmp_path / "a", format="medusa", num_speculative_tokens=0)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="overwrite"):
        export(resblock, taken, format="medusa")
    assert (taken / "mine.txt").read_text() == "keep" and not (tmp_path / "a").exists()
    export(resblock, taken, format="medusa", overwrite=True)
    assert not (taken / "mine.txt").exists() and (taken / "speculator" / "model.safetensors").exists()


def test_export_command(tmp_path, capsys):
    from transformers_mtp.cli import main

    model = randomised(transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="chained"))
    model.save_pretrained(tmp_path / "mtp")
    assert main(["export", str(tmp_path / "mtp"), str(tmp_path / "out"), "--format", "eagle3",
                 "--num-speculative-tokens", "4"]) == 0
    config = json.loads((tmp_path / "out" / "speculator" / "config.json").read_text())
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert "no tokenizer" in capsys.readouterr().out
    # a head type the format cannot carry: one line that names the formats, exit status 2, nothing written
    assert main(["export", str(tmp_path / "mtp"), str(tmp_path / "out2"), "--format", "medusa"]) == 2
    assert "cannot be exported as 'medusa'" in capsys.readouterr().err and not (tmp_path / "out2").exists()
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "out3"), "--format", "eagle3"]) == 2
    assert "is not a checkpoint folder" in capsys.readouterr().err
    # the embedded default model: its generate() heads have no format; medusa is refused before anything loads
    assert main(["export", "default", str(tmp_path / "out4"), "--format", "medusa"]) == 2
    assert "ships no resblock / linear heads" in capsys.readouterr().err and not (tmp_path / "out4").exists()


def test_unknown_shipped_head_set_is_named():
    with pytest.raises(ValueError, match=r"heads='medusa' is not a shipped head set; choose one of \['chained', 'default'\]"):
        transformers_mtp.load_default(heads="medusa")
