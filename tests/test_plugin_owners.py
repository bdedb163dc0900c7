"""A plug-in contract's findings name programs in the contract's own terms, and a guard overwrite names its writer
(issue 63, item 6).

* Owners: ``Contract.owner`` returning a ``typing.NamedTuple`` names a program's coordinates; findings, repro's
  lines, the reports and the case file show ``request 0`` / ``(request 0, block 0)``, and the address audit's program
  ids ``(x, y, z)`` take the contract's shape. The draft kernel (plain ``(s, b, k)`` tuples) prints as before.
* A ``GUARD_OVERWRITE``'s writer: on the CPU the program the address audit saw store there (seen, its
  ``writers``); without the audit (CUDA) the owner of the row's last element, said as inferred, never as seen.
  Each paired with the correct kernel, which has no such finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvfence.engine import registry
from kvfence.engine.casefile import finding_from_dict
from kvfence.engine.checking import TableChecker
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.launch import bind
from kvfence.engine.repro import finding_lines
from kvfence.reports.render import finding_table
from kvfence.reports.table_map import table_map_html

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "csr_contract"


@pytest.fixture
def csr(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURE))
    with registry.registered("csr-kv-indices", "csr_contract:CSR"):
        yield registry.get("csr-kv-indices")


def _case(lens, rows):
    from csr_contract import CsrCase

    return CsrCase(tuple(lens), tuple(rows), max(list(lens) + [1]))


def test_the_audits_programs_take_the_contracts_shape_and_names(csr):
    """A zero-width row (``short`` sizing, one token): the store through the null pointer was program ``(0, 0, 0)``
    of the interpreter's grid; the finding, its repro lines, the report table and the case file say
    ``request 0``, the CSR contract's own term (its ``owner`` returns ``Request(b)``)."""
    found = TableChecker(csr, "cpu").check(bind(csr, _case([1], [0]), "short"))
    (oob,) = [f for f in found if f.kind is Kind.OOB_WRITE]
    assert oob.programs == [(0,)] and oob.owner_names == ("request",), oob
    assert "expected owners request 0" in oob.headline()
    assert "    expected owners (programs): request 0" in finding_lines(1, oob)
    data = oob.to_dict()
    back = finding_from_dict(data, "findings[0]")
    assert back.owner_names == ("request",) and back.programs == [(0,)]
    row = finding_table({"findings": [dict(data, case="c.json")], "cases": {}}, str)[0]
    assert "request 0" in row, row


def test_a_guard_overwrite_names_the_program_the_audit_saw_store_there(csr):
    """``one_more`` copies a token more per request: request 1, the row's last, stores past the row. The audit saw
    it: the finding's writers are ``request 1``, said as seen. The reference kernel leaves the guard alone."""
    case = _case([3, 2], [1, 0])
    found = TableChecker(csr, "cpu").check(bind(csr, case, "safe", "mutant:one_more"))
    guard = [f for f in found if f.kind is Kind.GUARD_OVERWRITE]
    assert guard and guard[0].writers == [(1,)], found
    assert "written by request 1: seen (the CPU address audit recorded the store)" in guard[0].detail
    lines = finding_lines(1, guard[0])
    assert "    written by: request 1 (the programs the CPU address audit saw store there)" in lines, lines
    assert "written by request 1" in guard[0].headline()
    assert not [f for f in TableChecker(csr, "cpu").check(bind(csr, case, "safe")) if f.kind is Kind.GUARD_OVERWRITE]


def test_without_the_audit_a_guard_overwrites_writer_is_inferred_and_said_so(csr):
    """No address audit (as on CUDA): nothing saw the store, so the finding says so and names the owner of the row's
    last element as an inference, never as a writer it saw (its ``writers`` stay what the found values say)."""
    case = _case([3, 2], [1, 0])
    found = TableChecker(csr, "cpu", audit=False).check(bind(csr, case, "safe", "mutant:one_more"))
    (guard,) = [f for f in found if f.kind is Kind.GUARD_OVERWRITE]
    assert "who wrote it was not observed (no address audit on this device); inferred, not seen: request 1 owns " \
           "[0, 4], the last element of the row the oracle defines" in guard.detail, guard.detail
    assert "seen (the CPU address audit" not in guard.detail and guard.extra.get("writers") is None
    assert not TableChecker(csr, "cpu", audit=False).check(bind(csr, case, "safe"))


def test_shipped_plugin_contracts_name_their_owners_and_the_draft_keeps_its_triples():
    """Every shipped contract but the draft names its owners' coordinates; the draft's stay ``(s, b, k)``, printed
    and written as before (no ``owner_names`` in its findings' data)."""
    from kvfence.engine.record_probe import drawn
    from kvfence.engine.verdict import grid_shape

    for name in registry.names():
        record = registry.get(name)
        case = drawn(record, 3, 0, {})[-1]
        launch = bind(record, case, "safe")
        names, axes = grid_shape(record, launch, record.expected(launch))
        assert (names == ()) is (name in ("draft", "window-rail")), (name, names)
        assert axes == (3 if names == () else len(names)), (name, axes)  # the draft's (s, b, k)
    draft = Finding(Kind.GUARD_OVERWRITE, "kv_indices", "guard after row 0", 0, 2, programs=[(0, 1, 0)],
                    writers=[(0, 1, 1)])
    assert "owner_names" not in draft.to_dict()
    assert "expected owners (0,1,0); written by (0,1,1)" in draft.headline()


def test_the_table_map_lists_programs_in_the_contracts_terms(csr):
    launch = bind(csr, _case([3, 2], [1, 0]), "safe", "mutant:one_more")
    found = TableChecker(csr, "cpu").check(launch)
    page = str(table_map_html(csr, launch, [f.to_dict() for f in found]))
    assert "written by request 1" in page, page
