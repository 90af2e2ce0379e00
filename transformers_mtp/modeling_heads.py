# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Prediction heads 1..num_heads-1 of a multi-token model.

Every head maps a hidden state at position t to a hidden state that the base model's own (shared, frozen) final
norm and unembedding turn into logits for token t + 1 + i. No head owns a vocabulary-sized matrix.

Copied next to the weights by `save_pretrained`: imports only torch, transformers and `from .module import Name`.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP, Gemma2RMSNorm
from transformers.models.gemma3.modeling_gemma3 import Gemma3MLP, Gemma3RMSNorm
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, apply_rotary_pos_emb
from transformers.models.mistral.modeling_mistral import MistralMLP
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP


def head_attention_mask(query_len, key_len, key_padding_mask=None, device=None):
    """
    Causal mask for `query_len` queries that are the last positions of `key_len` keys.
    key_padding_mask: [B, key_len] with 1 for real tokens. Returns bool [B|1, 1, query_len, key_len] or None.
    """
    if query_len == 1 and key_padding_mask is None:
        return None
    offset = key_len - query_len
    keys = torch.arange(key_len, device=device)
    mask = (keys[None, :] <= offset + torch.arange(query_len, device=device)[:, None])[None, None]
    if key_padding_mask is not None:
        mask = mask & key_padding_mask[:, None, None, :].bool()
    return mask


class HeadMixin:
    """What every head type declares for the model and for training (the head registry's entries):

    - `reads_layer_input`: reads the last decoder layer's input (and the base cache), not the normed final state;
    - `lora_targets`: the submodules PEFT LoRA adapts (full-match regex parts, below `mtp_heads.<i>.`), `lora_bias`;
    - `modules_to_save(config)`: small submodules trained in full, or None;
    - `build(config, architecture_class)` and `reset_from_base(last_layer)`: make a head, and re-initialise it.
    """

    reads_layer_input = False
    lora_targets: tuple = ()
    lora_bias = "none"

    @staticmethod
    def modules_to_save(config):
        return None

    @classmethod
    def build(cls, config, architecture_class=None):
        return cls(config.hidden_size)

    def reset_from_base(self, last_layer):
        self.reset_parameters()


