"""The engine's verdict on a table kept between launches (the draft's CUDA-graph runner keeps its buffers between
replays, docs/contract.md §4): each row element is judged against what it held before the launch, not against a
fresh table's poison, on the fast path and the plain walk alike. An element the oracle leaves alone that still holds
an earlier launch's value is no stray write; an element the oracle defines that the launch left as it was is a
missing write, whatever an earlier launch put there."""

from kvfence.contract import Launch, Table
from kvfence.engine import tables as guarded
from kvfence.engine.verdict import clean, verdict


class OneRow:
    """A stand-in record: one row of four, the oracle defining its first two elements."""

    name = "one-row"

    def tables(self, launch):
        return [Table("out", 4, 1)]

    def expected(self, launch):
        return {"out": {(0, 0): 5, (0, 1): 6}}

    def owner(self, launch, table, row, column):
        return (column,)


def _judged(writes):
    """The findings ``(kind, start, stop)`` of a launch storing ``writes`` (column -> value) into a table an earlier
    launch left 9 in column 1 and 7 in column 3: on the fast path, on the plain walk, and ``clean``."""
    record, launch = OneRow(), Launch("one-row", None, 4, "safe")
    buffers = guarded.allocate_all(record.tables(launch), "cpu")
    g = buffers["out"]
    g.flat[g.position(0, 1)], g.flat[g.position(0, 3)] = 9, 7
    before = guarded.snapshot(buffers)
    for column, value in writes.items():
        g.flat[g.position(0, column)] = value
    after = guarded.snapshot(buffers)
    named = [[(f.kind.value, f.start, f.stop) for f in verdict(record, launch, buffers, before, after, every_element=e)]
             for e in (False, True)]
    return named, clean(buffers, before, after, record.expected(launch))


def test_a_correct_launch_over_an_earlier_launchs_values_is_clean():
    (fast, plain), is_clean = _judged({0: 5, 1: 6})
    assert fast == plain == [] and is_clean


def test_an_element_left_as_an_earlier_launch_wrote_it_is_a_missing_write_and_a_changed_one_a_stray_write():
    (fast, plain), is_clean = _judged({0: 5, 3: 8})
    assert not is_clean
    assert fast == plain == [("MISSING_WRITE", 1, 2), ("STRAY_WRITE", 3, 4)]
