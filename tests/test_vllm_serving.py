"""End to end in the real engine: heads exported by transformers_mtp.export, served by vLLM as its speculator.

vLLM runs in a virtualenv of its own (tests/vllm_engine.py): without it these tests skip, saying so, and with
TRANSFORMERS_MTP_REQUIRE_VLLM=1 (as `.ci/run` sets it) a missing engine is an error instead.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from vllm_engine import TEST_ENGINE_ENVIRONMENT, VLLM_PYTHON, requires_vllm

import transformers_mtp
from transformers_mtp.serving_export import export

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "vllm_serving.py"
pytestmark = requires_vllm


def serve(export_dir, tmp_path, *args):
    """Run benchmarks/vllm_serving.py in the engine's virtualenv; its JSON report."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH")}
    env.update(TEST_ENGINE_ENVIRONMENT)
    report = tmp_path / "report.json"
    done = subprocess.run([VLLM_PYTHON, str(SCRIPT), str(export_dir), "--output", str(report), *args], env=env,
                          check=False, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(report.read_text())


def tiny_llama_with_smollm2_tokenizer():
    """A tiny random Llama that vLLM's CPU back end runs (head_dim 64) with SmolLM2's tokenizer and chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tokenizer = transformers_mtp.load_default_base()
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=len(tokenizer), max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config), tokenizer


@pytest.mark.parametrize("head_type,format", [("chained", "eagle3"), ("resblock", "medusa")])
def test_a_tiny_random_export_round_trips_through_vllm(head_type, format, tmp_path):
    """Random heads on a tiny Llama: vLLM loads both folders, drafts with the speculator, and its greedy output
    with it is its own without it (whatever the drafts, verification keeps it)."""
    base, tokenizer = tiny_llama_with_smollm2_tokenizer()
    extra = {"draft_vocab_size": 2048} if head_type == "chained" else {}
    model = transformers_mtp.convert(base, num_heads=4, head_type=head_type, **extra)
    if head_type == "chained":  # an unsorted draft vocabulary: d2t must map every draft id back
        model.set_draft_vocabulary(torch.randperm(len(tokenizer))[:2048])
    with torch.no_grad():  # fresh resblock heads are zero (identity): make them draft something else
        for param in model.mtp_heads.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    out = export(model, tmp_path / "tiny", format=format, tokenizer=tokenizer)
    report = serve(out, tmp_path, "--limit", "4", "--max-tokens", "24", "--batch", "4")
    assert report["identical"] == 4, report["identical_per_prompt"]
    assert report["speculative"]["drafts"] > 0  # the speculator ran


def test_shipped_heads_in_vllm_keep_greedy_output_and_accept_about_what_generate_accepts(tmp_path):
    """The shipped chained drafter exported as EAGLE-3: vLLM's greedy output with it is its own without it, token
    for token, and its mean acceptance length is within 25% of our own chain drafting on the same prompts (heads
    only: no context lookup, no datastore, no tree; the engines draft differently, a broken export accepts ~0)."""
    from transformers_mtp.training.data import chat_input_ids

    model, tokenizer = transformers_mtp.load_default(heads="chained")
    limit, max_tokens = 4, 64
    prompts = [json.loads(line) for line in (ROOT / "transformers_mtp" / "bench_prompts.jsonl").read_text().splitlines()]
    prompts = prompts[:2] + prompts[8:10]  # two code, two chat
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    kept = []  # tokens kept per verify pass (drafts accepted + 1): what vLLM's mean acceptance length counts
    for prompt in prompts:
        out = model.generate(chat_input_ids(tokenizer, prompt["prompt"]), max_new_tokens=max_tokens, do_sample=False,
                             multi_token_mode=True, draft_tree_size=0, draft_lookup_ngram=0, draft_datastore=False,
                             return_dict_in_generate=True)
        kept += out.multi_token_stats.accepted_per_step
    ours = sum(kept) / len(kept)
    exported = export(model, tmp_path / "shipped", format="eagle3", tokenizer=tokenizer)
    report = serve(exported, tmp_path, "--prompts", str(prompt_file), "--limit", str(limit), "--max-tokens",
                   str(max_tokens), "--batch", str(limit))
    assert report["identical"] == limit, report["identical_per_prompt"]
    theirs = report["speculative"]["mean_acceptance_length"]
    assert abs(theirs - ours) <= 0.25 * ours, f"vLLM mean acceptance length {theirs:.2f}, ours {ours:.2f}"
