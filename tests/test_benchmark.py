import json

import torch
from conftest import VOCAB, tiny_base, tiny_mtp

import transformers_mtp
from transformers_mtp.benchmark import (
    batched_markdown_table,
    markdown_table,
    run_batched_benchmark,
    run_benchmark,
    write_report,
)
from transformers_mtp.benchmark import load_prompts


def test_benchmark_measures_every_mode_against_greedy(tmp_path):
    model = tiny_mtp("llama", num_heads=4, seed=3)
    prompts = [{"id": f"p{i}", "kind": "code" if i % 2 else "chat",
                "input_ids": torch.randint(3, VOCAB, (1, 5 + i), generator=torch.Generator().manual_seed(i))}
               for i in range(4)]
    result = run_benchmark(model, prompts, ks=[2, 4], thresholds=[0.0, 0.02], lookups=[0, 2], max_new_tokens=16,
                           progress=False)
    records = result["records"]
    # greedy + sample, then per k: verified x 2 thresholds x 2 lookups, unverified, prompt lookup, verified sampling
    # x 2 thresholds x 2 lookups
    assert len(records) == 4 * (2 + 2 * (4 + 1 + 1 + 4))
    verified = [r for r in records if r["mode"] == "verified"]
    assert all(r["identical"] for r in verified)  # lossless, whatever the heads draft
    assert all(r["forward_passes"] >= 1 and r["seconds"] > 0 and 0 < r["ttft"] <= r["seconds"] for r in records)
    greedy = [r for r in records if r["mode"] == "greedy"]
    assert all(r["forward_passes"] == r["new_tokens"] for r in greedy)  # one token per pass, counted by the hook
    unverified = [r for r in records if r["mode"] == "unverified" and r["k"] == 4]
    assert all(r["forward_passes"] < r["new_tokens"] for r in unverified if r["new_tokens"] > 4)
    rows = {(s["mode"], s["k"], s["kind"]) for s in result["summary"]}
    assert {("verified", 4, "all"), ("verified", 4, "code"), ("prompt_lookup", 2, "chat"), ("greedy", 1, "all")} <= rows
    greedy_row = next(s for s in result["summary"] if (s["mode"], s["kind"]) == ("greedy", "all"))
    assert greedy_row["speedup"]["median"] == 1.0 and greedy_row["exact_match_rate"] == 1.0
    assert "| verified k=4 (all) | 4 |" in markdown_table(result["summary"])
    assert "| verified k=4 t=0.02 (code) | 2 |" in markdown_table(result["summary"])
    assert "| verified k=4 t=0.02 lookup=2 (code) | 2 |" in markdown_table(result["summary"])
    # sampling modes: compared with plain sampling, no exact-match claim
    sampled = next(s for s in result["summary"] if (s["mode"], s["k"], s["threshold"], s["kind"]) ==
                   ("verified_sample", 4, 0.0, "all") and s["lookup"] == 0)
    assert sampled["baseline"] == "sample" and sampled["exact_match_rate"] is None
    assert all(r["identical"] is None for r in records if r["mode"] in ("sample", "verified_sample"))
    # a threshold that cuts drafts proposes fewer of them
    proposed = {t: sum(sum(r["head_proposed"]) for r in records if (r["mode"], r["k"], r["threshold"], r["lookup"])
                       == ("verified", 4, t, 0)) for t in (0.0, 0.02)}
    # without explicit values, the model's generation config decides (convert() turns 3-gram lookup on)
    default = run_benchmark(model, prompts[:1], modes=["verified"], max_new_tokens=4, warmup=False, progress=False)
    assert {(r["threshold"], r["lookup"]) for r in default["records"] if r["mode"] == "verified"} == {(0.0, 3)}
    assert proposed[0.02] < proposed[0.0]
    result["batched"] = run_batched_benchmark(model, prompts, batch_sizes=[1, 3], k=3, max_new_tokens=12,
                                              progress=False)
    assert [row["batch_size"] for row in result["batched"]] == [1, 3]
    assert all(row["identical_rows"] == row["batch_size"] and row["speedup"] > 0 for row in result["batched"])
    assert "| 3 | 3 |" in batched_markdown_table(result["batched"])
    write_report(result, tmp_path, environment={"device": "cpu"})
    assert json.loads((tmp_path / "bench.json").read_text())["environment"] == {"device": "cpu"}
    for name in ("bench.md", "head_acceptance.png", "speedup_per_prompt.png", "tokens_per_forward.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_prompt_files(tmp_path):
    shipped = load_prompts()
    assert {p["kind"] for p in shipped} == {"code", "chat"} and len(shipped) >= 16
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    import pytest

    with pytest.raises(ValueError, match="bad.jsonl:2 is not valid JSON"):
        load_prompts(bad)
    bad.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match='needs a "prompt" string'):
        load_prompts(bad)


