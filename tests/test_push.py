"""`transformers-mtp push`, offline and end to end: the real huggingface_hub client uploads to a local stand-in for the
Hub (tests/local_hub.py), and a fresh process that cannot import transformers_mtp loads the model back from it."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import tiny_base, tiny_mtp
from huggingface_hub import ModelCard, constants
from local_hub import LocalHub
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from transformers_mtp.cli import main
from transformers_mtp.hub import build_model_card
from transformers_mtp.model_card import NOT_MEASURED, format_measurements, read_bench_json, render_model_card

REPO_ROOT = Path(__file__).resolve().parent.parent
SHIPPED_BENCH = REPO_ROOT / "benchmarks" / "results" / "smollm2-shipped" / "bench.json"


def shipped_default_row():
    """The committed benchmark's row for the default verified settings (k = 3, lookup 3, no threshold), and its
    speedup as the card prints it."""
    bench = json.loads(SHIPPED_BENCH.read_text())
    row = next(r for r in bench["summary"] if (r["mode"], r["kind"], r.get("threshold", 0.0), r.get("lookup", 0))
               == ("verified", "all", 0.0, 3))
    s = row["speedup"]
    return row, f"{s['median']:.2f}x [{s['min']:.2f}, {s['max']:.2f}]"
TOKEN = "hf_local_test_token"
PROMPT = "w5 w17 w42 w8 w63 w11"

LOAD_FROM_HUB_WITHOUT_PLUGIN = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class BlockPlugin(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "transformers_mtp":
                raise ImportError("transformers_mtp is blocked in this process")

    sys.meta_path.insert(0, BlockPlugin())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    repo_id, expected = sys.argv[1], json.loads(sys.argv[2])
    model = AutoModelForCausalLM.from_pretrained(repo_id, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)
    ids = tokenizer(expected["text"], return_tensors="pt")["input_ids"]
    mtp = model.generate(ids, max_new_tokens=24, do_sample=False, multi_token_mode=True)
    assert not any(name.startswith("transformers_mtp") for name in sys.modules)
    print(json.dumps({"class_module": type(model).__module__, "ids": ids[0].tolist(), "mtp": mtp[0].tolist()}))
    """
)


def tiny_tokenizer():
    """A word-level tokenizer over the tiny models' 99 ids: "w5" is id 5."""
    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 99)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved tiny multi-token Llama with a tokenizer and no README.md, and its plain greedy output for PROMPT."""
    model = tiny_mtp("llama", "query_extension", head_input="feature_and_token")
    tokenizer = tiny_tokenizer()
    folder = tmp_path_factory.mktemp("push") / "tiny-mtp"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    greedy = model.generate(ids, max_new_tokens=24, do_sample=False)
    return {"folder": folder, "ids": ids[0].tolist(), "greedy": greedy[0].tolist()}


@pytest.fixture(scope="module")
def hub():
    with LocalHub() as server:
        yield server


@pytest.fixture
def hub_in_process(hub, monkeypatch):
    """Point this process's huggingface_hub at the local hub (it read HF_ENDPOINT at import, hence the patch)."""
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return hub


