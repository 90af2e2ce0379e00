# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The output folder of a training run: when it may be used (empty, `overwrite`, or `resume` with a checkpoint in
it), its `checkpoint-N` folders (listed by step, the latest), and the training recipe each checkpoint carries, which
a resume must match."""

import hashlib
import json
import shutil
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .adapters import HEAD_SETTING_KEYS


def _has_checkpoint(folder):
    return folder.is_dir() and any(p.name.startswith("checkpoint-") for p in folder.iterdir())


def prepare_output_dir(config):
    """The output folder, ready for this run: raises unless it is empty, `config.overwrite` is set (then it is
    emptied) or `config.resume` finds a checkpoint in it."""
    output_dir = Path(config.output_dir)
    if config.resume:
        if not _has_checkpoint(output_dir):
            raise FileNotFoundError(f"resume=True, but {str(output_dir)!r} holds no checkpoint-* folder to resume from.")
        return output_dir
    if output_dir.exists() and any(output_dir.iterdir()):
        if not config.overwrite:
            raise FileExistsError(
                f"{str(output_dir)!r} already exists and is not empty; pass resume=True (--resume) to continue its "
                "training, overwrite=True (--overwrite) to start over, or choose another folder."
            )
        shutil.rmtree(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    return output_dir


RECIPE_FILE = "training_recipe.json"
# HeadTrainingConfig fields that do not change what is trained
_RECIPE_IGNORED = ("output_dir", "overwrite", "resume", "eval_steps", "save_steps", "logging_steps",
                   "feature_batch_size", "feature_cache", "deadline")


def training_recipe(model, sequences, config):
    """What a resumed run must share with the run it continues: the head settings, the training settings, the base
    model's config and a digest of its unembedding, and a digest of the token sequences."""
    data = hashlib.sha256()
    for sequence in sequences:
        data.update(json.dumps([sequence["prompt_length"], list(sequence["input_ids"])]).encode())
    base = {k: v for k, v in model.config.to_dict().items() if k not in HEAD_SETTING_KEYS
            and k not in ("transformers_version", "auto_map", "architectures", "dtype", "torch_dtype")}
    weight = model.lm_head.weight.detach().float().cpu()
    return {
        "heads": {key: getattr(model.config, key) for key in HEAD_SETTING_KEYS},
        "training": {k: v for k, v in vars(config).items() if k not in _RECIPE_IGNORED},
        "base_config": hashlib.sha256(json.dumps(base, sort_keys=True, default=str).encode()).hexdigest(),
        "base_unembedding": hashlib.sha256(weight.numpy().tobytes()).hexdigest(),
        "data": data.hexdigest(),
        "num_sequences": len(sequences),
    }


def save_recipe(folder, recipe):
    """Write `recipe` (see `training_recipe`) into a checkpoint folder."""
    Path(folder, RECIPE_FILE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")


def check_checkpoint_recipe(checkpoint, recipe):
    """A resume from `checkpoint` whose recipe differs from `recipe` (or that has none) is an error."""
    if not (checkpoint / RECIPE_FILE).is_file():
        raise FileNotFoundError(f"{checkpoint / RECIPE_FILE} is missing: this checkpoint was not written by "
                                "train_heads, or by an older release; start a new run (overwrite=True).")
    _check_recipe(json.loads((checkpoint / RECIPE_FILE).read_text()), recipe, checkpoint)


def _check_recipe(saved, current, checkpoint):
    """A resume whose recipe differs from the checkpoint's is an error naming what changed."""
    changed = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += [f"{key}.{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                        if old.get(k) != new.get(k)]
        elif old != new:
            digest = key in ("data", "base_config", "base_unembedding")
            changed.append(f"{key}: changed" if digest else f"{key}: {old!r} -> {new!r}")
    if changed:
        raise ValueError(
            f"resume=True, but {checkpoint} was trained with another recipe ({'; '.join(changed)}). Resume with the "
            "same model, data and settings, or start a new run in another output_dir (or pass overwrite=True)."
        )


def list_checkpoints(output_dir):
    """The checkpoint-N folders of `output_dir`, by step."""
    return sorted((p for p in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.is_dir()),
                  key=lambda p: int(p.name.rsplit("-", 1)[1]))


def latest_checkpoint(output_dir):
    """The last checkpoint-N folder of `output_dir`, or None."""
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None

