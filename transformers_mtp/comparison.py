# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Side-by-side timing of plain greedy `generate()` and multi-token mode, in one process, interleaved, after warm-up.

Absolute times on shared machines are noise; the ratios measured here, run back to back on the same prompt, are not.
"""

import time
from dataclasses import dataclass, field

import torch

from .precision import NEAR_TIE_MARGIN, Divergence, divergence, greedy_logits


@dataclass
class Comparison:
    """One prompt, both modes. Times are medians over `repeats` interleaved runs."""

    prompt_tokens: int
    new_tokens: int
    identical: bool
    greedy_seconds: float
    multi_token_seconds: float
    tokens_per_forward: float
    head_acceptance: list[float] = field(default_factory=list)
    greedy_ids: torch.Tensor | None = None
    multi_token_ids: torch.Tensor | None = None
    # reduced precision, where the outputs differ: where they parted and how close greedy's top two logits were there
    divergence: Divergence | None = None

    @property
    def multi_token_new_tokens(self) -> int:
        return self.multi_token_ids.shape[1] - self.prompt_tokens

    @property
    def speedup(self) -> float:
        """Multi-token tokens/s over plain greedy tokens/s (outputs of different lengths, as a bfloat16 output that
        parted from greedy's may be, are compared per token)."""
        return (self.greedy_seconds / self.multi_token_seconds) * self.multi_token_new_tokens / max(self.new_tokens, 1)

    @property
    def near_tie(self) -> bool:
        """Identical, or parted from greedy at a near-tie (precision.NEAR_TIE_MARGIN): the guarantee of its dtype."""
        return self.identical or (self.divergence is not None and self.divergence.margin <= NEAR_TIE_MARGIN)


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


@torch.inference_mode()
def compare_with_greedy(model, input_ids, *, max_new_tokens=128, num_predict_heads=None, draft_tree_size=None, repeats=1,
                        **generate_kwargs):
    """Run plain greedy and verified multi-token decoding on `input_ids` [1, T]; alternate their order each repeat.
    `num_predict_heads` and `draft_tree_size` go to the multi-token run (None: the generation config's)."""
    greedy = lambda: model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False, **generate_kwargs)
    multi_token = lambda: model.generate(
        input_ids, max_new_tokens=max_new_tokens, do_sample=False, multi_token_mode=True,
        num_predict_heads=num_predict_heads, draft_tree_size=draft_tree_size, return_dict_in_generate=True,
        **generate_kwargs,
    )
    greedy_times, mtp_times = [], []
    for repeat in range(repeats):
        order = ((greedy_times, greedy), (mtp_times, multi_token))
        for times, fn in order if repeat % 2 == 0 else reversed(order):
            seconds, result = _timed(fn)
            times.append(seconds)
            if fn is greedy:
                greedy_ids = result
            else:
                mtp_out = result
    stats = mtp_out.multi_token_stats
    identical = bool(torch.equal(greedy_ids, mtp_out.sequences))
    parted = None
    if not identical:  # where, and how close a call it was for greedy: rerun it untimed, keeping its logits
        logits = greedy_logits(model, input_ids, greedy_ids, max_new_tokens, **generate_kwargs)
        if logits is not None:
            start = input_ids.shape[1]
            parted = divergence(greedy_ids[0, start:], logits, mtp_out.sequences[0, start:])
    return Comparison(
        prompt_tokens=input_ids.shape[1],
        new_tokens=greedy_ids.shape[1] - input_ids.shape[1],
        identical=identical,
        greedy_seconds=sorted(greedy_times)[len(greedy_times) // 2],
        multi_token_seconds=sorted(mtp_times)[len(mtp_times) // 2],
        tokens_per_forward=stats.tokens_per_forward,
        head_acceptance=stats.head_acceptance,
        greedy_ids=greedy_ids,
        multi_token_ids=mtp_out.sequences,
        divergence=parted,
    )


def warm_up(model, input_ids, *, num_predict_heads=None, draft_tree_size=None):
    """One short run of each mode, so one-time costs (allocator, kernels selection) land outside the timing."""
    compare_with_greedy(model, input_ids, max_new_tokens=8, num_predict_heads=num_predict_heads,
                        draft_tree_size=draft_tree_size)
