# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Multi-token-prediction (MTP) models: Hugging Face causal LMs plus light heads that propose several tokens per pass.

The classes subclass `LlamaForCausalLM` and `GPT2LMHeadModel` and add only what differs: `mtp_heads`, a forward that
returns head logits and the per-head loss on request, and a `generate()` that takes `multi_token_mode=True`
(generation_mixin.py). Where each architecture keeps its parts is in modeling_architectures.py; the head types are in
modeling_heads.py, the loss in modeling_losses.py.

Copied next to the weights by `save_pretrained`: imports only torch, transformers and `from .module import Name`.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import slice_logits_to_keep
from transformers.utils import can_return_tuple, logging
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_multi_token import (
    MultiTokenGemma2Config,
    MultiTokenGemma3TextConfig,
    MultiTokenGPT2Config,
    MultiTokenLlamaConfig,
    MultiTokenMistralConfig,
    MultiTokenQwen2Config,
    MultiTokenQwen3Config,
)
from .generation_cache import cache_layer_keys_values
from .generation_draft_sources import DATASTORE_EMPTY_KEY
from .generation_mixin import MultiTokenGenerationMixin
from .modeling_draft_tables import DraftTablesMixin
from .modeling_architectures import ARCHITECTURES, Architecture
from .modeling_chained_drafter import ChainedDraftLayer, chain_attention_mask
from .modeling_heads import INDEPENDENT_HEAD_CLASSES, head_attention_mask
from .modeling_losses import multi_token_loss

logger = logging.get_logger(__name__)

HEADS_PREFIX = "mtp_heads."
# head_type -> head class (the head registry); a new head type is one class and one entry here
HEAD_CLASSES = {**INDEPENDENT_HEAD_CLASSES, "chained": ChainedDraftLayer}


@dataclass
class MultiTokenCausalLMOutput(CausalLMOutputWithPast):
    r"""
    head_logits (`torch.FloatTensor` of shape `(batch_size, sequence_length, num_heads - 1, vocab_size)`):
        Logits of heads 1..num_heads-1; `head_logits[:, t, i - 1]` predicts token t + 1 + i. Head 0's logits are
        `logits`, exactly the base model's.
    head_losses (`torch.FloatTensor` of shape `(num_heads,)`, returned when `labels` are given):
        Cross-entropy of each head, head 0 first; `loss` aggregates them (mean, or `config.head_loss_weights`).
    """

    head_logits: torch.FloatTensor | None = None
    head_losses: torch.FloatTensor | None = None


