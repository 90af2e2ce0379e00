"""Trunk features kept on disk between training runs (`feature_cache`, training/feature_store.py), tiny models."""

import pytest
import torch
from conftest import tiny_base
from safetensors.torch import load_file
from test_training import greedy_sequences

import transformers_mtp
from transformers_mtp.presets import load_preset
from transformers_mtp.training import HeadTrainingConfig, feature_store, train_heads
from transformers_mtp.training.data import cache_trunk_features, chat_input_ids

LAYOUTS = {  # one head type of each feature layout: keys / values kept (time on dim 1), tapped layers, neither
    "query_extension": {"num_heads": 3, "head_type": "query_extension", "head_input": "feature_and_token",
                        "head_rank": 8},
    "chained": {"num_heads": 3, "head_type": "chained", "head_rank": 4},
    "resblock": {"num_heads": 3, "head_type": "resblock", "draft_vocab_size": 40},
}


def count_trunk_passes(monkeypatch):
    """Record how many sequences the store sends through the trunk."""
    computed = []

    def counting(model, sequences, **kwargs):
        computed.extend(sequences)
        return cache_trunk_features(model, sequences, **kwargs)

    monkeypatch.setattr(feature_store, "cache_trunk_features", counting)
    return computed


def train(model, sequences, folder, **extra):
    settings = {"max_steps": 12, "per_device_train_batch_size": 4, "learning_rate": 3e-3, "eval_steps": 12,
                "save_steps": 12, "logging_steps": 4, "eval_fraction": 0.2}
    config = HeadTrainingConfig(output_dir=str(folder), **{**settings, **extra})
    _, metrics = train_heads(model, sequences, config, progress=False)
    return metrics, load_file(str(folder / "adapter" / "adapter_model.safetensors"))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_training_from_stored_features_is_the_same_as_from_features_in_memory(layout, tmp_path, monkeypatch):
    sequences = greedy_sequences(transformers_mtp.convert(tiny_base("llama"), **LAYOUTS[layout]), count=16)
    in_memory, memory_weights = train(transformers_mtp.convert(tiny_base("llama"), **LAYOUTS[layout]), sequences,
                                      tmp_path / "memory")
    computed = count_trunk_passes(monkeypatch)
    stored, stored_weights = train(transformers_mtp.convert(tiny_base("llama"), **LAYOUTS[layout]), sequences,
                                   tmp_path / "stored", feature_cache=str(tmp_path / "features"))
    assert len(computed) == len(sequences)
    again, again_weights = train(transformers_mtp.convert(tiny_base("llama"), **LAYOUTS[layout]), sequences,
                                 tmp_path / "again", feature_cache=str(tmp_path / "features"))
    assert len(computed) == len(sequences)  # the second run read every feature back, computed none
    assert in_memory == stored == again
    assert memory_weights.keys() == stored_weights.keys() == again_weights.keys()
    for name in memory_weights:
        assert torch.equal(memory_weights[name], stored_weights[name]), name
        assert torch.equal(memory_weights[name], again_weights[name]), name


@pytest.mark.parametrize("layout", ["query_extension", "chained"])
def test_a_grown_answer_set_adds_only_the_new_features_and_reads_back_what_the_trunk_gives(layout, tmp_path,
                                                                                          monkeypatch):
    model = transformers_mtp.convert(tiny_base("llama"), **LAYOUTS[layout])
    sequences = greedy_sequences(model, count=12)
    computed = count_trunk_passes(monkeypatch)
    monkeypatch.setattr(feature_store, "SHARD_SEQUENCES", 4)
    store = feature_store.FeatureStore(tmp_path / "features", model)
    store.features(sequences[:5], progress=False)
    assert len(computed) == 5
    read = store.features(sequences + sequences[:2], progress=False)  # a repeated sequence is read twice
    assert len(computed) == 12
    expected = cache_trunk_features(model, sequences + sequences[:2], progress=False)
    assert len(read) == len(expected)
    for got, want in zip(read, expected):
        assert sorted(got) == sorted(want)
        for name in want:
            assert torch.equal(got[name], want[name]), name
    assert len(list(store.folder.glob("shard-*.safetensors"))) == 4  # 5 sequences in 2 shards, 7 more in 2


