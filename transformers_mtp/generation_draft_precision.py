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

import torch

from .modeling_stacked_heads import StackedHeads

DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DraftingCopy:
    """The model's heads, final norm and drafting unembedding cast to `dtype`, for drafting only (the model's own
    weights are untouched). The token embedding is not copied: its rows are cast as they are looked up."""

    def __init__(self, model, dtype):
        self.dtype = dtype
        self.version = self._version_of(model)
        with torch.no_grad():
            self.heads = copy.deepcopy(model.mtp_heads).to(dtype)
            self.final_norm = copy.deepcopy(model._parts()[2]).to(dtype)
            weight, _ = model.draft_unembedding()
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
