"""The README's quickstart is what a newcomer types first, so it is run here: its ``kvfence`` commands on
the CPU with a small budget (each must exit as its comment says), and its install lines checked against
``pyproject.toml``. The README cannot drift from the command line without this failing."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
#: Appended to each quickstart ``kvfence`` command (argparse: a later flag wins): CPU, small and repeatable.
SMALL_BUDGET = ["--device", "cpu", "--max-examples", "200", "--seed", "1", "--shrink-seconds", "10", "--quiet"]
#: Runs ``kvfence.cli:main`` as the ``kvfence`` console script does.
CONSOLE_SCRIPT = "import sys; from kvfence.cli import main; sys.exit(main())"


def quickstart_lines(readme: str) -> list:
    """``(command, comment)`` for each line of the first bash block under ``## Quickstart``."""
    section = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's Quickstart has no ```bash block"
    out = []
    for line in block.group(1).splitlines():
        command, _, comment = line.partition("#")
        if command.strip():
            out.append((command.strip(), comment.strip()))
    return out


def expected_exit(comment: str) -> int:
    m = re.match(r"exit (\d)\b", comment)
    assert m, f"a quickstart command's comment must start with 'exit N': {comment!r}"
    return int(m.group(1))


LINES = quickstart_lines((ROOT / "README.md").read_text())
KVFENCE = [(c, comment) for c, comment in LINES if c.startswith("kvfence ")]


def test_quickstart_starts_from_a_fresh_machine():
    commands = [c for c, _ in LINES]
    # From a clone of this repository: the block starts in it, with no placeholder to fill in.
    assert commands[0].startswith("cd ")
    assert not any(re.search(r"<[^>]+>", c) for c in commands), commands
    assert any(re.search(r"python3? -m venv (\S+) && \. \1/bin/activate", c) for c in commands)
    assert any(c.startswith("pytest") for c in commands)
    assert KVFENCE, "the quickstart runs no kvfence command"


def test_quickstart_install_lines_match_pyproject():
    pyproject = (ROOT / "pyproject.toml").read_text()
    extras = set(re.findall(r"^(\w+)\s*=\s*\[", pyproject.split("[project.optional-dependencies]", 1)[1]
                            .split("\n[", 1)[0], re.M))
    # A requirement string (torch and a version range), not the type checker's bare module name "torch".
    (torch_range,) = [Requirement(r) for r in re.findall(r'"(torch\s*[<>=!~][^"]*)"', pyproject)]
    pins = [w for c, _ in LINES if c.startswith("pip install") for w in shlex.split(c) if w.startswith("torch==")]
    assert pins, "the quickstart installs no pinned torch"
    for pin in pins:
        assert torch_range.specifier.contains(pin.split("==")[1]), f"{pin} is outside pyproject's {torch_range}"
    editable = [w for c, _ in LINES if c.startswith("pip install") for w in shlex.split(c) if w.startswith(".[")]
    assert editable, "the quickstart does not install the package"
    for spec in editable:
        assert set(spec[2:-1].split(",")) <= extras, f"{spec}: pyproject has extras {sorted(extras)}"
    # The torch line must come before the package, or pip resolves the package's range on its own.
    order = [c for c, _ in LINES if c.startswith("pip install")]
    assert "torch==" in order[0] and ".[" not in order[0]


@pytest.mark.cpu_only
@pytest.mark.parametrize("command, comment", KVFENCE, ids=[c for c, _ in KVFENCE])
def test_quickstart_kvfence_command_exits_as_the_readme_says(command, comment, tmp_path):
    argv = shlex.split(command)[1:]
    if argv[0] == "fuzz":
        argv += SMALL_BUDGET + ["--out", str(tmp_path / "out")]
    proc = subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, *argv], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
    assert proc.returncode == expected_exit(comment), proc.stdout[-2000:] + proc.stderr[-2000:]
    if proc.returncode == 1:
        # "prints a shrunk case": the case file and its repro command.
        cases = list((tmp_path / "out" / "cases").glob("*.json"))
        # ... spelled as README's "Read a finding" prints it: the console script's own name.
        assert cases and f"\nkvfence repro {cases[0]}" in proc.stdout, proc.stdout[-600:]
