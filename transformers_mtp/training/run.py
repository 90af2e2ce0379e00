# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""`train_heads`, a whole training run: split the sequences, cache the trunk features, set the draft tables (chosen
anew, or read back from the checkpoint a resume continues), train with `HeadsTrainer` and save `adapter/` and
`merged/`; and `check_single_process`, which it (and the CLI, before any work) runs first."""

import math
import os
import random
from functools import partial

import torch
from peft import PeftModel, get_peft_model
from transformers import TrainingArguments, set_seed

from ..draft_datastore import build_draft_datastore
from ..saving import save_atomically
from .adapters import (
    check_init_heads,
    init_heads_folder,
    lora_config_for,
    most_emitted_tokens,
    restore_draft_tables,
    restore_draft_vocabulary,
    save_head_settings,
)
from .checkpoints import (
    check_checkpoint_recipe,
    latest_checkpoint,
    prepare_output_dir,
    training_recipe,
)
from .config import HeadTrainingConfig
from .data import cache_trunk_features, check_sequences, collate_features
from .feature_store import FeatureStore
from .trainer import AgreementInProgressBar, HeadsTrainer, ListDataset, StopAtDeadline


def check_single_process():
    """Raise unless this is the only training process (see the `transformers_mtp.training` docstring)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world_size = max(world_size, torch.distributed.get_world_size())
    if world_size > 1:
        raise ValueError(
            f"train_heads runs in one process, but this is one of {world_size} (torchrun / accelerate launch set "
            "WORLD_SIZE): the heads' loss comes from cached trunk features outside the model's forward, so a DDP "
            "wrapper would not synchronise their gradients, and every process would write checkpoints. Start it as "
            "one process (python -m transformers_mtp train ..., --device cuda for one GPU)."
        )


def train_heads(model, sequences, config: HeadTrainingConfig, *, tokenizer=None, features=None, progress=True):
    """
    Train heads 1..num_heads-1 of a converted multi-token `model` on token `sequences` (dicts with `input_ids` and
    `prompt_length`, e.g. from `self_distill`). Writes `output_dir/adapter` (PEFT adapter) and `output_dir/merged`
    (a full checkpoint that loads with `trust_remote_code=True`). Returns (merged model, final eval metrics).
    `features`: trunk features of `sequences` (same order) cached earlier with `cache_trunk_features(...,
    all_features=True)`, to train several head types on one cache. Training runs on the model's device: move the
    model to a GPU first to train there (bf16 by default). It runs in one process and raises under `torchrun` /
    `accelerate launch`. With `config.resume`, the latest checkpoint's recipe must match this call's (the same model,
    sequences and settings) and its draft vocabulary and datastore are used as saved. With `config.init_heads` the
    heads start as those trained heads (and their draft vocabulary) instead of new ones.
    """
    check_single_process()
    lora_config = lora_config_for(model, config.lora_rank)
    init_dir = init_heads_folder(config.init_heads) if config.init_heads is not None else None
    if init_dir is not None:  # before any work
        check_init_heads(model, init_dir, lora_config)
    output_dir = prepare_output_dir(config)
    if features is not None:
        if len(features) != len(sequences):
            raise ValueError(f"Got {len(features)} cached features for {len(sequences)} sequences; cache them together.")
        features_by_id = {id(s): f for s, f in zip(sequences, features)}
    usable = check_sequences(sequences, num_heads=model.config.num_heads, vocab_size=model.config.vocab_size)
    order = list(range(len(usable)))
    random.Random(config.seed).shuffle(order)
    n_eval = max(1, math.ceil(len(usable) * config.eval_fraction)) if len(usable) > 1 else 0
    eval_items = [usable[i] for i in order[:n_eval]]
    train_items = [usable[i] for i in order[n_eval:]] or eval_items
    if features is None and config.feature_cache is not None:
        features = FeatureStore(config.feature_cache, model).features(
            train_items + eval_items, batch_size=config.feature_batch_size, progress=progress)
    elif features is None:
        features = cache_trunk_features(model, train_items + eval_items, batch_size=config.feature_batch_size,
                                        progress=progress)
    else:
        features = [features_by_id[id(s)] for s in train_items + eval_items]
    train_features, eval_features = features[: len(train_items)], features[len(train_items) :]
    recipe = training_recipe(model, usable, config)
    checkpoint = latest_checkpoint(output_dir) if config.resume else None
    if checkpoint is not None:
        check_checkpoint_recipe(checkpoint, recipe)
        restore_draft_tables(model, checkpoint)
    else:
        if model.config.draft_vocab_size is not None and init_dir is not None:
            restore_draft_vocabulary(model, init_dir)
        elif model.config.draft_vocab_size is not None:
            model.set_draft_vocabulary(most_emitted_tokens(train_features, model.config.draft_vocab_size))
        if model.config.draft_datastore_size is not None:  # from every answer: the datastore is not what eval measures
            model.set_draft_datastore(*build_draft_datastore(
                usable, vocab_size=model.config.vocab_size, length=model.config.num_heads - 1,
                max_entries=model.config.draft_datastore_size, min_count=config.datastore_min_count))

    if init_dir is not None:  # checked above; the draft vocabulary was set from it
        peft_model = PeftModel.from_pretrained(model, str(init_dir), is_trainable=True)
    else:
        # LoRA's A matrices start random: seed them as Trainer seeds the rest (it calls set_seed(seed) itself, but
        # only once the adapter exists), so that one preset and seed give the same heads in every process
        set_seed(config.seed)
        peft_model = get_peft_model(model, lora_config)
    on_cuda = model.device.type == "cuda"  # train where the caller put the model (and where the features are)
    args = TrainingArguments(
        output_dir=str(output_dir),
        learning_rate=config.learning_rate,
        num_train_epochs=config.num_train_epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        per_device_eval_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        warmup_steps=config.warmup_ratio,  # a float below 1 is a ratio of the total steps
        lr_scheduler_type="cosine",
        train_sampling_strategy="group_by_length" if config.group_by_length else "random",
        eval_strategy="steps" if eval_features else "no",
        eval_steps=config.eval_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=2,
        logging_steps=config.logging_steps,
        seed=config.seed,
        data_seed=config.seed,
        bf16=on_cuda if config.bf16 is None else config.bf16,
        use_cpu=not on_cuda,
        remove_unused_columns=False,
        report_to=[],
        disable_tqdm=not progress,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,  # the cached features already live on the model's device
    )
    trainer = HeadsTrainer(model=peft_model, args=args, recipe=recipe, head_loss=config.head_loss,
                           train_dataset=ListDataset(train_features),
                           eval_dataset=ListDataset(eval_features) if eval_features else None,
                           data_collator=collate_features)
    trainer.add_callback(AgreementInProgressBar(trainer))
    if config.deadline is not None:
        trainer.add_callback(StopAtDeadline(config.deadline))
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    metrics = trainer.evaluate() if eval_features else {}

    save_atomically(peft_model, output_dir / "adapter", overwrite=True, write_extra=partial(save_head_settings, model))
    merged = peft_model.merge_and_unload().eval()  # Trainer left it in training mode (dropout on, for GPT-2)
    save_atomically(merged, output_dir / "merged", tokenizer=tokenizer, overwrite=True)
    return merged, metrics

