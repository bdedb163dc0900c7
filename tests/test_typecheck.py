"""The typed contract interface catches a plug-in's wrong method signature: mypy over the worked example of
docs/contract-api.md (tests/fixtures/csr_contract/csr_contract.py) passes, and over copies of it with one method's
signature wrong reports an error naming that method. CI installs mypy (the test extra); without it those skip.
Every module of the engine is in pyproject.toml's strict override, so a new one cannot slip out of it."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

needs_mypy = pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")

ROOT = Path(__file__).resolve().parents[1]
#: The flags of mypy's --strict that pyproject.toml's strict override spells out one by one.
STRICT_FLAGS = ("disallow_untyped_calls", "disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs",
                "disallow_untyped_decorators", "disallow_any_generics", "disallow_subclassing_any", "warn_return_any",
                "no_implicit_reexport", "strict_equality", "extra_checks")
EXAMPLE = ROOT / "tests" / "fixtures" / "csr_contract" / "csr_contract.py"

#: (the example's line, the same line with a wrong signature, the method it names)
WRONG = {
    "untyped-missing-parameter": ("def launch(self, kernel, buffers, launch):", "def launch(self, buffers, launch):",
                                  "launch"),
    "typed-wrong-return": ("def need(self, launch):", "def need(self, launch: Launch[CsrCase]) -> str:", "need"),
    "cases-not-a-strategy": ("def cases(self, domain):", "def cases(self, domain) -> List[CsrCase]:", "cases"),
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The import tree the packaging makes (kvfence from harness/ and its sibling folders), as .ci/typecheck.py
    builds it for CI."""
    into = tmp_path_factory.mktemp("typecheck") / "tree"
    subprocess.run([sys.executable, str(ROOT / ".ci" / "typecheck.py"), "--tree", str(into)], check=True)
    return into


def mypy(tree: Path, plugin: Path) -> subprocess.CompletedProcess:
    """mypy over one plug-in module as its author would run it (kvfence's own modules followed silently)."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--check-untyped-defs", "--follow-imports=silent",
         "--python-version", "3.11", "--no-error-summary", plugin.name],
        cwd=plugin.parent, env={**os.environ, "MYPYPATH": str(tree)}, capture_output=True, text=True, timeout=300)


@needs_mypy
def test_the_worked_example_passes(tree, tmp_path):
    plugin = tmp_path / "csr_contract.py"
    plugin.write_text(EXAMPLE.read_text())
    done = mypy(tree, plugin)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_mypy
@pytest.mark.parametrize("mistake", sorted(WRONG))
def test_a_wrong_signature_is_an_error_naming_the_method(tree, tmp_path, mistake):
    right, wrong, method = WRONG[mistake]
    text = EXAMPLE.read_text()
    assert text.count(right) == 1
    text = text.replace(right, wrong).replace("from typing import ", "from typing import List, ", 1)
    text = text.replace("from kvfence.contract import ", "from kvfence.contract import Launch, ")
    plugin = tmp_path / "wrong_contract.py"
    plugin.write_text(text)
    done = mypy(tree, plugin)
    assert done.returncode == 1, done.stdout + done.stderr
    overrides = [line for line in done.stdout.splitlines() if line.endswith("[override]")]
    assert len(overrides) == 1 and f'"{method}"' in overrides[0] and 'supertype "' in overrides[0], done.stdout


def engine_modules(engine: Path) -> set:
    """The module names of every Python file under ``engine`` (harness/engine/ is ``kvfence.engine``)."""
    names = set()
    for path in engine.rglob("*.py"):
        parts = path.relative_to(engine).with_suffix("").parts
        names.add(".".join(("kvfence", "engine") + (parts[:-1] if parts[-1] == "__init__" else parts)))
    return names


def strict_modules(pyproject: str) -> set:
    """The modules of pyproject.toml's [[tool.mypy.overrides]] that set every flag of --strict."""
    import tomllib

    strict = set()
    for override in tomllib.loads(pyproject)["tool"]["mypy"].get("overrides", []):
        if all(override.get(flag) is True for flag in STRICT_FLAGS):
            modules = override["module"]
            strict.update([modules] if isinstance(modules, str) else modules)
    return strict


def test_every_engine_module_is_strict():
    engine = engine_modules(ROOT / "harness" / "engine")
    assert {"kvfence.engine", "kvfence.engine.loop", "kvfence.engine.jobs"} <= engine  # the walk finds them
    missing = sorted(engine - strict_modules((ROOT / "pyproject.toml").read_text()))
    assert not missing, f"add to pyproject.toml's strict [[tool.mypy.overrides]]: {missing}"


def test_a_module_left_out_of_the_strict_list_is_named():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert pyproject.count(' "kvfence.engine.jobs",') == 1
    left_out = strict_modules(pyproject.replace(' "kvfence.engine.jobs",', ""))
    assert sorted(engine_modules(ROOT / "harness" / "engine") - left_out) == ["kvfence.engine.jobs"]