class MultiTokenPredictionMixin(DraftTablesMixin, MultiTokenGenerationMixin):
    """What the Llama and GPT-2 classes share. Each names its entry of the architecture table (`architecture`)."""

    architecture: Architecture  # its entry of modeling_architectures.ARCHITECTURES

    def __init__(self, config):
        super().__init__(config)  # the base causal LM (LlamaForCausalLM / GPT2LMHeadModel) first
        self._build_heads()

    # --- architecture ------------------------------------------------------------------------------------------
    def _parts(self):
        """(trunk, last decoder layer, final norm, token embedding, rotary embedding or None)"""
        return self.architecture.parts(self)

    def _drafting_parts(self, drafting=None):
        """(final norm, token embedding, rotary embedding or None) the heads run with: the model's own, or with a
        `DraftingCopy` its final norm and the embedding's rows cast to its dtype as they are looked up (a copy of the
        whole table would cost more memory than the lookup saves)."""
        _, _, final_norm, embed_tokens, rotary = self._parts()
        if drafting is None:
            return final_norm, embed_tokens, rotary
        return drafting.final_norm, (lambda ids: drafting.cast(embed_tokens(ids))), rotary

    @property
    def query_extension_head_class(self):
        return self.architecture.query_extension_head

    @property
    def head_class(self):
        """The class of heads 1..num_heads-1 (from the head registry, `HEAD_CLASSES`)."""
        return HEAD_CLASSES[self.config.head_type]

    def _build_heads(self):
        config = self.config
        # One module per head, built in a loop: never `[Head()] * n`, which would share one module n times. A chained
        # drafter is one module that drafts every depth.
        count = 1 if self.drafts_with_one_layer else config.num_heads - 1
        self.mtp_heads = nn.ModuleList([self.head_class.build(config, self.query_extension_head_class)
                                        for _ in range(count)])
        if config.draft_vocab_size is not None:
            # saved with the heads (key mtp_heads.draft_token_ids); set from the base model's outputs at training
            self.mtp_heads.register_buffer("draft_token_ids", torch.arange(config.draft_vocab_size))
        if config.draft_datastore_size is not None:
            # saved with the heads; filled from the training answers by `set_draft_datastore` (empty until then)
            size, length = config.draft_datastore_size, config.num_heads - 1
            self.mtp_heads.register_buffer("datastore_keys", torch.full((size,), DATASTORE_EMPTY_KEY))
            self.mtp_heads.register_buffer("datastore_tokens", torch.zeros((size, length), dtype=torch.long))

    @torch.no_grad()
    def reset_heads(self):
        """Re-initialise heads 1..num_heads-1: identity maps, or copies of the base model's last decoder layer."""
        last_layer = self._parts()[1]
        if self.config.draft_vocab_size is not None:
            self.mtp_heads.draft_token_ids.copy_(torch.arange(self.config.draft_vocab_size))
        if self.config.draft_datastore_size is not None:
            self.mtp_heads.datastore_keys.fill_(DATASTORE_EMPTY_KEY)
            self.mtp_heads.datastore_tokens.zero_()
        for head in self.mtp_heads:
            head.reset_from_base(last_layer)

    @property
    def uses_layer_input(self):
        return self.head_class.reads_layer_input

    @property
    def drafts_with_one_layer(self):
        """Whether one chained draft layer (`head_type="chained"`) drafts every depth, instead of a head per depth."""
        return getattr(self.head_class, "chained", False)

    @property
    def drafts_in_chain(self):
        """Whether each draft reads the draft before it (the chained drafter, `sequential` heads), so drafting goes
        depth by depth instead of all heads at once."""
        return self.drafts_with_one_layer or self.config.head_input == "sequential"

    @property
    def head_feature_indices(self):
        """The trunk hidden states the heads read as their layer input (indices of `hidden_states`): the last layer's
        input, or the chained drafter's taps (`head_feature_layers`), concatenated in that order."""
        if self.drafts_with_one_layer:
            return list(self.config.head_feature_layers)
        return [self.config.num_hidden_layers - 1]

    # --- forward ------------------------------------------------------------------------------------------------
    def _trunk_forward(self, input_ids=None, *, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                       inputs_embeds=None, need_layer_input=None, output_hidden_states=None, **kwargs):
        """
        Run the frozen trunk. Returns (normed final hidden [B,T,H], the heads' layer input or None, the trunk's
        output): the input of the last layer [B,T,H], or for the chained drafter its tapped hidden states concatenated
        [B,T,n_taps*H] (`head_feature_indices`). `output_hidden_states` (else the config's): also return every
        layer's hidden states, as the base model does; the heads' layer input is taken from them.
        """
        trunk = self._parts()[0]
        need_layer_input = self.uses_layer_input if need_layer_input is None else need_layer_input
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        # Hidden states are numbered as transformers numbers them: 0 is the embeddings' output, n - 2 the last layer's
        # input, n - 1 the final (normed) output; `output_hidden_states` may be a flag or indices (negative from the
        # end). The trunk is asked for the user's selection plus the last layer's input when the heads read it.
        n = self.config.num_hidden_layers + 1
        taps = self.head_feature_indices if need_layer_input else []
        selected = None
        if not isinstance(output_hidden_states, bool) and output_hidden_states is not None:
            indices = [output_hidden_states] if isinstance(output_hidden_states, int) else list(output_hidden_states)
            selected = sorted({i % n for i in indices if -n <= i < n})
            request = sorted(set(selected) | set(taps))
        elif output_hidden_states:
            request = True
        else:
            request = sorted(taps) if need_layer_input else False
        out = trunk(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
            output_hidden_states=request,
            return_dict=True,
            **kwargs,
        )
        # every index has a slot; a selection leaves the others None, as the base model returns them
        layer_input = None
        if need_layer_input:
            tapped = [out.hidden_states[i] for i in taps]
            layer_input = tapped[0] if len(tapped) == 1 else torch.cat(tapped, dim=-1)
        if selected is not None:
            out.hidden_states = tuple(h if i in selected else None for i, h in enumerate(out.hidden_states))
        elif not output_hidden_states:
            out.hidden_states = None
        return out.last_hidden_state, layer_input, out

    def _head_states(self, *, normed, layer_input, next_token_ids, position_ids, key_padding_mask=None,
                     base_kv=None, head_past=None, num_heads=None, choose_token=None, stacked=None, last=None,
                     expand=None, drafting=None):
        """
        Inputs of the shared lm_head for heads 1..num_heads-1 at every given position.

        normed / layer_input: [B, T, H]; next_token_ids: [B, T] the token after each position (`feature_and_token`,
        `sequential`); position_ids: [B, T]; base_kv: the base last layer's (keys, values) covering every attended
        position (`share_kv`); head_past: per-head own (keys, values) of earlier positions, or None.
        choose_token (`sequential` only): `choose_token(i, state)` returns the token [B, T] that head i drafts from
        its state [B, T, H], which head i + 1 reads next, or None when no more drafts are wanted. Without it the
        heads are teacher-forced: head i + 1 reads the true token, `next_token_ids` shifted left by i + 1. A later
        head matters only when every earlier draft was accepted, and then its draft was the true token, so teacher
        forcing trains exactly what drafting uses.
        stacked: a `StackedHeads` of this model's heads (`StackedHeads.of`, built once per `generate` call): run them
        as one (inference only: the drafting fast path). None, or with gradients on: one head after another.
        The chained drafter (`head_type="chained"`) reads `layer_input` (its taps) and its own past `head_past`; with
        `choose_token` (a chain) or `expand` (a draft tree) it drafts from each row's position `last` [B] only
        (`_chain_states`).
        Returns ([B, T, n, H] with n <= num_heads - 1, per-head new (keys, values) for own-kv heads or None); with
        `choose_token`, chained states are [B, 1, n, H], at `last`.
        drafting: a `DraftingCopy` (generation_draft_precision.py): run its copies of the heads and final norm, in
        its dtype, instead (inference only; `stacked` should then be its stacked form). States come in that dtype.
        """
        if drafting is not None:  # the inputs in the drafting copy's dtype; own-kv heads' past already is
            normed, layer_input = drafting.cast(normed), drafting.cast(layer_input)
            base_kv = tuple(drafting.cast(x) for x in base_kv) if base_kv is not None else None
        if self.drafts_with_one_layer:
            return self._chain_states(layer_input=layer_input, next_token_ids=next_token_ids,
                                      position_ids=position_ids, key_padding_mask=key_padding_mask,
                                      head_past=head_past, num_steps=(num_heads or self.config.num_heads) - 1,
                                      choose_token=choose_token, last=last, expand=expand, drafting=drafting)
        heads = (self.mtp_heads if drafting is None else drafting.heads)[: (num_heads or self.config.num_heads) - 1]
        stacked = stacked.first(len(heads)) if stacked is not None and not torch.is_grad_enabled() else None
        if not self.uses_layer_input:
            # normed: [B, T, H] -> [B, T, K-1, H]
            return torch.stack([head(normed) for head in heads], dim=2), None
        final_norm, embed_tokens, rotary = self._drafting_parts(drafting)
        sequential = self.config.head_input == "sequential"
        q_len = layer_input.shape[1]
        hidden, tokens = layer_input, next_token_ids if self.config.head_reads_next_token else None
        if stacked is not None:
            mask = head_attention_mask(q_len, base_kv[0].shape[2], key_padding_mask, device=layer_input.device)
            output = stacked(layer_input, token_embeds=embed_tokens(tokens) if tokens is not None else None,
                             position_embeddings=rotary(layer_input, position_ids), past_kv=base_kv, attn_mask=mask)
            return final_norm(output), None
        states, new_kvs = [], []
        for i, head in enumerate(heads):
            if i == 0 or sequential:
                # a chained head stands one position further on: it reads the state of the token it follows
                position_embeddings = rotary(hidden, position_ids + i) if rotary is not None else None
            if head.share_kv:
                past = base_kv
                key_len = past[0].shape[2]
            else:
                past = head_past[i] if head_past is not None else None
                key_len = q_len + (past[0].shape[2] if past is not None else 0)
            mask = head_attention_mask(q_len, key_len, key_padding_mask, device=layer_input.device)
            output, new_kv = head(
                hidden, attn_mask=mask, position_embeddings=position_embeddings,
                token_embeds=embed_tokens(tokens) if tokens is not None else None, past_kv=past,
            )
            states.append(final_norm(output))
            new_kvs.append(new_kv)
            if sequential and i + 1 < len(heads):
                if choose_token is None:  # teacher forcing
                    tokens = F.pad(next_token_ids[:, i + 1 :], (0, i + 1), value=0)
                else:
                    tokens = choose_token(i, states[-1])
                    if tokens is None:
                        break  # no row wants more drafts
                hidden = output
        return torch.stack(states, dim=2), (None if self.config.head_share_kv else new_kvs)

    def _chain_states(self, *, layer_input, next_token_ids, position_ids, key_padding_mask, head_past, num_steps,
                      choose_token=None, last=None, expand=None, drafting=None):
        """
        The chained drafter's states (modeling_chained_drafter.py). Step 1 runs at every given position (the text:
        its keys and values are the drafter's cache, returned full, past ones first, as own-kv heads return theirs).
        Without `choose_token` or `expand` (training, `forward`): every later step at every position too,
        teacher-forced, each attending the text's step-1 keys up to its position and its own chain's keys there
        (training-time test); `[B, T, num_steps, H]`.
        Drafting, from each row's position `last` [B] on: `choose_token(step - 1, state [B, 1, H])` gives the token
        [B, 1] the next step reads (a chain; states `[B, 1, n, H]`, n <= num_steps), or `expand(step - 1, states
        [B, M, H])` gives (parents [M'] indices into the M nodes, tokens [B, M']): the next step runs on M' nodes at
        once, each reading its parent's output and its token and attending only its own ancestors (a draft tree;
        the states go to `expand` only, and None is returned for them). Either returns None to stop.
        """
        layer = (self.mtp_heads if drafting is None else drafting.heads)[0]
        final_norm, embed_tokens, rotary = self._drafting_parts(drafting)
        batch, q_len, _ = layer_input.shape
        past = head_past[0] if head_past else None
        key_len = q_len + (past[0].shape[2] if past is not None else 0)
        mask = head_attention_mask(q_len, key_len, key_padding_mask, device=layer_input.device)
        hidden = layer.fuse(layer_input)
        output, kv = layer.step(hidden, embed_tokens(next_token_ids), rotary(hidden, position_ids), past, mask)
        text_kv = kv if past is None else (torch.cat([past[0], kv[0]], dim=2), torch.cat([past[1], kv[1]], dim=2))
        keys = text_kv
        if choose_token is None and expand is None:  # training-time test: every step at every position
            if mask is None:
                mask = torch.ones((1, 1, q_len, key_len), dtype=torch.bool, device=layer_input.device)
            states = [final_norm(output)]
            for step in range(1, num_steps):
                tokens = F.pad(next_token_ids[:, step:], (0, step), value=0)  # the text's token after the last draft
                output, kv = layer.step(output, embed_tokens(tokens), rotary(output, position_ids + step), keys,
                                        chain_attention_mask(mask, step + 1))
                keys = (torch.cat([keys[0], kv[0]], dim=2), torch.cat([keys[1], kv[1]], dim=2))
                states.append(final_norm(output))
            return torch.stack(states, dim=2), [text_kv]
        if expand is None:  # a chain: one node per step
            def expand(step, state):
                tokens = choose_token(step, state)
                return None if tokens is None else (torch.zeros(1, dtype=torch.long, device=state.device), tokens)
        device = layer_input.device
        rows = torch.arange(batch, device=device)
        output, positions = output[rows, last][:, None], position_ids[rows, last][:, None]  # [B, 1, H], [B, 1]
        text_mask = (key_padding_mask.bool() if key_padding_mask is not None
                     else torch.ones((batch, key_len), dtype=torch.bool, device=device))
        text_mask = text_mask & (torch.arange(key_len, device=device)[None] <= (key_len - q_len) + last[:, None])
        # the drafted nodes so far: which of them each one sees (its ancestors and itself); the first step's state
        # (at `last`) is the text's, no node
        visible = torch.zeros((0, 0), dtype=torch.bool, device=device)
        frontier = None  # node indices of the states in `output`
        states = [final_norm(output)]
        for step in range(1, num_steps):
            choice = expand(step - 1, states[-1])
            if choice is None:
                break  # no more drafts wanted
            parents, tokens = choice
            count, known = tokens.shape[1], visible.shape[0]
            sees = (visible[frontier[parents]] if frontier is not None
                    else visible.new_zeros((count, known)))  # [M', known]: the parent's view, itself included
            sees = torch.cat([sees, torch.eye(count, dtype=torch.bool, device=device)], dim=1)  # [M', known + M']
            step_mask = torch.cat([text_mask[:, None, :].expand(batch, count, key_len),
                                   sees[None].expand(batch, -1, -1)], dim=2)[:, None]  # [B, 1, M', K + known + M']
            hidden = output[:, parents]
            output, kv = layer.step(hidden, embed_tokens(tokens), rotary(hidden, (positions + step).expand(-1, count)),
                                    keys, step_mask)
            keys = (torch.cat([keys[0], kv[0]], dim=2), torch.cat([keys[1], kv[1]], dim=2))
            visible = torch.cat([F.pad(visible, (0, count)), sees], dim=0)
            frontier = torch.arange(known, known + count, device=device)
            states.append(final_norm(output))
        chain = all(state.shape[1] == 1 for state in states)
        return (torch.stack(states, dim=2) if chain else None), [text_kv]

    def _forward_with_heads(self, input_ids=None, *, labels=None, cache=None, use_cache=None, attention_mask=None,
                            position_ids=None, inputs_embeds=None, logits_to_keep=0, shift_labels=None,
                            num_items_in_batch=None, **trunk_kwargs):
        """`forward` with labels or `output_head_logits=True`: the trunk once, then the base logits, every head's
        logits and, with labels, the per-head losses. `trunk_kwargs` go to the trunk as the base forward passes them."""
        num_heads = self.config.num_heads
        scored = labels if labels is not None else shift_labels
        if scored is not None and scored.shape[1] <= num_heads:
            raise ValueError(
                f"labels have {scored.shape[1]} tokens, so head {num_heads - 1} has nothing to predict; "
                f"use sequences of at least num_heads + 1 = {num_heads + 1} tokens."
            )
        past = int(cache.get_seq_length()) if cache is not None else 0
        share_kv = self.uses_layer_input and self.config.heads_share_base_kv
        if past and self.uses_layer_input and not share_kv:
            raise ValueError(
                f"heads with their own keys and values (head_share_kv=False, head_type='chained') keep no cache of their own "
                f"in forward(), so they cannot continue the {past} cached positions; call forward(..., "
                "output_head_logits=True) on the whole sequence without a cache (generate() keeps their cache itself)."
            )
        normed, layer_input, trunk_out = self._trunk_forward(
            input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            use_cache=True if share_kv else use_cache, inputs_embeds=inputs_embeds, **trunk_kwargs,
        )
        out_cache = trunk_out.cache
        seq_len = normed.shape[1]
        if position_ids is None:  # as the trunk computes them
            position_ids = torch.arange(past, past + seq_len, device=normed.device)[None]
        next_token_ids = None
        if self.uses_layer_input and self.config.head_reads_next_token:
            if input_ids is None:
                raise ValueError(
                    f"head_input={self.config.head_input!r} needs input_ids (the next tokens), not inputs_embeds."
                )
            # Teacher forcing: the token after position t is input_ids[t + 1]; the last position has none (id 0).
            next_token_ids = F.pad(input_ids[:, 1:], (0, 1), value=0)
        base_kv = None
        if share_kv:
            base_kv = self._last_layer_keys_values(out_cache, layer_input, position_ids, past)
        head_states, _ = self._head_states(
            normed=normed, layer_input=layer_input, next_token_ids=next_token_ids, position_ids=position_ids,
            key_padding_mask=attention_mask if attention_mask is not None and (attention_mask == 0).any() else None,
            base_kv=base_kv,
        )
        if labels is None and shift_labels is None:  # logits_to_keep applies where no loss needs every position
            normed, head_states = slice_logits_to_keep(normed, logits_to_keep), slice_logits_to_keep(
                head_states, logits_to_keep)
        logits, head_logits = self.unembed(normed), self.unembed(head_states)
        loss = head_losses = None
        if labels is not None:
            loss, head_losses = multi_token_loss(
                logits, head_logits, labels, self.config.head_loss_weights, shift_labels=shift_labels,
                num_items_in_batch=num_items_in_batch,
            )
        return MultiTokenCausalLMOutput(
            loss=loss, logits=logits, cache=out_cache if use_cache is not False else None, head_logits=head_logits,
            head_losses=head_losses, hidden_states=trunk_out.hidden_states, attentions=trunk_out.attentions,
        )

    def _last_layer_keys_values(self, cache, layer_input, position_ids, past):
        """The base last layer's (keys, values) [B, kvH, past + T, D] that `share_kv` heads attend over: read from
        the cache the trunk filled; computed from the layer's input where it filled none (gradient checkpointing
        turns caching off in training)."""
        if cache is not None and int(cache.get_seq_length()) == past + layer_input.shape[1]:
            return cache_layer_keys_values(cache, -1)
        if past:
            raise ValueError(
                "share_kv heads need the base last layer's keys and values of the cached positions, but the trunk "
                "did not extend the cache (gradient checkpointing in training mode turns caching off); call the model "
                "in eval mode, or without a cache."
            )
        _, last_layer, _, _, rotary = self._parts()
        position_embeddings = rotary(layer_input, position_ids) if rotary is not None else None
        return self.query_extension_head_class.base_layer_keys_values(last_layer, layer_input, position_embeddings)

    # --- loading ------------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, *args, allow_fresh_heads=False, **kwargs):
        r"""
        `PreTrainedModel.from_pretrained`, strict about the heads: a checkpoint whose head weights are missing or
        mis-shaped raises instead of silently coming up with random heads. Pass `allow_fresh_heads=True` to start
        untrained heads (re-initialised from the base model) on purpose.
        """
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing = sorted(info.get("missing_keys", []))
        mismatched = sorted(str(k[0]) if isinstance(k, tuple) else str(k) for k in info.get("mismatched_keys", []))
        bad_heads = [k for k in missing + mismatched if k.startswith(HEADS_PREFIX)]
        bad_base = [k for k in missing + mismatched if not k.startswith(HEADS_PREFIX)]
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        if bad_base:
            raise ValueError(
                f"The checkpoint {source!r} lacks or mis-shapes base weights {bad_base[:5]} "
                f"({len(bad_base)} in all): it is corrupt or was saved from a different architecture."
            )
        if bad_heads:
            if not allow_fresh_heads:
                raise ValueError(
                    f"The checkpoint {source!r} lacks or mis-shapes head weights {bad_heads[:5]} ({len(bad_heads)} in "
                    f"all) for num_heads={model.config.num_heads}, head_type={model.config.head_type!r}. Load a "
                    "checkpoint saved with these settings, or pass allow_fresh_heads=True to start untrained heads."
                )
            logger.warning(f"Starting {len(model.mtp_heads)} untrained heads (allow_fresh_heads=True).")
            model.reset_heads()
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        # `register_for_auto_class` fills auto_map for AutoConfig and AutoModelForCausalLM; AutoModel is added here so
        # `AutoModel.from_pretrained(..., trust_remote_code=True)` also finds the class.
        auto_map = dict(getattr(self.config, "auto_map", None) or {})
        auto_map["AutoConfig"] = f"configuration_multi_token.{type(self.config).__name__}"
        auto_map["AutoModel"] = f"modeling_multi_token.{type(self).__name__}"
        auto_map["AutoModelForCausalLM"] = f"modeling_multi_token.{type(self).__name__}"
        self.config.auto_map = auto_map
        return super().save_pretrained(save_directory, *args, **kwargs)


