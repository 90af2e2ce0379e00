# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The training step: the heads' loss from cached trunk features (`features_loss`), the `Trainer` subclass that
computes it, evaluates per-head top-1 agreement and writes checkpoints atomically (`HeadsTrainer`), and the progress
bar callback that shows them."""

import logging
import os
import shutil
import tempfile
import time

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..modeling_losses import aggregate_head_losses, head_cross_entropy, head_kl_divergence
from .adapters import save_head_settings
from .checkpoints import list_checkpoints, save_recipe
from .config import HEAD_LOSSES


def on_policy_targets(targets, next_ids, teacher, offset):
    """
    `targets` [B, T] (shifted: `targets[t]` is the base model's argmax after position t) with -100 wherever head
    `offset` at position t = s - offset would be scored on a path the base model would not have written: head i at t
    predicts the base model's token t + 1 + i as if tokens t + 1 .. t + i were its own, but a text's tokens are not
    always its argmax (teacher-forced conversations, bfloat16 answers, sampled answers). At inference every token a
    head builds on was verified, i.e. is the argmax, so such targets (and the known next token a `feature_and_token`
    head reads, `next_ids[t]`) teach what inference never asks. Prompt positions (teacher -100) are given text.
    """
    consistent = (next_ids == teacher) | (teacher == -100)  # [B, T]: the text's next token is the model's own
    valid = torch.ones_like(consistent)
    for j in range(offset):  # head `offset` at t needs tokens t + 1 .. t + offset to be the model's own
        valid[:, : valid.shape[1] - j] &= consistent[:, j:]
    masked = targets.clone()
    masked[:, offset:] = torch.where(valid[:, : targets.shape[1] - offset], targets[:, offset:], -100)
    return masked


def features_loss(model, batch, head_loss="cross_entropy"):
    """
    Loss of heads 1..K-1 from cached trunk features (head 0 is the frozen base: its loss is a constant and left out).
    Each head is scored only where the text it builds on is the base model's own argmax (`on_policy_targets`).
    `head_loss`: "cross_entropy" against the base model's argmax (what greedy verification accepts), or "kl": the KL
    divergence from the base model's distribution over the drafting vocabulary (soft targets, EAGLE-3 / HASS; what
    speculative sampling's acceptance depends on), recomputed here from the cached lm_head inputs.
    Returns (loss, per-head losses [K-1], per-head top-1 agreement counts [K-1, 2] as (agreed, scored)).
    """
    teacher, mask = batch["teacher"], batch["attention_mask"]
    batch_size, length = teacher.shape
    positions = torch.arange(length, device=teacher.device)[None].expand(batch_size, length)
    share_kv = model.uses_layer_input and model.config.heads_share_base_kv
    states, _ = model._head_states(
        normed=batch["normed"], layer_input=batch.get("layer_input"), next_token_ids=batch.get("next_ids"),
        position_ids=positions, key_padding_mask=mask if bool((mask == 0).any()) else None,
        base_kv=(batch["keys"], batch["values"]) if share_kv else None,
    )
    weight, draft_ids = model.draft_unembedding()
    head_logits = model.unembed(states, weight)  # [B, T, K-1, V or draft vocabulary]
    # teacher[t] is the base model's argmax at t, i.e. its token t + 1: already shifted, as `shift_labels` are. The
    # last position's argmax is a token past the end of the text, which is not scored.
    targets = F.pad(teacher[:, :-1], (0, 1), value=-100)
    draft_targets = targets
    if draft_ids is not None:  # targets as draft-vocabulary indices; a token outside it cannot be learned (-100)
        lookup = torch.full((model.config.vocab_size,), -100, dtype=torch.long, device=targets.device)
        lookup[draft_ids] = torch.arange(draft_ids.shape[0], device=targets.device)
        draft_targets = torch.where(targets == -100, targets, lookup[targets.clamp(min=0)])
    if head_loss not in HEAD_LOSSES:
        raise ValueError(f"head_loss={head_loss!r} is not one of {list(HEAD_LOSSES)}.")
    if head_loss == "kl":  # the frozen base model's own distribution, restricted (and renormalised) to `weight`'s rows
        with torch.no_grad():
            teacher_log_probs = F.log_softmax(model.unembed(batch["normed"], weight).float(), dim=-1)
    per_head, agreement = [], []
    for i in range(1, head_logits.shape[2] + 1):
        logits = head_logits[:, :, i - 1]
        head_targets = on_policy_targets(targets, batch["next_ids"], teacher, i)
        head_draft_targets = torch.where(head_targets == -100, head_targets, draft_targets)
        if head_loss == "kl":
            per_head.append(head_kl_divergence(logits, teacher_log_probs, head_targets, i))
        else:
            per_head.append(head_cross_entropy(logits, head_draft_targets, i))
        target = head_targets[:, i:]
        scored = target != -100  # agreement counts every target, in the draft vocabulary or not
        choice = logits[:, : length - i].argmax(-1)
        agreed = ((choice if draft_ids is None else draft_ids[choice]) == target) & scored
        agreement.append(torch.stack([agreed.sum(), scored.sum()]))
    per_head = torch.stack(per_head)
    weights = model.config.head_loss_weights
    return aggregate_head_losses(per_head, weights[1:] if weights else None), per_head, torch.stack(agreement)


class HeadsTrainer(Trainer):
    """`Trainer` whose loss comes from cached trunk features, with per-head top-1 agreement in the logs."""

    def __init__(self, *args, recipe=None, head_loss="cross_entropy", **kwargs):
        super().__init__(*args, **kwargs)
        self._agreement = None
        self.recipe = recipe  # written into each checkpoint (see `training_recipe`)
        self.head_loss = head_loss

    def _get_train_sampler(self, train_dataset=None):
        # Trainer infers lengths from an `input_ids` key, which cached features have not: give them their own
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if self.args.train_sampling_strategy == "group_by_length":
            return LengthGroupedSampler(self.args.train_batch_size * self.args.gradient_accumulation_steps,
                                        lengths=[len_of(item) for item in dataset])
        return super()._get_train_sampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset):
        # evaluation reads every held-out sequence once; its order changes nothing
        return torch.utils.data.SequentialSampler(eval_dataset) if eval_dataset is not None else None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # Accelerate applies `bf16` by wrapping the model's `forward` in autocast; the heads' loss comes from cached
        # features through `_head_states`, never `forward`, so the mixed-precision context is entered here (without
        # it `bf16=True` trained in float32). Losses are taken in float32 (modeling_losses.py); evaluation runs the
        # saved float32 weights as they are.
        with self.accelerator.autocast():
            loss, _, agreement = features_loss(model.get_base_model(), inputs, self.head_loss)
        self._agreement = agreement.detach() + (self._agreement if self._agreement is not None else 0)
        return (loss, None) if return_outputs else loss

    def log(self, logs, *args, **kwargs):
        if self._agreement is not None and "loss" in logs:
            for i, (agreed, scored) in enumerate(self._agreement.tolist(), start=1):
                logs[f"agree_head{i}"] = round(agreed / max(scored, 1), 4)
            self._agreement = None
        super().log(logs, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        # Trainer writes checkpoint-N in place; an interruption mid-write would leave a checkpoint that resume
        # trusts. Write it in a staging folder and move it into place with one rename instead.
        real_dir = self.args.output_dir
        staging = tempfile.mkdtemp(prefix=".staging-", dir=real_dir)
        self.args.output_dir = staging
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.output_dir = real_dir
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        # what resume reads back instead of recomputing: the head settings, draft vocabulary, datastore and recipe
        save_head_settings(self.model.get_base_model(), os.path.join(staging, name))
        if self.recipe is not None:
            save_recipe(os.path.join(staging, name), self.recipe)
        target = os.path.join(real_dir, name)
        if os.path.exists(target):
            shutil.rmtree(target)
        os.rename(os.path.join(staging, name), target)
        shutil.rmtree(staging)
        checkpoints = list_checkpoints(real_dir)
        for old in checkpoints[: -self.args.save_total_limit] if self.args.save_total_limit else []:
            shutil.rmtree(old)

    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        model = self.model.get_base_model()
        was_training = model.training
        model.eval()
        losses, agreement = [], None
        for batch in self.get_eval_dataloader(eval_dataset):
            batch = self._prepare_inputs(batch)
            loss, _, counts = features_loss(model, batch, self.head_loss)
            losses.append(loss.item())
            agreement = counts if agreement is None else agreement + counts
        model.train(was_training)
        metrics = {f"{metric_key_prefix}_loss": sum(losses) / max(len(losses), 1)}
        for i, (agreed, scored) in enumerate(agreement.tolist() if agreement is not None else [], start=1):
            metrics[f"{metric_key_prefix}_agree_head{i}"] = round(agreed / max(scored, 1), 4)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


class AgreementInProgressBar(TrainerCallback):
    """Shows the loss and each head's top-1 agreement with the base model on the training progress bar."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        bar = next((cb.training_bar for cb in self.trainer.callback_handler.callbacks
                    if isinstance(cb, ProgressCallback) and cb.training_bar is not None), None)
        if bar is not None and logs and "loss" in logs:
            agree = "/".join(f"{logs[k]:.2f}" for k in sorted(logs) if k.startswith("agree_head"))
            bar.set_postfix(loss=f"{logs['loss']:.3f}", agree=agree)


class StopAtDeadline(TrainerCallback):
    """
    Ends training after the first optimizer step that finishes past `deadline` (a `time.time()` value), with a
    checkpoint, so the run's normal end follows (final evaluation, adapter and merged model) and `resume=True` can
    finish the remaining steps later. transformers' `TrainingArguments` bound a run by steps or epochs only, not by
    wall-clock time; a lent GPU or a session that ends at a fixed time needs the latter.
    """

    def __init__(self, deadline):
        self.deadline = deadline

    def on_step_end(self, args, state, control, **kwargs):
        if time.time() >= self.deadline and state.global_step < state.max_steps:
            control.should_training_stop = True
            control.should_save = True
            logging.getLogger(__name__).warning(
                "Time limit reached: training stops at step %d of %d (saved as a checkpoint; resume=True continues "
                "it).", state.global_step, state.max_steps)


def len_of(features):
    """Tokens of one sequence's features: a stored sequence knows its length without reading its tensors."""
    return features.length if hasattr(features, "length") else features["teacher"].shape[0]


class ListDataset(torch.utils.data.Dataset):
    """A list of feature dicts as a dataset."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]

