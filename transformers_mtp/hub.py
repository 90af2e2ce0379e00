# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""Share a saved multi-token model on the Hugging Face Hub, with our model card.

`push_to_hub` uploads a `save_pretrained` folder as it is (weights, config.json with auto_map, the copied modeling
code, generation_config.json, tokenizer files) with `HfApi.upload_folder`, not with transformers' `push_to_hub`,
which would upload its own default card over ours. The card pushed is the folder's README.md, or one rendered from
the folder's config when there is none; either way it carries the `custom_code` and `multi-token-prediction` tags and,
when a bench JSON is at hand, the measured numbers.
"""

import importlib
import json
import logging
import re
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

from huggingface_hub import HfApi, ModelCard, get_token

from .model_card import (
    CARD_TAGS,
    NOT_MEASURED,
    PLACEHOLDER_REPO_ID,
    format_measurements,
    read_bench_json,
    render_model_card,
    set_measured_section,
)

logger = logging.getLogger(__name__)

MULTI_TOKEN_MODEL_TYPES = ("multi_token_llama", "multi_token_gpt2")
BENCH_FILE = "bench.json"  # a bench JSON in the model folder fills the card's "Measured" section
# the Hub's rule for both halves of "namespace/name": letters, digits, "-", "_", "."; no "--" or ".."; at most 96
_REPO_PART = r"(?!.*(--|\.\.))[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"{_REPO_PART}/{_REPO_PART}", flags=re.ASCII)
_RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\w+)\s+import", flags=re.MULTILINE)  # as transformers' dynamic loader
NOT_RECORDED = "not recorded in the pushed folder"
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def check_repo_id(repo_id):
    """Raise a ValueError naming `repo_id` unless it is a valid "namespace/name" Hub model id."""
    if not isinstance(repo_id, str) or not _REPO_ID.fullmatch(repo_id):
        raise ValueError(
            f"repo_id={repo_id!r} is not a Hub model id; use 'namespace/name' (your user or organisation, a slash, "
            "then letters, digits, '-', '_' or '.'), e.g. 'your-username/smollm2-mtp'."
        )


def _auto_map_modules(auto_map):
    """Module files named by auto_map values such as "modeling_multi_token.LlamaForMultiTokenPrediction"."""
    values = [v for value in auto_map.values() for v in (value if isinstance(value, (list, tuple)) else [value])]
    # "other/repo--module.Class" loads the code from another repo: nothing to find here
    return sorted({f"{v.rsplit('.', 1)[0]}.py" for v in values if isinstance(v, str) and "--" not in v and "." in v})


def check_model_folder(model_dir):
    """
    The parsed config.json of `model_dir` once it is known to be a saved multi-token model that loads with
    `trust_remote_code=True` on a machine without transformers-mtp: a multi-token model_type, an auto_map, and every
    code file that auto_map names, plus the files those import with `from .module import ...`.
    """
    folder = Path(model_dir)
    if not folder.exists():
        raise FileNotFoundError(f"model folder {str(folder)!r} does not exist; pass the folder written by "
                                "`transformers-mtp convert --output-dir` or `model.save_pretrained`.")
    if not folder.is_dir():
        raise NotADirectoryError(f"{str(folder)!r} is a file, not a model folder; pass the folder written by "
                                 "`transformers-mtp convert --output-dir` or `model.save_pretrained`.")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{str(folder)!r} has no config.json, so it is not a saved model; pass the folder written by "
                         "`transformers-mtp convert --output-dir` or `model.save_pretrained`.")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{str(config_file)!r} is not valid JSON ({error}); re-save the model.") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in MULTI_TOKEN_MODEL_TYPES:
        raise ValueError(
            f"{str(config_file)!r} has model_type={model_type!r}, not a multi-token model "
            f"({' or '.join(MULTI_TOKEN_MODEL_TYPES)}); add heads first with `transformers-mtp convert --base "
            f"{folder} --output-dir {folder.name}-mtp`."
        )
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict) or "AutoModelForCausalLM" not in auto_map:
        raise ValueError(
            f"{str(config_file)!r} has no auto_map for AutoModelForCausalLM, so the model would not load with "
            "trust_remote_code=True without transformers-mtp; re-save it with `model.save_pretrained` after "
            "`import transformers_mtp`."
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"{str(folder)!r} has no weights ({WEIGHT_FILES[0]} or {WEIGHT_FILES[1]}); save the model "
                         "into it with `model.save_pretrained`.")
    pending, seen = _auto_map_modules(auto_map), set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if not (folder / name).is_file():
            raise ValueError(
                f"{str(folder)!r} lacks {name}, the modeling code that config.json's auto_map (and the files it "
                "imports) needs for trust_remote_code=True; re-save the model with `model.save_pretrained` after "
                "`import transformers_mtp`, which copies the code next to the weights."
            )
        pending += [f"{module}.py" for module in _RELATIVE_IMPORT.findall((folder / name).read_text(encoding="utf-8"))]
    return config


def _check_bench_matches(bench, config, source):
    """Refuse numbers measured on another model: the bench JSON's recorded head settings must be the folder's."""
    environment = bench.get("environment") or {}
    for key in ("num_heads", "head_type"):
        if key in environment and key in config and environment[key] != config[key]:
            raise ValueError(
                f"{source} measured a model with {key}={environment[key]!r} but the folder's config.json has "
                f"{key}={config[key]!r}; run `transformers-mtp bench --model MODEL_DIR` on this model and pass its "
                "bench.json."
            )


def _rendered_card(folder, *, repo_id, measurements):
    """Our card for a folder without README.md, from its config and generation config (no weights are loaded)."""
    from transformers import AutoConfig, GenerationConfig  # the package's import registered our configs

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    try:
        generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    except OSError:  # no generation_config.json: the card falls back to num_heads
        generation_config = None
    model = SimpleNamespace(config=config, generation_config=generation_config)
    return render_model_card(model, base_model=None, repo_id=repo_id, training=NOT_RECORDED,
                             measurements=measurements or NOT_MEASURED)


def build_model_card(model_dir, *, repo_id, bench=None) -> str:
    """
    The README.md to push for `model_dir`: its own README.md, with the repo id filled into the usage snippet and our
    tags added if missing; or, without one, a card rendered from the folder's config. `bench` (a bench JSON dict)
    replaces the card's "Measured" section.
    """
    folder = Path(model_dir)
    measurements = format_measurements(bench) if bench else None
    readme = folder / "README.md"
    if not readme.is_file():
        return str(_rendered_card(folder, repo_id=repo_id, measurements=measurements))
    card = ModelCard(readme.read_text(encoding="utf-8"))
    missing = [tag for tag in CARD_TAGS if tag not in (card.data.tags or [])]
    if missing:  # a README.md from elsewhere still gets the tags that mark a trust_remote_code multi-token model
        card.data.tags = list(card.data.tags or []) + missing
    text = card.text.replace(PLACEHOLDER_REPO_ID, repo_id)
    card.text = set_measured_section(text, measurements) if measurements else text
    return str(card)


def _stage(folder, staging, card):
    """`staging` mirrors `folder` through symlinks (copies where links are not allowed), with README.md = `card`."""
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or relative.as_posix() == "README.md" or {".git", ".cache"} & set(relative.parts):
            continue
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            target.symlink_to(path.resolve())
        except OSError:
            shutil.copy2(path, target)
    (staging / "README.md").write_text(card, encoding="utf-8")


def _connection_errors():
    """The transport errors of huggingface_hub's HTTP client (httpx2 in huggingface_hub 2.x)."""
    errors = []
    for name in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def push_to_hub(model_dir, repo_id, *, private=False, revision=None, create_pr=False, token=None, commit_message=None,
                bench_json=None):
    """
    Upload everything in the saved multi-token model folder `model_dir` to the Hub model repo `repo_id` with
    `HfApi.upload_folder`, creating the repo if needed; the pushed README.md is our card (see `build_model_card`).
    The folder itself is not modified.

    Args:
        model_dir (`str` or `Path`): a folder written by `transformers-mtp convert` or `model.save_pretrained`.
        repo_id (`str`): "namespace/name".
        private (`bool`, *optional*, defaults to `False`): create the repo private; otherwise it gets the
            namespace's default visibility. An existing repo keeps its visibility.
        revision (`str`, *optional*): branch to push to, created from the default branch if missing; default: main.
        create_pr (`bool`, *optional*, defaults to `False`): open a pull request against the default branch instead of
            committing to it.
        token (`str`, *optional*): Hub token; default: `HF_TOKEN`, else the token stored by `hf auth login`.
        commit_message (`str`, *optional*): defaults to "Upload multi-token model with transformers-mtp".
        bench_json (`str` or `Path`, *optional*): a bench.json from `transformers-mtp bench` for the card's "Measured"
            section; default: `model_dir/bench.json` when present.

    Returns:
        huggingface_hub's `CommitInfo`: `.commit_url`, `.repo_url`, and `.pr_url` with `create_pr=True`.
    """
    folder = Path(model_dir)
    config = check_model_folder(folder)
    check_repo_id(repo_id)
    if create_pr and revision not in (None, "main"):
        raise ValueError(f"revision={revision!r} with create_pr=True: pull requests are opened against the default "
                         "branch; drop the revision (--revision) or push to the branch without create_pr.")
    if bench_json is None and (folder / BENCH_FILE).is_file():
        bench_json = folder / BENCH_FILE
    bench = read_bench_json(bench_json) if bench_json is not None else None
    if bench is not None:
        _check_bench_matches(bench, config, str(bench_json))
    if token is None and get_token() is None:
        raise ValueError("no Hugging Face token found; set HF_TOKEN, run `hf auth login`, or pass token=... "
                         "(a token with write access).")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        logger.warning("%s has no tokenizer files; users of %s will need the base model's tokenizer (save it into the "
                       "folder with `tokenizer.save_pretrained` to ship it).", folder, repo_id)
    card = build_model_card(folder, repo_id=repo_id, bench=bench)

    api = HfApi(token=token)
    try:
        repo_url = api.create_repo(repo_id, private=private or None, exist_ok=True)  # None: the namespace's default
        if revision is not None and revision != "main" and not revision.startswith("refs/pr/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="transformers-mtp-push-") as staging:
            _stage(folder, Path(staging), card)
            commit = api.upload_folder(
                repo_id=repo_id, folder_path=staging, revision=revision, create_pr=create_pr,
                commit_message=commit_message or "Upload multi-token model with transformers-mtp",
            )
    except _connection_errors() as error:
        raise ConnectionError(f"could not reach the Hub at {api.endpoint} ({error}); check the network, or "
                              "HF_ENDPOINT if you use a mirror.") from error
    logger.info("Pushed %s to %s: %s", folder, repo_url, commit.commit_url)
    return commit