class LinearHead(HeadMixin, nn.Module):
    """P_i of seed 000: logits_i = W_o P_i h. Identity-initialised, so an untrained head repeats head 0."""

    lora_targets = ("proj",)  # P_i = I + B A
    lora_bias = "lora_only"

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.eye_(self.proj.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [B, T, H] (normed final hidden state) -> [B, T, H] (input of the shared lm_head)
        return self.proj(hidden)


class ResBlockHead(HeadMixin, nn.Module):
    """Medusa-1's head without its own lm_head: h + SiLU(W h + b), W and b zero-initialised (identity at start)."""

    lora_targets = ("linear",)  # W = B A of rank r (W starts at zero as in Medusa) and its bias
    lora_bias = "lora_only"

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.act = nn.SiLU()
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [B, T, H] -> [B, T, H]
        return hidden + self.act(self.linear(hidden))


class QueryExtensionHead(HeadMixin, nn.Module):
    """
    Seed 000's query extension: a copy of the base model's last decoder layer whose query projection `q_proj` is the
    per-head extension point (W_q + ΔW_q^(i), ΔW trained as PEFT LoRA). It reads the input of the base last layer
    (optionally fused with the embedding of the token known to come next) and either attends over the base layer's
    cached keys/values (`share_kv=True`, no extra cache) or computes its own (`share_kv=False`).

    Subclasses supply the architecture: norms, MLP, position encoding and how to copy the base layer's weights.
    """

    reads_layer_input = True
    lora_targets = ("q_proj",)  # the per-head query extension ΔW_q^(i) of seed 000

    @staticmethod
    def modules_to_save(config):
        return ["token_fc"] if config.head_reads_next_token else None  # small: trained in full

    @classmethod
    def build(cls, config, architecture_class=None):
        # the architecture's own subclass (LlamaQueryExtensionHead, GPT2QueryExtensionHead)
        return (architecture_class or cls)(config)

    def reset_from_base(self, last_layer):
        self.copy_from_base_layer(last_layer)

    def __init__(self, *, hidden_size, num_attention_heads, num_key_value_heads, head_dim, bias, share_kv, use_token,
                 o_bias=None):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.share_kv = share_kv
        self.use_token = use_token
        self.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, bias=bias)
        if not share_kv:
            self.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, bias=bias)
            self.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, bias=bias if o_bias is None else o_bias)
        if use_token:
            # fc([h; e]) as in EAGLE, initialised to pass h through unchanged so the untrained head equals the copy.
            self.token_fc = nn.Linear(2 * hidden_size, hidden_size, bias=False)

    # --- architecture hooks -------------------------------------------------------------------------------------
    scaling: float

    def rotate(self, query, key, position_embeddings):
        """Apply the base model's position encoding to queries (and keys when computed here)."""
        return query, key

    def copy_from_base_layer(self, layer: nn.Module):
        raise NotImplementedError

    @staticmethod
    def base_layer_keys_values(layer: nn.Module, hidden: torch.Tensor, position_embeddings):
        """The keys and values [B, kvH, T, D] that the base decoder `layer` computes (and caches) from its input
        `hidden` [B, T, H], for `share_kv` heads when the trunk filled no cache."""
        raise NotImplementedError

    def heads_of(self, states, norm=None):
        """[B, T, n * D] projections -> [B, n, T, D] attention heads, each normed first by `norm` (Qwen3's per-head
        q_norm / k_norm) where the architecture has one."""
        states = states.view(*states.shape[:-1], -1, self.head_dim)
        return (states if norm is None else norm(states)).transpose(1, 2)

    def _reset_token_fc(self):
        if self.use_token:
            hidden_size = self.token_fc.out_features
            with torch.no_grad():
                self.token_fc.weight.zero_()
                self.token_fc.weight[:, :hidden_size].copy_(torch.eye(hidden_size))

    # --- forward ------------------------------------------------------------------------------------------------
    def forward(
        self,
        hidden: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None,
        position_embeddings=None,
        token_embeds: torch.Tensor | None = None,
        past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        """
        hidden: [B, Tq, H] input of the base last layer at the query positions.
        attn_mask: bool [B, 1, Tq, Tk] (True = attend) or None to attend to every key.
        token_embeds: [B, Tq, H] embeddings of the tokens that follow each query position (`use_token` heads only).
        past_kv: `share_kv` heads: the base last layer's keys/values [B, kvH, Tk, D] covering every attended position;
            own-kv heads: this head's earlier keys/values (or None); the new ones are appended.
        Returns the head's hidden state [B, Tq, H] (before the shared final norm) and its keys/values (own-kv only).
        """
        batch, q_len, _ = hidden.shape
        if self.use_token:
            hidden = self.token_fc(torch.cat([hidden, token_embeds], dim=-1))
        residual = hidden
        normed = self.input_layernorm(hidden)
        query = self.heads_of(self.q_proj(normed), getattr(self, "q_norm", None))
        if self.share_kv:
            query, _ = self.rotate(query, None, position_embeddings)
            key, value = past_kv
            new_kv = None
        else:
            key = self.heads_of(self.k_proj(normed), getattr(self, "k_norm", None))
            value = self.heads_of(self.v_proj(normed))
            query, key = self.rotate(query, key, position_embeddings)
            if past_kv is not None:
                key, value = torch.cat([past_kv[0], key], dim=2), torch.cat([past_kv[1], value], dim=2)
            new_kv = (key, value)
        groups = self.num_attention_heads // self.num_key_value_heads
        if groups > 1:  # grouped-query attention: repeat each key/value head for its query heads
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        attn = self.attend(query, key, value, attn_mask).transpose(1, 2).reshape(batch, q_len, -1)
        return self.block_output(residual, self.o_proj(attn)), new_kv

    def attend(self, query, key, value, attn_mask):
        """Scaled dot-product attention [B, nH, Tq, D] (attn_mask: bool, True = attend, or None)."""
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, scale=self.scaling)

    def block_output(self, residual, attn_out):
        """The layer's output from its input and the attention's projected output (pre-norm residual blocks)."""
        hidden = residual + attn_out
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaQueryExtensionHead(QueryExtensionHead):
    """The query-extension head of Llama-family layers (Mistral, Qwen2 and Qwen3 below differ slightly)."""

    mlp_class = LlamaMLP  # the architecture's own MLP (each reads its own config fields)
    norm_class = LlamaRMSNorm

    @staticmethod
    def projection_biases(config):
        """(q/k/v bias, o bias) of the architecture's attention."""
        bias = getattr(config, "attention_bias", False)  # Mistral has no such field: never biased
        return bias, bias

    def __init__(self, config):
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        bias, o_bias = self.projection_biases(config)
        super().__init__(
            hidden_size=config.hidden_size,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads,
            head_dim=head_dim,
            bias=bias,
            o_bias=o_bias,
            share_kv=config.head_share_kv,
            use_token=config.head_reads_next_token,
        )
        self.scaling = head_dim**-0.5
        self.input_layernorm = self.norm_class(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = self.norm_class(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = self.mlp_class(config)

    def rotate(self, query, key, position_embeddings):
        cos, sin = position_embeddings
        if key is None:  # shared keys were rotated by the base layer already
            return apply_rotary_pos_emb(query, query, cos, sin)[0], None
        return apply_rotary_pos_emb(query, key, cos, sin)

    @staticmethod
    def base_layer_keys_values(layer, hidden, position_embeddings):
        attn = layer.self_attn
        shape = (*hidden.shape[:-1], -1, attn.head_dim)
        normed = layer.input_layernorm(hidden)
        key = attn.k_proj(normed).view(shape)
        if getattr(attn, "k_norm", None) is not None:  # Qwen3 norms each key head before the rotation
            key = attn.k_norm(key)
        key, value = key.transpose(1, 2), attn.v_proj(normed).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        return apply_rotary_pos_emb(key, key, cos, sin)[1], value

    @torch.no_grad()
    def copy_from_base_layer(self, layer):
        attn = layer.self_attn
        self.q_proj.load_state_dict(attn.q_proj.state_dict())
        if not self.share_kv:
            self.k_proj.load_state_dict(attn.k_proj.state_dict())
            self.v_proj.load_state_dict(attn.v_proj.state_dict())
        self.o_proj.load_state_dict(attn.o_proj.state_dict())
        self.input_layernorm.load_state_dict(layer.input_layernorm.state_dict())
        self.post_attention_layernorm.load_state_dict(layer.post_attention_layernorm.state_dict())
        self.mlp.load_state_dict(layer.mlp.state_dict())
        for norm in ("q_norm", "k_norm"):  # Qwen3's per-head norms, where this head has them
            if getattr(self, norm, None) is not None:
                getattr(self, norm).load_state_dict(getattr(attn, norm).state_dict())
        self._reset_token_fc()


class MistralQueryExtensionHead(LlamaQueryExtensionHead):
    mlp_class = MistralMLP


class Qwen2QueryExtensionHead(LlamaQueryExtensionHead):
    mlp_class = Qwen2MLP

    @staticmethod
    def projection_biases(config):
        return True, False  # main diff with Llama: q, k and v are biased, o is not


class Qwen3QueryExtensionHead(LlamaQueryExtensionHead):
    mlp_class = Qwen3MLP

    def __init__(self, config):
        super().__init__(config)
        # main diff with Llama: each query (and key) head is RMS-normed before the rotation
        self.q_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        if not self.share_kv:
            self.k_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)


class Gemma2QueryExtensionHead(LlamaQueryExtensionHead):
    """Gemma 2's layer: `(1 + weight)` RMSNorms, the attention's output and the MLP's normed on both sides, queries
    scaled by `query_pre_attn_scalar`, attention logits soft-capped (which SDPA cannot do, so attention is eager)."""

    mlp_class = Gemma2MLP
    norm_class = Gemma2RMSNorm

    def __init__(self, config):
        super().__init__(config)
        # main diff with Llama: norms around the MLP, the query scale and the attention soft-cap
        self.pre_feedforward_layernorm = self.norm_class(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = self.norm_class(config.hidden_size, eps=config.rms_norm_eps)
        self.scaling = config.query_pre_attn_scalar**-0.5
        self.softcap = config.attn_logit_softcapping

    def attend(self, query, key, value, attn_mask):
        # as transformers' Gemma 2 eager attention: scale, soft-cap, mask, softmax in fp32
        weights = query @ key.transpose(2, 3) * self.scaling
        if self.softcap is not None:
            weights = torch.tanh(weights / self.softcap) * self.softcap
        if attn_mask is not None:
            weights = weights.masked_fill(~attn_mask, torch.finfo(weights.dtype).min)
        weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
        return weights @ value

    def block_output(self, residual, attn_out):
        hidden = residual + self.post_attention_layernorm(attn_out)
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))

    @torch.no_grad()
    def copy_from_base_layer(self, layer):
        super().copy_from_base_layer(layer)
        self.pre_feedforward_layernorm.load_state_dict(layer.pre_feedforward_layernorm.state_dict())
        self.post_feedforward_layernorm.load_state_dict(layer.post_feedforward_layernorm.state_dict())


