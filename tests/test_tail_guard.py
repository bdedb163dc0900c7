"""An output table's tail guard holds what its launch can store past the last row within the contract's bounds
(issue 67): one whole row with its guard, or the launch's spill (``need - width``) where longer. A store there
lands in kvfence's own guard and is a ``GUARD_OVERWRITE`` in the ``tail``, never a write past the allocation into
another tensor; the memory budget (``table_bytes``) counts those tails. Cheap: tensors on the CPU, no kernel."""

from typing import Dict, List

import pytest

from kvfence.contract import Launch, Table
from kvfence.engine import tables as guarded
from kvfence.engine.budget import table_bytes
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.launch import spill
from kvfence.engine.verdict import verdict

ROWS = 3
#: Wider than ``GUARD``: a row past the last one does not fit a 64-element tail.
WIDTH = 200


class Spilling:
    """A stand-in record: one output table of ``ROWS`` rows, the launch's width each; ``need`` from its case."""

    name = "spilling"

    def tables(self, launch: Launch) -> List[Table]:
        return [Table("out", launch.width, ROWS), Table("lengths", ROWS, role="input", contents=[1] * ROWS)]

    def need(self, launch: Launch) -> int:
        return int(launch.case)

    def expected(self, launch: Launch) -> Dict[str, Dict]:
        return {"out": {(r, c): r for r in range(ROWS) for c in range(launch.width)}, "lengths": {}}

    def owner(self, launch: Launch, table: str, row: int, column: int) -> tuple:
        return (row,)


def _stored_past_the_last_row(launch: Launch, columns: range) -> List[Finding]:
    """The verdict after a "kernel" wrote every row right and also ``columns`` of the row after the last, by the
    table's row stride, as a kernel computing ``row * stride + column`` does (an ``IndexError`` past the
    allocation)."""
    record = Spilling()
    buffers = guarded.allocate_all(record.tables(launch), "cpu", layout=launch.layout,
                                   spill=spill(record, launch))
    before = guarded.snapshot(buffers)
    g = buffers["out"]
    for (r, c), v in record.expected(launch)["out"].items():
        g.flat[g.position(r, c)] = v
    for c in columns:
        g.flat[g.position(ROWS, c)] = 7
    return verdict(record, launch, buffers, before, guarded.snapshot(buffers))


@pytest.mark.parametrize("layout", ["redzone", "production"])
def test_a_whole_row_past_the_last_one_lands_in_the_tail_guard(layout):
    launch = Launch("spilling", WIDTH, WIDTH, "safe", layout=layout)
    found = _stored_past_the_last_row(launch, range(WIDTH))
    assert [(f.kind, f.buffer, f.region) for f in found] == [(Kind.GUARD_OVERWRITE, "out", "tail")]
    assert not _stored_past_the_last_row(launch, range(0))  # the correct launch: nothing


def test_the_tail_holds_the_launchs_spill_when_it_is_longer_than_a_row():
    """need = 3 x width: a correct kernel under this too-narrow sizing stores 2 x width past each row; the last
    row's spill stays inside the tail."""
    launch = Launch("spilling", 3 * WIDTH, WIDTH, "bad", layout="production")
    assert spill(Spilling(), launch) == 2 * WIDTH
    found = _stored_past_the_last_row(launch, range(2 * WIDTH))
    assert {(f.kind, f.region) for f in found} == {(Kind.GUARD_OVERWRITE, "tail")}


def test_only_output_tails_grow_and_no_absorb_keeps_none():
    out, inp = Table("out", WIDTH, ROWS), Table("in", WIDTH, ROWS, role="input", contents=[[0] * WIDTH] * ROWS)
    assert guarded.tail_guard(out) == guarded.GUARD + WIDTH + guarded.GUARD
    assert guarded.tail_guard(out, layout="production") == guarded.GUARD + WIDTH
    assert guarded.tail_guard(out, spill=5000) == guarded.GUARD + 5000
    assert guarded.tail_guard(inp, spill=5000) == guarded.GUARD
    assert guarded.tail_guard(out, layout="production", absorb=False, spill=5000) == 0
    g = guarded.allocate(out, "cpu", spill=5000)
    assert g.tail == guarded.GUARD + 5000 and g.flat.numel() == guarded.allocated_elements(out, spill=5000)


def test_the_memory_budget_counts_every_allocated_element():
    record = Spilling()
    for case in (WIDTH, 3 * WIDTH):
        launch = Launch("spilling", case, WIDTH, "safe")
        buffers = guarded.allocate_all(record.tables(launch), "cpu", spill=spill(record, launch))
        held = sum(g.flat.numel() * g.flat.element_size() for g in buffers.values())
        assert table_bytes(record, launch) == held, case
