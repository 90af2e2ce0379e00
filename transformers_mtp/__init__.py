# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""transformers-mtp: multi-token prediction heads for pretrained Hugging Face causal LMs, with lossless decoding.

Importing the package registers the configs with AutoConfig and the models with AutoModel and AutoModelForCausalLM.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_multi_token import MultiTokenGPT2Config, MultiTokenLlamaConfig
from .conversion import SUPPORTED_ARCHITECTURES, convert, load_base_model
from .default_model import default_gguf_path, load_default, load_default_base
from .generation_multi_token import MultiTokenGenerateOutput, MultiTokenStats
from .hub import push_to_hub
from .modeling_losses import multi_token_loss
from .modeling_multi_token import GPT2ForMultiTokenPrediction, LlamaForMultiTokenPrediction, MultiTokenCausalLMOutput

__version__ = "0.1.0"

for _config, _model in (
    (MultiTokenLlamaConfig, LlamaForMultiTokenPrediction),
    (MultiTokenGPT2Config, GPT2ForMultiTokenPrediction),
):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)

__all__ = [
    "GPT2ForMultiTokenPrediction",
    "LlamaForMultiTokenPrediction",
    "MultiTokenCausalLMOutput",
    "MultiTokenGPT2Config",
    "MultiTokenGenerateOutput",
    "MultiTokenLlamaConfig",
    "MultiTokenStats",
    "SUPPORTED_ARCHITECTURES",
    "convert",
    "default_gguf_path",
    "load_base_model",
    "load_default",
    "load_default_base",
    "multi_token_loss",
    "push_to_hub",
]
