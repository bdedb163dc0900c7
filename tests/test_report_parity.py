"""A plug-in contract's findings and reports read like the draft kernel's (issue 56, item 4).

* Width 0: a table of no elements (a legal batch: the CSR fixture's lengths all 0) reaches the kernel as a null
  pointer, and a store through it is named after the table by the audit; the run and its reports complete, clean
  or not.
* Writers: a finding's ``writers`` are the programs the contract says store the value found there
  (``Contract.owner`` of the elements the oracle gives that value): a row written with another row's pages names
  that row's programs.
* Decoded values: a guard poison (a read past an input's rows) or an output guard's canary found in an element is
  said in the finding's detail, whatever its kind.
* The coverage panel: the field the contract chooses (``Keys.config``'s first pair), never the draft kernel's
  ``page_size`` for a contract without pages.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvfence import cli
from kvfence.contracts.page_table.record import FLASHMLA, PageTableCase, page_ids
from kvfence.engine import registry
from kvfence.engine.checking import TableChecker
from kvfence.engine.launch import bind

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "csr_contract"


@pytest.fixture
def csr(monkeypatch):
    """The CSR fixture registered as ``csr-kv-indices`` (its folder on the import path its workers get)."""
    monkeypatch.syspath_prepend(str(FIXTURE))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with registry.registered("csr-kv-indices", "csr_contract:CSR"):
        yield registry.get("csr-kv-indices")


def _fuzz(capfd, *argv):
    capfd.readouterr()
    code = cli.main(["fuzz", *argv])
    out, err = capfd.readouterr()
    return code, out, err


def test_a_width_0_table_runs_end_to_end_and_its_reports_render(csr, tmp_path, capfd):
    """The CSR fixture's first example has every length 0: its output table is 0 wide. A clean run over such
    examples ends with exit 0 and writes its reports and plot; under the ``short`` sizing a one-token batch gets a
    0-wide table, the kernel's store through its null pointer is dropped and named after ``kv_indices``, and the
    report draws the 0-wide row."""
    code, out, err = _fuzz(capfd, "--contract", "csr-kv-indices", "--device", "cpu", "--max-examples", "10",
                           "--seed", "0", "--out", str(tmp_path / "clean"))
    assert code == 0 and "no findings" in out, out + err
    doc = json.loads((tmp_path / "clean" / "summary.json").read_text())
    fields = doc["coverage"]["fields"]
    assert [dict(zip(fields, row))["width"] for row in doc["coverage"]["examples"]].count(0) >= 1
    assert (tmp_path / "clean" / "report.html").is_file() and (tmp_path / "clean" / "coverage.png").is_file()
    code, out, err = _fuzz(capfd, "--contract", "csr-kv-indices", "--sizing", "short", "--device", "cpu",
                           "--max-examples", "10", "--seed", "0", "--shrink-seconds", "5",
                           "--out", str(tmp_path / "short"))
    assert code == 1, out + err
    doc = json.loads((tmp_path / "short" / "summary.json").read_text())
    null = [f for f in doc["findings"] if f["kind"] == "OOB_WRITE"]
    assert null and null[0]["buffer"] == "kv_indices" and "null pointer" in null[0]["region"], doc["findings"]
    (case,) = doc["cases"].values()
    assert case["width"] == 0
    page = (tmp_path / "short" / "report.html").read_text()
    assert "kv_indices row 0: width 0" in page and "null pointer" in page


def _kernel(tmp_path: Path, name: str, old: str, new: str) -> str:
    text = (ROOT / "kernels" / "page_table" / "flashmla_page_table.py").read_text()
    assert text.count(old) == 1
    path = tmp_path / f"{name}.py"
    path.write_text(text.replace(old, new))
    return f"{path}:create_flashmla_kv_indices_triton"


STORE = "    tl.store(kv_indices + b * kv_indices_stride + page, slot // PAGED_SIZE, mask=mask)\n"


def test_a_finding_names_the_programs_that_store_what_was_found_there(tmp_path):
    """Every row stored one row down: row 1 holds row 0's pages, so its ``VALUE_MISMATCH`` is written by row 0's
    programs ((0, 0): request 0, page block 0), the expected owners being row 1's."""
    spec = _kernel(tmp_path, "one_row_down", STORE,
                   STORE.replace("kv_indices + b * kv_indices_stride", "kv_indices + (b + 1) * kv_indices_stride"))
    case = PageTableCase(16, 64, 0, (64, 64, 64), (2, 0, 1), 3, None, False, 1)
    found = TableChecker(FLASHMLA, "cpu").check(bind(FLASHMLA, case, "safe", spec))
    row1 = [f for f in found if f.kind.value == "VALUE_MISMATCH" and f.region == "row 1"]
    assert row1 and row1[0].programs == [(1, 0)] and row1[0].writers == [(0, 0)], found
    assert row1[0].samples[0][2] == page_ids(case)[0][0]
    assert "written by (request 0, block 0)" in row1[0].headline() and row1[0].owner_names == ("request", "block")


