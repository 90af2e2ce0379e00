# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Independent query-extension heads run as one module when drafting: the decode loop's fast path.

Each head is a decoder layer with its own weights, and when the heads draft independently (not `sequential`) and
attend over the base last layer's keys and values (`head_share_kv`), they all read the same input, positions and
keys. Run one after another they cost three rounds of small kernels; stacked, each projection is one batched matrix
multiply and the attention one call, with the heads' queries side by side along the query axis. torch has no
module for "n Linear layers with different weights on the same input", and `torch.func.vmap` over the heads'
stacked parameters was no faster than the loop (`benchmarks/step_costs.py bfloat16`, two measurements of 200 runs:
vmap 2.8 / 3.0 ms, loop 3.3 / 2.4 ms, stacked 2.3 / 2.0 ms), so the few ops of a Llama-family layer are written out
here, op for op as `LlamaRMSNorm`, `LlamaMLP` and the heads' own forward compute them: on the
shipped heads the stacked states equal the loop's bit for bit in bfloat16 (tests/test_stacked_heads.py checks
equality within rounding on tiny models).

Measured on the embedded default model in bfloat16 on a 2-core AMD EPYC (benchmarks/README.md, "Where a step's time
goes", `benchmarks/step_costs.py bfloat16`): 3 heads drafting from one position, 2.7-3.2 ms as a loop, 1.9-2.2 ms
stacked.

Only for inference: the stacked weights are copies, rebuilt whenever a head's weight changes (in place or replaced),
and never trained; heads with PEFT layers still attached (not merged), other norms (Gemma's, GPT-2's LayerNorm,
Qwen3's per-head norms) or biased MLPs take the per-head loop (`StackedHeads.of` returns None).

Copied next to the weights by `save_pretrained`: imports only torch, transformers and `from .module import Name`.
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb


def _plain_linear(module):
    """A Linear layer whose weight is the whole map (not a PEFT layer wrapping a base one)."""
    return type(module) is nn.Linear


def _rms_norm(hidden, weight, eps):
    """`LlamaRMSNorm.forward` with one weight per head: hidden [n, T, H], weight [n, 1, H]."""
    input_dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(input_dtype)


def _stacked(tensors):
    """[n, ...] from n tensors, or None where they are all None (unbiased projections)."""
    if all(t is None for t in tensors):
        return None
    return torch.stack(tensors)


def _bmm(x, weight, bias):
    """n Linear maps at once: x [n, T, in], weight [n, out, in], bias [n, out] or None -> [n, T, out]."""
    out = torch.matmul(x, weight.transpose(1, 2))
    return out if bias is None else out + bias[:, None]


class StackedHeads:
    """
    Heads 1..n of a multi-token model as one, for drafting: `__call__` returns every head's output state (before the
    shared final norm) at the given positions, [B, T, n, H], as the heads' loop in `_head_states` does.
    """

    def __init__(self, heads):
        first = heads[0]
        self.num_heads = len(heads)
        self.num_attention_heads, self.num_key_value_heads = first.num_attention_heads, first.num_key_value_heads
        self.head_dim, self.scaling, self.use_token = first.head_dim, first.scaling, first.use_token
        self.eps = first.input_layernorm.variance_epsilon
        self.act_fn = first.mlp.act_fn
        params = [p for head in heads for p in head.parameters()]
        self.version = self._version_of(params)
        # the weights' storages, kept alive so that a new storage never reuses their addresses: equal addresses and
        # versions then mean the same, unchanged weights
        self._alive = [p.detach() for p in params]
        self.token_fc = torch.cat([h.token_fc.weight for h in heads]) if self.use_token else None  # [n * H, 2H]
        self.norm_in = torch.stack([h.input_layernorm.weight for h in heads])[:, None]  # [n, 1, H]
        self.norm_post = torch.stack([h.post_attention_layernorm.weight for h in heads])[:, None]
        self.q = torch.stack([h.q_proj.weight for h in heads])  # [n, nH * D, H]
        self.q_bias = _stacked([h.q_proj.bias for h in heads])
        self.o = torch.stack([h.o_proj.weight for h in heads])
        self.o_bias = _stacked([h.o_proj.bias for h in heads])
        # gate and up in one multiply: [n, 2I, H]
        self.gate_up = torch.stack([torch.cat([h.mlp.gate_proj.weight, h.mlp.up_proj.weight]) for h in heads])
        self.down = torch.stack([h.mlp.down_proj.weight for h in heads])

    @staticmethod
    def _version_of(params):
        # Tensors made under torch.inference_mode keep no version counter: for them an in-place change of a weight
        # goes unseen and the stacked copy keeps the old value. That costs draft quality, never correctness (every
        # draft is verified), and such tensors can only be changed in place inside inference mode.
        return tuple((p.data_ptr(), None if p.is_inference() else p._version) for p in params)

    @classmethod
    def supports(cls, heads, config):
        """Whether these heads can run stacked (else the per-head loop runs)."""
        if config.head_type != "query_extension" or config.head_input == "sequential" or not config.head_share_kv:
            return False
        first = heads[0]
        for head in heads:
            if type(head) is not type(first) or getattr(head, "q_norm", None) is not None:
                return False  # Qwen3's per-head norms
            if type(head.input_layernorm) is not LlamaRMSNorm or type(head.post_attention_layernorm) is not LlamaRMSNorm:
                return False  # Gemma's (1 + weight) norms, GPT-2's LayerNorm
            linears = [head.q_proj, head.o_proj, *(getattr(head.mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj"))]
            if head.use_token:
                linears.append(head.token_fc)
            if not all(m is not None and _plain_linear(m) for m in linears):
                return False  # PEFT layers still attached, or another MLP
            if any(m.bias is not None for m in linears[2:]):
                return False  # a biased MLP or token_fc
        return True

    @classmethod
    def of(cls, model, num_heads):
        """The stacked form of `model`'s first `num_heads` drafting heads, reusing the one built last time while no
        weight changed; None where they cannot run stacked."""
        heads = list(model.mtp_heads[:num_heads])
        if not heads or not cls.supports(heads, model.config):
            return None
        cached = model.__dict__.get("_stacked_heads")  # a plain attribute: never part of the state dict
        if cached is None or cached.num_heads != len(heads) or cached.version != cls._version_of(
                [p for head in heads for p in head.parameters()]):
            with torch.no_grad():
                cached = cls(heads)
            model.__dict__["_stacked_heads"] = cached
        return cached

    def first(self, num_heads):
        """The first `num_heads` of these heads (views of the stacked weights), for a shallower draft."""
        if num_heads == self.num_heads:
            return self
        part = copy.copy(self)
        part.num_heads = num_heads
        for name in ("norm_in", "norm_post", "q", "q_bias", "o", "o_bias", "gate_up", "down"):
            if getattr(self, name) is not None:
                setattr(part, name, getattr(self, name)[:num_heads])
        if self.token_fc is not None:
            part.token_fc = self.token_fc[: num_heads * self.token_fc.shape[0] // self.num_heads]
        return part

    def __call__(self, hidden, *, token_embeds, position_embeddings, past_kv, attn_mask):
        """hidden, token_embeds: [B, T, H]; position_embeddings: (cos, sin) [B, T, D]; past_kv: the base last layer's
        (keys, values) [B, kvH, Tk, D]; attn_mask: bool [B|1, 1, T, Tk] or None. Returns [B, T, n, H]."""
        n, (batch, q_len, size) = self.num_heads, hidden.shape
        if self.use_token:
            hidden = F.linear(torch.cat([hidden, token_embeds], dim=-1), self.token_fc)  # [B, T, n * H]
            hidden = hidden.view(batch * q_len, n, size).transpose(0, 1)  # [n, B*T, H]
        else:
            hidden = hidden.reshape(1, batch * q_len, size).expand(n, -1, -1)
        residual = hidden
        query = _bmm(_rms_norm(hidden, self.norm_in, self.eps), self.q, self.q_bias)  # [n, B*T, nH * D]
        heads, dim = self.num_attention_heads, self.head_dim
        # every head's queries side by side along the query axis: [B, nH, n * T, D]
        query = query.view(n, batch, q_len, heads, dim).permute(1, 3, 0, 2, 4).reshape(batch, heads, n * q_len, dim)
        cos, sin = (x.repeat(1, n, 1) for x in position_embeddings)
        query = apply_rotary_pos_emb(query, query, cos, sin)[0]
        key, value = past_kv
        groups = heads // self.num_key_value_heads
        if groups > 1:
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        if attn_mask is not None and attn_mask.shape[2] > 1:
            attn_mask = attn_mask.repeat(1, 1, n, 1)
        attn = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, scale=self.scaling)
        attn = attn.view(batch, heads, n, q_len, dim).permute(2, 0, 3, 1, 4).reshape(n, batch * q_len, heads * dim)
        hidden = residual + _bmm(attn, self.o, self.o_bias)
        gate, up = _bmm(_rms_norm(hidden, self.norm_post, self.eps), self.gate_up, None).chunk(2, dim=-1)
        hidden = hidden + _bmm(self.act_fn(gate) * up, self.down, None)
        return hidden.transpose(0, 1).reshape(batch, q_len, n, size)
