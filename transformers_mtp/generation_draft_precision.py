# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Drafting in another precision than the model verifies in (`generate(..., draft_dtype="bfloat16")`).

Every drafted token is checked by the verify pass, which runs in the model's own dtype, so the precision of the
drafts changes how many are kept, never the output of verified decoding (greedy: still the tokens of plain greedy;
sampling: still the model's distribution, since each draft is accepted against the same distribution it was drawn
from). Unverified decoding emits the drafts as they are, so there it changes the text.

Why: on a 2-core CPU with native bfloat16 (AVX512-BF16) the heads' small matrix products are several times cheaper in
bfloat16 than in float32 (float32's jump from one row to two: benchmarks/README.md, "Where a step's time goes"), and
a drafter that runs one layer step per depth (`head_type="chained"`) pays that at every step.

Copied next to the weights by `save_pretrained`: imports only torch, transformers and `from .module import Name`.
"""

import copy
from pathlib import Path

import torch

from .modeling_stacked_heads import StackedHeads

DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# CPU flags (Linux /proc/cpuinfo) of native bfloat16 arithmetic: AVX512-BF16 (AMD Zen 4+, Intel Cooper Lake+) and
# AMX-BF16 (Intel Sapphire Rapids+). torch has no public query for them: `torch.backends.mkldnn` reports bf16 support
# wherever oneDNN can emulate it (any AVX512 CPU), which is the slow path.
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The flags this CPU reports (Linux /proc/cpuinfo; empty where the OS does not say)."""
    path = Path(cpuinfo)
    if not path.is_file():
        return frozenset()
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_bf16_flags(cpuinfo="/proc/cpuinfo"):
    """The native-bfloat16 flags this CPU reports (empty where none, or where the OS does not say: not Linux)."""
    flags = cpu_flags(cpuinfo)
    return tuple(flag for flag in NATIVE_BF16_CPU_FLAGS if flag in flags)


def computes_bfloat16_natively(device):
    """Whether `device` (a torch.device) has bfloat16 arithmetic in hardware, where it is not emulated (slower)."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(cpu_bf16_flags())


def auto_draft_dtype(model):
    """draft_dtype="auto": bfloat16 for a float32 model on hardware that computes bfloat16 natively, else the
    model's own dtype (None)."""
    if model.dtype == torch.float32 and computes_bfloat16_natively(model.device):
        return torch.bfloat16
    return None


class DraftingCopy:
    """The model's heads, final norm and drafting unembedding cast to `dtype`, for drafting only (the model's own
    weights are untouched). The token embedding is not copied: its rows are cast as they are looked up."""

    def __init__(self, model, dtype):
        self.dtype = dtype
        self.version = self._version_of(model)
        with torch.no_grad():
            self.heads = copy.deepcopy(model.mtp_heads).to(dtype)
            self.final_norm = copy.deepcopy(model._parts()[2]).to(dtype)
            weight, self.draft_ids = model.draft_unembedding()
            self.draft_weight = weight.to(dtype)
            heads = list(self.heads[: model.config.num_heads - 1])
            self.stacked = StackedHeads(heads) if heads and StackedHeads.supports(heads, model.config) else None

    @classmethod
    def of(cls, model, dtype):
        """`model`'s drafting copy in `dtype`, reusing the one built last time while no head weight changed."""
        cached = model.__dict__.get("_drafting_copy")  # a plain attribute: never part of the state dict
        if (cached is None or cached.dtype != dtype
                or cached.version != cls._version_of(model)):
            cached = cls(model, dtype)
            model.__dict__["_drafting_copy"] = cached
        return cached

    @staticmethod
    def _version_of(model):
        # what the copy is made of: the heads' weights and tables (the draft vocabulary's ids), the final norm and
        # the unembedding whose rows the draft vocabulary takes
        tensors = [*model.mtp_heads.parameters(), *model.mtp_heads.buffers(), *model._parts()[2].parameters(),
                   model.lm_head.weight]
        return StackedHeads._version_of(tensors)

    def cast(self, tensor):
        return None if tensor is None else tensor.to(self.dtype)
