# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The float32 model's argmax over the vocabulary without its float32 unembedding (`certified_argmax`).

Greedy verification needs, at every verified position, only the argmax of the base model's float32 logits, not the
logits. On a CPU with native bfloat16 the float32 unembedding of SmolLM2 (49,152 x 576) is a quarter of a verify
pass (23 ms of about 95 for 17 rows on a 2-core AMD EPYC; 5 ms in bfloat16), so `CertifiedArgmax` computes the
logits in bfloat16, bounds their error rigorously, and recomputes in float32 only the tokens that the bound cannot
rule out (usually one or two a row), whose exact argmax is then the model's.

The bound, per position x [H] and vocabulary row w [H] (u = 2^-8: bfloat16's unit roundoff; g = H 2^-24 / (1 - H
2^-24): float32 accumulation over H terms, in any order):
  - rounding x and w to bfloat16 moves each product x_i w_i by at most (2u + u^2) |x_i w_i|;
  - the bfloat16 kernels accumulate those (exact in float32) products in float32: at most g (1 + u)^2 sum |x_i w_i|;
  - the float32 logit the model itself computes is within g sum |x_i w_i| of the exact dot product;
  - the product is rounded to bfloat16 on output: at most u / (1 - u) of its magnitude;
  - sum |x_i w_i| <= |x| |w| (Cauchy-Schwarz).
So |z - z~| <= eps = c1 |x| |w| + c2 |z~| with c1 = 2u + u^2 + g (1 + (1 + u)^2) and c2 = u / (1 - u), both inflated by
0.1% for the float32 rounding of the norms. The true argmax v* has z~[v*] + eps[v*] >= z[v*] >= z[u] >= z~[u] - eps[u]
for every u, so it is among the candidates {v : z~[v] + eps[v] >= max_u (z~[u] - eps[u])}. Where there are several,
their float32 logits decide (ties to the lowest id, as `torch.argmax`), in two steps:
  - the candidates' float32 logits z' alone (a product over their rows only). Any float32 product of a row, the one
    plain decoding computes included, is within e = g sum |x_i w_i| of the exact dot product, however its kernel
    orders the sum, so plain decoding's z differs from z' by at most 2e. Where the best candidate wins by more
    (z'[b] - 2e[b] > z'[u] + 2e[u] for every other u), it is plain decoding's argmax.
  - otherwise the candidates tie within float32's rounding, and the order of the sums decides: the row's whole
    float32 unembedding is computed one position at a time, as plain decoding computes its one new position's (the
    same product, so the same bits; a product over a subset of the rows may sum in another order: on a 2-core Intel
    Xeon with AMX a 2-row product differed from the 512-row one in the last bit and flipped a near-tie).
On SmolLM2's text the measured error stays under 15% of eps.