def test_another_model_or_head_layout_gets_its_own_store(tmp_path):
    folders = set()
    for model in (transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["query_extension"]),
                  transformers_mtp.convert(tiny_base("llama", seed=1), **LAYOUTS["query_extension"]),
                  transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["chained"]),
                  transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["chained"], head_feature_layers=[1]),
                  transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["resblock"]),
                  transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["resblock"]).to(torch.bfloat16)):
        folders.add(feature_store.FeatureStore(tmp_path, model).folder)
    assert len(folders) == 6
    # the heads' own weights are no part of what the features depend on
    model = transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["query_extension"])
    with torch.no_grad():
        for parameter in model.mtp_heads.parameters():
            parameter.add_(1.0)
    assert feature_store.FeatureStore(tmp_path, model).folder in folders


def test_an_interrupted_caching_keeps_its_finished_shards_and_resumes_after_them(tmp_path, monkeypatch):
    model = transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["query_extension"])
    sequences = greedy_sequences(model, count=10)
    monkeypatch.setattr(feature_store, "SHARD_SEQUENCES", 4)
    calls = []

    def failing_on_the_third_shard(model, chunk, **kwargs):
        calls.append(len(chunk))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return cache_trunk_features(model, chunk, **kwargs)

    monkeypatch.setattr(feature_store, "cache_trunk_features", failing_on_the_third_shard)
    store = feature_store.FeatureStore(tmp_path / "features", model)
    with pytest.raises(KeyboardInterrupt):
        store.features(sequences, progress=False)
    assert len(list(store.folder.glob("shard-*.safetensors"))) == 2
    computed = count_trunk_passes(monkeypatch)
    store.features(sequences, progress=False)
    assert computed == sequences[8:]


def test_a_feature_cache_that_is_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "features").write_text("not a folder")
    model = transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["resblock"])
    with pytest.raises(NotADirectoryError, match="feature_cache=.*is a file; give a folder"):
        train(model, greedy_sequences(model, count=8), tmp_path / "run", feature_cache=str(tmp_path / "features"))


def test_a_preset_may_name_a_feature_cache_and_a_resume_may_move_it(tmp_path):
    preset = tmp_path / "preset.yaml"
    preset.write_text("head_type: resblock\ntrain:\n  feature_cache: outputs/features\n")
    assert load_preset(preset)["train"]["feature_cache"] == "outputs/features"
    model = transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["resblock"])
    sequences = greedy_sequences(model, count=8)
    train(model, sequences, tmp_path / "run", feature_cache=str(tmp_path / "a"))
    model = transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["resblock"])
    # the folder is no part of the recipe: a resume with the features elsewhere is the same run
    train(model, sequences, tmp_path / "run", feature_cache=str(tmp_path / "b"), resume=True)


