import json

import pytest
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from transformers_mtp import (
    GPT2ForMultiTokenPrediction,
    LlamaForMultiTokenPrediction,
    MultiTokenGPT2Config,
    MultiTokenLlamaConfig,
)

TINY = {
    "llama": (MultiTokenLlamaConfig, dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, vocab_size=99)),
    "gpt2": (MultiTokenGPT2Config, dict(n_embd=32, n_layer=2, n_head=4, vocab_size=99)),
}


@pytest.mark.parametrize("arch,model_class", [("llama", LlamaForMultiTokenPrediction),
                                              ("gpt2", GPT2ForMultiTokenPrediction)])
def test_registered_with_auto_classes(arch, model_class):
    config_class, kwargs = TINY[arch]
    config = AutoConfig.for_model(config_class.model_type, num_heads=3, **kwargs)
    assert type(config) is config_class
    assert type(AutoModelForCausalLM.from_config(config)) is model_class
    assert type(AutoModel.from_config(config)) is model_class


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_round_trip_persists_multi_token_fields(arch, tmp_path):
    config_class, kwargs = TINY[arch]
    config = config_class(num_heads=5, head_type="query_extension", head_rank=16, head_input="feature_and_token",
                          head_share_kv=False, head_loss_weights=[1.0, 0.5, 0.5, 0.25, 0.25], **kwargs)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["num_heads"] == 5 and saved["model_type"] == config_class.model_type
    assert saved["head_type"] == "query_extension" and saved["head_rank"] == 16
    assert saved["head_input"] == "feature_and_token" and saved["head_share_kv"] is False
    assert saved["head_loss_weights"] == [1.0, 0.5, 0.5, 0.25, 0.25]
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is config_class
    assert (loaded.num_heads, loaded.head_type, loaded.head_rank) == (5, "query_extension", 16)


@pytest.mark.parametrize(
    "name,overrides,message",
    [
        ("num_heads too small", {"num_heads": 1}, "num_heads=1 is out of range; pass an integer from 2 to 16"),
        ("num_heads too large", {"num_heads": 17}, "num_heads=17 is out of range"),
        ("unknown head_type", {"head_type": "medusa"}, "head_type='medusa' is not supported; choose one of"),
        ("bad head_rank", {"head_rank": 0}, "head_rank=0 must be a positive integer"),
        ("unknown head_input", {"head_input": "token"}, "head_input='token' is not supported"),
        ("sequential without query_extension", {"head_input": "sequential"}, "head_input='sequential' chains"),
        ("token input on a resblock head", {"head_input": "feature_and_token"},
         "head_input='feature_and_token' is read by head_type='query_extension' only; head_type='resblock'"),
        ("token input on a linear head", {"head_type": "linear", "head_input": "feature_and_token"},
         "head_type='linear' heads read the final hidden state"),
        ("sequential with own keys", {"head_type": "query_extension", "head_input": "sequential",
                                      "head_share_kv": False}, "head_share_kv=False. Use head_type"),
        ("weights length", {"num_heads": 3, "head_loss_weights": [1.0, 1.0]}, "head_loss_weights has 2 entries but num_heads=3"),
        ("negative weight", {"num_heads": 2, "head_loss_weights": [1.0, -1.0]}, "must be non-negative"),
    ],
)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_bad_values_raise_naming_the_field(arch, name, overrides, message):
    config_class, kwargs = TINY[arch]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        config_class(**kwargs, **overrides)


def test_wrong_type_is_rejected():
    config_class, kwargs = TINY["llama"]
    with pytest.raises(Exception, match="num_heads"):
        config_class(num_heads="four", **kwargs)
