"""A saved multi-token model loads with trust_remote_code=True in a process that cannot import transformers_mtp."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ARCHS, VOCAB, tiny_mtp

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


@pytest.mark.parametrize("arch", ARCHS)
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
