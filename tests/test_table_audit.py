"""Reads past a table's rows in the table contracts (issue 56, item 2): the engine audits every contract's tables
under the interpreter (``kvfence.engine.checking.check_launch``, ``Audit.register_table``) and judges a stored
guard poison as ``POISON_READ`` (``kvfence.engine.verdict``).

Each buggy kernel is kvfence's own kernel text with one read changed, written to a plug-in file here (no release
text): a load that lost its mask reads past the request's ``req_to_token`` row (``OOB_READ`` under the audit, and
nothing the outputs show), a load one page ahead stores what it read past the row at the wall (``POISON_READ``
with the audit off too). The correct kernel is clean on the same launches. ``--no-audit`` is honoured the same way
by every registered contract, and refused in one line where it would let a wild store write host memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.contracts.page_table.record import FLASHMLA, TRTLLM_MHA, PageTableCase
from kvfence.engine import registry
from kvfence.engine.checking import TableChecker, checker_for
from kvfence.engine.launch import bind
from kvfence.engine.plan import RunPlan
from kvfence.errors import BadInput

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
#: Per contract: kvfence's kernel file and function, and its read bugs as (text, replacement) pairs.
KERNELS = {
    "flashmla-page-table": ("flashmla_page_table.py", "create_flashmla_kv_indices_triton", {
        "unmasked": ("mask=mask)\n    tl.store(kv_indices", "mask=None)\n    tl.store(kv_indices"),
        "one_more": ("mask=mask)\n    tl.store(kv_indices", "mask=page <= num_pages)\n    tl.store(kv_indices"),
        "ahead": ("first_token = start + page.to(tl.int64) * PAGED_SIZE",
                  "first_token = start + (page.to(tl.int64) + 1) * PAGED_SIZE")}),
    "trtllm-mha-page-table": ("trtllm_mha_page_table.py", "create_trtllm_mha_kv_indices_triton", {
        "unmasked": ("* PAGE_SIZE, mask=mask)", "* PAGE_SIZE, mask=None)"),
        "one_more": ("* PAGE_SIZE, mask=mask)", "* PAGE_SIZE, mask=page <= num_pages)"),
        "ahead": ("page.to(tl.int64) * PAGE_SIZE, mask=mask)", "(page.to(tl.int64) + 1) * PAGE_SIZE, mask=mask)")}),
}
#: Launches where the buggy reads leave the row: the longest request at the wall (``ctx + draft``), so its row of
#: ``req_to_token`` ends where its pages do; two requests, pool rows out of order, page sizes 1 and 16.
CASES = [PageTableCase(1, 40, 2, (42, 7), (1, 0), 3, None, False, 3),
         PageTableCase(16, 100, 4, (104, 17), (0, 2), 3, None, False, 5)]


def _kernel(tmp_path: Path, contract: str, bug: str) -> str:
    """A plug-in spec of kvfence's own kernel for ``contract`` with ``bug`` (a key of ``KERNELS``)."""
    file, function, bugs = KERNELS[contract]
    old, new = bugs[bug]
    text = (ROOT / "kernels" / "page_table" / file).read_text()
    assert text.count(old) == 1, (contract, old)
    path = tmp_path / f"{contract.replace('-', '_')}_{bug}.py"
    path.write_text(text.replace(old, new))
    return f"{path}:{function}"


def _kinds(record, kernel: str, audit: bool):
    checker = TableChecker(record, "cpu", audit=audit)
    return [sorted({f.kind.value for f in checker.check(bind(record, case, "safe", kernel))}) for case in CASES]


@pytest.mark.parametrize("record", [FLASHMLA, TRTLLM_MHA], ids=lambda r: r.name)
def test_an_unmasked_load_past_the_row_is_an_oob_read_and_the_correct_kernel_is_clean(tmp_path, record):
    """The load without its mask reads a whole page block from each request's row: past the row's end into the
    guard after it and beyond (``OOB_READ``, the audit's finding, named after ``req_to_token``; the lanes outside
    every allocation are masked off, so nothing wild is read). A load mask one page too wide reads the guard after
    the row at the wall: ``OOB_READ`` too. Their stores keep their mask, so with the audit off nothing shows (the
    flag is honoured). The reference is clean either way."""
    assert _kinds(record, "reference", True) == [[], []]
    assert _kinds(record, "reference", False) == [[], []]
    unmasked = _kernel(tmp_path, record.name, "unmasked")
    assert _kinds(record, unmasked, True) == [["OOB_READ"], ["OOB_READ"]]
    found = TableChecker(record, "cpu").check(bind(record, CASES[0], "safe", unmasked))
    assert any(f.buffer == "req_to_token" and "guard after row" in f.region for f in found), found
    one_more = _kernel(tmp_path, record.name, "one_more")
    assert _kinds(record, one_more, True) == [["OOB_READ"], ["OOB_READ"]]
    assert _kinds(record, one_more, False) == [[], []]


