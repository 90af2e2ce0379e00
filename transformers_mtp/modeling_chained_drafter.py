# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The chained draft layer (`head_type="chained"`): one decoder layer that drafts token after token, EAGLE-3 style.

Unlike the independent heads (modeling_heads.py), one layer serves every draft depth: step 1 at position t reads a
fusion of the trunk's hidden states from several depths (`fc` over `head_feature_layers`) and the embedding of the
token known to come next, t + 1, and its output, through the base model's final norm and unembedding, predicts token
t + 2; step j + 1 reads step j's output and the embedding of the token step j drafted, one position further on, so
each draft depends on the drafts before it. The layer keeps keys and values of its own: over the text (step 1 at
every position, cached across decoding steps) and, within one drafting round, over the drafts before the current
one (discarded after it).

Training unrolls the chain on its own outputs (training-time test, EAGLE-3): step j at every position attends the
step-1 keys of the text up to that position and the keys its own chain made there (`chain_attention_mask`), exactly
what drafting computes when the tokens before are accepted. The tokens it reads are the text's (teacher forcing): a
later step matters only when every earlier draft was accepted, and then each draft was the text's token (the base
model's argmax: training scores only such paths, `on_policy_targets`).

Weights are laid out as the speculators EAGLE-3 format has them, so that an export renames rather than retrains:
`fc` over the concatenated tapped hidden states, one decoder layer whose attention reads `[embed_norm(embedding);
hidden_norm(hidden)]` (2 x hidden wide; q, k and v packed in `qkv_proj`), and the base model's final norm and
unembedding rows of the draft vocabulary (`draft_vocab_size`) as its norm and lm_head.

Copied next to the weights by `save_pretrained`: imports only torch, transformers and `from .module import Name`.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .modeling_heads import HeadMixin, LlamaQueryExtensionHead, Qwen3QueryExtensionHead


def chain_attention_mask(base_mask, steps):
    """
    The training-time-test mask of chain step `steps` (1 = the first) over the keys [step 1 (P + T) | step 2 (T) |
    ... | step `steps` (T)]: causal over step 1's keys as `base_mask` [B|1, 1, T, P + T] (bool, or None for all),
    plus, at each position, the keys of the later steps made at that same position. Returns bool or None.
    """
    if steps == 1:
        return base_mask
    if base_mask is None:
        raise ValueError("chain_attention_mask needs the step-1 mask for more than one step")
    length = base_mask.shape[2]
    diagonal = torch.eye(length, dtype=torch.bool, device=base_mask.device)[None, None]
    diagonal = diagonal.expand(base_mask.shape[0], 1, length, length)
    return torch.cat([base_mask] + [diagonal] * (steps - 1), dim=-1)


