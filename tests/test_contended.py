"""Elements two programs store to in the production layout: a row overflow's spill landing on the next
row's write set (docs/contract.md, the verdict). Which store lands last is a race on a GPU, so the
verdict accepts any writer's value there (``kvfence.engine.verdict.with_spills``) and still names a value that is
none of them. Under the CPU interpreter programs run in grid order (row ``s + 1`` last); the launchers
of tests/targets/spills.py fix the other order and a third value."""

import dataclasses
from pathlib import Path

import pytest

from kvfence.contracts.draft import compare
from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.launches import launch_of
from kvfence.contracts.draft.record import DRAFT
from kvfence.contracts.draft.session import Session, host_verdict
from kvfence.engine.verdict import with_spills

ROOT = Path(__file__).resolve().parents[1]
SPILLS = ROOT / "tests" / "targets" / "spills.py"

#: The H200 comparison's seed-0 disagreement (sizing_one_request): rows of 28 for a launch that needs 36,
#: so rows 1 and 2 spill 2 and 5 elements into rows 2 and 3, and row 3 spills 8 into the tail guard.
SPILL_CASE = Case(Config(topk=1, num_steps=4, page_size=2, ctx=24, max_bs=3, buckets=(1, 2, 3),
                         layout="production", mode="graph",
                         sizing=f"{ROOT / 'kernels' / 'draft' / 'mutants' / 'sizing_one_request.py'}:row_width"),
                  Batch((14, 5, 5), (2, 3, 0), 450), "reference")
HOST_KNOWN = ("SIZING_VIOLATION", "kv_indices", "row 3", 28, 36)
TAIL = ("GUARD_OVERWRITE", "kv_indices", "tail", 0, 8)


def with_kernel(kernel: str) -> Case:
    return Case(SPILL_CASE.config, SPILL_CASE.batch, kernel)


def verdict(device, kernel):
    """The case's launch and its findings (``host_verdict``: the engine's verdict on the runner's buffers)."""
    obs = Session(device, kernel).observe(with_kernel(kernel))
    return obs, compare.named(host_verdict(obs))


def contended(obs):
    """The kv_indices elements ``with_spills`` accepts several values at, by flat position."""
    expected = with_spills(DRAFT.expected(launch_of(obs.case)), obs.buffers)["kv_indices"]
    return {obs.kv_indices.position(*key): value for key, value in expected.items() if isinstance(value, frozenset)}


@pytest.mark.cpu_only
def test_the_contended_elements_are_the_spills_onto_the_next_rows_write_set():
    obs = Session("cpu", "reference").observe(SPILL_CASE)
    either = contended(obs)
    kvi = obs.kv_indices
    assert sorted(either) == [kvi.position(2, e) for e in range(2)] + [kvi.position(3, e) for e in range(5)]
    assert all(len(values) == 2 for values in either.values())
    # Without the production layout's missing row guards nothing races: the redzone layout has no such element.
    redzone = Case(dataclasses.replace(SPILL_CASE.config, layout="redzone"), SPILL_CASE.batch, "reference")
    assert not contended(Session("cpu", "reference").observe(redzone))


@pytest.mark.cpu_only
def test_a_spill_that_lands_last_is_no_value_mismatch():
    """The pair's correct half: the spilling program stores last (as a GPU may order it). Its values are
    really what row 2 and 3 hold, and the verdict accepts them."""
    obs, found = verdict("cpu", f"{SPILLS}:spill_wins")
    expected = DRAFT.expected(launch_of(obs.case))["kv_indices"]
    either = contended(obs)
    in_row = {obs.kv_indices.position(*key): value for key, value in expected.items()}
    left = {f: int(obs.after["kv_indices"][f]) for f in either}
    assert all(left[f] != in_row[f] and left[f] in values for f, values in either.items())  # spills won
    assert found == sorted([HOST_KNOWN, TAIL])


@pytest.mark.cpu_only
def test_a_third_value_at_a_contended_element_is_a_value_mismatch():
    """The buggy half: neither writer's value at row 2 element 0."""
    _, found = verdict("cpu", f"{SPILLS}:spill_third_value")
    assert found == sorted([HOST_KNOWN, TAIL, ("VALUE_MISMATCH", "kv_indices", "row 2", 0, 1)])


@pytest.mark.cpu_only
def test_both_paths_agree_on_the_h200_seed_0_case():
    """The case the H200 comparison disagreed on, through both paths under the interpreter: the same
    host-known finding and tail damage, nothing racy, and the same with the spill landing last."""
    for kernel in ("reference", f"{SPILLS}:spill_wins"):
        result = compare.Paths("cpu", kernel).check(with_kernel(kernel))
        assert result.agree and not result.racy, result.problems
        assert compare.named(result.oracle) == compare.named(result.device) == sorted([HOST_KNOWN, TAIL])
