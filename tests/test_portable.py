"""A saved multi-token model loads with trust_remote_code=True in a process that cannot import transformers_mtp."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ALL_ARCHS, VOCAB, tiny_mtp

LOAD_WITHOUT_PLUGIN = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class BlockPlugin(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "transformers_mtp":
                raise ImportError("transformers_mtp is blocked in this process")

    sys.meta_path.insert(0, BlockPlugin())
    import torch
    from transformers import AutoModelForCausalLM

    folder = sys.argv[1]
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    inputs = torch.load(folder + "/expected.pt")
    out = model(inputs["ids"], output_head_logits=True)
    greedy = model.generate(inputs["prompt"], max_new_tokens=24, do_sample=False)
    mtp = model.generate(inputs["prompt"], max_new_tokens=24, do_sample=False, multi_token_mode=True)
    tree = model.generate(inputs["prompt"], max_new_tokens=24, do_sample=False, multi_token_mode=True,
                          draft_tree_size=6)
    assert not any(name.startswith("transformers_mtp") for name in sys.modules)
    print(json.dumps({
        "class_module": type(model).__module__,
        "logits_equal": bool(torch.equal(out.logits, inputs["logits"])),
        "head_logits_equal": bool(torch.equal(out.head_logits, inputs["head_logits"])),
        "greedy_equal": bool(torch.equal(greedy, inputs["greedy"])),
        "mtp_equal_greedy": bool(torch.equal(mtp, greedy)),
        "tree_equal_greedy": bool(torch.equal(tree, greedy)),
    }))
    """
)


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_loads_with_trust_remote_code_without_the_plugin(arch, tmp_path):
    model = tiny_mtp(arch, "query_extension", head_input="feature_and_token")
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)
    ids = torch.randint(0, VOCAB, (1, 9))
    prompt = torch.randint(3, VOCAB, (1, 5))
    out = model(ids, output_head_logits=True)
    greedy = model.generate(prompt, max_new_tokens=24, do_sample=False)
    torch.save({"ids": ids, "prompt": prompt, "logits": out.logits, "head_logits": out.head_logits,
                "greedy": greedy}, folder / "expected.pt")
    script = tmp_path / "load.py"
    script.write_text(LOAD_WITHOUT_PLUGIN)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HOME"] = str(tmp_path / "hf_home")  # fresh modules cache, as on another machine
    run = subprocess.run([sys.executable, str(script), str(folder)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["class_module"].startswith("transformers_modules.")
    assert result == {**result, "logits_equal": True, "head_logits_equal": True, "greedy_equal": True,
                      "mtp_equal_greedy": True, "tree_equal_greedy": True}


def _remote_code_modules():
    """The package's modules that `save_pretrained` copies next to the weights: the config's and the model's files
    and every module they reach through same-folder relative imports."""
    import ast
    from pathlib import Path

    import transformers_mtp

    folder = Path(transformers_mtp.__file__).parent
    imports, pending, seen = {}, ["configuration_multi_token", "modeling_multi_token"], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        tree = ast.parse((folder / f"{name}.py").read_text())
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(0, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                found.append((node.level, node.module or ""))
        imports[name] = found
        pending += [module for level, module in found if level == 1 and module]
    return folder, imports


def test_remote_code_files_import_only_torch_transformers_and_each_other(tmp_path):
    """transformers copies and resolves same-folder relative imports only, so the copied files may import the
    standard library, torch, transformers (with huggingface_hub, which it needs) and each other, nothing else."""
    folder, imports = _remote_code_modules()
    allowed_roots = {"torch", "transformers", "huggingface_hub"} | set(sys.stdlib_module_names)
    for name, found in imports.items():
        for level, module in found:
            if level == 0:
                assert module.split(".")[0] in allowed_roots, f"{name}.py imports {module}"
            else:
                assert level == 1 and module and (folder / f"{module}.py").is_file(), \
                    f"{name}.py has `from {'.' * level}{module} import ...`: only `from .module import Name` is copied"
    tiny_mtp("llama").save_pretrained(tmp_path)
    assert {f"{name}.py" for name in imports} <= {p.name for p in tmp_path.iterdir()}
