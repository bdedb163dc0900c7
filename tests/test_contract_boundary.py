"""One boundary for a plug-in contract's code (kvfence.engine.boundary, docs/security.md "A plug-in contract's
code"): a method that exits (``SystemExit(0)``, ``os._exit(0)``), never returns, raises ``KeyboardInterrupt`` itself,
raises, answers a wrong type or forks ends every entry point (``fuzz``, ``check-contract``, ``upstream sizing``, a
run recovering a journal slot, ``check_kernel``, the pytest plugin) with one line naming the contract and the method
and a non-zero exit (2 for the commands), nothing it started left running; the correct record passes the same entry
points, and the user's SIGINT still interrupts (130). Hostile records: tests/fixtures/csr_contract/hostile.py.

Cost on a shared 2-core machine: the default tests 71 s (each command a subprocess, ``KVFENCE_CALL_LIMIT_S=3`` for
the hangs); the ``long`` ones (SIGINT, forks, journal recovery, the pytest plugin's refusal) 28 s to 78 s more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvfence.contract import Contract
from kvfence.engine import registry
from kvfence.engine.boundary import ContractFault, guard

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "csr_contract"
CALL_LIMIT_S = "3"


def _env(contracts: dict, **extra) -> dict:
    return dict(os.environ, TRITON_INTERPRET="1", KVFENCE_CALL_LIMIT_S=CALL_LIMIT_S,
                KVFENCE_REGISTERED=json.dumps({"entries": {n: [s] for n, s in contracts.items()},
                                               "sys_path": [str(FIXTURE)]}), **extra)


def kvfence(*argv, contracts: dict, timeout=240, **extra):
    """``python -m kvfence ARGV`` with ``contracts`` (``{name: spec}``) registered as an installed package would."""
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=ROOT, env=_env(contracts, **extra),
                          capture_output=True, text=True, timeout=timeout)


def hostile(attr: str) -> tuple:
    name = f"csr-{attr.lower()}"
    return name, {name: f"hostile:{attr}"}


def _one_line(proc, name: str, method: str) -> str:
    """The command failed with exit 2 and its last line names the contract and the method, no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines and lines[-1].startswith(f"kvfence: error: contract '{name}': its {method}"), lines[-1:]
    return lines[-1]


#: (hostile record, the method its line names, what the line says of it)
FUZZED = [("EXITINCASES", "cases()", "raised SystemExit(0)"),
          ("HARDEXITINNEED", "need()", "ended its process with exit status 0"),
          ("EXITINKEYS", "keys()", "raised SystemExit(0)"),
          ("EXITINGSIZINGS", "sizings", "ended its process with exit status 0"),
          ("LOOPSINCASES", "cases()", f"did not return within {CALL_LIMIT_S}s"),
          ("INTERRUPTINNEED", "need()", "raised KeyboardInterrupt while no signal came"),
          ("WRONGNEEDTYPE", "need()", "answered something kvfence cannot use (TypeError"),
          ("RAISESINNEED", "need()", "raised ValueError: need is not implemented yet")]


@pytest.mark.parametrize("attr, method, said", FUZZED, ids=[f[0] for f in FUZZED])
def test_fuzz_of_a_hostile_contract_is_one_line_naming_the_method(tmp_path, attr, method, said):
    name, contracts = hostile(attr)
    proc = kvfence("fuzz", "--contract", name, "--device", "cpu", "--max-examples", "3", "--seed", "0", "--quiet",
                   "--shrink-seconds", "0", "--out", str(tmp_path / "out"), contracts=contracts)
    assert said in _one_line(proc, name, method)


def test_fuzz_of_a_contract_whose_from_json_refuses_its_own_draws_names_the_contract_and_method(tmp_path):
    """The line used to be the record's own message alone ("seq_lens: at most 100 tokens a batch")."""
    name, spec = "csr-pickyfromjson", "mistakes:PICKYFROMJSON"
    proc = kvfence("fuzz", "--contract", name, "--device", "cpu", "--max-examples", "200", "--seed", "0", "--quiet",
                   "--shrink-seconds", "0", "--out", str(tmp_path / "out"), contracts={name: spec})
    assert "refused: seq_lens: at most 100 tokens a batch" in _one_line(proc, name, "from_json()")


