"""Training answers written by vLLM (`distill_engine: vllm`), in the real engine: they are the base model's own
text, as `generate()` writes it. vLLM runs in a virtualenv of its own (tests/vllm_engine.py)."""

import json

import pytest
import torch
from vllm_engine import TEST_ENGINE_ENVIRONMENT, requires_vllm

import transformers_mtp
from transformers_mtp.training import training_sequences
from transformers_mtp.training.data import chat_ids, self_distill
from transformers_mtp.training.sequences import training_prompt_texts

pytestmark = [requires_vllm, pytest.mark.real_model]


def test_vllm_writes_the_base_models_own_answers_to_the_cache(tmp_path, monkeypatch):
    """Greedy answers by vLLM in float32: the prompt is our chat template's tokens, each answer ends at the EOS or
    the token limit, and the float32 base model's own argmax is vLLM's token at (nearly) every answer position
    (where the engines round a near-tie apart, the text goes on differently, still the model's argmax). Sampled
    answers come too, each seeded, and the cache records the engine."""
    for name, value in TEST_ENGINE_ENVIRONMENT.items():  # the worker inherits this environment
        monkeypatch.setenv(name, value)
    base, tokenizer = transformers_mtp.load_default_base()
    max_new_tokens, limit = 48, 6
    cache = tmp_path / "cache.jsonl"
    settings = {"data": "builtin", "num_prompts": limit, "max_new_tokens": max_new_tokens, "distill_engine": "vllm",
                "data_cache": str(cache), "sampled_per_prompt": 1, "sample_temperature": 0.7}
    sequences = training_sequences(base, tokenizer, settings, progress=False)
    prompts = training_prompt_texts("builtin", limit=limit)
    greedy, sampled = sequences[:limit], sequences[limit:]
    assert len(sampled) == limit and all(s["engine"] == "vllm" for s in sequences)
    assert [json.loads(line)["engine"] for line in cache.read_text().splitlines()] == ["vllm"] * limit

    agree = total = 0
    for prompt, sequence in zip(prompts + prompts, sequences):
        ids, start = sequence["input_ids"], sequence["prompt_length"]
        assert ids[:start] == chat_ids(tokenizer, prompt)
        answer = ids[start:]
        assert 0 < len(answer) <= max_new_tokens
        assert len(answer) == max_new_tokens or answer[-1] == tokenizer.eos_token_id
        assert tokenizer.eos_token_id not in answer[:-1]
        if sequence in greedy:
            with torch.no_grad():
                argmax = base(torch.tensor([ids])).logits[0, start - 1 : -1].argmax(-1).tolist()
            agree += sum(a == b for a, b in zip(argmax, answer))
            total += len(answer)
    assert agree / total >= 0.97, f"vLLM's greedy tokens are the base model's argmax at {agree}/{total} positions"
    assert any(s["input_ids"] != g["input_ids"] for s, g in zip(sampled, greedy))  # sampling took other branches

    ours = self_distill(base, tokenizer, prompts[:2], max_new_tokens=max_new_tokens, progress=False)
    # the same text as generate() writes, except past a near-tie: most of the first answers' tokens are shared
    shared = [next((i for i, (a, b) in enumerate(zip(o["input_ids"], g["input_ids"])) if a != b),
                   min(len(o["input_ids"]), len(g["input_ids"]))) - o["prompt_length"] for o, g in zip(ours, greedy)]
    assert sum(shared) >= 0.5 * 2 * max_new_tokens - 1, shared


def test_vllm_samples_answers_when_a_step_splits_a_prompt(tmp_path, monkeypatch):
    """Seeded sampling with more prompt tokens than one engine step takes (4,096 on the CPU back end): vLLM 0.32's
    chunked prefill then rewinds a seeded request's generator, which its CPU generator cannot do ("CPU Generator
    does not use offset"); the worker turns chunked prefill off for sampled runs. Seen on the real-prompt preset's
    first sampled round."""
    for name, value in TEST_ENGINE_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    base, tokenizer = transformers_mtp.load_default_base()
    limit = 160  # about 6,000 prompt tokens
    settings = {"data": "builtin", "num_prompts": limit, "max_new_tokens": 2, "distill_engine": "vllm",
                "data_cache": str(tmp_path / "cache.jsonl"), "sampled_per_prompt": 1, "sample_temperature": 0.7}
    prompts = training_prompt_texts("builtin", limit=limit)
    assert sum(len(chat_ids(tokenizer, p)) for p in prompts) > 4096
    sequences = training_sequences(base, tokenizer, settings, progress=False)
    sampled = sequences[limit:]
    assert len(sampled) == limit and all(s["sample"] == 0 and s["engine"] == "vllm" for s in sampled)
    assert all(0 < len(s["input_ids"]) - s["prompt_length"] <= 2 for s in sampled)