@pytest.mark.real_model
@pytest.mark.parametrize("layout", ["query_extension", "chained"])
def test_the_default_model_reads_back_the_features_it_stored_bit_for_bit(layout, default_base, tmp_path):
    base, tokenizer = default_base
    settings = {"query_extension": {"num_heads": 4, "head_type": "query_extension", "head_input": "feature_and_token"},
                "chained": {"num_heads": 5, "head_type": "chained", "head_feature_layers": [2, 15, 27]}}[layout]
    model = transformers_mtp.convert(base, **settings)
    sequences = [{"input_ids": chat_input_ids(tokenizer, text)[0].tolist(), "prompt_length": 8}
                 for text in ("Explain in three sentences why the sky is blue.", "Write a haiku about rivers.")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads may split a GEMM differently from one call to the next (test_default_model)
    try:
        stored = feature_store.FeatureStore(tmp_path, model).features(sequences, progress=False)
        expected = cache_trunk_features(model, sequences, progress=False)
    finally:
        torch.set_num_threads(threads)
    for got, want in zip(stored, expected):
        assert sorted(got) == sorted(want)
        for name in want:
            assert torch.equal(got[name], want[name]), name


def stored_and_direct(model, sequences, store):
    """What `store` returns for `sequences`, and what the trunk computes for them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads may split a GEMM differently from one call to the next (test_default_model)
    try:
        return store.features(sequences, progress=False), cache_trunk_features(model, sequences, progress=False)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("source_taps", [[0], [1], [0, 1]])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_another_layouts_store_of_the_same_trunk_gives_query_extension_features_without_the_trunk(
        arch, source_taps, tmp_path, monkeypatch):
    chained = transformers_mtp.convert(tiny_base(arch), **LAYOUTS["chained"], head_feature_layers=source_taps)
    sequences = greedy_sequences(chained, count=9)
    monkeypatch.setattr(feature_store, "SHARD_SEQUENCES", 4)
    feature_store.FeatureStore(tmp_path, chained).features(sequences[:6], progress=False)
    model = transformers_mtp.convert(tiny_base(arch), **LAYOUTS["query_extension"])
    computed = count_trunk_passes(monkeypatch)
    store = feature_store.FeatureStore(tmp_path, model)
    stored, expected = stored_and_direct(model, sequences, store)
    assert computed == sequences[6:]  # the 6 the chained store holds were derived from its taps, not the trunk
    for got, want in zip(stored, expected):
        assert sorted(got) == sorted(want) == ["keys", "layer_input", "next_ids", "normed", "teacher", "values"]
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=name)


def test_heads_of_the_normed_state_copy_their_features_from_any_store_of_the_same_trunk(tmp_path, monkeypatch):
    chained = transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["chained"])
    sequences = greedy_sequences(chained, count=5)
    feature_store.FeatureStore(tmp_path, chained).features(sequences, progress=False)
    model = transformers_mtp.convert(tiny_base("llama"), **LAYOUTS["resblock"])
    computed = count_trunk_passes(monkeypatch)
    stored, expected = stored_and_direct(model, sequences, feature_store.FeatureStore(tmp_path, model))
    assert computed == []
    for got, want in zip(stored, expected):
        assert sorted(got) == sorted(want)
        for name in want:
            assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("case", ["deeper taps", "other trunk", "gpt2"])
def test_a_store_that_cannot_give_the_features_is_not_read_and_the_trunk_computes_them(case, tmp_path, monkeypatch):
    arch = "gpt2" if case == "gpt2" else "llama"
    source = {"deeper taps": transformers_mtp.convert(tiny_base(arch), **LAYOUTS["query_extension"]),
              "other trunk": transformers_mtp.convert(tiny_base(arch, seed=1), **LAYOUTS["query_extension"]),
              "gpt2": transformers_mtp.convert(tiny_base(arch), **LAYOUTS["resblock"])}[case]
    # a chained drafter reads layer 0, below the query-extension store's tap; GPT-2 cannot run layers on their own
    model = (transformers_mtp.convert(tiny_base(arch), **LAYOUTS["chained"], head_feature_layers=[0])
             if case == "deeper taps" else transformers_mtp.convert(tiny_base(arch), **LAYOUTS["query_extension"]))
    sequences = greedy_sequences(model, count=4)
    feature_store.FeatureStore(tmp_path, source).features(sequences, progress=False)
    computed = count_trunk_passes(monkeypatch)
    stored, expected = stored_and_direct(model, sequences, feature_store.FeatureStore(tmp_path, model))
    assert computed == sequences
    for got, want in zip(stored, expected):
        for name in want:
            assert torch.equal(got[name], want[name]), name


@pytest.mark.real_model
def test_the_default_models_query_extension_features_derive_from_the_chained_drafters_store(default_base, tmp_path,
                                                                                            monkeypatch):
    base, tokenizer = default_base
    chained = transformers_mtp.convert(base, num_heads=5, head_type="chained", head_feature_layers=[2, 15, 27])
    sequences = [{"input_ids": chat_input_ids(tokenizer, text)[0].tolist(), "prompt_length": 8}
                 for text in ("Explain in three sentences why the sky is blue.", "Write a haiku about rivers.")]
    model = transformers_mtp.convert(base, num_heads=4, head_type="query_extension", head_input="feature_and_token")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as above: one thread, so that both ways run the same GEMM splits
    try:
        feature_store.FeatureStore(tmp_path, chained).features(sequences, progress=False)
        computed = count_trunk_passes(monkeypatch)
        stored, expected = stored_and_direct(model, sequences, feature_store.FeatureStore(tmp_path, model))
    finally:
        torch.set_num_threads(threads)
    assert computed == []  # layers 27 and 28 ran on the stored tap; the trunk did not run
    for got, want in zip(stored, expected):
        assert sorted(got) == sorted(want)
        for name in want:  # the same products on the same inputs: bit for bit
            assert torch.equal(got[name], want[name]), name
