# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""transformers-mtp: multi-token prediction heads for pretrained Hugging Face causal LMs, with lossless decoding.

Importing the package registers the configs with AutoConfig and the models with AutoModel and AutoModelForCausalLM.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_multi_token import (
    MultiTokenGemma2Config,
    MultiTokenGemma3TextConfig,
    MultiTokenGPT2Config,
    MultiTokenLlamaConfig,
    MultiTokenMistralConfig,
    MultiTokenQwen2Config,
    MultiTokenQwen3Config,
)
from .conversion import SUPPORTED_ARCHITECTURES, convert, load_base_model
from .default_model import default_gguf_path, load_default, load_default_base
from .generation_multi_token import MultiTokenGenerateOutput, MultiTokenStats
from .hub import push_to_hub
from .serving_export import export
from .modeling_losses import multi_token_loss
from .modeling_multi_token import (
    MULTI_TOKEN_CLASSES,
    Gemma2ForMultiTokenPrediction,
    Gemma3ForMultiTokenPrediction,
    GPT2ForMultiTokenPrediction,
    LlamaForMultiTokenPrediction,
    MistralForMultiTokenPrediction,
    MultiTokenCausalLMOutput,
    Qwen2ForMultiTokenPrediction,
    Qwen3ForMultiTokenPrediction,
)

__version__ = "0.1.0"

for _model in MULTI_TOKEN_CLASSES.values():
    _config = _model.config_class
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)

__all__ = [
    "GPT2ForMultiTokenPrediction",
    "Gemma2ForMultiTokenPrediction",
    "Gemma3ForMultiTokenPrediction",
    "LlamaForMultiTokenPrediction",
    "MistralForMultiTokenPrediction",
    "MultiTokenCausalLMOutput",
    "MultiTokenGPT2Config",
    "MultiTokenGemma2Config",
    "MultiTokenGemma3TextConfig",
    "MultiTokenGenerateOutput",
    "MultiTokenLlamaConfig",
    "MultiTokenMistralConfig",
    "MultiTokenQwen2Config",
    "MultiTokenQwen3Config",
    "MultiTokenStats",
    "Qwen2ForMultiTokenPrediction",
    "Qwen3ForMultiTokenPrediction",
    "SUPPORTED_ARCHITECTURES",
    "convert",
    "default_gguf_path",
    "export",
    "load_base_model",
    "load_default",
    "load_default_base",
    "multi_token_loss",
    "push_to_hub",
]
