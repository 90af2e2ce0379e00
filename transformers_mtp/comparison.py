# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Side-by-side timing of plain greedy `generate()` and multi-token mode, in one process, interleaved, after warm-up.

Absolute times on shared machines are noise; the ratios measured here, run back to back on the same prompt, are not.
"""

import time
from dataclasses import dataclass, field

import torch


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

    @property
    def speedup(self) -> float:
        """Multi-token tokens/s over plain greedy tokens/s (same tokens, so the inverse time ratio)."""
        return self.greedy_seconds / self.multi_token_seconds


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
    return Comparison(
        prompt_tokens=input_ids.shape[1],
        new_tokens=greedy_ids.shape[1] - input_ids.shape[1],
        identical=bool(torch.equal(greedy_ids, mtp_out.sequences)),
        greedy_seconds=sorted(greedy_times)[len(greedy_times) // 2],
        multi_token_seconds=sorted(mtp_times)[len(mtp_times) // 2],
        tokens_per_forward=stats.tokens_per_forward,
        head_acceptance=stats.head_acceptance,
        greedy_ids=greedy_ids,
        multi_token_ids=mtp_out.sequences,
    )


def warm_up(model, input_ids, *, num_predict_heads=None, draft_tree_size=None):
    """One short run of each mode, so one-time costs (allocator, kernels selection) land outside the timing."""
    compare_with_greedy(model, input_ids, max_new_tokens=8, num_predict_heads=num_predict_heads,
                        draft_tree_size=draft_tree_size)