def test_max_seconds_bounds_a_run_whose_contract_method_never_returns(tmp_path):
    """``--max-seconds 2`` with a cases() that never returns (no KVFENCE_CALL_LIMIT_S): the call limit is
    max(2, 10) s, so the run ends in about 10 s plus start-up (it used to run on past 300 s)."""
    name, contracts = hostile("LOOPSINCASES")
    env = {k: v for k, v in _env(contracts).items() if k != "KVFENCE_CALL_LIMIT_S"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--contract", name, "--device", "cpu",
                           "--max-seconds", "2", "--quiet", "--out", str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert "did not return within 10s" in _one_line(proc, name, "cases()")
    assert time.monotonic() - started < 90


def test_fuzz_and_check_contract_of_the_correct_record_pass(tmp_path):
    contracts = {"csr-kv-indices": "csr_contract:CSR"}
    clean = kvfence("fuzz", "--contract", "csr-kv-indices", "--device", "cpu", "--max-examples", "5", "--quiet",
                    "--out", str(tmp_path / "out"), contracts=contracts)
    assert clean.returncode == 0, clean.stderr[-2000:]
    checked = kvfence("check-contract", "csr-kv-indices", "--examples", "5", contracts=contracts)
    assert checked.returncode == 0 and "well formed" in checked.stdout, checked.stderr[-2000:]


CHECKED = [("EXITINGSIZINGS", "sizings", "ended its process"),
           ("HARDEXITINNEED", "need()", "ended its process with exit status 0"),
           ("LOOPSINNEED", "need()", f"did not return within {CALL_LIMIT_S}s"),
           ("INTERRUPTINNEED", "need()", "raised KeyboardInterrupt while no signal came"),
           ("EXITINCASES", "cases()", "raised SystemExit(0)")]


@pytest.mark.parametrize("attr, method, said", CHECKED, ids=[c[0] for c in CHECKED])
def test_check_contract_of_a_hostile_contract_is_one_line_naming_the_method(attr, method, said):
    """Both parts: the static one (the sizings property) and the drawn one (its own child, behind the boundary)."""
    name, contracts = hostile(attr)
    proc = kvfence("check-contract", name, "--examples", "3", contracts=contracts)
    assert said in _one_line(proc, name, method)


def test_upstream_sizing_of_a_contract_whose_sizings_exit_is_one_line():
    name, contracts = hostile("EXITINGSIZINGS")
    proc = kvfence("upstream", "sizing", "0.5.10", "--contract", name, contracts=contracts)
    assert "ended its process" in _one_line(proc, name, "sizings")


@pytest.fixture
def csr_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURE))
    monkeypatch.setenv("KVFENCE_CALL_LIMIT_S", CALL_LIMIT_S)


@pytest.mark.parametrize("attr, method", [("EXITINCASES", "cases()"), ("HARDEXITINNEED", "need()"),
                                          ("LOOPSINCASES", "cases()")])
def test_check_kernel_with_a_hostile_contract_raises_naming_the_method(csr_on_path, tmp_path, attr, method):
    """In the caller's process: never a return (the old check_kernel returned on ``os._exit(0)`` in the caller)."""
    import kvfence

    name, _ = hostile(attr)
    with registry.registered(name, f"hostile:{attr}"), pytest.raises(ContractFault) as raised:
        kvfence.check_kernel("reference", contract=name, device="cpu", max_examples=3, out_dir=tmp_path,
                             shrink_seconds=0)
    assert str(raised.value).startswith(f"contract '{name}': its {method}")


def test_check_kernel_with_the_correct_plug_in_contract_returns_and_a_bug_fails(csr_on_path, tmp_path):
    import kvfence

    with registry.registered("csr-kv-indices", "csr_contract:CSR"):
        kvfence.check_kernel("reference", contract="csr-kv-indices", device="cpu", max_examples=5, out_dir=tmp_path)
        with pytest.raises(AssertionError, match="SIZING_VIOLATION"):
            kvfence.check_kernel("reference", contract="csr-kv-indices", sizing="short", device="cpu",
                                 max_examples=10, out_dir=tmp_path, shrink_seconds=2)


def test_the_guard_names_the_method_in_process_and_keeps_what_a_record_defines(csr_on_path):
    """The caller's own process (a pytest run drawing a plug-in's cases): an exit is ContractFault naming the
    method; ``type(record).m is Contract.m`` still tells which members the record defines (static checks)."""
    import hostile as module

    record = guard(module.ExitInKeys(), "csr-exitinkeys")
    with pytest.raises(ContractFault, match=r"^contract 'csr-exitinkeys': its keys\(\) raised SystemExit\(0\)"):
        record.keys(None)
    assert isinstance(record, Contract) and type(record).__name__ == "ExitInKeys"
    assert type(record).keys is not Contract.keys and type(record).report is Contract.report
    assert record.need.__name__ == "need"


