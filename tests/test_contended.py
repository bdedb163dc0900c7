"""Elements two programs store to in the production layout: a row overflow's spill landing on the next
row's write set (docs/contract.md, the verdict). Which store lands last is a race on a GPU, so the
verdict accepts any writer's value there (``ExpectedWrites.either``) and still names a value that is
none of them. Under the CPU interpreter programs run in grid order (row ``s + 1`` last); the launchers
of tests/targets/spills.py fix the other order and a third value."""

from pathlib import Path

import pytest

from kvfence.contracts.draft import compare
from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.fastcheck import expected_writes_torch
from kvfence.contracts.draft.session import Session
from kvfence.contracts.draft.verdict import check, expected_from_oracle

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


def verdicts(device, kernel):
    """The case's findings through the plain oracle's write set and through the torch builder's."""
    obs = Session(device, kernel).observe(with_kernel(kernel))
    return obs, compare.named(check(obs)), compare.named(check(obs, expected_writes_torch(obs)))


@pytest.mark.cpu_only
def test_the_contended_elements_are_the_spills_onto_the_next_rows_write_set():
    obs = Session("cpu", "reference").observe(SPILL_CASE)
    either = expected_from_oracle(obs).either
    kvi = obs.kv_indices
    assert sorted(either) == [kvi.flat_index(2, e) for e in range(2)] + [kvi.flat_index(3, e) for e in range(5)]
    assert all(len(values) == 2 for values in either.values())
    assert expected_writes_torch(obs).either == either


@pytest.mark.cpu_only
def test_a_spill_that_lands_last_is_no_value_mismatch():
    """The pair's correct half: the spilling program stores last (as a GPU may order it). Its values are
    really what row 2 and 3 hold, and both write-set builders accept them."""
    obs, plain, torch_built = verdicts("cpu", f"{SPILLS}:spill_wins")
    expected = expected_from_oracle(obs)
    in_row = dict(zip(expected.indices_pos.tolist(), expected.indices_val.tolist()))
    left = {f: int(obs.after["kv_indices"][f]) for f in expected.either}
    assert all(left[f] != in_row[f] and left[f] in values for f, values in expected.either.items())  # spills won
    assert plain == torch_built == sorted([HOST_KNOWN, TAIL])


@pytest.mark.cpu_only
def test_a_third_value_at_a_contended_element_is_a_value_mismatch():
    """The buggy half: neither writer's value at row 2 element 0."""
    _, plain, torch_built = verdicts("cpu", f"{SPILLS}:spill_third_value")
    assert plain == torch_built == sorted([HOST_KNOWN, TAIL, ("VALUE_MISMATCH", "kv_indices", "row 2", 0, 1)])


@pytest.mark.cpu_only
def test_both_paths_agree_on_the_h200_seed_0_case():
    """The case the H200 comparison disagreed on, through both paths under the interpreter: the same
    host-known finding and tail damage, nothing racy, and the same with the spill landing last."""
    for kernel in ("reference", f"{SPILLS}:spill_wins"):
        result = compare.Paths("cpu", kernel).check(with_kernel(kernel))
        assert result.agree and not result.racy, result.problems
        assert compare.named(result.oracle) == compare.named(result.device) == sorted([HOST_KNOWN, TAIL])
