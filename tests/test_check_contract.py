"""``kvfence check-contract``: the CSR fixture contract (written from docs/contract-api.md alone) is well formed,
and each record mistake planted in a copy of it is named in one line, exit 2, never a finding against the correct
kernel and never a traceback."""

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from kvfence import cli
from kvfence.engine import registry

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "csr_contract"


def check(name: str, spec: str, *argv):
    """``kvfence check-contract NAME`` with ``spec`` registered as NAME, as an installed package registers it:
    ``(exit code, stdout, stderr lines)``. A plug-in's check runs behind the boundary (kvfence.engine.boundary), in
    a child whose output is the command's own: a subprocess here, so the test reads it."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               KVFENCE_REGISTERED=json.dumps({"entries": {name: [spec]}, "sys_path": [str(FIXTURE)]}))
    proc = subprocess.run([sys.executable, "-m", "kvfence", "check-contract", name, "--examples", "6", *argv],
                          env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr.strip().splitlines()


@pytest.fixture(autouse=True)
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURE))


def test_the_csr_fixture_is_well_formed_and_small():
    code, out, err = check("csr-kv-indices", "csr_contract:CSR")
    assert code == 0 and err == [], err
    # Every method is asked about 100 drawn cases (record_probe.METHOD_EXAMPLES), the reference launched on 6.
    assert "well formed: 100 drawn cases" in out and "on 6 launches" in out and "1 planted bug(s) resolve" in out
    lines = sum(len(p.read_text().splitlines()) for p in (FIXTURE / "csr_contract.py", FIXTURE / "csr_kernel.py"))
    assert lines <= 120, lines


@pytest.mark.parametrize("mistake, named", [
    ("ROUNDTRIP", "from_json rejects what to_json wrote"),
    ("EXTRATABLE", "expected(launch) names table 'kv_last_page_len', which tables(launch) lacks"),
    ("FLATKEYS", "is no (row, column) pair of integers"),
    ("UNDECLAREDKIND", "mutant one_more detects ROW_OVERFLOW, which no kind declares"),
    ("NOSAFE", "sizings has no 'safe' policy"),
    ("NEGATIVENEED", "need(launch) must be an integer >= 0, got -1"),
    ("TEXTWIDTH", "sizing 'safe' gives width '"),  # the text's repr: quoted
    ("OBSERVEDBEFORELAUNCH", "findings_before_launch gives GUARD_OVERWRITE"),
    ("WRONGORACLE", "its reference kernel is not clean under the 'safe' sizing"),
    # None of the first 20 drawn cases (the default --examples) holds over 100 tokens: asked about 100, it shows.
    ("PICKYFROMJSON", "from_json rejects what to_json wrote: seq_lens: at most 100 tokens a batch"),
    ("EXITS", "its need() ended its process with exit status 0"),
])
def test_each_planted_record_mistake_is_one_line_and_exit_2(mistake, named):
    name = f"csr-{mistake.lower()}"
    code, out, err = check(name, f"mistakes:{mistake}")
    assert code == 2 and len(err) == 1 and named in err[0], err
    assert err[0].startswith(f"kvfence: error: contract {name!r}") and "Traceback" not in "\n".join(err)


def test_unknown_contract_and_bad_pins_are_one_line():
    code, _, err = check("csr-kv-indices", "csr_contract:CSR", "--pin", "window=4")
    assert code == 2 and len(err) == 1 and "--pin 'window=4'" in err[0], err
    out, errs = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(errs):
        assert cli.main(["check-contract", "no-such-contract"]) == 2
    assert len(errs.getvalue().strip().splitlines()) == 1 and "no-such-contract" in errs.getvalue()


def test_list_names_every_registered_contract():
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["check-contract", "--list"]) == 0
    assert {line.split()[0] for line in out.getvalue().splitlines()} == set(registry.names())
    assert sys.modules.get("csr_contract") is None or "csr-kv-indices" not in registry.names()


def test_a_need_below_the_oracles_writes_is_caught_with_default_settings_and_a_correct_need_passes():
    """``need(launch)`` promises no ``SIZING_VIOLATION`` at that width: the oracle's elements must fit the tables at
    ``width = need``. One short of it (``mistakes.ShortNeed``) is one line naming the contract and ``need``; the CSR
    fixture's own need (the sum of the lengths) passes; both under ``check-contract``'s defaults (no flags)."""
    env = dict(os.environ, TRITON_INTERPRET="1", KVFENCE_REGISTERED=json.dumps({
        "entries": {"csr-shortneed": ["mistakes:SHORTNEED"], "csr-kv-indices": ["csr_contract:CSR"]},
        "sys_path": [str(FIXTURE)]}))
    short, correct = (subprocess.run([sys.executable, "-m", "kvfence", "check-contract", name], env=env,
                                     capture_output=True, text=True, timeout=300)
                      for name in ("csr-shortneed", "csr-kv-indices"))
    err = short.stderr.strip().splitlines()
    assert short.returncode == 2 and len(err) == 1, short.stderr
    assert err[0].startswith("kvfence: error: contract 'csr-shortneed': need(launch) is ") and \
        "expected(launch) defines kv_indices[0, " in err[0], err
    assert correct.returncode == 0 and correct.stderr == "", correct.stderr
    assert "on 20 launches" in correct.stdout, correct.stdout


@pytest.mark.parametrize("name", registry.names())
def test_every_shipped_contracts_need_holds_what_its_oracle_writes(name):
    """The need check on kvfence's own contracts, whose ``need`` is no column count for some (fa3-decode-metadata,
    slot-mapping, window-rail): at ``width = need`` every oracle element fits the tables of that width."""
    from kvfence.contract import Launch
    from kvfence.engine.record_check import need_problems
    from kvfence.engine.record_probe import drawn

    record = registry.get(name)
    checked = 0
    for case in drawn(record, 25, 0, {}):
        for mode in ("graph", "eager"):
            launch = Launch(name, case, record.sizings["safe"](case, mode), "safe", mode=mode)
            assert need_problems(record, launch, record.need(launch)) == [], (name, case)
            checked += 1
    assert checked >= 25
