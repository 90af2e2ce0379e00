import json

import pytest
import torch
from conftest import ALL_ARCHS, ARCHS, HEAD_IDS, HEAD_SETUPS, VOCAB, randomize_heads, tiny_base, tiny_mtp
from transformers import AutoModelForCausalLM, OPTConfig, OPTForCausalLM

import transformers_mtp
from transformers_mtp import multi_token_loss


@pytest.mark.parametrize("head_type,extra", HEAD_SETUPS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_base_logits_bit_identical_after_conversion(arch, head_type, extra):
    base = tiny_base(arch)
    ids = torch.randint(0, VOCAB, (2, 11))
    before = base(ids).logits
    state_before = {k: v.clone() for k, v in base.state_dict().items()}
    model = transformers_mtp.convert(base, num_heads=4, head_type=head_type, **extra)
    assert torch.equal(model(ids).logits, before)
    out = model(ids, output_head_logits=True)
    assert torch.equal(out.logits, before)
    assert out.head_logits.shape == (2, 11, 3, VOCAB)
    # the base weights are the base model's own tensors, untouched
    for name, tensor in base.state_dict().items():
        assert torch.equal(tensor, state_before[name])
    base_ptrs = {p.data_ptr() for p in base.parameters()}
    assert all(p.data_ptr() in base_ptrs for n, p in model.named_parameters() if not n.startswith("mtp_heads."))
    assert all(p.data_ptr() not in base_ptrs for p in model.mtp_heads.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_forward_does_not_compute_heads(arch, monkeypatch):
    model = tiny_mtp(arch, "query_extension")
    called = []
    monkeypatch.setattr(type(model), "_head_states", lambda *a, **k: called.append(1))
    model(torch.randint(0, VOCAB, (1, 6)))
    model.generate(torch.randint(0, VOCAB, (1, 6)), max_new_tokens=4, do_sample=False)
    assert called == []


@pytest.mark.parametrize("head_input", ["feature_and_token", "sequential"])
@pytest.mark.parametrize("arch", ARCHS)
def test_teacher_forced_heads_read_known_tokens_and_never_their_target(arch, head_input):
    """Head i at position t predicts token t + 1 + i. Teacher-forced, it may read tokens up to t + 1 (the known next
    token) and, when chained, the tokens t + 2 .. t + i the heads before it stand for; never its own target or later.
    A leak would let training score a head on its own answer."""
    model = tiny_mtp(arch, "query_extension", num_heads=4, head_input=head_input)
    ids = torch.randint(3, VOCAB, (1, 12))
    t = 4
    reference = model(ids, output_head_logits=True).head_logits[0, t]  # [3, V]
    for changed in range(t + 1, ids.shape[1]):
        other = ids.clone()
        other[0, changed] = (ids[0, changed] + 1 - 3) % (VOCAB - 3) + 3
        logits = model(other, output_head_logits=True).head_logits[0, t]
        for i in (1, 2, 3):
            reads = changed == t + 1 or (head_input == "sequential" and changed <= t + i)
            assert torch.equal(logits[i - 1], reference[i - 1]) != reads, (changed, i)


def hand_loss(logits, head_logits, labels, weights=None):
    """Per-head cross-entropy written out token by token."""
    per_head = []
    batch, length = labels.shape
    for i in range(head_logits.shape[2] + 1):
        head = logits if i == 0 else head_logits[:, :, i - 1]
        total, count = 0.0, 0
        for b in range(batch):
            for t in range(length - 1 - i):
                target = labels[b, t + 1 + i].item()
                if target == -100:
                    continue
                total += -torch.log_softmax(head[b, t].double(), -1)[target].item()
                count += 1
        per_head.append(total / max(count, 1))
    if weights is None:
        return sum(per_head) / len(per_head), per_head
    return sum(w * h for w, h in zip(weights, per_head)) / sum(weights), per_head


@pytest.mark.parametrize("weights", [None, [1.0, 0.5, 0.25, 0.0]])
@pytest.mark.parametrize("arch", ARCHS)
def test_per_head_loss_matches_hand_computation(arch, weights):
    model = tiny_mtp(arch, "linear", head_loss_weights=weights)
    ids = torch.randint(3, VOCAB, (2, 9))
    labels = ids.clone()
    labels[0, 5] = -100
    labels[1, :3] = -100
    out = model(ids, labels=labels)
    expected, expected_heads = hand_loss(out.logits, out.head_logits, labels, weights)
    assert out.head_losses.shape == (4,)
    assert torch.allclose(out.head_losses.double(), torch.tensor(expected_heads, dtype=torch.double), atol=1e-5)
    assert abs(out.loss.item() - expected) < 1e-5
    direct, _ = multi_token_loss(out.logits, out.head_logits, labels, weights)
    assert torch.equal(direct, out.loss)


def test_loss_trains_only_the_heads():
    model = tiny_mtp("llama", "resblock")
    ids = torch.randint(3, VOCAB, (2, 9))
    model(ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.mtp_heads.parameters())


def test_labels_shorter_than_heads_raise():
    model = tiny_mtp("llama", num_heads=4)
    ids = torch.randint(3, VOCAB, (1, 4))
    with pytest.raises(ValueError, match="labels have 4 tokens.*at least num_heads \\+ 1 = 5 tokens"):
        model(ids, labels=ids)


def test_convert_rejects_unsupported_architecture():
    opt = OPTForCausalLM(OPTConfig(hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
                                   vocab_size=50, word_embed_proj_dim=16))
    with pytest.raises(ValueError, match="Unsupported architecture OPTForCausalLM; convert\\(\\) supports "
                                         "LlamaForCausalLM, GPT2LMHeadModel"):
        transformers_mtp.convert(opt)


def test_convert_rejects_converted_model_and_bad_path(tmp_path):
    model = tiny_mtp("gpt2")
    with pytest.raises(ValueError, match="already a multi-token model"):
        transformers_mtp.convert(model)
    with pytest.raises(FileNotFoundError, match="neither a checkpoint folder nor a .gguf file"):
        transformers_mtp.convert(tmp_path / "nope")
    with pytest.raises(ValueError, match="num_heads=0 is out of range"):
        transformers_mtp.convert(tiny_base("gpt2"), num_heads=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_convert_from_checkpoint_folder(arch, tmp_path):
    base = tiny_base(arch)
    base.save_pretrained(tmp_path)
    model = transformers_mtp.convert(tmp_path, num_heads=3, head_type="linear")
    ids = torch.randint(0, VOCAB, (1, 7))
    assert torch.equal(model(ids).logits, base(ids).logits)


@pytest.mark.parametrize("head_type,extra", [HEAD_SETUPS[1], HEAD_SETUPS[5]], ids=[HEAD_IDS[1], HEAD_IDS[5]])
@pytest.mark.parametrize("arch", ARCHS)
def test_save_and_load_with_plugin(arch, head_type, extra, tmp_path):
    model = tiny_mtp(arch, head_type, **extra)
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "configuration_multi_token.py",
            "modeling_multi_token.py", "modeling_heads.py", "generation_multi_token.py"} <= files
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_heads"] == 4 and config["head_type"] == head_type
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM"}
    assert json.loads((tmp_path / "generation_config.json").read_text())["num_predict_heads"] == 4
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)  # plugin installed: no trust_remote_code needed
    assert type(loaded) is type(model)
    ids = torch.randint(0, VOCAB, (1, 8))
    expected, got = model(ids, output_head_logits=True), loaded(ids, output_head_logits=True)
    assert torch.equal(expected.logits, got.logits) and torch.equal(expected.head_logits, got.head_logits)


def test_missing_heads_raise_unless_fresh_heads_requested(tmp_path):
    model = tiny_mtp("llama", num_heads=3)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_heads"] = 4  # the checkpoint has 2 extra heads; this config asks for 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="lacks or mis-shapes head weights.*allow_fresh_heads=True"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, allow_fresh_heads=True)
    ids = torch.randint(0, VOCAB, (1, 5))
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_mis_shaped_head_type_raises(tmp_path):
    model = tiny_mtp("gpt2", "linear")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["head_type"] = "resblock"  # the saved weights are linear heads
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="lacks or mis-shapes head weights"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_base_checkpoint_with_missing_base_weights_raises(tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny_mtp("llama")
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lacks or mis-shapes base weights.*corrupt"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("head_type,extra", HEAD_SETUPS, ids=HEAD_IDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_head_registry_entries_declare_what_training_needs(arch, head_type, extra):
    """Every head type of the config has a registry entry whose LoRA targets and full-trained modules exist in the
    heads it builds, and whose reset brings a perturbed head back to its initial state."""
    from transformers_mtp.configuration_multi_token import HEAD_TYPES
    from transformers_mtp.modeling_multi_token import HEAD_CLASSES

    assert set(HEAD_CLASSES) == set(HEAD_TYPES)
    model = tiny_mtp(arch, head_type, randomize=False, **extra)
    head_class = model.head_class
    names = {name.split(".", 1)[1] for name, _ in model.mtp_heads.named_modules() if "." in name}  # below "<i>."
    assert set(head_class.lora_targets) <= names
    assert set(head_class.modules_to_save(model.config) or []) <= names
    initial = {k: v.clone() for k, v in model.mtp_heads.state_dict().items()}
    randomize_heads(model, seed=3)
    model.reset_heads()
    for key, value in model.mtp_heads.state_dict().items():
        assert torch.equal(value, initial[key]), key


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_architecture_table_names_the_base_models_own_parts(arch):
    """Each supported architecture is one entry of the table; its names resolve to the converted base's modules."""
    from transformers_mtp.modeling_architectures import ARCHITECTURES
    from transformers_mtp.modeling_multi_token import MULTI_TOKEN_CLASSES

    base = tiny_base(arch)
    model = transformers_mtp.convert(base, num_heads=3, head_type="query_extension")
    assert MULTI_TOKEN_CLASSES[type(base)] is type(model)
    assert type(model).architecture is ARCHITECTURES[base.config.model_type]
    assert isinstance(model, type(base)) and model.config.to_dict()["num_heads"] == 3
    trunk, last_layer, final_norm, embed_tokens, rotary = model._parts()
    gpt2 = arch == "gpt2"
    base_trunk = base.transformer if gpt2 else base.model
    assert trunk is base_trunk and last_layer is (base_trunk.h if gpt2 else base_trunk.layers)[-1]
    assert final_norm is (base_trunk.ln_f if gpt2 else base_trunk.norm)
    assert embed_tokens is base.get_input_embeddings() and model.lm_head is base.get_output_embeddings()
    if arch == "gemma3":  # local and global layers: the last layer's rotary embedding
        assert rotary.func is base_trunk.rotary_emb and rotary.keywords == {"layer_type": "sliding_attention"}
    else:
        assert rotary is None if gpt2 else rotary is base_trunk.rotary_emb
    assert all(isinstance(head, type(model).architecture.query_extension_head) for head in model.mtp_heads)
    assert set(transformers_mtp.SUPPORTED_ARCHITECTURES) == set(MULTI_TOKEN_CLASSES)


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_copied_query_extension_head_is_the_last_layer(arch):
    """An untouched own-keys query-extension head reading the last layer's input is a copy of that layer: its output
    equals the layer's. A head that skipped what the architecture adds (Qwen2's q/k/v biases, Qwen3's q_norm /
    k_norm, GPT-2's scalings; randomised in tiny_base) would differ."""
    model = transformers_mtp.convert(tiny_base(arch), num_heads=2, head_type="query_extension", head_share_kv=False)
    ids = torch.randint(3, VOCAB, (2, 9))
    out = model(ids, output_hidden_states=True)
    layer_input, layer_output = out.hidden_states[-2], out.hidden_states[-1]
    trunk, last_layer, final_norm, _, rotary = model._parts()
    positions = torch.arange(ids.shape[1])[None].expand(2, -1)
    embeddings = rotary(layer_input, positions) if rotary is not None else None
    from transformers_mtp.modeling_heads import head_attention_mask

    mask = head_attention_mask(ids.shape[1], ids.shape[1])
    hidden, _ = model.mtp_heads[0](layer_input, attn_mask=mask, position_embeddings=embeddings)
    # hidden_states[-1] is after the final norm (transformers applies it before returning the last state)
    assert torch.allclose(final_norm(hidden), layer_output, atol=1e-5)
