"""Every command line of README.md's and docs/'s ```bash blocks runs as written, so the docs cannot drift
from what kvfence does (tests/test_docs_guide.py checks their options against the parser).

A line runs in a scratch project on the CPU: the files the docs name as the user's own
(``path/to/my_kernel.py``, ``my_sizing.py``) are there, written as docs/own-kernel.md describes, and the
exit code is the one the line's ``# exit N`` comment gives (0 without one). A line that cannot run here
(it needs a GPU, a site's database or scheduler, or sets up a checkout) is listed in ``NOT_HERE`` with the
reason; lines that download SGLang run with the ``network`` marker, and lines that take minutes with
``long``. Every line must be in exactly one of these, so a new command in the docs is either run or
explained: ``test_every_documented_command_is_run_or_says_why_not``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Lines that do not run here, by pattern, with the reason (checked in the order given).
NOT_HERE = (
    (r"^(cd kvfence|python3 -m venv|pip install)", "sets up a checkout: .ci/run does this from the same files"),
    (r"^pytest -n auto$", "the whole suite: it is what CI runs"),
    (r"pytest -n auto --kvfence-|KVFENCE_KERNEL=",
     "the whole suite against the reader's kernel (tests/test_plugins.py runs the options on a kernel of its own)"),
    (r"--device cuda", "needs a GPU (the H200 runs of BENCHMARKS.md)"),
    (r"^kvfence sweep|benchmarks/nightly\.py",
     "the compute-sanitizer sweep: needs the CUDA toolkit's compute-sanitizer and a GPU (benchmarks/gpu.sh "
     "nightly; tests/test_sanitizer.py runs the sweep against a fake compute-sanitizer)"),
    (r"redis\.internal|redis://HOST|/shared/|/scratch/|sbatch|^DB=|^NIGHT=|^JOB=",
     "a site's shared database, folders or scheduler (docs/campaigns.md; the campaign tests use local ones)"),
    (r"^(HEAD=|srun |sleep |kubectl |ray start)",
     "starts a Ray cluster or submits to one (Slurm, KubeRay): tests/test_campaign_ray.py starts a local Ray head node "
     "and runs kvfence campaign --engine ray on it"),
    (r"^export ", "sets a variable of the reader's shell"),
    (r"CASE\.json", "replays a case file of the reader's own run (tests/test_repro.py replays real ones)"),
    (r"import sglang", "asks an installed SGLang for its version"),
)
#: Lines that download SGLang's or vLLM's wheels: run with --kvfence-network. (A table contract's self-test plants
#: bugs in the release kernels' own text, read from the wheels: kvfence.contracts.page_table.release_mutants.)
NETWORK = (r"^kvfence (affected|upstream (fetch|sizing|matrix))|--kernel (sglang|vllm)==|"
           r"^kvfence mutants --contract (flashmla-page-table|trtllm-mha-page-table|fa3-decode-metadata)")
#: Lines that take minutes on 2 cores: run with --kvfence-long.
#: (A plug-in's fuzz runs the default budget: a minute on 2 cores. Of docs/campaigns.md's laptop campaigns CI runs
#: the first, ~40 s; the clean one and the one on a Ray cluster of its own, ~30-45 s each, are long.)
LONG = (r"--seeds 20|^kvfence mutants --device cpu --json|--out campaign-(clean|ray)$|"
        r"^kvfence fuzz --(kernel path/to/my_kernel\.py|sizing my_sizing\.py)\S* (--topk 4 )?--device cpu$")

#: The user's own files the docs name, written as docs/own-kernel.md describes: the reference kernel under
#: the user's paths, and a sizing with draft headroom under both names the docs use.
SIZING = '''
def row_width(n, topk, ctx, num_steps):
    """Room for every request at the context limit and its draft tokens."""
    return n * topk * (ctx + num_steps)


kv_indices_width = row_width
'''


class DocLine(NamedTuple):
    page: str
    number: int
    command: str
    exit_code: int


def doc_lines() -> List[DocLine]:
    """Each command of a ```bash block (``\\`` continuations joined), with its first line's number and the
    exit its ``# exit N`` comment states (0 without one); comment lines are skipped."""
    out = []
    for page in [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        for block in re.finditer(r"```(?:bash|sh)\n(.*?)```", text, re.S):
            first = text[:block.start(1)].count("\n") + 1
            lines = block.group(1).split("\n")
            i = 0
            while i < len(lines):
                start, line = i, lines[i]
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + " " + lines[i]
                i += 1
                command, _, comment = ("", "", line) if line.lstrip().startswith("#") else line.partition(" #")
                command = " ".join(command.split())
                if command:
                    code = re.search(r"\bexit (\d+)", comment)
                    out.append(DocLine(page.relative_to(ROOT).as_posix(), first + start, command,
                                       int(code.group(1)) if code else 0))
    return out


def where(line: DocLine) -> str:
    """``run``, ``network``, ``long``, or the reason the line does not run here."""
    for pattern, reason in NOT_HERE:
        if re.search(pattern, line.command):
            return reason
    if re.search(NETWORK, line.command):
        return "network"
    if re.search(LONG, line.command):
        return "long"
    return "run"


LINES = doc_lines()


def _id(line: DocLine) -> str:
    return f"{line.page}:{line.number}"


def _params(kind: str):
    marks = {"network": [pytest.mark.network], "long": [pytest.mark.long]}.get(kind, [])
    return [pytest.param(line, id=_id(line), marks=[pytest.mark.interpreter, *marks])
            for line in LINES if where(line) == kind]


def test_every_documented_command_is_run_or_says_why_not():
    kinds = {}
    for line in LINES:
        kinds.setdefault(where(line), []).append(_id(line))
    # The docs hold commands of every kind, and the CI run (no GPU, no network) still runs some.
    assert len(LINES) >= 30 and len(kinds.get("run", [])) >= 4, kinds
    # The reader's own placeholders resolve to the files the scratch project writes.
    for line in LINES:
        for token in shlex.split(line.command):
            if token.startswith(("path/to/", "my_sizing.py", "my_pkg/")) and where(line) in ("run", "long"):
                assert token.split(":")[0] in ("path/to/my_kernel.py", "my_sizing.py", "my_pkg/kernels.py"), line


@pytest.fixture
def project(tmp_path):
    """A scratch project holding the files the docs call the reader's own."""
    kernel = (ROOT / "kernels" / "draft" / "draft_kv_indices.py").read_text()
    for rel in ("path/to/my_kernel.py", "my_pkg/kernels.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(kernel)
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_sizing.py").write_text(SIZING)
    (tmp_path / "my_pkg" / "sizing.py").write_text(SIZING)
    return tmp_path


def doc_tests():
    """Each ```python block of README.md and docs/ that defines a pytest test, as (id, source)."""
    out = []
    for page in [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        for block in re.finditer(r"```python\n(.*?)```", text, re.S):
            if re.search(r"^def test_", block.group(1), re.M):
                number = text[:block.start(1)].count("\n") + 1
                out.append(pytest.param(block.group(1), id=f"{page.relative_to(ROOT).as_posix()}:{number}"))
    return out


def _run(line: DocLine, cwd: Path) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    argv = shlex.split(line.command)
    if argv[0] == "kvfence":  # the installed console script, as the reader types it
        script = Path(sys.executable).with_name("kvfence")
        argv = [str(script), *argv[1:]] if script.exists() else [sys.executable, "-m", "kvfence", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == line.exit_code, (f"{_id(line)}: {line.command}: exit {proc.returncode}, the docs say "
                                               f"{line.exit_code}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")


@pytest.mark.parametrize("line", _params("run"))
def test_a_documented_command_exits_as_written(line, project):
    _run(line, project)


@pytest.mark.parametrize("line", _params("long"))
def test_a_documented_long_command_exits_as_written(line, project):
    _run(line, ROOT if line.command.startswith("python benchmarks") else project)


@pytest.mark.parametrize("line", _params("network"))
def test_a_documented_command_that_downloads_sglang_exits_as_written(line, project):
    _run(line, project)


@pytest.mark.interpreter
@pytest.mark.long
@pytest.mark.parametrize("source", doc_tests())
def test_a_documented_test_passes_on_a_correct_kernel_in_a_project_of_its_own(source, project):
    """The test a page shows, pasted into the reader's project as ``tests/test_doc.py``, passes under
    Hypothesis's default settings (no profile) on the correct kernel."""
    (project / "tests").mkdir()
    (project / "tests" / "test_doc.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
    # docs/contract-api.md's own-contract test: the reader's package provides and registers the CSR contract.
    csr = ROOT / "tests" / "fixtures" / "csr_contract"
    env.update(PYTHONPATH=os.pathsep.join([str(csr), *filter(None, [env.get("PYTHONPATH")])]),
               KVFENCE_REGISTERED=json.dumps({"entries": {"csr-kv-indices": ["csr_contract:CSR"]},
                                              "sys_path": [str(csr)]}))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_doc.py"],
                          cwd=project, env=dict(env, TRITON_INTERPRET="1"), capture_output=True, text=True,
                          timeout=1800, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_documented_tests_are_found():
    assert len(doc_tests()) >= 3  # README's check_kernel test, and own-kernel.md's two
