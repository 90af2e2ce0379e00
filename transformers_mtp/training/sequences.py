# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""`training_sequences`: the token sequences a preset's `train:` section asks for (self-distillation on the built-in
prompts, or a text / JSONL file), with the self-distillation cache (`data_cache`) that lets a later run reuse the
responses and generate only the missing ones."""

import json
import os
from functools import partial
from pathlib import Path

from transformers.utils import logging

from .data import load_text_sequences, self_distill
from .prompts import training_prompts

logger = logging.get_logger(__name__)


def _read_cache(cache, expected, describe):
    """Lines of a self-distillation cache, checked against `expected` (one (prompt, extra) key per line, in order):
    a cache made from other prompts or settings is an error naming the line, never silently reused."""

    if cache is None or not cache.is_file():
        return []
    cached = [json.loads(line) for line in cache.read_text().splitlines() if line.strip()][: len(expected)]
    for number, (sequence, (prompt, extra)) in enumerate(zip(cached, expected), 1):
        found = {key: sequence.get(key) for key in extra}
        if sequence.get("prompt") != prompt or found != extra:
            raise ValueError(
                f"{cache}:{number} holds the response to {sequence.get('prompt')!r} {found or ''}, not to "
                f"{describe(number)} ({prompt!r} {extra or ''}): the cache was made from other prompts or settings. "
                "Delete it or set another data_cache."
            )
    logger.info(f"Reusing {len(cached)} self-distilled sequences from {cache}")
    return cached


def _write_cache(cache, sequences):
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = cache.with_suffix(f".{os.getpid()}.tmp")  # one per process: under torchrun every rank writes the same
    staging.write_text("".join(json.dumps(s) + "\n" for s in sequences))
    os.replace(staging, cache)  # atomic: a later run never reads half a file


def training_sequences(model, tokenizer, settings, *, progress=True):
    """The sequences a preset's `train:` section asks for: self-distillation on the first `num_prompts` built-in
    prompts, or a plain text / JSONL file.

    Self-distillation gives each prompt its greedy response and, with `sampled_per_prompt: N`, N more responses
    sampled at `sample_temperature`. Sampled text is still scored against the base model's argmax at every
    position (`cache_trunk_features`), so it adds contexts the model itself writes, at no loss of target quality.

    With `data_cache`, responses are kept in JSONL files (greedy: `data_cache`; sampled: `data_cache` with a
    `.sampled` suffix), one line per response in a fixed order. A later run reuses them, and when it asks for more
    it generates only the missing ones and appends them (a longer run need not redo the first hours of generation).
    A cache made from other prompts or settings is an error, never silently reused."""
    data = settings.get("data", "builtin")
    if data != "builtin":
        return load_text_sequences(data, tokenizer)
    prompts = [p["prompt"] for p in training_prompts(limit=settings.get("num_prompts", 640))]
    samples = settings.get("sampled_per_prompt", 0)
    if not isinstance(samples, int) or samples < 0:
        raise ValueError(f"sampled_per_prompt={samples!r} must be a whole number >= 0 (0: greedy responses only).")
    temperature = settings.get("sample_temperature", 0.7)
    distill = partial(self_distill, model, tokenizer, max_new_tokens=settings.get("max_new_tokens", 160),
                      batch_size=settings.get("distill_batch_size", 16), progress=progress)
    cache = Path(settings["data_cache"]) if settings.get("data_cache") else None

    greedy = _read_cache(cache, [(p, {}) for p in prompts], lambda n: f"built-in prompt {n}")
    if len(greedy) < len(prompts):
        missing = prompts[len(greedy):]
        greedy += [dict(s, prompt=p) for s, p in zip(distill(missing), missing)]
        if cache is not None:
            _write_cache(cache, greedy)
    if not samples:
        return greedy

    # round j holds the j-th sample of every prompt, so asking for more samples only appends rounds
    expected = [(p, {"sample": j, "temperature": temperature}) for j in range(samples) for p in prompts]
    sampled_cache = cache.with_suffix(".sampled.jsonl") if cache is not None else None
    sampled = _read_cache(sampled_cache, expected, lambda n: f"sample {(n - 1) // len(prompts)} of built-in prompt "
                                                             f"{(n - 1) % len(prompts) + 1}")
    while len(sampled) < len(expected):
        j, done = divmod(len(sampled), len(prompts))
        missing = prompts[done:]
        responses = distill(missing, temperature=temperature, seed=settings.get("seed", 0) * 1000 + j)
        sampled += [dict(s, prompt=p, sample=j, temperature=temperature) for s, p in zip(responses, missing)]
        if sampled_cache is not None:
            _write_cache(sampled_cache, sampled)
    return greedy + sampled