def hub_env(hub, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_MODULES_CACHE")}
    # set before the child imports huggingface_hub; a fresh cache and modules cache, as on another machine
    return {**env, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf_home")}


def test_push_then_load_from_the_hub_without_the_plugin(saved, hub, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(saved["folder"], folder)
    shutil.copy(SHIPPED_BENCH, folder / "bench.json")  # a real bench JSON (4 query_extension heads, like this model)
    env = hub_env(hub, tmp_path)
    push = subprocess.run([sys.executable, "-m", "transformers_mtp", "push", str(folder), "local-user/tiny-mtp"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert push.returncode == 0, push.stderr[-3000:]
    assert f"{hub.url}/local-user/tiny-mtp/commit/" in push.stdout

    (commit,) = [c for c in hub.commits if c["repo_id"] == "local-user/tiny-mtp"]
    assert commit["revision"] == "main" and not commit["create_pr"]
    local_files = {p.name for p in folder.iterdir()}
    assert "README.md" not in local_files  # the folder is left as it was
    assert set(commit["paths"]) == local_files | {"README.md"}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "modeling_multi_token.py",
            "configuration_multi_token.py", "modeling_heads.py", "generation_multi_token.py"} <= local_files
    for name in local_files:
        assert hub.file("local-user/tiny-mtp", name) == (folder / name).read_bytes(), name
    assert {r["authorization"] for r in hub.requests if r["method"] == "POST"} == {f"Bearer {TOKEN}"}

    card = ModelCard(hub.file("local-user/tiny-mtp", "README.md").decode())  # ours, not push_to_hub's default card
    assert {"custom_code", "multi-token-prediction"} <= set(card.data.tags)
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert 'from_pretrained("local-user/tiny-mtp", trust_remote_code=True)' in card.text
    measured = card.text.split("## Measured", 1)[1]
    row, spread = shipped_default_row()
    assert f"| verified multi-token, context lookup up to 3-grams | all (16) | 3 | {row['tokens_per_forward']:.2f} | " \
           f"{spread} |" in measured
    assert "cpu (x86_64, 2 threads), float32" in measured and NOT_MEASURED not in measured

    load = subprocess.run([sys.executable, "-c", LOAD_FROM_HUB_WITHOUT_PLUGIN, "local-user/tiny-mtp",
                           json.dumps({"text": PROMPT})], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert load.returncode == 0, load.stderr[-3000:]
    result = json.loads(load.stdout.strip().splitlines()[-1])
    assert result["class_module"].startswith("transformers_modules.")
    assert result["ids"] == saved["ids"]
    assert result["mtp"] == saved["greedy"]  # multi-token output over the Hub == the original model's greedy output
    assert hub.calls("HEAD", "/local-user/tiny-mtp/resolve/")


# upload_folder streams through its Xet pipeline when hf_xet is installed, else sends one create_commit: test both
@pytest.mark.parametrize("xet", [True, False], ids=["xet-pipeline", "single-commit"])
def test_private_revision_and_create_pr_reach_the_hub(xet, saved, hub_in_process, monkeypatch, capsys):
    from huggingface_hub import hf_api

    monkeypatch.setattr(hf_api, "is_xet_available", lambda: xet)
    hub, repo = hub_in_process, f"local-user/flags-{xet}"
    assert main(["push", str(saved["folder"]), repo, "--private", "--revision", "dev",
                 "--commit-message", "heads v1"]) == 0
    (create,) = [r for r in hub.calls("POST", "/api/repos/create") if r["json"]["name"] == repo.split("/")[1]]
    assert create["json"]["visibility"] == "private" and hub.repos[repo].private
    assert hub.calls("POST", f"/api/models/{repo}/branch/dev")
    (commit,) = [c for c in hub.commits if c["repo_id"] == repo]
    assert commit["revision"] == "dev" and commit["summary"] == "heads v1"
    assert hub.file(repo, "config.json", "dev") == (saved["folder"] / "config.json").read_bytes()
    assert "config.json" not in hub.repos[repo].commits[hub.repos[repo].refs["main"]]  # main untouched
    assert "(dev)" in capsys.readouterr().out

    assert main(["push", str(saved["folder"]), repo, "--create-pr"]) == 0
    if xet:  # the pipeline opens the pull request first; create_commit asks the commit endpoint to open it
        (pull,) = hub.calls("POST", f"/api/models/{repo}/discussions")
        assert pull["json"]["pullRequest"] is True
    else:
        assert hub.calls("POST", f"/api/models/{repo}/commit/main")[-1]["query"] == {"create_pr": "1"}
    assert hub.commits[-1]["revision"] == "refs/pr/1"
    assert "README.md" in hub.commits[-1]["paths"]
    assert "config.json" not in hub.repos[repo].commits[hub.repos[repo].refs["main"]]  # still only the PR has it
    assert f"Opened pull request {hub.url}/{repo}/discussions/1" in capsys.readouterr().out


def _folder(saved, tmp_path, edit=None):
    folder = tmp_path / "model"
    shutil.copytree(saved["folder"], folder)
    if edit:
        edit(folder)
    return folder


def _edit_config(**changes):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))

    return edit


def _write(name, content):
    return lambda folder: (folder / name).write_text(content)


def _bench_of(**environment):
    bench = json.loads(SHIPPED_BENCH.read_text())
    return json.dumps({**bench, "environment": {**bench["environment"], **environment}})


def _a_file(saved, tmp):
    (tmp / "file.txt").write_text("not a model")
    return tmp / "file.txt"


def _empty_folder(saved, tmp):
    (tmp / "empty").mkdir()
    return tmp / "empty"


def _plain_llama(saved, tmp):
    tiny_base("llama").save_pretrained(tmp / "plain")
    return tmp / "plain"


BAD_INPUTS = [
    ("missing folder", lambda saved, tmp: tmp / "nope", [], "does not exist", "nope"),
    ("a file, not a folder", _a_file, [], "is a file, not a model folder", "file.txt"),
    ("no config.json", _empty_folder, [], "has no config.json", "empty"),
    ("plain Llama", _plain_llama, [], "model_type='llama', not a multi-token model", "transformers-mtp convert"),
    ("no auto_map", lambda saved, tmp: _folder(saved, tmp, _edit_config(auto_map=None)), [], "has no auto_map",
     "trust_remote_code"),
    ("no weights", lambda saved, tmp: _folder(saved, tmp, lambda f: (f / "model.safetensors").unlink()), [],
     "has no weights (model.safetensors", "save_pretrained"),
    ("code file missing", lambda saved, tmp: _folder(saved, tmp, lambda f: (f / "modeling_heads.py").unlink()), [],
     "lacks modeling_heads.py", "save_pretrained"),
    ("repo id without namespace", lambda saved, tmp: _folder(saved, tmp), ["REPO=tiny-mtp"],
     "repo_id='tiny-mtp' is not a Hub model id", "namespace/name"),
    ("repo id with a space", lambda saved, tmp: _folder(saved, tmp), ["REPO=me/tiny mtp"],
     "repo_id='me/tiny mtp' is not a Hub model id", "namespace/name"),
    ("revision with create-pr", lambda saved, tmp: _folder(saved, tmp), ["--revision", "dev", "--create-pr"],
     "revision='dev' with create_pr=True", "drop the revision"),
    ("not a bench JSON", lambda saved, tmp: _folder(saved, tmp, _write("bench.json", '{"rows": []}')), [],
     "is not a transformers-mtp bench JSON", "bench.json"),
    ("bench of another model", lambda saved, tmp: _folder(saved, tmp, _write("bench.json", _bench_of(num_heads=3))),
     [], "num_heads=3 but the folder's config.json has num_heads=4", "transformers-mtp bench --model"),
    ("missing --bench-json", lambda saved, tmp: _folder(saved, tmp), ["--bench-json", "/no/such/bench.json"],
     "'/no/such/bench.json' does not exist", "transformers-mtp bench"),
    ("no token", lambda saved, tmp: _folder(saved, tmp), ["NO_TOKEN"], "no Hugging Face token found",
     "hf auth login"),
    ("revision the Hub does not know", lambda saved, tmp: _folder(saved, tmp), ["--revision", "refs/pr/9"],
     "the Hub refused the push: 404", "check REPO_ID and --revision"),
]


@pytest.mark.parametrize("case,make,extra,message,hint", BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_is_one_line_naming_it(case, make, extra, message, hint, saved, hub_in_process, tmp_path,
                                         monkeypatch, capsys):
    repo = next((e.split("=", 1)[1] for e in extra if e.startswith("REPO=")), "local-user/bad-input")
    if "NO_TOKEN" in extra:
        monkeypatch.delenv("HF_TOKEN")
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    options = [e for e in extra if not e.startswith("REPO=") and e != "NO_TOKEN"]
    folder, commits = make(saved, tmp_path), len(hub_in_process.commits)
    capsys.readouterr()  # drop what making the folder printed
    assert main(["push", str(folder), repo, *options]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err and hint in err and "TRANSFORMERS_MTP_DEBUG=1" in err
    assert len(hub_in_process.commits) == commits  # nothing was committed


def test_measurements_of_a_fresh_bench_run_fill_the_card(saved, tmp_path):
    from transformers_mtp.benchmark import run_benchmark

    model = tiny_mtp("llama", "query_extension", head_input="feature_and_token").eval()
    prompts = [{"id": f"p{i}", "kind": kind, "input_ids": torch.tensor([[5 + i, 17, 42, 8]])}
               for i, kind in enumerate(["code", "chat"])]
    result = run_benchmark(model, prompts, modes=["verified", "unverified"], max_new_tokens=6, progress=False)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**result, "environment": {"device": "cpu", "dtype": "float32", "threads": 2,
                                                          "num_heads": 4, "head_type": "query_extension"}}))
    text = format_measurements(read_bench_json(path))
    assert "| verified multi-token, context lookup up to 3-grams | all (2) | 4 |" in text  # convert()'s default
    assert "| unverified multi-token (lossy) | code (1) | 4 |" in text
    assert "on cpu (2 threads), float32" in text and "2 prompts (1 chat, 1 code), 6 new tokens at most" in text

    card = build_model_card(saved["folder"], repo_id="me/tiny", bench=read_bench_json(path))
    assert card.count("## Measured") == 1 and text in card and NOT_MEASURED not in card
    # `bench --dtype float32 bfloat16`: each row says its dtype
    both = [{**row, "dtype": dtype} for dtype in ("float32", "bfloat16") for row in result["summary"]]
    path.write_text(json.dumps({**result, "summary": both, "environment": {"device": "cpu",
                                                                          "dtype": "float32, bfloat16"}}))
    text = format_measurements(read_bench_json(path))
    assert "| bfloat16: verified multi-token, context lookup up to 3-grams | all (2) | 4 |" in text
    assert "| float32: verified multi-token, context lookup up to 3-grams | all (2) | 4 |" in text


def test_a_folder_card_is_kept_with_repo_id_and_measurements_filled_in(saved, tmp_path):
    folder = _folder(saved, tmp_path)
    model = tiny_mtp("llama", "query_extension", head_input="feature_and_token")
    render_model_card(model, base_model="me/base", license="mit", training="two epochs").save(folder / "README.md")
    plain = ModelCard(build_model_card(folder, repo_id="me/tiny"))
    assert plain.data.base_model == "me/base" and plain.data.license == "mit" and "two epochs" in plain.text
    assert 'from_pretrained("me/tiny", trust_remote_code=True)' in plain.text and "path/to/this" not in plain.text
    assert "- head type: `query_extension` (`head_input=feature_and_token`)" in plain.text
    assert NOT_MEASURED in plain.text

    (folder / "README.md").write_text("# My notes\n\nHand-written.\n")
    own = ModelCard(build_model_card(folder, repo_id="me/tiny", bench=read_bench_json(SHIPPED_BENCH)))
    assert own.text.startswith("# My notes\n\nHand-written.\n") and shipped_default_row()[1] in own.text
    assert {"custom_code", "multi-token-prediction"} <= set(own.data.tags)
