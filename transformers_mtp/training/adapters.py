# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""What a head adapter is, beyond PEFT's own files: the LoRA config of the heads (`lora_config_for`), the head
settings file and the draft tables (draft vocabulary, draft datastore) written beside the adapter and into every
checkpoint, and reading them back (`load_trained_heads`, `restore_draft_tables`). The draft vocabulary a new run
starts from is chosen here too (`most_emitted_tokens`)."""

import json
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel
from safetensors.torch import load_file, save_file

from ..generation_draft_sources import DATASTORE_EMPTY_KEY

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"  # PEFT adapters hold parameters only; the draft vocabulary rides beside
DRAFT_DATASTORE_FILE = "draft_datastore.safetensors"  # likewise the draft datastore
# (config size, file, what it is, how the model takes it back) for each draft table
DRAFT_TABLES = (
    ("draft_vocab_size", DRAFT_VOCAB_FILE, "a draft vocabulary",
     lambda model, tables: model.set_draft_vocabulary(tables["draft_token_ids"])),
    ("draft_datastore_size", DRAFT_DATASTORE_FILE, "a draft datastore",
     lambda model, tables: model.set_draft_datastore(tables["keys"], tables["tokens"])),
)


HEAD_SETTINGS_FILE = "multi_token.json"  # the convert() settings to rebuild the model this adapter belongs to
HEAD_SETTING_KEYS = ("num_heads", "head_type", "head_rank", "head_input", "head_share_kv", "head_loss_weights",
                     "head_feature_layers", "draft_vocab_size", "draft_datastore_size")


def save_head_settings(model, folder):
    """Write the head settings file and the model's draft tables (if it has them) into `folder`."""
    settings = {key: getattr(model.config, key) for key in HEAD_SETTING_KEYS}
    settings["num_predict_heads"] = getattr(model.generation_config, "num_predict_heads", model.config.num_heads)
    settings["draft_tree_size"] = getattr(model.generation_config, "draft_tree_size", None) or 0
    lookup_tokens = getattr(model.generation_config, "draft_lookup_num_tokens", None)
    if lookup_tokens is not None:
        settings["draft_lookup_num_tokens"] = lookup_tokens
    draft_dtype = getattr(model.generation_config, "draft_dtype", None)
    if draft_dtype is not None:
        settings["draft_dtype"] = draft_dtype
    (Path(folder) / HEAD_SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    draft_ids = model.draft_unembedding()[1]
    if draft_ids is not None:
        save_file({"draft_token_ids": draft_ids.contiguous().cpu()}, str(Path(folder) / DRAFT_VOCAB_FILE))
    datastore = model.draft_datastore()
    if datastore is not None:
        used = int((datastore[0] != DATASTORE_EMPTY_KEY).sum())
        save_file({"keys": datastore[0][:used].contiguous().cpu(), "tokens": datastore[1][:used].contiguous().cpu()},
                  str(Path(folder) / DRAFT_DATASTORE_FILE))


def _set_draft_tables(model, folder, missing, only=None):
    """Set each draft table the model's config asks for (of those whose size key is in `only`, if given) from its file
    in `folder`; a missing file raises FileNotFoundError(missing(path, what it is))."""
    for size_key, name, what, set_table in DRAFT_TABLES:
        if getattr(model.config, size_key) is None or (only is not None and size_key not in only):
            continue
        path = Path(folder) / name
        if not path.is_file():
            raise FileNotFoundError(missing(path, what))
        set_table(model, load_file(str(path)))


def load_trained_heads(model, adapter_dir):
    """Apply a head adapter written by `train_heads` to a converted model (made with the same head settings) and
    merge it: returns the model with trained heads, base weights untouched."""
    adapter_dir = Path(adapter_dir)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    _set_draft_tables(merged, adapter_dir,
                      lambda path, what: f"{path} is missing: this adapter was trained with {what}.")
    return merged


def restore_draft_tables(model, checkpoint):
    """Set the draft vocabulary and datastore that `checkpoint` was trained with (read back, not recomputed)."""
    _set_draft_tables(model, checkpoint, lambda path, what: (
        f"{path} is missing: the checkpoint cannot be resumed with the draft tables it was trained with. Start a new "
        "run (overwrite=True)."))


def init_heads_folder(name_or_path):
    """The adapter folder `HeadTrainingConfig.init_heads` names: a shipped head set's folder by its name, else the path.
    A folder that is not a head adapter raises FileNotFoundError saying what it lacks."""
    from ..default_model import SHIPPED_HEADS  # imported here: default_model loads heads through this module

    folder = Path(SHIPPED_HEADS[name_or_path][0] if name_or_path in SHIPPED_HEADS else name_or_path)
    for name in (HEAD_SETTINGS_FILE, "adapter_config.json", "adapter_model.safetensors"):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"init_heads={str(name_or_path)!r}: {folder / name} is missing. Pass the adapter/ folder of an earlier "
                f"`transformers-mtp train` run, or a shipped head set's name ({', '.join(SHIPPED_HEADS)}).")
    return folder


def check_init_heads(model, folder, lora_config):
    """The heads in `folder` (see `init_heads_folder`) must have the model's head settings and `lora_config`'s LoRA
    layout: other heads would load partly or not at all, so a difference is a ValueError naming it."""
    saved = json.loads((folder / HEAD_SETTINGS_FILE).read_text())
    for key in HEAD_SETTING_KEYS:
        if key in saved and saved[key] != getattr(model.config, key):
            raise ValueError(f"init_heads {folder} has {key}={saved[key]!r} but this model has "
                             f"{key}={getattr(model.config, key)!r}; train with the head settings those heads were "
                             "trained with (their multi_token.json), or start from new heads (no init_heads).")
    saved_lora = LoraConfig.from_pretrained(str(folder))
    for key in ("r", "lora_alpha", "modules_to_save"):
        theirs, ours = getattr(saved_lora, key), getattr(lora_config, key)
        if key == "modules_to_save":  # a list (in any order) or None
            theirs, ours = sorted(theirs or []), sorted(ours or [])
        if theirs != ours:
            raise ValueError(f"init_heads {folder} has LoRA {key}={theirs!r} but this run uses {key}={ours!r}; set "
                             "lora_rank to the rank those heads were trained with, or start from new heads.")


def restore_draft_vocabulary(model, folder):
    """Set the draft vocabulary the heads in `folder` were trained with (they rank exactly these tokens)."""
    _set_draft_tables(model, folder, lambda path, what: f"{path} is missing: the heads in {folder} were trained with "
                      f"{what}.", only=("draft_vocab_size",))


def lora_config_for(model, rank=None) -> LoraConfig:
    """LoRA on the heads only, on the submodules their class declares (`lora_targets`, `modules_to_save`). The regexes
    are full matches, so no base layer is touched (a plain ["q_proj"] would adapt every base attention layer too)."""
    head_class = model.head_class
    rank = rank or model.config.head_rank
    targets = "|".join(head_class.lora_targets)
    targets = targets if len(head_class.lora_targets) == 1 else f"({targets})"
    return LoraConfig(r=rank, lora_alpha=rank, target_modules=rf".*mtp_heads\.\d+\.{targets}",
                      modules_to_save=head_class.modules_to_save(model.config), bias=head_class.lora_bias)


def most_emitted_tokens(features, count):
    """The `count` token ids the base model predicts most often on the training features (sorted by id)."""
    teacher = torch.cat([f["teacher"] for f in features])
    frequency = torch.bincount(teacher[teacher >= 0], minlength=count)
    return torch.topk(frequency, count).indices.sort().values