class ChainedDraftLayer(HeadMixin, nn.Module):
    """EAGLE-3's draft layer for Llama-family models (Llama, Mistral, Qwen2): see the module docstring.

    Initialised from the base model's last decoder layer (its input read through the tap nearest it, the token's
    half of the attention input at zero), so an untrained chain starts from what that layer computes. Training adapts
    the copied `o_proj` and MLP with PEFT LoRA (rank `head_rank`) and trains in full what has no base counterpart:
    the fusion `fc`, the 2 x hidden-wide `qkv_proj` and the norms (`modules_to_save`).
    """

    reads_layer_input = True  # reads the trunk's hidden states (the taps), not the normed final state
    chained = True  # one module drafts every depth; `mtp_heads` holds just it
    lora_targets = ("o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # regex parts: "." matches "."
    # names no base Llama module ends with (PEFT matches modules_to_save by suffix)
    trained_in_full = ("fc", "qkv_proj", "embed_norm", "hidden_norm", "mlp_norm")

    @staticmethod
    def modules_to_save(config):
        return list(ChainedDraftLayer.trained_in_full)

    @classmethod
    def build(cls, config, architecture_class=None):
        supported = architecture_class is not None and issubclass(architecture_class, LlamaQueryExtensionHead) and (
            architecture_class.block_output is LlamaQueryExtensionHead.block_output
            and not issubclass(architecture_class, Qwen3QueryExtensionHead))
        if not supported:
            raise ValueError(
                f"head_type='chained' drafts with a Llama-style decoder layer (Llama, Mistral, Qwen2 models); this "
                f"model is {config.model_type!r}. Use head_type='query_extension' (every architecture) instead."
            )
        return cls(config, architecture_class)

    def __init__(self, config, architecture_class):
        super().__init__()
        hidden = config.hidden_size
        self.head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
        self.num_attention_heads, self.num_key_value_heads = config.num_attention_heads, config.num_key_value_heads
        bias, o_bias = architecture_class.projection_biases(config)
        self.scaling = self.head_dim**-0.5
        self.fc = nn.Linear(len(config.head_feature_layers) * hidden, hidden, bias=False)
        self.embed_norm = architecture_class.norm_class(hidden, eps=config.rms_norm_eps)
        self.hidden_norm = architecture_class.norm_class(hidden, eps=config.rms_norm_eps)
        width = (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
        self.qkv_proj = nn.Linear(2 * hidden, width, bias=bias)
        self.o_proj = nn.Linear(self.num_attention_heads * self.head_dim, hidden, bias=o_bias)
        self.mlp_norm = architecture_class.norm_class(hidden, eps=config.rms_norm_eps)
        self.mlp = architecture_class.mlp_class(config)
        # the tap whose block of `fc` starts as the identity: the one nearest the last layer's input
        self.identity_tap = len(config.head_feature_layers) - 1

    @torch.no_grad()
    def reset_from_base(self, last_layer):
        attn, hidden = last_layer.self_attn, self.o_proj.out_features
        self.qkv_proj.weight.zero_()
        self.qkv_proj.weight[:, hidden:].copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        if self.qkv_proj.bias is not None:
            self.qkv_proj.bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        self.o_proj.load_state_dict(attn.o_proj.state_dict())
        self.hidden_norm.load_state_dict(last_layer.input_layernorm.state_dict())
        self.embed_norm.weight.fill_(1.0)  # Llama RMSNorms start at one
        self.mlp_norm.load_state_dict(last_layer.post_attention_layernorm.state_dict())
        self.mlp.load_state_dict(last_layer.mlp.state_dict())
        self.fc.weight.zero_()
        start = self.identity_tap * hidden
        self.fc.weight[:, start : start + hidden].copy_(torch.eye(hidden))

    def fuse(self, features):
        """[..., n_taps * H] concatenated tapped hidden states -> [..., H], the first step's hidden input."""
        return self.fc(features)

    def step(self, hidden, token_embeds, position_embeddings, keys_before=None, attn_mask=None):
        """
        One chain step at Tq positions. hidden: [B, Tq, H] (the fused features, or the previous step's output);
        token_embeds: [B, Tq, H] embeddings of the token after each position's own; position_embeddings: (cos, sin)
        at the positions this step stands at; keys_before: (keys, values) [B, kvH, K, D] already attended (rotated);
        attn_mask: bool [B|1, 1, Tq, K + Tq] or None (attend to all).
        Returns (output [B, Tq, H] before the final norm, this step's (keys, values) [B, kvH, Tq, D]).
        """
        batch, q_len, _ = hidden.shape
        residual = hidden
        packed = self.qkv_proj(torch.cat([self.embed_norm(token_embeds), self.hidden_norm(hidden)], dim=-1))
        q_width, kv_width = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        query, key, value = packed.split([q_width, kv_width, kv_width], dim=-1)
        query, key, value = (x.view(batch, q_len, -1, self.head_dim).transpose(1, 2) for x in (query, key, value))
        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        new_kv = (key, value)
        if keys_before is not None:
            key, value = torch.cat([keys_before[0], key], dim=2), torch.cat([keys_before[1], value], dim=2)
        groups = self.num_attention_heads // self.num_key_value_heads
        if groups > 1:  # grouped-query attention: repeat each key/value head for its query heads
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        attn = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, scale=self.scaling)
        hidden = residual + self.o_proj(attn.transpose(1, 2).reshape(batch, q_len, -1))
        return hidden + self.mlp(self.mlp_norm(hidden)), new_kv
