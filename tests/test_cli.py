import pytest
import torch
import yaml
from conftest import VOCAB, tiny_base
from huggingface_hub import ModelCard
from transformers import AutoConfig, AutoModelForCausalLM

from transformers_mtp.cli import build_parser, main
from transformers_mtp.presets import PRESET_DIR, load_preset


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen3"])
def test_convert_command_writes_a_loadable_checkpoint_with_card(arch, tmp_path):
    base = tiny_base(arch)
    base.save_pretrained(tmp_path / "base")
    out = tmp_path / "converted"
    assert main(["convert", "--base", str(tmp_path / "base"), "--output-dir", str(out), "--num-heads", "3",
                 "--head-type", "linear", "--num-predict-heads", "2", "--license", "mit"]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.randint(0, VOCAB, (1, 6))
    assert torch.equal(model(ids).logits, base(ids).logits)
    assert model.config.num_heads == 3 and model.generation_config.num_predict_heads == 2
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert {"custom_code", "multi-token-prediction"} <= set(card.data.tags) and card.data.license == "mit"
    assert card.data.base_model and "multi_token_mode=True" in card.text and "trust_remote_code=True" in card.text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".converted")]  # no staging folder left
    # a bare weights folder brings no tokenizer, and none is made up (transformers builds an empty one for Qwen)
    assert not [p.name for p in out.iterdir() if p.name.startswith(("tokenizer", "vocab"))]


def test_head_type_override_drops_a_query_extension_preset_head_input(tmp_path, capsys):
    # a preset written for query_extension heads (head_input: feature_and_token) with --head-type resblock: the
    # heads read the final hidden state alone, so the preset's head_input is dropped and said, not an error
    tiny_base("llama").save_pretrained(tmp_path / "base")
    preset = tmp_path / "preset.yaml"
    preset.write_text("num_heads: 3\nhead_type: query_extension\nhead_input: feature_and_token\n")
    out = tmp_path / "converted"
    assert main(["convert", "--preset", str(preset), "--base", str(tmp_path / "base"), "--output-dir", str(out),
                 "--head-type", "resblock"]) == 0
    assert "ignoring the preset's head_input='feature_and_token'" in capsys.readouterr().out
    config = AutoConfig.from_pretrained(out)
    assert (config.head_type, config.head_input) == ("resblock", "feature")


def test_convert_command_keeps_the_base_folders_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tiny_base("qwen2").save_pretrained(tmp_path / "base")
    vocab = {f"t{i}": i for i in range(VOCAB)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))).save_pretrained(
        tmp_path / "base")
    assert main(["convert", "--base", str(tmp_path / "base"), "--output-dir", str(tmp_path / "out")]) == 0
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "out").vocab_size == VOCAB  # the base folder's own vocabulary


def test_convert_refuses_to_overwrite_without_flag(tmp_path, capsys):
    tiny_base("gpt2").save_pretrained(tmp_path / "base")
    out = tmp_path / "converted"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    args = ["convert", "--base", str(tmp_path / "base"), "--output-dir", str(out)]
    assert main(args) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert (out / "precious.txt").read_text() == "keep me"
    assert main(args + ["--overwrite"]) == 0
    assert not (out / "precious.txt").exists() and (out / "config.json").exists()


def test_errors_are_one_line_with_a_hint(tmp_path, capsys):
    assert main(["convert", "--base", str(tmp_path / "missing"), "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "TRANSFORMERS_MTP_DEBUG=1" in err and "neither a checkpoint folder" in err


def test_presets_are_valid_and_unknown_keys_rejected(tmp_path):
    names = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    assert names == [
        "gpt2", "llama", "smollm2-135m", "smollm2-135m-chained", "smollm2-135m-chained-gpu-real", "smollm2-135m-chained-real",
        "smollm2-135m-gpu",
        "smollm2-135m-gpu-real", "smollm2-135m-gpu-tuned-real", "smollm2-135m-medusa", "smollm2-135m-real",
        "smollm2-135m-tuned-real",
    ]
    for name in names:
        preset = load_preset(name)
        assert 2 <= preset["num_heads"] <= 16 and preset["num_predict_heads"] <= preset["num_heads"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"num_heads": 4, "num_hedas": 3}))
    with pytest.raises(ValueError, match="unknown keys \\['num_hedas'\\]"):
        load_preset(bad)
    with pytest.raises(FileNotFoundError, match="No preset 'nope'"):
        load_preset("nope")


def test_every_command_has_an_example_in_help():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "demo" in a.choices).choices
    for name, sub in subparsers.items():
        assert "example" in sub.format_help(), name


