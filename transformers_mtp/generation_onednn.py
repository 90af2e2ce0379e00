# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Float32 trunk passes of several tokens through oneDNN's matrix products (`generate(..., onednn_verify=...)`).

A verify pass multiplies a block of a few rows (the last token and its drafts: 9 for a tree of 8) by every weight of
the trunk. torch computes a float32 `linear` on CPU with MKL's sgemm; on this project's 2-core AMD EPYC, for SmolLM2's
shapes, MKL takes 2-2.5x as long as oneDNN (also inside torch, which uses it for bfloat16) once there are 3 rows or
more (576 -> 1,536 over 9 rows: 245 against 100 us; benchmarks/README.md, "oneDNN for float32 verify passes"),
which is why a float32 verify pass cost about 1.6x a one-token pass where in bfloat16 it costs 1.15x. Within the
multi-token decoding's trunk passes, `OneDNNLinear` sends such products to oneDNN instead.

Both are float32 products that sum in their own order; a verify block's logits already differ in their last bits from
the one-token passes of plain greedy (any two kernels, or one kernel at two shapes, do), and the tokens stay the
argmax of the model's float32 logits: the output is checked identical to plain greedy's by the same tests and
benchmarks as before. One-token passes (and products under 2^18 weights, where oneDNN's fixed cost loses) keep torch's
own kernel; plain `generate()` is never touched.

Why a `TorchFunctionMode` and a private operator: torch has no switch that sends float32 `linear` to oneDNN at full
precision (`torch.backends.mkldnn.matmul.fp32_precision` only allows reduced-precision ones), and
`torch.ops.mkldnn._linear_pointwise` is the oneDNN linear that torch's own compiler (inductor, with freezing) emits.
Being private, it is probed once against `torch.nn.functional.linear` before it is used.

Copied next to the weights by `save_pretrained` (through generation_state.py): imports only torch, transformers and
`from .module import Name`.
"""

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from .generation_draft_precision import cpu_flags

MIN_ROWS = 3  # measured: at 2 rows oneDNN loses on 576 x 576 (71 against 44 us) and barely wins on 1,536 x 576
MIN_WEIGHT_NUMEL = 2**18  # measured: oneDNN's fixed cost (about 30 us) loses on 192 x 576 up to 5 rows
_probe_result = None  # None: not probed yet; else the reason it cannot be used ("" where it can)


def _probe():
    """Why oneDNN's float32 linear cannot be used in this process (a sentence), or "" where it can."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build has no oneDNN linear (torch.ops.mkldnn._linear_pointwise)"
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(shape, generator=generator) for shape in ((2, 5, 64), (96, 64), (96,)))
    try:
        with torch.no_grad():
            got = onednn_float32_linear(x, weight, bias)
    except Exception as error:  # a changed private signature, an unsupported CPU: fall back, say why
        return f"torch.ops.mkldnn._linear_pointwise failed on this machine ({type(error).__name__}: {error})"
    expected = torch.nn.functional.linear(x, weight, bias)
    if got.shape != expected.shape or got.dtype != expected.dtype or not torch.allclose(got, expected, atol=1e-4):
        return "torch.ops.mkldnn._linear_pointwise does not compute float32 linear here (probe mismatch)"
    return ""


def onednn_linear_unavailable():
    """Why oneDNN's float32 linear cannot be used in this process, or None (probed once)."""
    global _probe_result
    if _probe_result is None:
        _probe_result = _probe()
    return _probe_result or None


def onednn_verify_unsupported(model):
    """Why `model`'s trunk passes cannot use oneDNN (a sentence), or None where they can."""
    if model.dtype != torch.float32:
        return f"the model is {model.dtype}, not float32 (torch already uses oneDNN for it)"
    if model.device.type != "cpu":
        return f"the model is on {model.device.type}, not the CPU"
    return onednn_linear_unavailable()


def auto_onednn_verify(model):
    """onednn_verify="auto": on for a float32 CPU model on an x86 CPU with AVX-512, where it was measured faster."""
    return onednn_verify_unsupported(model) is None and "avx512f" in cpu_flags()


class OneDNNLinear(TorchFunctionMode):
    """Within it, float32 CPU `linear` over at least `MIN_ROWS` rows with a large plain weight runs on oneDNN; every
    other call (other dtypes, devices, tensor subclasses, autograd, small products) runs as torch runs it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            x, weight, bias = _linear_arguments(*args, **kwargs)
            if self._routes(x, weight, bias):
                return onednn_float32_linear(x, weight, bias)
        return func(*args, **kwargs)

    @staticmethod
    def _routes(x, weight, bias):
        tensors = [x, weight] + ([bias] if bias is not None else [])
        if any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in tensors):
            return False  # None, a quantized or other tensor subclass
        if any(t.dtype != torch.float32 or t.device.type != "cpu" or t.layout != torch.strided for t in tensors):
            return False
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return False  # the oneDNN operator has no backward
        return weight.dim() == 2 and weight.numel() >= MIN_WEIGHT_NUMEL and x.dim() >= 1 and x.shape[-1] > 0 \
            and x.numel() // x.shape[-1] >= MIN_ROWS


def onednn_float32_linear(x, weight, bias=None):
    """`torch.nn.functional.linear(x, weight, bias)` computed by oneDNN (float32 CPU tensors)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _linear_arguments(input, weight, bias=None):
    return input, weight, bias


def onednn_linear(enabled):
    """The context of a trunk pass: `OneDNNLinear()` when `enabled`, else nothing."""
    return OneDNNLinear() if enabled else contextlib.nullcontext()
