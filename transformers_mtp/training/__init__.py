# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Train the heads with PEFT LoRA by self-distillation, with the transformers `Trainer`.

- Every base parameter stays frozen (PEFT freezes them; only LoRA weights of the heads and the heads' own small
  modules train), so the base model's outputs are bit-identical after training.
- The frozen trunk runs once per sequence (`cache_trunk_features`); each step then runs only the heads and the
  shared lm_head, several times cheaper than a full forward on CPU.
- `Trainer` brings gradient accumulation, warmup, bf16, checkpoints of the adapter only, and exact resumption
  (optimizer, scheduler, RNG and data order are restored; the draft vocabulary and datastore are read back from the
  checkpoint, and a changed recipe is refused).
- One process: the loss is computed from cached features outside the model's forward, which a DDP wrapper would
  not see (no gradient sync), so `train_heads` refuses to start under `torchrun` / `accelerate launch`.

The sub-package, one concern per module:

- `config`: `HeadTrainingConfig`, the settings of a run.
- `data`: token sequences (`self_distill`, `load_text_sequences`, `check_sequences`) and the cached trunk features
  with the base model's targets (`cache_trunk_features`, `collate_features`); also the chat-template helpers.
- `feature_store`: `FeatureStore`, those features on disk between runs (`feature_cache`), read back per batch.
- `prompts`: the built-in prompt set for self-distillation (`training_prompts`).
- `real_prompts`: real prompts read offline from PyPI packages (ShareGPT's opening turns, HumanEval), mixed with the
  built-in ones (`mixed_prompts`).
- `sequences`: `training_sequences`, what a preset's `train:` section asks for (`training_prompt_texts`: built-in,
  real or the user's own prompts), with the self-distillation cache.
- `adapters`: the heads' LoRA config, the head settings file and draft tables beside an adapter, `load_trained_heads`.
- `trainer`: the loss from cached features (`features_loss`), `HeadsTrainer` and its progress bar callback.
- `checkpoints`: the output folder policy, checkpoint listing, and the training recipe a resume must match.
- `run`: `train_heads`, the whole run, and `check_single_process`.

None of these is imported by the files `save_pretrained` copies next to the weights.
"""

from .adapters import (
    DRAFT_DATASTORE_FILE,
    DRAFT_VOCAB_FILE,
    HEAD_SETTING_KEYS,
    HEAD_SETTINGS_FILE,
    load_trained_heads,
    lora_config_for,
    most_emitted_tokens,
)
from .checkpoints import RECIPE_FILE, training_recipe
from .config import HeadTrainingConfig
from .data import (
    cache_trunk_features,
    check_sequences,
    collate_features,
    load_text_sequences,
    self_distill,
)
from .prompts import training_prompts
from .run import check_single_process, train_heads
from .sequences import training_sequences
from .trainer import AgreementInProgressBar, HeadsTrainer, features_loss

__all__ = [
    "DRAFT_DATASTORE_FILE",
    "DRAFT_VOCAB_FILE",
    "HEAD_SETTINGS_FILE",
    "HEAD_SETTING_KEYS",
    "RECIPE_FILE",
    "AgreementInProgressBar",
    "HeadTrainingConfig",
    "HeadsTrainer",
    "cache_trunk_features",
    "check_sequences",
    "check_single_process",
    "collate_features",
    "features_loss",
    "load_text_sequences",
    "load_trained_heads",
    "lora_config_for",
    "most_emitted_tokens",
    "self_distill",
    "train_heads",
    "training_prompts",
    "training_recipe",
    "training_sequences",
]
