"""An input table's rows owned by programs (``Table.row_owners``, issue 67): the contract declares that the program
of index ``b`` on a grid axis reads row ``rows[b]`` only, and the engine's CPU address audit
(``Audit.register_table``) reports a read of another row as ``OOB_READ``, in the table, "outside own row"; the same
table without the declaration is one block (any row may be read). A malformed declaration is one line."""

from __future__ import annotations

from typing import List, Optional, Tuple

import pytest

from kvfence.contract import Table
from kvfence.engine import tables as guarded
from kvfence.engine.audit import Audit
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.record_check import shape_problems

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

WIDTH = 4
#: Program ``b`` owns pool row ``POOL_ROWS[b]`` (out of order, as requests' pool rows are).
POOL_ROWS = (2, 0, 1)


def _copy_rows(by_owner: bool, owners: Optional[Tuple[int, Tuple[int, ...]]]) -> Tuple[List[Finding], list]:
    """Each program ``b`` copies a row of ``pool`` to ``out[b]``: its own (``pool[rows[b]]``, the correct kernel)
    or ``pool[b]`` (the bug: another request's row). The audit's findings and the copied rows."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_row(pool, rows, out, pool_stride, out_stride, BY_OWNER: tl.constexpr, W: tl.constexpr):
        b = tl.program_id(0)
        row = tl.load(rows + b) if BY_OWNER else b
        cols = tl.arange(0, W)
        tl.store(out + b * out_stride + cols, tl.load(pool + row * pool_stride + cols))

    pool_rows = [[10 * r + c for c in range(WIDTH)] for r in range(3)]
    buffers = guarded.allocate_all([
        Table("pool", WIDTH, 3, "input", pool_rows, row_owners=owners),
        Table("rows", len(POOL_ROWS), None, "input", list(POOL_ROWS)),
        Table("out", WIDTH, len(POOL_ROWS))], "cpu")
    audit = Audit()
    for g in buffers.values():
        audit.register_table(g)
    pool, out = buffers["pool"], buffers["out"]
    with audit:
        copy_row[(len(POOL_ROWS),)](pool.view, buffers["rows"].view, out.view, pool.stride, out.stride,
                                    BY_OWNER=by_owner, W=WIDTH)
    return audit.findings(), out.view.tolist()


def test_a_read_of_a_row_the_program_does_not_own_is_an_oob_read():
    owners = (0, POOL_ROWS)
    found, copied = _copy_rows(True, owners)
    assert found == [] and copied == [[10 * r + c for c in range(WIDTH)] for r in POOL_ROWS]
    found, _ = _copy_rows(False, owners)
    # Programs 0 and 1 read rows 0 and 1, which programs 1 and 2 own; program 2 reads row 2, program 0's.
    assert {(f.kind, f.buffer) for f in found} == {(Kind.OOB_READ, "pool")}
    assert all(f.region.startswith("outside own row") for f in found), found
    assert sorted(p for f in found for p in f.programs) == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]


def test_without_the_declaration_any_row_may_be_read():
    assert _copy_rows(False, None)[0] == []


@pytest.mark.parametrize("owners, problem", [
    ((3, (0, 1)), "row_owners must be"),
    ((0, [0, 1]), "row_owners must be"),
    ((0, (0, 3)), "outside the table's 3"),
])
def test_a_malformed_declaration_is_one_line(owners, problem):
    table = Table("pool", WIDTH, 3, "input", [[0] * WIDTH] * 3, row_owners=owners)
    assert [p for p in shape_problems(table) if problem in p], shape_problems(table)
    assert shape_problems(Table("out", WIDTH, 3, row_owners=(0, (0,)))) == [
        "row_owners is for an input table (who may read which row)"]
