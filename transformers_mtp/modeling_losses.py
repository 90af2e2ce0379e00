# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The multi-token loss: each head's cross-entropy against the token it predicts, then aggregated.

Copied next to the weights by `save_pretrained` (through modeling_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

import torch
import torch.nn.functional as F


def head_cross_entropy(logits, targets, offset, num_items_in_batch=None):
    """
    Cross-entropy of `logits` [B, T, V] at position t against `targets[t + offset]` (-100 ignored), where `targets`
    are already shifted as `shift_labels` are: `targets[t]` is the token that follows position t. Mean over the scored
    tokens, or their sum divided by `num_items_in_batch` (as transformers' causal-LM loss does under gradient
    accumulation). A head with no scored token gives 0 rather than NaN.
    """
    length = logits.shape[1]
    pred, target = logits[:, : length - offset].float(), targets[:, offset:].to(logits.device)
    total = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum")
    if num_items_in_batch is not None:
        return total / num_items_in_batch
    return total / (target != -100).sum().clamp(min=1)


def head_kl_divergence(logits, teacher_log_probs, targets, offset):
    """
    KL(base || head) of `logits` [B, T, V] at position t against the base model's distribution `teacher_log_probs`
    [B, T, V] at t + offset (the one whose argmax `targets[t + offset]` is), over the positions where
    `targets[t + offset]` is scored (not -100). Mean over those positions; 0 where none is scored.
    """
    length = logits.shape[1]
    pred = F.log_softmax(logits[:, : length - offset].float(), dim=-1)
    teacher = teacher_log_probs[:, offset:].float()
    scored = targets[:, offset:].to(logits.device) != -100
    per_position = (teacher.exp() * (teacher - pred)).sum(-1)
    return (per_position * scored).sum() / scored.sum().clamp(min=1)


def shifted_targets(labels=None, shift_labels=None):
    """The token after each position [B, T] (-100 where none): `shift_labels` as given, else `labels` shifted left."""
    if shift_labels is not None:
        return shift_labels
    return F.pad(labels[:, 1:], (0, 1), value=-100)


def aggregate_head_losses(per_head, weights=None):
    """Mean of the per-head losses, or their `weights`-weighted mean."""
    if weights is None:
        return per_head.mean()
    weights = torch.tensor(weights, dtype=per_head.dtype, device=per_head.device)
    return (weights * per_head).sum() / weights.sum()


def multi_token_loss(logits, head_logits, labels=None, weights=None, *, shift_labels=None, num_items_in_batch=None):
    """
    Each head's cross-entropy computed separately, then aggregated (seed 004: a joint loss over the block diverged).

    logits: [B, T, V] (head 0), head_logits: [B, T, K-1, V], labels: [B, T] with -100 ignored, the usual causal-LM
    labels (the shift happens here: head i at position t is scored against labels[t + 1 + i]); or `shift_labels`
    [B, T], already shifted (as sequence-parallel training passes them): head i at t is scored against
    shift_labels[t + i]. `num_items_in_batch`: as in transformers' causal-LM loss (gradient accumulation).
    Returns (loss, per_head [K]).
    """
    targets = shifted_targets(labels, shift_labels)
    heads = [logits] + [head_logits[:, :, i] for i in range(head_logits.shape[2])]
    per_head = torch.stack([head_cross_entropy(head, targets, i, num_items_in_batch) for i, head in enumerate(heads)])
    return aggregate_head_losses(per_head, weights), per_head
