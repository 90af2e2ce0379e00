"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`), for the installed transformers release.

The tests are not copied into this repository: they are taken from the release's source distribution on PyPI (the
sdist ships `tests/*.py`, the top-level files only), fetched with `pip download` for exactly the installed version,
extracted once into a cache folder and imported as the package `transformers_upstream_tests`.

    python3 tests/transformers_suite.py     # fetch now (CI runs this before pytest); prints the folder

Cache folder: `$TRANSFORMERS_TESTS_DIR` if set, else `~/.cache/transformers-mtp/transformers-tests-<version>`; it
holds `transformers_upstream_tests/` and `SUITE.json` (version, sdist file name and sha256, placeholders written).

The sdist lacks the subfolders of transformers' `tests/` (the GitHub repository has them), yet the common files import
from three of them. Where the sdist lacks such a module, a PLACEHOLDER is written, listed in `SUITE.json` and in
`PLACEHOLDERS` below:

- `exporters/test_export.py` -> `ExportTesterMixin`, base class of `ModelTesterMixin`: the placeholder has no export
  tests, only `test_upstream_export_suite_unavailable`, which skips saying so.
- `generation/test_utils.py` -> `GenerationTesterMixin`: the placeholder has no generation tests, only
  `test_upstream_generation_suite_unavailable`, which skips saying so.
- `utils/test_configuration_utils.py` -> `config_common_kwargs`, used by `ConfigTester.check_config_arguments_init`:
  the placeholder sets it to `None`, so that check raises if called (our tests skip it, naming this).
"""

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "transformers_upstream_tests"
MARKER = "SUITE.json"
INIT_TEXT = '"""transformers\' tests, extracted by transformers-mtp\'s tests/transformers_suite.py."""\n'
LAYOUT_VERSION = 1  # bump when the extracted layout or the placeholders change: older caches are rebuilt

EXPORT_UNAVAILABLE = (
    "transformers' export test suite (tests/exporters/test_export.py, ExportTesterMixin) is not shipped in the "
    "transformers {version} sdist; a placeholder without its tests stands in, so no export tests ran"
)
GENERATION_UNAVAILABLE = (
    "transformers' generation test suite (tests/generation/test_utils.py, GenerationTesterMixin) is not shipped in "
    "the transformers {version} sdist; a placeholder without its tests stands in, so no generation tests ran"
)
CONFIG_KWARGS_UNAVAILABLE = (
    "tests/utils/test_configuration_utils.py (config_common_kwargs) is not shipped in the transformers {version} "
    "sdist, so ConfigTester.check_config_arguments_init cannot run"
)

_HEADER = '''"""PLACEHOLDER written by transformers-mtp's tests/transformers_suite.py, NOT transformers' file.

transformers {version}'s sdist does not ship `tests/{path}`, which the common test files import; this stands in for it
so that they import. {what}
"""

'''

PLACEHOLDERS = {
    "exporters/test_export.py": (
        "It defines `ExportTesterMixin` with none of the real export tests.",
        '''import unittest

REASON = {reason!r}


class ExportTesterMixin:
    """Placeholder for transformers' ExportTesterMixin: no export tests, one test that skips saying so."""

    def test_upstream_export_suite_unavailable(self):
        raise unittest.SkipTest(REASON)
''',
        EXPORT_UNAVAILABLE,
    ),
    "generation/test_utils.py": (
        "It defines `GenerationTesterMixin` with none of the real generation tests.",
        '''import unittest

REASON = {reason!r}


class GenerationTesterMixin:
    """Placeholder for transformers' GenerationTesterMixin: no generation tests, one test that skips saying so."""

    UPSTREAM_PLACEHOLDER = True

    def test_upstream_generation_suite_unavailable(self):
        raise unittest.SkipTest(REASON)
''',
        GENERATION_UNAVAILABLE,
    ),
    "utils/test_configuration_utils.py": (
        "`config_common_kwargs` is None: `ConfigTester.check_config_arguments_init` raises if called.",
        '''REASON = {reason!r}

config_common_kwargs = None  # placeholder: the real dict is in transformers' GitHub repository only
''',
        CONFIG_KWARGS_UNAVAILABLE,
    ),
}


class SuiteUnavailable(RuntimeError):
    """transformers' test files could not be obtained or imported."""


def transformers_version():
    from importlib.metadata import version

    return version("transformers")


def required():
    """Whether a missing suite must fail rather than skip: in CI (`CI=true`), or TRANSFORMERS_MTP_REQUIRE_SUITE=1."""
    flags = (os.environ.get("CI", ""), os.environ.get("TRANSFORMERS_MTP_REQUIRE_SUITE", ""))
    return any(flag.strip().lower() in ("1", "true", "yes", "on") for flag in flags)


