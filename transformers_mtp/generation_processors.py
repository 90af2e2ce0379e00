# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Logits processors, row by row: rows of a batch advance by different numbers of tokens.

Copied next to the weights by `save_pretrained` (through generation_multi_token.py): imports only torch, transformers
and `from .module import Name`.
"""

import copy
import inspect

import torch
from transformers import LogitsProcessorList


def _rows_of_tensor(attribute):
    """Per-row state held as a tensor with one entry (row) per row of the batch."""
    def cut(processor, row, batch_size):
        value = getattr(processor, attribute, None)
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch_size:
            return {attribute: value[row : row + 1]}
        return {}
    return cut


def _rows_of_encoder_ngrams(processor, row, batch_size):
    return {"batch_size": 1, "generated_ngrams": [processor.generated_ngrams[row]]}


# State that transformers' processors keep per row of the batch, and how to cut one row of it. Every other tensor a
# processor holds (token ids, biases) is shared by all rows, however long it is.
_PER_ROW_PROCESSOR_STATE = {
    "RepetitionPenaltyLogitsProcessor": _rows_of_tensor("prompt_ignore_length"),  # each prompt's padding
    "EncoderRepetitionPenaltyLogitsProcessor": _rows_of_tensor("encoder_input_ids"),  # each row's prompt
    "EncoderNoRepeatNGramLogitsProcessor": _rows_of_encoder_ngrams,  # each row's prompt n-grams
}
# Processors that keep state across calls (a watermark's context, a guidance model's own cache), which checking
# several drafts per pass, or a draft that is rejected, would advance wrongly
_STATEFUL_PROCESSORS = {
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config (SynthID)",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
}


class RowProcessors(LogitsProcessorList):
    """
    A `LogitsProcessorList` that reads each processor's signature once. transformers' `LogitsProcessorList.__call__`
    runs `inspect.signature` on every processor at every call (tens of microseconds each): plain decoding calls the
    list once per step for the whole batch, but verification calls it once per row and draft position, and on a
    batch of 6,000 sampled rows that took a third of generate()'s time. Otherwise the same: a processor whose
    `__call__` takes more than (input_ids, scores) needs its extra arguments passed, or it is the same ValueError.
    """

    def __call__(self, input_ids, scores, **kwargs):
        for processor in self:
            names = _parameter_names(processor)
            if len(names) > 2:
                if not all(name in kwargs for name in names[2:]):
                    raise ValueError(f"Make sure that all the required parameters: {list(names)} for "
                                     f"{processor.__class__} are passed to the logits processor.")
                scores = processor(input_ids, scores, **kwargs)
            else:
                scores = processor(input_ids, scores)
        return scores


_PARAMETER_NAMES = {}  # processor class -> the parameter names of its __call__


def _parameter_names(processor):
    if "__call__" in getattr(processor, "__dict__", {}):  # an instance with a __call__ of its own: read it each time, as transformers
        return tuple(inspect.signature(processor.__call__).parameters)
    cls = type(processor)
    if cls not in _PARAMETER_NAMES:
        _PARAMETER_NAMES[cls] = tuple(inspect.signature(processor.__call__).parameters)
    return _PARAMETER_NAMES[cls]


def processors_per_row(logits_processor, batch_size):
    """
    One `LogitsProcessorList` per row. Rows of a batch advance by different numbers of tokens, so each row's
    processors are called on that row alone, with that row's share of the state transformers keeps per row.
    """
    for processor in logits_processor:
        option = _STATEFUL_PROCESSORS.get(type(processor).__name__)
        if option is not None:
            raise ValueError(f"{option} builds {type(processor).__name__}, which keeps state from one call to the "
                             "next; verifying several drafts per pass would advance it wrongly. Drop multi_token_mode "
                             f"to use it, or drop {option}.")
    if batch_size == 1:
        return [RowProcessors(logits_processor)]
    rows = []
    for row in range(batch_size):
        processors = RowProcessors()
        for processor in logits_processor:
            name = type(processor).__name__
            if name == "PrefixConstrainedLogitsProcessor":
                raise ValueError("prefix_allowed_tokens_fn is called with the batch index, which batched "
                                 "multi_token_mode does not keep; pass one prompt at a time.")
            cut = _PER_ROW_PROCESSOR_STATE.get(name)
            per_row = cut(processor, row, batch_size) if cut is not None else {}
            if per_row:
                processor = copy.copy(processor)
                vars(processor).update(per_row)
            processors.append(processor)
        rows.append(processors)
    return rows