def test_benchmark_compares_the_draft_datastore_on_and_off(tmp_path):
    from transformers_mtp.draft_datastore import build_draft_datastore

    model = transformers_mtp.convert(tiny_base("llama"), num_heads=3, draft_datastore_size=100).eval()
    prompts = [{"id": f"p{i}", "kind": "code", "input_ids": torch.randint(3, VOCAB, (1, 6), generator=torch.Generator()
                                                                          .manual_seed(i))} for i in range(2)]
    answers = [{"input_ids": model.generate(p["input_ids"], max_new_tokens=12, do_sample=False)[0].tolist(),
                "prompt_length": 6} for p in prompts]
    model.set_draft_datastore(*build_draft_datastore(answers, vocab_size=VOCAB, length=2, max_entries=100, min_count=1))
    result = run_benchmark(model, prompts, modes=["verified"], lookups=[0], datastores=[True, False],
                           max_new_tokens=12, warmup=False, progress=False)
    verified = {r["datastore"]: r for r in result["records"] if r["mode"] == "verified" and r["prompt_id"] == "p0"}
    assert set(verified) == {True, False} and all(r["identical"] for r in verified.values())
    assert verified[True]["forward_passes"] < verified[False]["forward_passes"]  # its own answer, drafted from store
    table = markdown_table(result["summary"])
    assert "| verified k=3 datastore=on (all) | 2 |" in table and "| verified k=3 datastore=off (all) | 2 |" in table
    write_report(result, tmp_path)


def test_benchmark_compares_draft_trees_with_chains(tmp_path):
    model = tiny_mtp("gpt2", num_heads=4, seed=5)
    prompts = [{"id": f"p{i}", "kind": "chat", "input_ids": torch.randint(3, VOCAB, (1, 4 + i), generator=torch
                                                                          .Generator().manual_seed(i))} for i in range(2)]
    result = run_benchmark(model, prompts, modes=["verified", "unverified"], tree_sizes=[0, 6], max_new_tokens=12,
                           warmup=False, progress=False)
    records = result["records"]
    # greedy, then verified as a chain and as a tree, then unverified (chains only)
    assert sorted((r["mode"], r["tree_size"]) for r in records if r["prompt_id"] == "p0") == [
        ("greedy", 0), ("unverified", 0), ("verified", 0), ("verified", 6)]
    assert all(r["identical"] for r in records if r["mode"] == "verified")
    assert "| verified k=4 lookup=3 tree=6 (all) | 2 |" in markdown_table(result["summary"])
    write_report(result, tmp_path)