The float32 accumulation is what CPU kernels do (oneDNN's AVX512-BF16 and AMX instructions accumulate in float32);
cuBLAS may reduce in bfloat16 (`allow_bf16_reduced_precision_reduction`), so the bound is only claimed on CPU.

Copied next to the weights by `save_pretrained` (through generation_state.py): imports only torch, transformers and
`from .module import Name`.
"""

import torch

from .generation_draft_precision import computes_bfloat16_natively

_U16 = 2.0**-8  # bfloat16 unit roundoff (8 significand bits, round to nearest)
_U32 = 2.0**-24  # float32 unit roundoff


def float32_accumulation_bound(hidden_size):
    """g of the module docstring: a float32 dot product over `hidden_size` terms, summed in any order, is within
    g sum |x_i w_i| of the exact one (inflated by 1% for the float32 rounding of sum |x_i w_i| itself)."""
    return hidden_size * _U32 / (1 - hidden_size * _U32) * 1.01


def error_bound_constants(hidden_size):
    """(c1, c2) of the module docstring's bound for dot products over `hidden_size` terms."""
    accumulation = hidden_size * _U32 / (1 - hidden_size * _U32)
    c1 = 2 * _U16 + _U16 * _U16 + accumulation * (1 + (1 + _U16) ** 2)
    c2 = _U16 / (1 - _U16)
    return c1 * 1.001, c2 * 1.001


def certified_argmax_unsupported(model):
    """Why `model`'s argmax cannot be certified this way (a sentence), or None where it can."""
    if model.dtype != torch.float32:
        return f"the model is {model.dtype}, not float32 (its own unembedding is already that cheap)"
    if model.device.type != "cpu":
        return (f"the model is on {model.device.type}, whose bfloat16 kernels may reduce in bfloat16, outside the "
                "error bound (CPU kernels accumulate in float32)")
    if getattr(model.lm_head, "bias", None) is not None:
        return "its lm_head has a bias"
    if getattr(model.config, "final_logit_softcapping", None) is not None:
        return "its logits are soft-capped (final_logit_softcapping)"
    return None


def auto_certified_argmax(model):
    """certified_argmax="auto": on for a float32 CPU model where the CPU computes bfloat16 natively (elsewhere the
    bfloat16 product is emulated and no faster than float32's)."""
    return certified_argmax_unsupported(model) is None and computes_bfloat16_natively(model.device)


class CertifiedArgmax:
    """The float32 argmax of `model.lm_head` over final-normed states, through a bfloat16 copy of its weight (the
    model's own weight is untouched); see the module docstring for why the result is the float32 model's."""

    def __init__(self, model):
        weight = model.lm_head.weight
        self.version = self._version_of(model)
        with torch.no_grad():
            # the live float32 rows, for the candidates; holding them keeps their storage alive, so that a new
            # weight never reuses its address (the address is part of the version)
            self.weight = weight.detach()
            self.low = self.weight.to(torch.bfloat16)
            self.row_norms = self.weight.double().norm(dim=-1).float()  # [V]
        self.c1, self.c2 = error_bound_constants(self.weight.shape[1])
        self.float32_accumulation = float32_accumulation_bound(self.weight.shape[1])

    @classmethod
    def of(cls, model):
        """`model`'s certified argmax, reusing the one built last time while the unembedding did not change."""
        cached = model.__dict__.get("_certified_argmax")  # a plain attribute: never part of the state dict
        if cached is None or cached.version is None or cached.version != cls._version_of(model):
            cached = cls(model)
            model.__dict__["_certified_argmax"] = cached
        return cached

    @staticmethod
    def _version_of(model):
        # The bfloat16 copy must never be stale (a stale one could miss the argmax), so a weight without a version
        # counter (made under torch.inference_mode) is copied afresh at every call (None: never reused).
        weight = model.lm_head.weight
        if weight.is_inference():
            return None
        return weight.data_ptr(), weight._version

    @torch.no_grad()
    def __call__(self, hidden):
        """hidden [..., H] (float32, final-normed) -> the float32 model's argmax token ids [...]."""
        shape = hidden.shape[:-1]
        x = hidden.reshape(-1, hidden.shape[-1])
        low = torch.nn.functional.linear(x.to(torch.bfloat16), self.low).float()  # [N, V]
        eps = torch.outer(x.norm(dim=-1).mul_(self.c1), self.row_norms).add_(low.abs().mul_(self.c2))
        floor = (low - eps).amax(-1, keepdim=True)  # [N, 1]: no token's float32 logit is below it at the argmax
        if not bool(torch.isfinite(floor).all()):  # inf / nan logits: the float32 product decides as plain decoding
            return torch.nn.functional.linear(x, self.weight).argmax(-1).reshape(shape)
        candidates = low.add_(eps) >= floor  # [N, V]
        choices = candidates.to(torch.uint8).argmax(-1)  # the first candidate: the answer where it is the only one
        for row in (candidates.sum(-1) > 1).nonzero()[:, 0].tolist():
            choices[row] = self._decide(x[row : row + 1], candidates[row].nonzero()[:, 0])
        return choices.reshape(shape)

    def _decide(self, state, ids):
        """The float32 argmax of one position `state` [1, H] among the candidate token `ids` [k] (ascending)."""
        logits = torch.nn.functional.linear(state, self.weight[ids])[0]  # [k]
        # e = g sum |x_i w_i|: how far any float32 product of a row may be from the exact dot product
        sum_abs = torch.nn.functional.linear(state.abs(), self.weight[ids].abs())[0]
        error = sum_abs.mul_(2 * self.float32_accumulation)  # two products: this one and plain decoding's
        best = int(logits.argmax())  # ties to the lowest id, as torch.argmax
        others = torch.ones_like(logits, dtype=torch.bool)
        others[best] = False
        if bool((logits[best] - error[best] > logits[others] + error[others]).all()):
            return ids[best]
        # a tie within float32's rounding: sum as plain decoding does, over the whole vocabulary for this position
        return torch.nn.functional.linear(state, self.weight).argmax(-1)[0]
