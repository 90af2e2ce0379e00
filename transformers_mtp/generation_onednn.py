# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Float32 trunk passes of several tokens through oneDNN's matrix products (`generate(..., onednn_verify=...)`).

A verify pass multiplies a block of a few rows (the last token and its drafts: 9 for a tree of 8) by every weight of
the trunk. torch computes a float32 `linear` on CPU with MKL's sgemm; on this project's 2-core AMD EPYC, for SmolLM2's
shapes, MKL takes 1.4-3.7x as long as oneDNN (also inside torch, which uses it for bfloat16) once there are 3 rows
or more (576 -> 1,536 over 9 rows: 246 against 151 us; the unembedding 19.6 against 5.4 ms; benchmarks/README.md,
"oneDNN for float32 verify passes"), which is why a float32 verify pass cost about 1.6x a one-token pass where in
bfloat16 it costs 1.15x. Within the multi-token decoding's trunk passes, `OneDNNLinear` sends such products to oneDNN
instead.

Both are float32 products that sum in their own order; a verify block's logits already differ in their last bits from
the one-token passes of plain greedy (any two kernels, or one kernel at two shapes, do), and the tokens stay the
argmax of the model's float32 logits: the output is checked identical to plain greedy's by the same tests and
benchmarks as before. Products of one or two rows (and weights under 2^18 elements, where oneDNN's fixed cost loses)
keep torch's own kernel, except the unembedding, which oneDNN computes faster at one row too; plain `generate()` is
never touched.

Why replaced `forward`s and a private operator: torch has no switch that sends float32 `linear` to oneDNN at full
precision (`torch.backends.mkldnn.matmul.fp32_precision` only allows reduced-precision ones), and
`torch.ops.mkldnn._linear_pointwise` is the oneDNN linear that torch's own compiler (inductor, with freezing) emits.
Being private, it is probed once against `torch.nn.functional.linear` before it is used.

Copied next to the weights by `save_pretrained` (through generation_state.py): imports only torch, transformers and
`from .module import Name`.
"""

import threading

import torch

from .generation_draft_precision import cpu_flags

MIN_ROWS = 3  # measured: at 2 rows oneDNN loses on 576 x 576 (71 against 44 us) and barely wins on 1,536 x 576
MIN_WEIGHT_NUMEL = 2**18  # measured: oneDNN's fixed cost (about 30 us) loses on 192 x 576 up to 5 rows
ONE_ROW_MIN_WEIGHT_NUMEL = 2**22  # measured at one row: 49,152 x 576 (the unembedding) 7.8 -> 3.6 ms; 576 x 1,536 loses
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


# x86 vector extensions on which oneDNN's float32 products were measured faster than MKL's for a verify pass's few
# rows (benchmarks/README.md, "oneDNN for float32 verify passes"): AVX-512 (the AVX512-BF16 AMD EPYC, 2026-12-03) and
# AVX2 without AVX-512 (a Zen 2 AMD EPYC, 2026-12-06: the unembedding over 9 rows 23.5 against 8.9 ms)
ONEDNN_MEASURED_CPU_FLAGS = ("avx512f", "avx2")


def auto_onednn_verify(model):
    """onednn_verify="auto": on for a float32 CPU model on an x86 CPU with AVX2 or AVX-512, where it was measured
    faster."""
    flags = cpu_flags()
    return onednn_verify_unsupported(model) is None and any(flag in flags for flag in ONEDNN_MEASURED_CPU_FLAGS)


class OneDNNLinear:
    """Within it, `model`'s float32 CPU `torch.nn.Linear` layers with a weight of at least `min_weight_numel`
    elements compute their products on oneDNN when the input has at least `MIN_ROWS` rows (at least one row for
    weights of `ONE_ROW_MIN_WEIGHT_NUMEL` elements or more: the unembedding); every other call (other dtypes, devices,
    tensor subclasses, autograd, small products, other threads) runs as torch runs it.

    Why per layer rather than a `TorchFunctionMode` over every operator: a mode intercepts each of the few thousand
    torch calls of a pass, which cost 4-9 ms per trunk pass of SmolLM2 here (one token: 59.8 ms plain, 65.7 under the
    mode; benchmarks/onednn_routing_overhead.py); replacing the `forward` of the routed layers for the duration of
    the pass costs one Python call per layer. Layers whose `forward` is already replaced on the instance (accelerate's hooks) are left alone."""

    def __init__(self, model, min_weight_numel=None):
        threshold = MIN_WEIGHT_NUMEL if min_weight_numel is None else min_weight_numel
        # (layer, its routed forward), built once per generate() call rather than per pass
        self.layers = [
            (module, self._routed_forward(module, 1 if module.weight.numel() >= ONE_ROW_MIN_WEIGHT_NUMEL else MIN_ROWS))
            for module in model.modules()
            if type(module) is torch.nn.Linear and _plain_float32_cpu(module.weight)
            and (module.bias is None or _plain_float32_cpu(module.bias)) and module.weight.numel() >= threshold
        ]
        self._installed, self._thread = [], None

    def __enter__(self):
        self._thread = threading.get_ident()
        for module, forward in self.layers:
            if "forward" not in module.__dict__:
                module.forward = forward
                self._installed.append((module, forward))
        return self

    def __exit__(self, *exc_info):
        for module, forward in self._installed:
            if module.__dict__.get("forward") is forward:
                del module.forward
        self._installed = []
        return False

    def _routed_forward(self, module, min_rows):
        def forward(input):
            weight, bias = module.weight, module.bias
            if (_plain_float32_cpu(input) and input.dim() >= 1 and input.shape[-1] > 0
                    and input.numel() // input.shape[-1] >= min_rows and threading.get_ident() == self._thread
                    and not (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))):
                return onednn_float32_linear(input, weight, bias)  # looked up per call: the tests spy on it
            return torch.nn.functional.linear(input, weight, bias)

        return forward


def _plain_float32_cpu(tensor):
    """A plain (not quantized, not a subclass) strided float32 CPU tensor."""
    return type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.dtype == torch.float32 \
        and tensor.device.type == "cpu" and tensor.layout == torch.strided


def onednn_float32_linear(x, weight, bias=None):
    """`torch.nn.functional.linear(x, weight, bias)` computed by oneDNN (float32 CPU tensors)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
