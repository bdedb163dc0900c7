"""The slot-mapping self-test under a GPU's conditions, on the CPU (issue 65).

On an H100 two planted bugs escaped that the CPU catches: a read only the interpreter's address audit saw (CUDA
audits no address) and an overlap of two programs' stores that the interpreter's program order decided (it runs
the grid in order, so the last program's store landed last; on a GPU that program, with one load before its
stores, stores first and the request's own store wins). Here the audit is off and the programs of each group run
in reverse order (the last program first): every planted bug must still change an output element, and the
reference stay clean.
"""

from __future__ import annotations

import pytest

from kvfence.contracts.slot_mapping.case import Group, SlotCase
from kvfence.engine import registry
from kvfence.engine.launch import bind

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

NAME = "slot-mapping"
RECORD = registry.get(NAME)


@pytest.fixture
def last_program_first(monkeypatch):
    """Triton's interpreter runs program ``(g, b)`` for ``b`` from the last to the first (``set_grid_idx`` is
    where it names the program it runs next)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    in_order = builder.set_grid_idx
    monkeypatch.setattr(builder, "set_grid_idx", lambda x, y, z: in_order(x, builder.grid_dim[1] - 1 - y, z))


def _check(case: SlotCase, kernel: str):
    from kvfence.engine import kernels
    from kvfence.engine.checking import check_launch

    launch = bind(RECORD, case, "safe", kernel, "eager")
    return check_launch(RECORD, kernels.resolve(RECORD, kernel), launch, "cpu", audit=False)


def test_a_dummy_requests_row_read_is_poison_in_its_slot_without_the_audit():
    """A row of 640 blocks (block size 1): row -1 starts 640 elements before the table, past the engine's front
    guard of 64; the guard row before the first row holds it, so the slot the read makes is poison."""
    case = SlotCase(ctx=640, groups=(Group(1),), req_rows=(0, -1), starts=(5, 7), query_lens=(2, 3),
                    table_rows=1).validate()
    found = _check(case, "mutant:dummy_row_read")
    assert {f.kind.value for f in found} == {"POISON_READ"}, found
    assert all(f.buffer == "slot_mappings" for f in found)
    assert _check(case, "reference") == []


def test_every_mutant_changes_an_output_with_the_audit_off_and_the_last_program_first(last_program_first):
    """The self-test on one seed, in this process (so the interpreter's order is the fixture's), audit off."""
    from kvfence.selftest.mutants import self_test

    report = self_test(RECORD, "cpu", seeds=[0], max_examples=60, audit=False, isolate=False)
    rows = {r["name"]: r for r in report["rows"]}
    assert rows[f"reference ({NAME})"]["passed"], rows[f"reference ({NAME})"]
    missed = [m.name for m in RECORD.mutants if rows[m.name]["detections"] != 1]
    assert not missed, {n: rows[n]["runs"] for n in missed}
    assert report["passed"]


def test_the_self_test_budget_is_the_contracts_per_domain(monkeypatch):
    """Without ``--max-examples`` each row runs the examples its contract declares for the domain it draws from
    (on CUDA a CPU-domain bug draws from the CPU domain, so it gets the CPU domain's budget, not the GPU's): a
    contract declaring 3 on the CPU domain runs its clean reference 3 examples a seed; the draft kernel's GPU
    examples (runs of 32 batches) keep 150; a bad declaration is one line."""
    from kvfence.contracts.draft.record import DRAFT
    from kvfence.errors import BadInput
    from kvfence.selftest.mutants import budget, self_test

    assert (budget(RECORD, "cpu"), budget(RECORD, "gpu"), budget(DRAFT, "gpu")) == (60, 16, 150)
    monkeypatch.setattr(RECORD, "selftest_examples", {"cpu": 3}, raising=False)
    assert budget(RECORD, "gpu") == 16
    report = self_test(RECORD, "cpu", seeds=[0, 1], names=["sizing_block_floor"], isolate=False)
    reference = next(r for r in report["rows"] if r["reference"])
    assert [r["examples"] for r in reference["runs"]] == [3, 3]
    monkeypatch.setattr(RECORD, "selftest_examples", {"cpu": 0}, raising=False)
    with pytest.raises(BadInput, match=r"selftest_examples\['cpu'\] must be a positive integer"):
        budget(RECORD, "cpu")


def test_a_record_with_a_bad_budget_is_named_by_the_static_check(monkeypatch):
    from kvfence.engine.record_check import static_problems

    assert not [p for p in static_problems(NAME, NAME, RECORD) if "selftest_examples" in p]
    monkeypatch.setattr(RECORD, "selftest_examples", {"gpu": 0, "tpu": 3}, raising=False)
    assert [p for p in static_problems(NAME, NAME, RECORD) if p.startswith("selftest_examples must map domains")]
