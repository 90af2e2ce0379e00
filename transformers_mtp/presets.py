# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Presets: short YAML files in `configuration/`, each number commented with why it is what it is."""

from pathlib import Path

import yaml

PRESET_KEYS = ("base", "num_heads", "head_type", "head_rank", "head_input", "head_share_kv", "head_loss_weights",
               "head_feature_layers",
               "num_predict_heads", "draft_tree_size", "draft_lookup_num_tokens", "draft_dtype", "draft_vocab_size",
               "draft_datastore_size", "train")
# keys of a preset's `train:` section: where the data comes from, then HeadTrainingConfig's fields
TRAIN_DATA_KEYS = ("data", "num_prompts", "sampled_per_prompt", "sample_temperature", "max_new_tokens",
                   "distill_batch_size", "distill_dtype", "distill_engine", "data_cache")
TRAIN_KEYS = TRAIN_DATA_KEYS + ("lora_rank", "learning_rate", "num_train_epochs", "max_steps",
                                "per_device_train_batch_size", "gradient_accumulation_steps", "warmup_ratio",
                                "eval_fraction", "eval_steps", "save_steps", "logging_steps", "seed", "bf16",
                                "feature_batch_size", "feature_cache", "group_by_length", "datastore_min_count", "head_loss",
                                "init_heads")
# installed: transformers_mtp/configuration/ (setup.py maps the repository's configuration/ there); a source checkout
# or an editable install: the repository's configuration/ itself
PRESET_DIR = next((path for path in (Path(__file__).resolve().parent / "configuration",
                                     Path(__file__).resolve().parent.parent / "configuration") if path.is_dir()),
                  Path(__file__).resolve().parent.parent / "configuration")


def load_preset(name_or_path) -> dict:
    """Read a preset by path, or by name from `configuration/` (`smollm2-135m`). Unknown keys are an error."""
    path = Path(name_or_path)
    if not path.is_file():
        path = PRESET_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PRESET_DIR.glob("*.yaml")) if PRESET_DIR.is_dir() else []
        raise FileNotFoundError(f"No preset {str(name_or_path)!r}; pass a YAML file or one of {known}.")
    preset = yaml.safe_load(path.read_text()) or {}
    if not isinstance(preset, dict):
        raise ValueError(f"Preset {path} must be a mapping of keys to values.")
    unknown = sorted(set(preset) - set(PRESET_KEYS))
    if unknown:
        raise ValueError(f"Preset {path} has unknown keys {unknown}; allowed keys are {list(PRESET_KEYS)}.")
    train = preset.get("train") or {}
    unknown = sorted(set(train) - set(TRAIN_KEYS))
    if unknown:
        raise ValueError(f"Preset {path} has unknown train keys {unknown}; allowed keys are {list(TRAIN_KEYS)}.")
    return preset