@pytest.mark.long
def test_sigint_to_an_isolated_plug_in_run_interrupts_it(tmp_path):
    """The user's Ctrl-C (SIGINT to the command) ends the run as interrupted: 130, the summary says SIGINT (the
    old parent swallowed it: exit 0, ``interrupted: null``)."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "kvfence", "fuzz", "--contract", "csr-kv-indices", "--device",
                             "cpu", "--max-examples", "100000", "--quiet", "--out", str(out)], cwd=ROOT,
                            env=_env({"csr-kv-indices": "csr_contract:CSR"}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "journal").is_dir() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["interrupted"] == "SIGINT"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.long
def test_a_fork_a_method_started_does_not_outlive_the_run(tmp_path):
    name, contracts = hostile("FORKSINNEED")
    pids = tmp_path / "forks"
    proc = kvfence("fuzz", "--contract", name, "--device", "cpu", "--max-examples", "3", "--quiet",
                   "--out", str(tmp_path / "out"), contracts=contracts, HOSTILE_FORK_PIDS=str(pids))
    assert proc.returncode == 0, proc.stderr[-2000:]
    forked = [int(p) for p in pids.read_text().split()]
    time.sleep(0.5)
    assert forked and not [p for p in forked if _alive(p)]


@pytest.mark.long
def test_a_run_recovering_a_plug_in_journal_slot_is_one_line_naming_from_json(tmp_path):
    """A dead run of a plug-in contract left its slot; a later draft run into the folder recovers it with that
    contract's code: a ``from_json`` that ends the process is one line naming it, never exit 0 without a summary."""
    name, contracts = hostile("EXITINFROMJSON")
    journal = tmp_path / "out" / "journal"
    journal.mkdir(parents=True)
    slot = {"run": {"device": "cpu", "pid": 1, "started": 1.0}, "contract": name,
            "case": {"case": {"seq_lens": [1], "pool_rows": [0], "pool_len": 1}, "width": 1, "sizing": "safe",
                     "kernel": "reference", "mode": "eager", "layout": "redzone"}}
    (journal / "1-00000000.inflight").write_bytes(b"S" + json.dumps(slot).encode() + b"\n")
    proc = kvfence("fuzz", "--device", "cpu", "--max-examples", "1", "--quiet", "--out", str(tmp_path / "out"),
                   contracts=contracts)
    assert "ended its process with exit status 0" in _one_line(proc, name, "from_json()")


#: docs/contract-api.md's own-contract ``@given`` test, verbatim (tests/test_contract_api.py holds the page to it).
OWN_GIVEN = FIXTURE / "own_given_example.py"


def _pytest(tmp_path, contract):
    (tmp_path / "test_own.py").write_text(OWN_GIVEN.read_text())
    registered = {"csr-kv-indices": "csr_contract:CSR", "csr-exitincases": "hostile:EXITINCASES"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_own.py"),
            "--kvfence-device", "cpu", *(["--kvfence-contract", contract] if contract else [])]
    return subprocess.run(argv, cwd=tmp_path, env=_env(registered, PYTHONPATH=str(FIXTURE)), capture_output=True,
                          text=True, timeout=300)


def test_the_docs_own_contract_given_test_passes_under_the_pytest_plugin(tmp_path):
    """docs/contract-api.md's ``@given`` example, run as its reader runs it; with the default contract (the draft)
    the launch is checked by its own contract (it used to be checked as a draft launch and fail after minutes)."""
    proc = _pytest(tmp_path, None)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.long
@pytest.mark.parametrize("contract, expected", [("csr-exitincases", 4), ("csr-kv-indices", 0)])
def test_the_pytest_plugin_refuses_a_hostile_contract_and_passes_the_correct_one(tmp_path, contract, expected):
    """``--kvfence-contract`` of a contract whose cases() exits: a usage error naming it (pytest's 4), never exit
    0; the correct one passes."""
    proc = _pytest(tmp_path, contract)
    assert proc.returncode == expected, proc.stdout[-3000:] + proc.stderr[-2000:]
    if expected:
        assert "contract 'csr-exitincases': its cases() raised SystemExit(0)" in proc.stderr, proc.stderr[-2000:]