_FORWARD_DOC = r"""
        The base causal LM's forward, with the same arguments. Without `labels` or `output_head_logits=True` it is
        exactly the base forward, at its cost. Otherwise it also computes the heads and returns a
        [`MultiTokenCausalLMOutput`] whose `logits` are the base model's and whose `head_logits` are
        `[batch, seq, num_heads - 1, vocab]`; with `labels` (or `labels` and `shift_labels`), `loss` aggregates the
        per-head cross-entropies (`head_losses`) instead of head 0's alone.
"""


class LlamaFamilyForward:
    """The forward of `LlamaForCausalLM`, which Mistral, Qwen2, Qwen3 and Gemma 2 / 3 share argument for argument."""

    # The signature is LlamaForCausalLM.forward's, plus `output_head_logits`.
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, logits_to_keep=0, output_head_logits=False, **kwargs):
        if labels is None and not output_head_logits:
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                inputs_embeds=inputs_embeds, use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs,
            )
        return self._forward_with_heads(
            input_ids, labels=labels, cache=cache, use_cache=use_cache, attention_mask=attention_mask,
            position_ids=position_ids, inputs_embeds=inputs_embeds, logits_to_keep=logits_to_keep, **kwargs,
        )

    forward.__doc__ = _FORWARD_DOC


