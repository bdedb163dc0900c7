"""A disk that fills up (ENOSPC) or turns read-only (EROFS) late in a run, after its case file was
written: the case file survives, the error is one line naming the path and the errno, exit 2 (never 0,
never a traceback). The failure is injected into a real run in a subprocess: once a case file exists,
creating any file directly in --out fails, as it would on a full disk."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.engine import casefile
from kvfence.engine.findings import Kind

pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--device", "cpu", "--mode", "eager", "--topk", "2", "--num-steps", "1", "--ctx", "6", "--max-bs", "2",
         "--seed", "1", "--quiet", "--database", "none", "--max-examples", "20", "--shrink-seconds", "5"]

#: Runs ``kvfence.cli.main(argv)`` with file creation in OUT failing with ERRNO once OUT/cases/*.json exists.
INJECT = """
import errno, io, os, sys
from pathlib import Path

out, err = Path(sys.argv[1]).resolve(), getattr(errno, sys.argv[2])

def full(path):
    try:
        p = Path(os.fsdecode(path)).resolve()
    except TypeError:
        return False  # a file descriptor
    return p.parent == out and any((out / "cases").glob("*.json"))

real_os_open, real_io_open = os.open, io.open

def os_open(path, flags, *args, **kwargs):
    if flags & os.O_CREAT and full(path):
        raise OSError(err, os.strerror(err), os.fsdecode(path))
    return real_os_open(path, flags, *args, **kwargs)

def io_open(file, mode="r", *args, **kwargs):
    if any(c in mode for c in "wax+") and full(file):
        raise OSError(err, os.strerror(err), os.fsdecode(file))
    return real_io_open(file, mode, *args, **kwargs)

os.open, io.open = os_open, io_open
import builtins
builtins.open = io_open
from kvfence.cli import main
sys.exit(main(sys.argv[3:]))
"""


def run(out: Path, errno_name: str, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", INJECT, str(out), errno_name, "fuzz", "--out", str(out), *args,
                           *SMALL], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("errno_name, text", [("ENOSPC", "No space left on device"),
                                              ("EROFS", "Read-only file system")])
def test_a_full_disk_after_the_case_file_keeps_it_and_is_one_line_exit_2(tmp_path, errno_name, text):
    out = tmp_path / "out"
    res = run(out, errno_name, "--sizing", "prefix")
    assert res.returncode == 2, (res.stdout, res.stderr)
    # The first failure is announced when found (before the outputs); the error is then one line.
    lines = [line for line in res.stderr.strip().splitlines() if not line.startswith("kvfence: first failure")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"cannot write {out / 'summary.json'}: {text} ({errno_name})" in lines[0]
    cases = list((out / "cases").glob("*.json"))
    assert len(cases) == 1 and str(cases[0]) in lines[0] and "1 case file(s)" in lines[0]
    loaded = casefile.load_case(cases[0])
    assert Kind.SIZING_VIOLATION in {f.kind for f in loaded.findings}
    assert not (out / "summary.json").exists()


def test_a_clean_run_under_the_same_injection_writes_its_summary(tmp_path):
    # No case file is ever written, so the disk never "fills": the run ends as usual.
    out = tmp_path / "out"
    res = run(out, "ENOSPC")
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert json.loads((out / "summary.json").read_text())["findings"] == []