def test_train_refuses_several_processes_before_any_work(tmp_path, capsys, monkeypatch):
    """Under torchrun the train command stops at once, before loading the model or generating any data."""
    import transformers_mtp

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(transformers_mtp, "load_default_base", never)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--preset", "smollm2-135m", "--output-dir", str(tmp_path / "run")]) == 2
    assert "runs in one process, but this is one of 2" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_train_time_limit_becomes_the_training_deadline_and_is_checked(tmp_path, capsys, monkeypatch):
    """--time-limit S: training steps stop S seconds after the command started (the config's deadline); a limit that
    is not a positive number of seconds is refused before any work."""
    import time

    import transformers_mtp
    from transformers_mtp.training import sequences as sequences_module

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(transformers_mtp, "load_default_base", never)
    for bad in ("0", "-5"):
        assert main(["train", "--output-dir", str(tmp_path / "run"), "--time-limit", bad]) == 2
        assert f"--time-limit {float(bad)} is not a positive number of seconds" in capsys.readouterr().err
    monkeypatch.setattr(transformers_mtp, "load_default_base", lambda: (tiny_base("llama"), None))
    monkeypatch.setattr(sequences_module, "self_distill", lambda model, tokenizer, prompts, **kwargs: [
        {"input_ids": [3, 4, 5, 6, 7], "prompt_length": 2} for _ in prompts])
    seen = {}

    def fake_train(model, sequences, config, **kwargs):
        seen["deadline"] = config.deadline
        return None, {}

    monkeypatch.setattr("transformers_mtp.training.train_heads", fake_train)
    preset = tmp_path / "p.yaml"
    preset.write_text(yaml.safe_dump({"base": "default", "num_heads": 2, "train": {"data": "builtin",
                                                                                    "num_prompts": 3}}))
    before = time.time()
    assert main(["train", "--preset", str(preset), "--output-dir", str(tmp_path / "run"), "--time-limit", "90"]) == 0
    assert before + 90 <= seen["deadline"] <= time.time() + 90
    assert main(["train", "--preset", str(preset), "--output-dir", str(tmp_path / "run2")]) == 0
    assert seen["deadline"] is None


def test_dtype_choices_are_checked_and_reported(capsys):
    import torch

    from transformers_mtp.cli import build_parser, resolve_dtype_argument

    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--dtype", "bf16"])
    assert "invalid choice: 'bf16'" in capsys.readouterr().err
    assert build_parser().parse_args(["bench", "--dtype", "float32", "bfloat16"]).dtype == ["float32", "bfloat16"]
    assert build_parser().parse_args(["demo"]).dtype == "auto"
    dtype, _ = resolve_dtype_argument("float32")
    assert dtype == torch.float32
    assert "dtype: float32 (as asked). Guarantee: float32: token for token" in capsys.readouterr().out


def test_train_answers_only_writes_the_answer_cache_and_trains_nothing(tmp_path, capsys, monkeypatch):
    """--answers-only: the preset's answers go to its data_cache (here written by a faked generate()) and no
    training starts; a preset without a data_cache is refused before any work, as is train without --output-dir."""
    import transformers_mtp
    from transformers_mtp.training import sequences as sequences_module

    monkeypatch.setattr(transformers_mtp, "load_default_base", lambda: (tiny_base("llama"), None))
    monkeypatch.setattr(sequences_module, "self_distill", lambda model, tokenizer, prompts, **kwargs: [
        {"input_ids": [3, 4, 5, 6, 7], "prompt_length": 2} for _ in prompts])
    monkeypatch.setattr("transformers_mtp.training.train_heads", lambda *a, **k: pytest.fail("training started"))
    cache = tmp_path / "answers.jsonl"
    preset = tmp_path / "p.yaml"
    preset.write_text(yaml.safe_dump({"base": "default", "num_heads": 2, "train": {
        "data": "builtin", "num_prompts": 5, "data_cache": str(cache)}}))
    assert main(["train", "--preset", str(preset), "--answers-only"]) == 0
    assert "5 answers (15 answer tokens) in" in capsys.readouterr().out
    assert len(cache.read_text().splitlines()) == 5
    preset.write_text(yaml.safe_dump({"base": "default", "num_heads": 2, "train": {"num_prompts": 5}}))
    assert main(["train", "--preset", str(preset), "--answers-only"]) == 2
    assert "sets none; add `data_cache: outputs/answers.jsonl`" in capsys.readouterr().err
    assert main(["train", "--preset", str(preset)]) == 2
    assert "train needs --output-dir" in capsys.readouterr().err
