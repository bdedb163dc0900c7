"""A plug-in contract's own code can never make a run pass (docs/security.md): a method that exits, raises
``SystemExit`` or a ``KeyboardInterrupt`` no signal sent ends ``kvfence fuzz``, ``repro`` and ``check_kernel`` in
one line and exit 2 (the command runs in a child: ``kvfence.engine.boundary``), while the same commands on the
correct record pass and a real Ctrl-C still interrupts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "csr_contract"


def kvfence(*argv, contracts: dict, timeout=300):
    """``python -m kvfence ARGV`` with ``contracts`` (``{name: spec}``) registered as an installed package would."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               KVFENCE_REGISTERED=json.dumps({"entries": {n: [s] for n, s in contracts.items()},
                                              "sys_path": [str(FIXTURE)]}))
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("mistake", ["EXITS", "EXITSINORACLE", "RAISESSYSTEMEXIT", "RAISESINTERRUPT"])
def test_a_contract_method_that_ends_its_process_never_passes_a_fuzz_run(tmp_path, mistake):
    name = f"csr-{mistake.lower()}"
    proc = kvfence("fuzz", "--contract", name, "--device", "cpu", "--max-examples", "5", "--seed", "0", "--quiet",
                   "--shrink-seconds", "0", "--out", str(tmp_path / "out"), contracts={name: f"mistakes:{mistake}"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert lines and lines[-1].startswith("kvfence: error:") and "Traceback" not in proc.stderr, proc.stderr
    assert name in lines[-1] or "KeyboardInterrupt" in lines[-1], lines[-1]


def test_the_correct_record_passes_and_its_case_file_replays_through_the_child(tmp_path):
    contracts = {"csr-kv-indices": "csr_contract:CSR"}
    clean = kvfence("fuzz", "--contract", "csr-kv-indices", "--device", "cpu", "--max-examples", "8", "--quiet",
                    "--out", str(tmp_path / "clean"), contracts=contracts)
    assert clean.returncode == 0, clean.stderr
    found = kvfence("fuzz", "--contract", "csr-kv-indices", "--sizing", "short", "--device", "cpu", "--max-examples",
                    "8", "--quiet", "--shrink-seconds", "5", "--out", str(tmp_path / "short"), contracts=contracts)
    assert found.returncode == 1 and "SIZING_VIOLATION" in found.stdout, found.stdout + found.stderr
    (case,) = (tmp_path / "short" / "cases").glob("*.json")
    replay = kvfence("repro", str(case), "--device", "cpu", contracts=contracts)
    assert replay.returncode == 1 and "SIZING_VIOLATION" in replay.stdout, replay.stdout + replay.stderr
    # The same case file, its contract's oracle now ending the processes that replay it: the checking worker's
    # death is the case's CRASH (exit 1), or the command's own is one line (exit 2); never a pass.
    doc = json.loads(case.read_text())
    doc["contract"] = "csr-exitsinoracle"
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps(doc))
    ended = kvfence("repro", str(hostile), "--device", "cpu", contracts={"csr-exitsinoracle": "mistakes:EXITSINORACLE"})
    assert (ended.returncode == 1 and "CRASH" in ended.stdout) or (
        ended.returncode == 2 and "csr-exitsinoracle" in ended.stderr.strip().splitlines()[-1]), ended


def test_check_kernel_with_a_contract_that_exits_raises_instead_of_returning(monkeypatch, tmp_path):
    """In a caller's process (a test calling check_kernel) a method raising SystemExit or KeyboardInterrupt is an
    error of the run, never a return."""
    import kvfence
    from kvfence.engine import registry
    from kvfence.errors import BadInput

    monkeypatch.syspath_prepend(str(FIXTURE))
    for name, spec, raised in (("csr-raisesinterrupt", "mistakes:RAISESINTERRUPT", "KeyboardInterrupt"),
                               ("csr-raisessystemexit", "mistakes:RAISESSYSTEMEXIT", "SystemExit")):
        with registry.registered(name, spec), pytest.raises(BadInput, match=raised):
            kvfence.check_kernel("reference", contract=name, device="cpu", max_examples=5, out_dir=tmp_path)
