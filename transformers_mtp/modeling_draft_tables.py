# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""The draft tables a multi-token model may carry with its heads: the draft vocabulary and the draft datastore.

Both are buffers of `mtp_heads` (saved with the heads), built at training and read by the decode loop.

Copied next to the weights by `save_pretrained` (through modeling_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

import torch

from .generation_draft_sources import DATASTORE_EMPTY_KEY


class DraftTablesMixin:
    """Setters and readers of the draft vocabulary (`config.draft_vocab_size`) and datastore
    (`config.draft_datastore_size`); the buffers themselves are registered with the heads."""

    def set_draft_vocabulary(self, token_ids):
        """Draft over these token ids only (`config.draft_vocab_size` of them)."""
        token_ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.lm_head.weight.device)
        if token_ids.shape != (self.config.draft_vocab_size,):
            raise ValueError(f"Expected {self.config.draft_vocab_size} draft token ids, got shape {tuple(token_ids.shape)}.")
        self.mtp_heads.draft_token_ids.copy_(token_ids)

    def set_draft_datastore(self, keys, tokens):
        """Fill the draft datastore: `keys` [M] (sorted `datastore_key`s of 3-token contexts, M at most
        `config.draft_datastore_size`) and `tokens` [M, num_heads - 1] (what followed each). Unused entries stay empty."""
        size, length = self.config.draft_datastore_size or 0, self.config.num_heads - 1
        keys, tokens = torch.as_tensor(keys, dtype=torch.long), torch.as_tensor(tokens, dtype=torch.long)
        if keys.ndim != 1 or keys.shape[0] > size or tokens.shape != (keys.shape[0], length):
            raise ValueError(
                f"A draft datastore of {tuple(keys.shape)} keys and {tuple(tokens.shape)} tokens does not fit this "
                f"model: it holds at most draft_datastore_size={self.config.draft_datastore_size} entries of "
                f"num_heads - 1 = {length} tokens."
            )
        unsorted = (keys[1:] <= keys[:-1]).nonzero()
        if unsorted.shape[0]:
            position = int(unsorted[0, 0]) + 1
            raise ValueError(f"Draft datastore key {position} ({int(keys[position])}) is not above the one before it: keys "
                             "must be sorted and unique; build them with build_draft_datastore.")
        self.mtp_heads.datastore_keys.fill_(DATASTORE_EMPTY_KEY)
        self.mtp_heads.datastore_tokens.zero_()
        self.mtp_heads.datastore_keys[: keys.shape[0]] = keys.to(self.mtp_heads.datastore_keys.device)
        self.mtp_heads.datastore_tokens[: keys.shape[0]] = tokens.to(self.mtp_heads.datastore_tokens.device)

    def draft_datastore(self):
        """(keys [M], tokens [M, num_heads - 1]) of the draft datastore, or None without one."""
        if self.config.draft_datastore_size is None:
            return None
        return self.mtp_heads.datastore_keys, self.mtp_heads.datastore_tokens

    def unembed(self, hidden, weight=None):
        """Logits from final-normed states [..., H]: the unembedding (or `weight`'s rows [N, H], e.g. the draft
        vocabulary's), soft-capped as the architecture's own forward caps them (Gemma 2's `final_logit_softcapping`),
        so that logits processors and sampling see what plain decoding sees."""
        logits = self.lm_head(hidden) if weight is None else hidden @ weight.T
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is not None:  # as Gemma2ForCausalLM.forward computes it, op for op
            logits = logits / cap
            logits = torch.tanh(logits)
            logits = logits * cap
        return logits

    def draft_unembedding(self):
        """(weight [N, H], token ids [N]) of the drafting vocabulary; (lm_head weight, None) for the full one."""
        if self.config.draft_vocab_size is None:
            return self.lm_head.weight, None
        ids = self.mtp_heads.draft_token_ids
        return self.lm_head.weight.index_select(0, ids), ids
