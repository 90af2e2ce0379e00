# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Configurations of multi-token-prediction (MTP) models.

This file is copied next to the weights by `save_pretrained`, so it imports only torch, transformers and its own
siblings (`from .module import Name`): a checkpoint must load with `trust_remote_code=True` where transformers_mtp
is not installed.
"""

from dataclasses import dataclass

from huggingface_hub.dataclasses import strict
from transformers import Gemma2Config, Gemma3TextConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

HEAD_TYPES = ("linear", "resblock", "query_extension", "chained")
HEAD_INPUTS = ("feature", "feature_and_token", "sequential")
MAX_NUM_HEADS = 16  # beyond ~6 the far heads are almost never accepted (seed 000: "k 2-6, too large hurts quality")


def default_feature_layers(num_hidden_layers):
    """EAGLE-3's taps for the chained drafter: the hidden states after a low, a middle and a high layer (2, L / 2 and
    L - 3), as indices of transformers' `hidden_states` (0 is the embeddings' output, i the output of layer i;
    hidden_states[L] is the final norm's output, not a tap)."""
    last = num_hidden_layers - 1
    return sorted({min(2, last), num_hidden_layers // 2 if num_hidden_layers > 1 else 0, max(num_hidden_layers - 3, 0)})


@dataclass(kw_only=True)
class MultiTokenConfigMixin:
    r"""
    Fields shared by every multi-token config. They are dataclass fields, so all of them are written to config.json.

    Args:
        num_heads (`int`, *optional*, defaults to 4):
            Tokens proposed per forward pass; head 0 is the model's own next-token head and head i
            (1 <= i < num_heads) at position t predicts token t + 1 + i.
        head_type (`str`, *optional*, defaults to `"resblock"`):
            Architecture of heads 1..num_heads-1: `"linear"` (a hidden x hidden map P_i in front of the shared
            unembedding, seed 000), `"resblock"` (Medusa-1, `h + SiLU(W h + b)` with W zero-initialised) or
            `"query_extension"` (a copy of the last decoder layer whose query projection is extended per head) or
            `"chained"` (EAGLE-3's drafter: one decoder layer, run once per draft, each reading the draft before it
            and a fusion of the trunk's hidden states at `head_feature_layers`; Llama, Mistral and Qwen2 models;
            modeling_chained_drafter.py). With `"chained"`, `num_heads - 1` is the chain's depth.
        head_rank (`int`, *optional*, defaults to 64):
            Rank of the low-rank query extension ΔW_q of each `query_extension` head (trained as PEFT LoRA); the
            articles suggest 32-128.
        head_input (`str`, *optional*, defaults to `"feature"`):
            What a `query_extension` head reads: `"feature"` (the input of the last decoder layer) or
            `"feature_and_token"` (also the embedding of the token known to come next, as EAGLE / DeepSeek-V3) or
            `"sequential"`: head 1 reads what `"feature_and_token"` reads, and each later head reads the output of the
            head before it and the token that head drafted (EAGLE / DeepSeek-V3 chained drafting), so a draft depends
            on the drafts before it. Needs `head_share_kv=True`.
        head_share_kv (`bool`, *optional*, defaults to `True`):
            Whether a `query_extension` head attends over the base last layer's keys and values (no extra cache) or
            computes its own from its input. The `"chained"` drafter always keeps its own.
        head_feature_layers (`list[int]`, *optional*):
            `"chained"` only: the trunk hidden states it fuses (indices of transformers' `hidden_states`: 0 is the
            embeddings' output, i the output of layer i). Defaults to EAGLE-3's low, middle and high layers, e.g.
            `[2, 15, 27]` for 30 layers.
        draft_vocab_size (`int`, *optional*):
            Draft over the `draft_vocab_size` tokens the base model emits most (chosen at training, EAGLE-3 style)
            instead of the whole vocabulary: drafting and head training get several times cheaper, and a token
            outside that set is simply never drafted (verification keeps the output exact). `None`: full vocabulary.
        draft_datastore_size (`int`, *optional*):
            Entries of the draft datastore: for the most frequent 3-token contexts in the model's own training answers,
            the `num_heads - 1` tokens that most often followed (REST-style retrieval drafting, built at training).
            When a row's last 3 tokens are in it (and nothing was copied from the row's own context), its tokens are
            drafted instead of the heads'. Verification keeps the output exact. `None`: no datastore.
        head_loss_weights (`list[float]`, *optional*):
            Weight of each head's cross-entropy in the aggregated loss (length `num_heads`, head 0 first). `None`
            means a plain mean over heads, as seed 004 recommends.
    """

    num_heads: int = 4
    head_type: str = "resblock"
    head_rank: int = 64
    head_input: str = "feature"
    head_share_kv: bool = True
    head_loss_weights: list[float] | None = None
    head_feature_layers: list[int] | None = None
    draft_vocab_size: int | None = None
    draft_datastore_size: int | None = None

    @property
    def head_reads_next_token(self) -> bool:
        """Whether (the first) query_extension head, or the chained drafter, reads the embedding of the token known
        to come next."""
        return self.head_type == "chained" or self.head_input in ("feature_and_token", "sequential")

    @property
    def heads_share_base_kv(self) -> bool:
        """Whether heads that read the last layer's input attend over the base last layer's keys and values (else
        they keep their own: `head_share_kv=False`, and the chained drafter)."""
        return self.head_share_kv and self.head_type != "chained"

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)  # the base architecture's config (LlamaConfig / GPT2Config) first
        if self.head_type == "chained" and self.head_feature_layers is None:
            self.head_feature_layers = default_feature_layers(self.num_hidden_layers)
        self.validate_multi_token_fields()

    def validate_multi_token_fields(self):
        """Raise a `ValueError` naming the bad field, its value and the allowed values."""
        if not 2 <= self.num_heads <= MAX_NUM_HEADS:
            raise ValueError(
                f"num_heads={self.num_heads} is out of range; pass an integer from 2 to {MAX_NUM_HEADS} "
                "(head 0 is the base model's own next-token head, so 2 is the smallest useful value)."
            )
        if self.head_type not in HEAD_TYPES:
            raise ValueError(f"head_type={self.head_type!r} is not supported; choose one of {list(HEAD_TYPES)}.")
        if self.head_rank < 1:
            raise ValueError(f"head_rank={self.head_rank} must be a positive integer (the articles suggest 32-128).")
        if self.head_input not in HEAD_INPUTS:
            raise ValueError(f"head_input={self.head_input!r} is not supported; choose one of {list(HEAD_INPUTS)}.")
        if self.head_input == "sequential" and (self.head_type != "query_extension" or not self.head_share_kv):
            raise ValueError(
                f"head_input='sequential' chains query_extension heads that share the base model's keys and values; "
                f"got head_type={self.head_type!r}, head_share_kv={self.head_share_kv}. Use head_type="
                "'query_extension' with head_share_kv=True, or head_input='feature_and_token'."
            )
        if self.head_input != "feature" and self.head_type in ("linear", "resblock"):
            # these heads read the final hidden state alone: accepting another input would train and export heads
            # that silently ignore it
            raise ValueError(
                f"head_input={self.head_input!r} is read by head_type='query_extension' only; head_type="
                f"{self.head_type!r} heads read the final hidden state. Drop head_input (it defaults to 'feature'), "
                "or set head_type='query_extension'."
            )
        if self.head_feature_layers is not None:
            layers = self.head_feature_layers
            if self.head_type != "chained":
                raise ValueError(f"head_feature_layers={layers} is read by head_type='chained' only; drop it, or set "
                                 "head_type='chained'.")
            if (not isinstance(layers, (list, tuple)) or not layers or len(set(layers)) != len(layers)
                    or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_hidden_layers
                           for i in layers)):
                raise ValueError(
                    f"head_feature_layers={layers!r} must list distinct hidden-state indices from 0 (the embeddings) "
                    f"to {self.num_hidden_layers - 1} (the last layer's input); e.g. EAGLE-3's low, middle and high "
                    "layers."
                )
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size} is out of range; pass 1 to vocab_size={self.vocab_size}, "
                "or None for the full vocabulary."
            )
        if self.draft_datastore_size is not None and (isinstance(self.draft_datastore_size, bool)
                                                       or not isinstance(self.draft_datastore_size, int)
                                                       or self.draft_datastore_size < 1):
            raise ValueError(
                f"draft_datastore_size={self.draft_datastore_size!r} must be a positive number of entries, or None for "
                "no draft datastore."
            )
        if self.head_loss_weights is not None:
            weights = self.head_loss_weights
            if len(weights) != self.num_heads:
                raise ValueError(
                    f"head_loss_weights has {len(weights)} entries but num_heads={self.num_heads}; "
                    f"pass one weight per head (head 0 first) or None for a plain mean."
                )
            if any(w < 0 for w in weights) or sum(weights) <= 0:
                raise ValueError(
                    f"head_loss_weights={weights} must be non-negative with a positive sum."
                )


