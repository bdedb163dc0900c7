"""The typed contract interface catches a plug-in's wrong method signature: mypy over the worked example of
docs/contract-api.md (tests/fixtures/csr_contract/csr_contract.py) passes, and over copies of it with one method's
signature wrong reports an error naming that method. CI installs mypy (the test extra); without it this skips."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]
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


def test_the_worked_example_passes(tree, tmp_path):
    plugin = tmp_path / "csr_contract.py"
    plugin.write_text(EXAMPLE.read_text())
    done = mypy(tree, plugin)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("mistake", sorted(WRONG))
def test_a_wrong_signature_is_an_error_naming_the_method(tree, tmp_path, mistake):
    right, wrong, method = WRONG[mistake]
    text = EXAMPLE.read_text()
    assert text.count(right) == 1
    text = text.replace(right, wrong).replace("from typing import Tuple", "from typing import List, Tuple")
    text = text.replace("from kvfence.contract import ", "from kvfence.contract import Launch, ")
    plugin = tmp_path / "wrong_contract.py"
    plugin.write_text(text)
    done = mypy(tree, plugin)
    assert done.returncode == 1, done.stdout + done.stderr
    overrides = [line for line in done.stdout.splitlines() if line.endswith("[override]")]
    assert len(overrides) == 1 and f'"{method}"' in overrides[0] and 'supertype "' in overrides[0], done.stdout