def suite_dir(version=None):
    if os.environ.get("TRANSFORMERS_TESTS_DIR"):
        return Path(os.environ["TRANSFORMERS_TESTS_DIR"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "transformers-mtp" / f"transformers-tests-{version or transformers_version()}"


def _is_complete(directory, version):
    try:
        marker = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        marker.get("transformers_version") == version
        and marker.get("layout") == LAYOUT_VERSION
        and (directory / PACKAGE / "test_modeling_common.py").is_file()
    )


def _download_sdist(version, into):
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
               "--disable-pip-version-check", f"transformers=={version}", "-d", str(into)]
    result = subprocess.run(command, capture_output=True, text=True)
    archives = sorted(Path(into).glob(f"transformers-{version}.tar.gz"))
    if result.returncode != 0 or not archives:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise SuiteUnavailable(
            f"could not download the transformers {version} sdist from PyPI for its test files "
            f"({' '.join(command[2:])} exited {result.returncode}: {' | '.join(tail)}). Run "
            "`python3 tests/transformers_suite.py` with network access, or set TRANSFORMERS_TESTS_DIR to a folder "
            "prepared that way."
        )
    return archives[0]


def _extract_tests(archive, package_dir):
    """Write the `tests/` files of the sdist under package_dir (regular files only, no path escapes)."""
    written = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) < 3 or parts[1] != "tests" or not member.isfile() or ".." in parts:
                continue
            target = package_dir.joinpath(*parts[2:])
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
            written.append("/".join(parts[2:]))
    if "test_modeling_common.py" not in written:
        raise SuiteUnavailable(f"{archive.name} has no tests/test_modeling_common.py")
    return written


def _write_placeholders(package_dir, version):
    written = []
    for path, (what, body, reason) in PLACEHOLDERS.items():
        target = package_dir / path
        if target.exists():  # a later sdist may ship the real file: keep it
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        header = _HEADER.format(version=version, path=path, what=what)
        target.write_text(header + body.format(reason=reason.format(version=version)), encoding="utf-8")
        written.append(path)
    # every folder becomes a package (the sdist has no __init__.py files), so the relative imports resolve
    for folder in [package_dir, *(p for p in package_dir.rglob("*") if p.is_dir())]:
        init = folder / "__init__.py"
        if not init.exists():
            # kept empty of code: test_configuration_common executes tests/__init__.py (direct_transformers_import)
            init.write_text(INIT_TEXT, encoding="utf-8")
    return written


def ensure_suite(version=None):
    """Folder holding the importable `transformers_upstream_tests` package; fetches and extracts it when missing."""
    version = version or transformers_version()
    directory = suite_dir(version)
    if _is_complete(directory, version):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory.parent, prefix=f".{directory.name}-") as tmp:
        tmp = Path(tmp)
        archive = _download_sdist(version, tmp / "download")
        build = tmp / "suite"
        package_dir = build / PACKAGE
        files = _extract_tests(archive, package_dir)
        placeholders = _write_placeholders(package_dir, version)
        (build / MARKER).write_text(json.dumps({
            "transformers_version": version,
            "layout": LAYOUT_VERSION,
            "sdist": archive.name,
            "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
            "files": sorted(files),
            "placeholders": placeholders,
        }, indent=2) + "\n", encoding="utf-8")
        if directory.exists():  # stale (other version / layout) or half-written: replace it
            shutil.rmtree(directory)
        try:
            build.rename(directory)
        except OSError:  # another process finished first
            if not _is_complete(directory, version):
                raise
    return directory


def placeholders_used(directory):
    return json.loads((Path(directory) / MARKER).read_text(encoding="utf-8")).get("placeholders", [])


def import_suite(version=None):
    """Fetch if needed and import the suite; returns (test_modeling_common, test_configuration_common, folder).
    Raises SuiteUnavailable when it cannot be fetched or imported."""
    directory = ensure_suite(version)
    if str(directory) not in sys.path:
        sys.path.append(str(directory))
    try:
        modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
        configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    except ImportError as error:  # e.g. `parameterized` missing: pip install -e ".[test]"
        raise SuiteUnavailable(
            f"transformers' test files in {directory} do not import: {error!r} (install the test extra: "
            'pip install -e ".[test]")'
        ) from error
    return modeling, configuration, directory


def main():
    try:
        print(ensure_suite())
    except SuiteUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
