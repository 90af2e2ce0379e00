# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The architecture table: where each supported causal LM keeps the parts the heads read and copy.

One entry per architecture, keyed by the base config's `model_type`. Adding an architecture is one entry here, its
query-extension layer class in modeling_heads.py (a copy of its last decoder layer's attention and MLP), a config and
a model class in configuration_multi_token.py / modeling_multi_token.py, and the tests' tiny base model.

Copied next to the weights by `save_pretrained` (through modeling_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

from dataclasses import dataclass
from functools import partial

from .modeling_heads import (
    Gemma2QueryExtensionHead,
    Gemma3QueryExtensionHead,
    GPT2QueryExtensionHead,
    LlamaQueryExtensionHead,
    MistralQueryExtensionHead,
    QueryExtensionHead,
    Qwen2QueryExtensionHead,
    Qwen3QueryExtensionHead,
)


@dataclass(frozen=True)
class Architecture:
    """Attribute names, from the causal LM down, of the parts the heads use."""

    trunk: str  # the decoder stack, `model.<trunk>`; it runs the base forward and fills the cache
    layers: str  # its decoder layers, `model.<trunk>.<layers>`; query-extension heads copy the last one
    final_norm: str  # `model.<trunk>.<final_norm>`, shared by every head before the unembedding
    embed_tokens: str  # `model.<trunk>.<embed_tokens>`, read by heads that see the next token
    rotary: str | None  # `model.<trunk>.<rotary>`, the rotary embedding; None where positions are added to the input
    query_extension_head: type[QueryExtensionHead]  # the query-extension head built on this architecture's layer
    unembedding: str = "lm_head"  # `model.<unembedding>`, shared (frozen) by every head
    rotary_per_layer_type: bool = False  # one rotary embedding per layer type (Gemma 3: local and global layers)

    def parts(self, model):
        """(trunk, last decoder layer, final norm, token embedding, rotary embedding or None) of `model`."""
        trunk = getattr(model, self.trunk)
        rotary = getattr(trunk, self.rotary) if self.rotary is not None else None
        if rotary is not None and self.rotary_per_layer_type:  # the heads copy the last layer: its positions
            rotary = partial(rotary, layer_type=model.config.layer_types[-1])
        return (trunk, getattr(trunk, self.layers)[-1], getattr(trunk, self.final_norm),
                getattr(trunk, self.embed_tokens), rotary)


_LLAMA_PARTS = {"trunk": "model", "layers": "layers", "final_norm": "norm", "embed_tokens": "embed_tokens",
                "rotary": "rotary_emb"}

ARCHITECTURES = {
    "llama": Architecture(**_LLAMA_PARTS, query_extension_head=LlamaQueryExtensionHead),
    "mistral": Architecture(**_LLAMA_PARTS, query_extension_head=MistralQueryExtensionHead),
    "qwen2": Architecture(**_LLAMA_PARTS, query_extension_head=Qwen2QueryExtensionHead),
    "qwen3": Architecture(**_LLAMA_PARTS, query_extension_head=Qwen3QueryExtensionHead),
    # Gemma 2's embedding module scales its output itself, and its logits are soft-capped (model.unembed)
    "gemma2": Architecture(**_LLAMA_PARTS, query_extension_head=Gemma2QueryExtensionHead),
    "gemma3_text": Architecture(**_LLAMA_PARTS, query_extension_head=Gemma3QueryExtensionHead,
                                rotary_per_layer_type=True),
    # main diff with Llama: GPT-2 adds learned positions to its input, so there is no rotary embedding
    "gpt2": Architecture(trunk="transformer", layers="h", final_norm="ln_f", embed_tokens="wte", rotary=None,
                         query_extension_head=GPT2QueryExtensionHead),
}
