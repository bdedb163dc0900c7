"""The device verifier against the full verdict: its counters must be zero exactly when the full verdict (the
engine's, ``kvfence.contracts.draft.session.host_verdict``) finds nothing, and a batched device path must name what
the oracle path names (on CPU under the interpreter here, on CUDA in the GPU run)."""

from pathlib import Path

import pytest
import triton
import triton.language as tl
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.device_verify import DeviceVerifier
from kvfence.contracts.draft.session import Session
from kvfence.contracts.draft.strategies import batches, configs
from kvfence.engine.findings import Kind
from kvfence.kernels.draft.verify.slots import slot_ids

BAD = Path(__file__).parent / "targets" / "bad_writes.py"


@triton.jit
def eval_slot_ids(index, seeds, out, N: tl.constexpr):
    j = tl.arange(0, N)
    tl.store(out + j, slot_ids(tl.load(index + j), tl.load(seeds + j)))


#: Sizings whose rows are too narrow for some launches: a row overflow spills into the next row.
MUTANTS = Path(__file__).resolve().parents[1] / "kernels" / "draft" / "mutants"
OVERFLOWING = ["prefix", f"{MUTANTS / 'sizing_one_request.py'}:row_width",
               f"{MUTANTS / 'sizing_missing_topk.py'}:row_width"]


@st.composite
def overflowing_cases(draw):
    """A production-layout graph-mode case whose rows are too narrow (``need > width``), so a step row's
    spill lands on the next row's write set: shrinks toward the smallest config and batch that overflow."""
    config = draw(configs(sizing=draw(st.sampled_from(OVERFLOWING)), layout="production", mode="graph"))
    case = Case(config, draw(batches(config)))
    sizing = case.sizing_summary()
    assume(sizing["need"] > sizing["width"])
    return case


@settings(max_examples=6)
@given(data=st.data())
def test_the_batched_device_path_equals_the_oracle_on_production_spills(device, data):
    """A run of one overflowing config through ``Session.check_many`` on the device path names exactly what the
    oracle path names, case by case: kind, buffer, region,
    element range, programs and detail. Not the sampled values: where several programs spill into one
    guard element (past the last row), which of their values is found there is the GPU's race (seen on
    the H200), and each path samples its own launch."""
    first = data.draw(overflowing_cases())
    run = [first] + [Case(first.config, data.draw(batches(first.config))) for _ in range(2)]
    batched = Session(device, "reference", verifier="device").check_many(run)
    oracle = Session(device, "reference", verifier="oracle")

    def named(findings):
        return sorted((f.kind.value, f.buffer, f.region, f.start, f.stop, tuple(f.programs), f.detail)
                      for f in findings)

    assert [named(fs) for fs in batched] == [named(oracle.check(c)) for c in run]


def device_session(device, kernel):
    return Session(device, kernel, verifier="device")


@settings(max_examples=15)
@given(data=st.data())
def test_device_verifier_is_clean_exactly_when_the_reference_is(device, data):
    config = data.draw(configs(sizing="safe", layout=data.draw(st.sampled_from(["redzone", "production"]))))
    case = Case(config, data.draw(batches(config)))
    session = device_session(device, "reference")
    runner = session.runner(config)
    assert DeviceVerifier(runner).counters(case) == [0, 0, 0, 0]
    assert session.check(case) == [] and session.stats["fast_clean"] == 1


COUNTER_FOR = {  # bad launcher -> the counter that must see it
    "row_value": 0, "last_row_missing": 0, "slack_write": 2, "row_guard_write": 2, "front_guard_write": 2,
    "tail_write": 2, "indptr_column0_write": 2, "indptr_column0_zero": 2, "indptr_value": 1, "input_write": 3,
}


@pytest.mark.parametrize("launcher, counter", sorted(COUNTER_FOR.items()))
def test_device_verifier_counts_each_bad_write_and_the_full_path_names_it(device, launcher, counter):
    config = Config(topk=1 if launcher == "last_row_missing" else 2, num_steps=2, ctx=8, max_bs=2, sizing="safe")
    case = Case(config, Batch((5, 3), (2, 0), 11))
    good = device_session(device, "reference")
    assert good.check(case) == []
    bad = device_session(device, f"{BAD}:{launcher}")
    counts = DeviceVerifier(bad.runner(config)).counters(case)
    assert counts[counter] > 0, counts
    findings = bad.check(case)
    assert findings and bad.stats["full"] == 1
    assert {f.kind for f in findings} == {f.kind for f in Session(device, f"{BAD}:{launcher}").check(case)}