class LlamaForMultiTokenPrediction(MultiTokenPredictionMixin, LlamaFamilyForward, LlamaForCausalLM):
    config_class = MultiTokenLlamaConfig
    architecture = ARCHITECTURES["llama"]


class MistralForMultiTokenPrediction(MultiTokenPredictionMixin, LlamaFamilyForward, MistralForCausalLM):
    config_class = MultiTokenMistralConfig
    architecture = ARCHITECTURES["mistral"]


class Qwen2ForMultiTokenPrediction(MultiTokenPredictionMixin, LlamaFamilyForward, Qwen2ForCausalLM):
    config_class = MultiTokenQwen2Config
    architecture = ARCHITECTURES["qwen2"]


class Qwen3ForMultiTokenPrediction(MultiTokenPredictionMixin, LlamaFamilyForward, Qwen3ForCausalLM):
    config_class = MultiTokenQwen3Config
    architecture = ARCHITECTURES["qwen3"]


class Gemma2ForMultiTokenPrediction(MultiTokenPredictionMixin, LlamaFamilyForward, Gemma2ForCausalLM):
    config_class = MultiTokenGemma2Config
    architecture = ARCHITECTURES["gemma2"]


class Gemma3ForMultiTokenPrediction(MultiTokenPredictionMixin, LlamaFamilyForward, Gemma3ForCausalLM):
    config_class = MultiTokenGemma3TextConfig
    architecture = ARCHITECTURES["gemma3_text"]