def test_benchmark_reports_each_dtype_against_its_own_greedy_and_where_outputs_part(tmp_path):
    """Two dtypes in one report, each against plain greedy of its own dtype; an output that parts from greedy's
    (unverified drafting with random heads does) gets the position and greedy's top-two margin there."""
    from transformers_mtp.benchmark import RunRecord, summarize

    prompts = [{"id": f"p{i}", "kind": "code" if i % 2 else "chat",
                "input_ids": torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(i))}
               for i in range(2)]
    records = []
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_mtp("llama", num_heads=3, seed=5).to(dtype)
        records += run_benchmark(model, prompts, modes=["verified", "unverified"], max_new_tokens=12,
                                 progress=False)["records"]
    assert {r["dtype"] for r in records} == {"float32", "bfloat16"}
    summary = summarize([RunRecord(**r) for r in records])
    for dtype in ("float32", "bfloat16"):
        greedy = next(s for s in summary if (s["dtype"], s["mode"], s["kind"]) == (dtype, "greedy", "all"))
        assert greedy["speedup"]["median"] == 1.0 and greedy["prompts"] == 2
    parted = [r for r in records if r["mode"] == "unverified" and not r["identical"]]
    assert parted, "random unverified drafts should part from greedy"
    for r in parted:
        assert 0 <= r["divergence_position"] < r["new_tokens"]
        assert r["divergence_margin"] >= 0 and 0 < r["divergence_rank"] <= 1
    fp32_verified = [r for r in records if (r["dtype"], r["mode"]) == ("float32", "verified")]
    assert all(r["identical"] and r["divergence_margin"] is None for r in fp32_verified)
    row = next(s for s in summary if (s["mode"], s["kind"]) == ("unverified", "all") and s["diverged"])
    assert row["diverged"] == sum(1 for r in parted if r["dtype"] == row["dtype"])
    table = markdown_table(summary)
    assert "| float32 | verified k=3 lookup=3 (all) |" in table and "| bfloat16 | greedy (all) |" in table
    write_report({"records": records, "summary": summary, "max_new_tokens": 12}, tmp_path)
    assert (tmp_path / "speedup_per_prompt.png").is_file()


def test_repeated_rounds_time_each_variant_by_its_median(monkeypatch):
    import pytest

    from transformers_mtp import benchmark

    model = tiny_mtp("llama", num_heads=4, seed=3)
    prompts = [{"id": f"p{i}", "kind": "code", "input_ids": torch.randint(3, VOCAB, (1, 6))} for i in range(2)]
    clock = iter(range(10_000))  # the n-th perf_counter() call reads n^2 s: every round runs longer than the one before
    monkeypatch.setattr(benchmark.time, "perf_counter", lambda: float(next(clock)) ** 2)
    result = run_benchmark(model, prompts, modes=["verified", "prompt_lookup"], max_new_tokens=8, repeats=3,
                           warmup=False, progress=False)
    assert result["repeats"] == 3 and len(result["records"]) == 2 * 3  # one record per prompt and variant
    for record in result["records"]:
        assert record["repeats"] == 3 and len(record["seconds_per_run"]) == 3
        first, middle, last = record["seconds_per_run"]
        assert first < middle < last and record["seconds"] == middle
        assert record["identical"]  # greedy and verified decode the same text in every round
    with pytest.raises(ValueError, match="repeats=0 must be a whole number >= 1"):
        run_benchmark(model, prompts, modes=["verified"], repeats=0, warmup=False, progress=False)


def test_rounds_that_decode_different_texts_are_an_error(monkeypatch):
    import pytest

    from transformers_mtp import benchmark

    model = tiny_mtp("llama", num_heads=4, seed=3)
    prompts = [{"id": "p0", "kind": "chat", "input_ids": torch.randint(3, VOCAB, (1, 6))}]
    real_run_one, calls = benchmark.run_one, []

    def drifting_run_one(*args, **kwargs):
        sequences, record = real_run_one(*args, **kwargs)
        calls.append(1)
        return (sequences + 1 if len(calls) == 4 else sequences), record  # the second round's greedy differs

    monkeypatch.setattr(benchmark, "run_one", drifting_run_one)
    with pytest.raises(RuntimeError, match="gave two different outputs for prompt 'p0' with the same seed"):
        run_benchmark(model, prompts, modes=["verified", "prompt_lookup"], max_new_tokens=6, repeats=2,
                      warmup=False, progress=False)
