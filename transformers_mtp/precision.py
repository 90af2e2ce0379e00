# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Which precision to run, and what each one guarantees.

- float32: verified multi-token decoding gives token for token the text of plain greedy `generate()`.
- bfloat16 / float16: every token is the argmax of the base model's own logits in the pass that verified it, so the
  text can part from plain greedy of the same dtype only where greedy's top two logits are within rounding of each
  other (a near-tie): a pass over k tokens rounds differently from k passes over one, and so does a KV cache written
  in blocks. transformers' own prompt-lookup decoding and vLLM behave the same way. `divergence_report` measures it.

`resolve_dtype("auto")` picks bfloat16 where the hardware computes it natively (a CUDA GPU that supports it; a CPU with
AVX512-BF16 or AMX-BF16) and float32 elsewhere, where bfloat16 is emulated and slower. Why bfloat16 is the default
there: benchmarks/README.md, "Precision".
"""

import platform
from dataclasses import dataclass

import torch

# the CPU's native-bfloat16 check lives with the drafting copy, which `trust_remote_code` loading also needs
from .generation_draft_precision import NATIVE_BF16_CPU_FLAGS, cpu_bf16_flags  # noqa: F401

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
# A near-tie: greedy's top-two logit margin at most this, in logits (4 steps of bfloat16's rounding for logits of 16
# to 32). Measured on SmolLM2-135M in bfloat16 on the 16 benchmark prompts (benchmarks/results/smollm2-precision/
# guarantee-bfloat16.json): the 13 outputs of verified decoding and the 12 of transformers' prompt lookup that parted
# from plain greedy all parted at a margin of at most 0.25 (median 0.125 and 0.078), while greedy's median margin over
# all positions is 2.06.
NEAR_TIE_MARGIN = 0.5
# ... and among the smallest margins of that greedy output: its rank (the fraction of positions with a margin at most
# as large) at most this. Measured: at most 0.117 (median 0.070 and 0.039); a position picked at random ranks 0.5 on
# average.
NEAR_TIE_RANK = 0.25


def resolve_dtype(dtype="auto", device="cpu"):
    """(torch.dtype, why) for a `--dtype` value: a name in DTYPE_CHOICES or a torch.dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype={dtype} is not supported; use one of {list(DTYPE_CHOICES)}.")
        return dtype, "as asked"
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype={dtype!r} is not one of {list(DTYPE_CHOICES)}; 'auto' picks bfloat16 where the "
                         "hardware has it natively, else float32.")
    if dtype != "auto":
        return getattr(torch, dtype), "as asked"
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16, "auto: this GPU computes bfloat16 natively"
        return torch.float32, "auto: this GPU has no native bfloat16"
    flags = cpu_bf16_flags()
    if flags:
        return torch.bfloat16, f"auto: this CPU computes bfloat16 natively ({', '.join(flags)})"
    return torch.float32, f"auto: this CPU ({platform.machine()}) has no native bfloat16 (AVX512-BF16 / AMX-BF16)"


def guarantee(dtype):
    """One line: what verified multi-token decoding promises in `dtype`."""
    if dtype == torch.float32:
        return "float32: token for token the text of plain greedy decoding"
    return (f"{str(dtype).removeprefix('torch.')}: each token is the base model's argmax in the pass that verified it; "
            "the text may part from plain greedy of the same dtype at a near-tie of its top two logits")


def top2_margins(logits):
    """[N, V] logits -> [N] top-1 minus top-2 logit, in float32."""
    top = logits.float().topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def first_difference(a, b):
    """Index of the first position where 1-D sequences `a` and `b` differ (within the shorter one), else None."""
    n = min(a.shape[0], b.shape[0])
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else None


@torch.inference_mode()
def greedy_logits(model, input_ids, greedy_sequences, max_new_tokens, **generate_kwargs):
    """Plain greedy's logits per new token [N, V], from one more untimed greedy run of `input_ids`; None if that run
    did not give `greedy_sequences` again (then no divergence can be placed against it)."""
    out = model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True,
                         output_logits=True, **generate_kwargs)
    return torch.cat(out.logits) if torch.equal(out.sequences, greedy_sequences) else None


@dataclass
class Divergence:
    """Where one output parted from plain greedy's: the new-token index, and greedy's top-two margin there and its
    rank among the margins at every position of that greedy output (the fraction of positions with a margin at most
    this large: a near-tie has a rank near 0, a defect a rank anywhere)."""

    position: int
    margin: float
    rank: float


def divergence(greedy_new_tokens, greedy_logits, other_new_tokens):
    """A `Divergence`, or None where the outputs agree. greedy_logits: [N, V], plain greedy's logits per new token
    (`generate(output_logits=True)`, stacked)."""
    position = first_difference(greedy_new_tokens, other_new_tokens)
    if position is None:
        return None
    margins = top2_margins(greedy_logits)
    margin = float(margins[position])
    return Divergence(position, margin, float((margins <= margin).float().mean()))


@torch.inference_mode()
def agreement_with(model, sequences, prompt_length):
    """How plausible new tokens are to `model` (e.g. the float32 one), teacher-forced in one pass per row:
    (fraction of new tokens that are its argmax, mean log-likelihood per new token). sequences: [B, T] with the first
    `prompt_length` tokens the prompt."""
    logits = model(sequences).logits[:, prompt_length - 1 : -1].float()  # predicts the new tokens
    chosen = logits.gather(-1, sequences[:, prompt_length:, None])[..., 0]
    log_likelihood = chosen - logits.logsumexp(-1)
    return float((chosen == logits.max(-1).values).float().mean()), float(log_likelihood.mean())