@pytest.mark.parametrize("record", [FLASHMLA, TRTLLM_MHA], ids=lambda r: r.name)
def test_a_read_past_the_row_that_is_stored_is_a_poison_read_with_or_without_the_audit(tmp_path, record):
    """Each page read one page ahead: at the wall the last page's slot comes from the guard after the row, and its
    poison is stored (``POISON_READ``, decoded as a read past ``req_to_token``'s rows) beside the shifted ids
    (``VALUE_MISMATCH``); the audit adds the ``OOB_READ`` of that load."""
    spec = _kernel(tmp_path, record.name, "ahead")
    with_audit = _kinds(record, spec, True)
    without = _kinds(record, spec, False)
    assert all({"POISON_READ", "VALUE_MISMATCH", "OOB_READ"} <= set(k) for k in with_audit), with_audit
    assert all({"POISON_READ", "VALUE_MISMATCH"} <= set(k) and "OOB_READ" not in k for k in without), without
    found = TableChecker(record, "cpu", audit=False).check(bind(record, CASES[1], "safe", spec))
    poison = [f for f in found if f.kind.value == "POISON_READ"]
    assert poison and all("read past an input's rows" in f.detail for f in poison), poison


def test_the_plain_command_finds_the_unmasked_load_and_no_audit_is_honoured(tmp_path):
    """``kvfence fuzz`` as users run it, on the CPU: TRTLLM-MHA's load one page past the length is a finding
    (``OOB_READ``, exit 1); under ``--no-audit`` the same run is clean (exit 0), as the flag says."""
    spec = _kernel(tmp_path, "trtllm-mha-page-table", "one_more")
    env = dict(os.environ, TRITON_INTERPRET="1")
    common = ["--contract", "trtllm-mha-page-table", "--kernel", spec, "--device", "cpu", "--max-examples", "20",
              "--seed", "0", "--shrink-seconds", "5"]
    run = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", *common, "--out", str(tmp_path / "a")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1 and "OOB_READ" in run.stdout, run.stdout + run.stderr
    off = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", *common, "--no-audit", "--out",
                          str(tmp_path / "b")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert off.returncode == 0 and "no findings" in off.stdout, off.stdout + off.stderr
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["findings"] == []


def test_no_audit_is_honoured_or_refused_the_same_way_by_every_contract(monkeypatch):
    """For every registered contract, through the checker the engine gives a run's plan (the contract's own or
    the engine's): the audit runs on the CPU by default, never under ``audit=False`` (``--no-audit``), and
    ``--no-audit`` with the production layout's unguarded tail (``--no-absorb``) is refused in one line."""
    from kvfence.engine import audit as audit_module
    from kvfence.engine.record_probe import drawn

    entered = []
    original = audit_module.Audit.__enter__

    def counted(self):
        entered.append(1)
        return original(self)

    monkeypatch.setattr(audit_module.Audit, "__enter__", counted)
    for name in registry.names():
        record = registry.get(name)
        cases = drawn(record, 2, 0, {})
        for audit, wanted in ((None, True), (False, False)):
            entered.clear()
            checker = checker_for(record, RunPlan(contract=name, device="cpu", audit=audit))
            for case in cases:
                checker.check(bind(record, case, "safe"))
            assert bool(entered) is wanted, (name, audit, len(entered))
        with pytest.raises(BadInput) as refused:
            checker_for(record, RunPlan(contract=name, device="cpu", audit=False, absorb=False, layout="production"))
        assert "--no-absorb on the CPU needs the address audit" in str(refused.value)
        assert "\n" not in str(refused.value), name