def assert_device_counts(device, config, case, launcher, counter):
    """The device verifier on ``case`` with ``launcher`` (a bad write of tests/targets/bad_writes.py, or
    the reference): all counters zero for the reference, counter ``counter`` non-zero otherwise."""
    spec = "reference" if launcher == "reference" else f"{BAD}:{launcher}"
    counts = DeviceVerifier(device_session(device, spec).runner(config)).counters(case)
    if counter is None:
        assert counts == [0, 0, 0, 0]
    else:
        assert counts[counter] > 0, counts


@pytest.mark.parametrize("launcher, counter", [("reference", None), ("indptr_last_column", 1), ("slack_write", 2)])
def test_device_verifier_on_more_branches_than_one_verify_block(device, launcher, counter):
    """600 branches: kv_indptr's prefix sum spans several verifier pieces (kernels/verify/indptr.py), and
    the reference stays clean while a wrong total in the last column is counted."""
    config = Config(topk=8, num_steps=1, ctx=2, max_bs=75, sizing="safe", buckets=(75,))
    case = Case(config, Batch(tuple(1 + i % 2 for i in range(75)), tuple(range(75)), 5))
    assert_device_counts(device, config, case, launcher, counter)


@pytest.mark.parametrize("launcher, counter", [("reference", None), ("row_value", 0), ("last_row_missing", 0)])
def test_device_verifier_on_segments_across_verify_blocks(device, launcher, counter):
    """Segments of 1,400 and 700 tokens cross the verifier's 1,024-element aligned pieces
    (kernels/verify/segments.py) at different offsets: clean stays clean, a wrong or missing value counts."""
    config = Config(topk=1 if launcher == "last_row_missing" else 2, num_steps=2, ctx=1500, max_bs=2, sizing="safe")
    case = Case(config, Batch((1400, 700), (2, 0), 9))
    assert_device_counts(device, config, case, launcher, counter)


@pytest.mark.parametrize("programs", [256, 4])
@pytest.mark.parametrize("launcher, counter", [("reference", None), ("slack_write", 2), ("tail_write", 2)])
def test_device_verifier_on_rows_of_many_outside_blocks(device, launcher, counter, programs, monkeypatch):
    """Rows of 22,400 columns (22 blocks): the outside check (kernels/verify/outside.py) reads each
    row's slack from its first unwritten column with up to ``PROGRAMS_PER_ROW`` programs, each taking
    every P-th block; with 4 programs each loops over several blocks. A write at the end of the slack
    and one into the tail are still counted, and the reference stays clean."""
    import kvfence.kernels.draft.verify.outside as outside

    monkeypatch.setattr(outside, "PROGRAMS_PER_ROW", programs)
    config = Config(topk=8, num_steps=1, ctx=700, max_bs=4, sizing="safe")
    assert config.row_width(4) > 16 * outside.BLOCK_ELEMENTS
    case = Case(config, Batch((3, 1, 2), (0, 2, 1), 4))
    assert_device_counts(device, config, case, launcher, counter)


def test_sizing_violation_skips_the_fast_path(device):
    config = Config(topk=2, num_steps=2, ctx=8, max_bs=2, sizing="prefix")
    session = device_session(device, "reference")
    findings = session.check(Case(config, Batch((8, 7), (1, 2), 3)))
    assert Kind.SIZING_VIOLATION in {f.kind for f in findings}
    assert (session.stats["fast_clean"], session.stats["full"]) == (0, 1)


@pytest.mark.cpu_only
def test_verifier_slot_ids_equal_the_case_model_in_32_bit_arithmetic():
    """kernels/verify/slots.py computes slot ids with wrapping 32-bit products; they must equal
    kvfence.contracts.draft.case.slot_id (defined on unbounded integers) for any index and seed, large ones included."""
    import torch

    from kvfence.contracts.draft.tokens import slot_id

    pairs = [(0, 0), (1, 0), (7, 2**30 - 1), (2**31 - 1, 12345), (2**31, 99), (2**32 + 5, 2**29), (2**33 + 77, 7),
             (123456789, 987654321 % 2**30)] + [(i * 104729 + 3, (i * 7919) % 2**30) for i in range(8)]
    index = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    seeds = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    out = torch.zeros(len(pairs), dtype=torch.int32)
    eval_slot_ids[(1,)](index, seeds, out, N=len(pairs))
    assert out.tolist() == [slot_id(seed, i) for i, seed in pairs]