class Gemma3QueryExtensionHead(Gemma2QueryExtensionHead):
    """Gemma 3's layer: Gemma 2's, plus per-head q_norm / k_norm (Gemma norms); its rotary embedding depends on the
    layer type (local or global), which the architecture table passes for the last layer."""

    mlp_class = Gemma3MLP
    norm_class = Gemma3RMSNorm

    def __init__(self, config):
        super().__init__(config)
        self.q_norm = Gemma3RMSNorm(self.head_dim, eps=config.rms_norm_eps)  # main diff with Gemma 2
        if not self.share_kv:
            self.k_norm = Gemma3RMSNorm(self.head_dim, eps=config.rms_norm_eps)


class GPT2QueryExtensionHead(QueryExtensionHead):
    def __init__(self, config):
        head_dim = config.hidden_size // config.num_attention_heads
        super().__init__(
            hidden_size=config.hidden_size,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_attention_heads,
            head_dim=head_dim,
            bias=True,
            share_kv=config.head_share_kv,
            use_token=config.head_reads_next_token,
        )
        # main diff with Llama: GPT-2's optional scalings, no rotary embedding (positions are added to the input)
        self.scaling = head_dim**-0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scaling /= float(config.num_hidden_layers)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        inner_dim = config.n_inner if config.n_inner is not None else 4 * config.hidden_size
        self.mlp = GPT2MLP(inner_dim, config)

    @staticmethod
    def base_layer_keys_values(layer, hidden, position_embeddings):
        attn = layer.attn
        _, key, value = attn.c_attn(layer.ln_1(hidden)).split(attn.split_size, dim=2)
        shape = (*hidden.shape[:-1], -1, attn.head_dim)
        return key.view(shape).transpose(1, 2), value.view(shape).transpose(1, 2)

    @torch.no_grad()
    def copy_from_base_layer(self, layer):
        # GPT-2 stores Conv1D weights as [in, out] with q, k and v fused in c_attn; nn.Linear wants [out, in].
        hidden_size = self.q_proj.in_features
        weight, bias = layer.attn.c_attn.weight, layer.attn.c_attn.bias
        self.q_proj.weight.copy_(weight[:, :hidden_size].t())
        self.q_proj.bias.copy_(bias[:hidden_size])
        if not self.share_kv:
            self.k_proj.weight.copy_(weight[:, hidden_size : 2 * hidden_size].t())
            self.k_proj.bias.copy_(bias[hidden_size : 2 * hidden_size])
            self.v_proj.weight.copy_(weight[:, 2 * hidden_size :].t())
            self.v_proj.bias.copy_(bias[2 * hidden_size :])
        self.o_proj.weight.copy_(layer.attn.c_proj.weight.t())
        self.o_proj.bias.copy_(layer.attn.c_proj.bias)
        self.input_layernorm.load_state_dict(layer.ln_1.state_dict())
        self.post_attention_layernorm.load_state_dict(layer.ln_2.state_dict())
        self.mlp.load_state_dict(layer.mlp.state_dict())
        self._reset_token_fc()


# head_type -> class of the heads that draft each depth on their own (modeling_multi_token.HEAD_CLASSES adds the
# chained drafter, modeling_chained_drafter.py)
INDEPENDENT_HEAD_CLASSES = {"linear": LinearHead, "resblock": ResBlockHead, "query_extension": QueryExtensionHead}