@strict
class MultiTokenLlamaConfig(MultiTokenConfigMixin, LlamaConfig):
    r"""
    Configuration of [`LlamaForMultiTokenPrediction`]: a [`LlamaConfig`] plus the multi-token fields documented in
    [`MultiTokenConfigMixin`].
    """

    model_type = "multi_token_llama"


@strict
class MultiTokenGPT2Config(MultiTokenConfigMixin, GPT2Config):
    r"""
    Configuration of [`GPT2ForMultiTokenPrediction`]: a [`GPT2Config`] plus the multi-token fields documented in
    [`MultiTokenConfigMixin`].
    """

    model_type = "multi_token_gpt2"


@strict
class MultiTokenQwen2Config(MultiTokenConfigMixin, Qwen2Config):
    r"""
    Configuration of [`Qwen2ForMultiTokenPrediction`]: a [`Qwen2Config`] (Qwen2, Qwen2.5) plus the multi-token fields
    documented in [`MultiTokenConfigMixin`].
    """

    model_type = "multi_token_qwen2"


@strict
class MultiTokenQwen3Config(MultiTokenConfigMixin, Qwen3Config):
    r"""
    Configuration of [`Qwen3ForMultiTokenPrediction`]: a [`Qwen3Config`] plus the multi-token fields documented in
    [`MultiTokenConfigMixin`].
    """

    model_type = "multi_token_qwen3"


@strict
class MultiTokenMistralConfig(MultiTokenConfigMixin, MistralConfig):
    r"""
    Configuration of [`MistralForMultiTokenPrediction`]: a [`MistralConfig`] plus the multi-token fields documented
    in [`MultiTokenConfigMixin`].
    """

    model_type = "multi_token_mistral"


@strict
class MultiTokenGemma2Config(MultiTokenConfigMixin, Gemma2Config):
    r"""
    Configuration of [`Gemma2ForMultiTokenPrediction`]: a [`Gemma2Config`] plus the multi-token fields documented in
    [`MultiTokenConfigMixin`].
    """

    model_type = "multi_token_gemma2"


@strict
class MultiTokenGemma3TextConfig(MultiTokenConfigMixin, Gemma3TextConfig):
    r"""
    Configuration of [`Gemma3ForMultiTokenPrediction`]: a [`Gemma3TextConfig`] (the text model of Gemma 3) plus the
    multi-token fields documented in [`MultiTokenConfigMixin`].
    """

    model_type = "multi_token_gemma3_text"