class GPT2ForMultiTokenPrediction(MultiTokenPredictionMixin, GPT2LMHeadModel):
    config_class = MultiTokenGPT2Config
    architecture = ARCHITECTURES["gpt2"]

    # The signature is GPT2LMHeadModel.forward's (its own positional order), plus `output_head_logits`.
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @can_return_tuple
    def forward(self, input_ids=None, cache=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, encoder_hidden_states=None, encoder_attention_mask=None, labels=None,
                use_cache=None, logits_to_keep=0, output_head_logits=False, **kwargs):
        if labels is None and not output_head_logits:
            return super().forward(
                input_ids=input_ids, cache=cache, attention_mask=attention_mask, token_type_ids=token_type_ids,
                position_ids=position_ids, inputs_embeds=inputs_embeds, encoder_hidden_states=encoder_hidden_states,
                encoder_attention_mask=encoder_attention_mask, use_cache=use_cache, logits_to_keep=logits_to_keep,
                **kwargs,
            )
        if encoder_hidden_states is not None and self.uses_layer_input:
            # a query-extension head is a copy of the last layer's self-attention and MLP, without cross-attention
            raise ValueError(
                "query_extension heads have no cross-attention, so they cannot read encoder_hidden_states; use "
                "linear or resblock heads, or call the model without labels and output_head_logits."
            )
        # token_type_ids are added to the trunk's input embeddings, which the heads read through its hidden states
        return self._forward_with_heads(
            input_ids, labels=labels, cache=cache, use_cache=use_cache, attention_mask=attention_mask,
            position_ids=position_ids, inputs_embeds=inputs_embeds, logits_to_keep=logits_to_keep,
            token_type_ids=token_type_ids, encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask, **kwargs,
        )

    forward.__doc__ = _FORWARD_DOC


# base causal-LM class -> its multi-token class (convert() reads this; the architecture table says where the parts are)
MULTI_TOKEN_CLASSES = {
    LlamaForCausalLM: LlamaForMultiTokenPrediction,
    GPT2LMHeadModel: GPT2ForMultiTokenPrediction,
    MistralForCausalLM: MistralForMultiTokenPrediction,
    Qwen2ForCausalLM: Qwen2ForMultiTokenPrediction,
    Qwen3ForCausalLM: Qwen3ForMultiTokenPrediction,
    Gemma2ForCausalLM: Gemma2ForMultiTokenPrediction,
    Gemma3ForCausalLM: Gemma3ForMultiTokenPrediction,
}

# `save_pretrained` then writes auto_map and copies this file and the files it imports next to the weights.
for _model_class in MULTI_TOKEN_CLASSES.values():
    _model_class.config_class.register_for_auto_class()
    _model_class.register_for_auto_class("AutoModelForCausalLM")
