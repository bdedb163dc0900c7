"""The engine's verdict walks each output table by its own width: a launch's tables need not share the row width
its sizing gave (the draft's kv_indptr, FA3's 1-D outputs, the slot mapping), and an element past the launch's
width that the oracle defines and the kernel left unwritten is a MISSING_WRITE, on the fast path and the plain
walk alike."""

from kvfence.contract import Launch, Table
from kvfence.engine import tables as guarded
from kvfence.engine.verdict import clean, verdict


class TwoWidths:
    """A stand-in record: a row table as wide as the launch, and a 1-D table three elements wider."""

    name = "two-widths"

    def tables(self, launch):
        return [Table("rows", launch.width, 1), Table("offsets", launch.width + 3)]

    def expected(self, launch):
        return {"rows": {(0, c): 10 + c for c in range(launch.width)},
                "offsets": {(0, c): c for c in range(launch.width + 3)}}

    def owner(self, launch, table, row, column):
        return (column,)


def _run(kernel_writes_everything: bool):
    record, launch = TwoWidths(), Launch("two-widths", None, 2, "safe")
    buffers = guarded.allocate_all(record.tables(launch), "cpu")
    before = guarded.snapshot(buffers)
    expected = record.expected(launch)
    for name, cells in expected.items():  # the "kernel": every element but, maybe, the last offset
        g = buffers[name]
        for (r, c), v in cells.items():
            if kernel_writes_everything or (name, c) != ("offsets", launch.width + 2):
                g.flat[g.position(r, c)] = v
    after = guarded.snapshot(buffers)
    fast = verdict(record, launch, buffers, before, after)
    plain = verdict(record, launch, buffers, before, after, every_element=True)
    return fast, plain, clean(buffers, before, after, expected)


def test_an_unwritten_element_past_the_launch_width_is_a_missing_write_on_both_paths():
    fast, plain, is_clean = _run(kernel_writes_everything=False)
    assert not is_clean
    for findings in (fast, plain):
        assert [(f.kind.value, f.buffer, f.start, f.stop) for f in findings] == [("MISSING_WRITE", "offsets", 4, 5)]


def test_the_correct_kernel_is_clean_on_both_paths():
    fast, plain, is_clean = _run(kernel_writes_everything=True)
    assert fast == plain == [] and is_clean