def test_a_guard_poison_or_a_canary_found_in_an_element_is_decoded_whatever_its_kind(tmp_path):
    """A kernel that stores the canaries of its output's guard into the row: each ``VALUE_MISMATCH`` says whose
    canary it holds. One that reads a page ahead under a table a page too narrow (``context-floor``): what lands in
    the guard after the row is ``req_to_token``'s guard poison, and the ``GUARD_OVERWRITE`` says so (the same value
    inside a row is a ``POISON_READ``, decoded as before)."""
    canary = _kernel(tmp_path, "stores_canaries", STORE, STORE.replace(
        "slot // PAGED_SIZE", "tl.load(kv_indices + b * kv_indices_stride + kv_indices_stride - 64 + page % 64)"))
    case = PageTableCase(1, 8, 0, (8, 8), (0, 1), 2, None, False, 1)
    found = TableChecker(FLASHMLA, "cpu", audit=False).check(bind(FLASHMLA, case, "safe", canary))
    mismatch = [f for f in found if f.kind.value == "VALUE_MISMATCH"]
    assert mismatch and all("is the canary of kv_indices guard after row" in f.detail for f in mismatch), found
    ahead = _kernel(tmp_path, "reads_ahead", "first_token = start + page.to(tl.int64) * PAGED_SIZE",
                    "first_token = start + (page.to(tl.int64) + 1) * PAGED_SIZE")
    case = PageTableCase(1, 9, 2, (11,), (0,), 1, None, False, 1)  # 11 pages in a row of 9 (context-floor)
    found = TableChecker(FLASHMLA, "cpu", audit=False).check(bind(FLASHMLA, case, "context-floor", ahead))
    spill = [f for f in found if f.kind.value == "GUARD_OVERWRITE"]
    assert spill and "is the guard poison of req_to_token guard after row" in spill[0].detail, found
    assert spill[0].samples[-1][2] <= -(1 << 24)  # the last page's read: past the pool row of 11 tokens


def test_the_coverage_panel_is_the_field_the_contract_chooses(csr, tmp_path, capfd):
    """The CSR fixture (no pages, the default keys: its scalar fields but the seed, sorted) is plotted per
    ``pool_len``, and no report of its run says ``page_size``; the page-table contracts choose ``page_size``."""
    code, out, err = _fuzz(capfd, "--contract", "csr-kv-indices", "--device", "cpu", "--max-examples", "8",
                           "--seed", "1", "--out", str(tmp_path / "o"))
    assert code == 0, out + err
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert doc["coverage"]["fields"][0] == "pool_len"
    for name in ("report.md", "report.html", "summary.json"):
        text = (tmp_path / "o" / name).read_text()
        assert "page_size" not in text, name
    assert "one panel per pool_len" in (tmp_path / "o" / "report.md").read_text()
    assert FLASHMLA.keys(bind(FLASHMLA, PageTableCase(16, 64, 0, (3,), (0,), 1), "safe")).config[0][0] == "page_size"
