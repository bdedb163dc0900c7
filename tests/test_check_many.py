"""The batched device path (``Session.check_many``, as fuzzing runs it) gives every case the verdict
``Session.check`` gives it alone: over batches longer than one staging chunk with buckets first needed
mid-batch (counters queued by earlier chunks must survive a later capture), and over batches with one
dirty case at a random position (the re-check of an earlier clean case must not meet the dirty case's
stray write). On the CPU under the interpreter here; on CUDA (compiled kernels in captured graphs) in
the GPU run. ``BATCH_ROWS`` is shrunk so that a handful of tiny cases spans several chunks.
"""

from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvfence.contracts.draft.device_verify as device_verify
from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.session import Session

BAD = Path(__file__).parent / "targets" / "bad_writes.py"
#: Dirty exactly in launches of more than two requests (bucket 4 here): a stray store into the tail guard.
BUCKET_DIRTY = f"{BAD}:tail_write_past_two"
#: Tiny: every interpreted launch costs milliseconds. Buckets 1, 2 and 4.
CONFIG = Config(topk=1, num_steps=2, ctx=4, max_bs=4, sizing="safe")
CHUNK = 3


def named(findings):
    return sorted((f.kind.value, f.buffer, f.region, f.start, f.stop, f.detail) for f in findings)


@st.composite
def tiny_batches(draw, *, requests=None):
    """A batch of ``CONFIG``: ``requests`` requests (1..2 by default: buckets 1 and 2) of lengths 1..4
    on distinct pool rows, and a token seed; shrinks toward one request of length 1 on row 0, seed 0."""
    requests = st.integers(1, 2) if requests is None else requests
    n = draw(requests)
    lens = draw(st.lists(st.integers(1, CONFIG.ctx), min_size=n, max_size=n))
    rows = draw(st.permutations(range(CONFIG.pool_rows)))[:n]
    return Batch(tuple(lens), tuple(rows), draw(st.integers(0, 2**20)))


@st.composite
def batches_with_one_big(draw, *, min_cases: int, max_cases: int):
    """``min_cases..max_cases`` batches of buckets 1 and 2, and one of three or four requests (bucket 4)
    at a drawn position: a bucket first needed mid-batch. Returns (batches, that position)."""
    assert 1 <= min_cases <= max_cases
    small = draw(st.lists(tiny_batches(), min_size=min_cases - 1, max_size=max_cases - 1))
    at = draw(st.integers(0, len(small)))
    big = draw(tiny_batches(requests=st.integers(3, 4)))
    return small[:at] + [big] + small[at:], at


def small_chunks():
    """Staging chunks of ``CHUNK`` rows while it lasts, so a few cases already span several chunks."""
    return mock.patch.object(device_verify, "BATCH_ROWS", CHUNK)


def verdicts_alone(device, kernel, cases):
    return [named(Session(device, kernel, verifier="device").check(c)) for c in cases]


@settings(max_examples=4)
@given(drawn=batches_with_one_big(min_cases=CHUNK + 2, max_cases=2 * CHUNK + 1))
def test_a_batch_gives_each_case_its_own_verdict(device, drawn):
    """One dirty case at a random position of a multi-chunk batch, in a bucket no earlier chunk used:
    check_many names it, with the findings it has alone, and blames no clean case (the pair: the
    reference on the same cases is clean everywhere)."""
    batches, at = drawn
    dirty = Session(device, BUCKET_DIRTY, verifier="device")
    cases = [Case(CONFIG, b, BUCKET_DIRTY) for b in batches]
    with small_chunks():
        together = [named(f) for f in dirty.check_many(cases)]
    assert dirty.stats["batches"] == 1
    assert together == verdicts_alone(device, BUCKET_DIRTY, cases)
    assert [i for i, f in enumerate(together) if f] == [at]
    assert {f[0] for f in together[at]} == {"GUARD_OVERWRITE"}
    assert not any("unrepeatable" in str(f) for f in together[at])
    clean = Session(device, "reference", verifier="device")
    with small_chunks():
        assert clean.check_many([Case(CONFIG, b) for b in batches]) == [[]] * len(batches)
    assert clean.stats["fast_clean"] == len(batches)


def test_counters_of_an_earlier_chunk_survive_a_capture_in_a_later_one(device):
    """The dirty case is in the first chunk, its bucket and then a new one (4) only in the last chunk:
    the total must still be non-zero, and the dirty case named."""
    first = Batch((2, 3, 1), (0, 1, 2), 7)  # bucket 4: dirty
    rest = [Batch((1,), (0,), s) for s in range(CHUNK)] + [Batch((2, 2), (3, 4), 9)]
    cases = [Case(CONFIG, b, BUCKET_DIRTY) for b in [first] + rest]
    session = Session(device, BUCKET_DIRTY, verifier="device")
    with small_chunks():
        verifier = session._device_verifier(session.runner(CONFIG))
        assert verifier.total_counters(cases)[device_verify.COUNTERS.index("outside")] > 0
        out = session.check_many(cases)
    assert [bool(f) for f in out] == [True] + [False] * len(rest)


def test_a_batch_longer_than_one_real_chunk(device):
    """More than the real ``BATCH_ROWS`` (64) cases with the dirty bucket first needed in the second
    chunk: the dirty case is found (it came back clean when a capture zeroed the counters)."""
    n = device_verify.BATCH_ROWS + 1
    batches = [Batch((1 + i % 4,), (i % CONFIG.pool_rows,), i) for i in range(n - 1)] + [Batch((1, 2, 3), (0, 1, 2), 3)]
    session = Session(device, BUCKET_DIRTY, verifier="device")
    out = session.check_many([Case(CONFIG, b, BUCKET_DIRTY) for b in batches])
    assert [i for i, f in enumerate(out) if f] == [n - 1]
    assert session.stats["batches"] == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_failure_fuzzing_reports_on_the_batched_path_replays_with_repro(device, seed, tmp_path):
    """Fuzzing as the GPU runs it (several batches of one config per example, checked by check_many,
    no shrinking, as the mutation self-test runs): the failure it reports is the dirty case, and its
    case file fails again under ``repro`` (the independent oracle path) with the same finding kinds."""
    import io

    from hypothesis import strategies as hst

    from kvfence.contracts.draft.record import DRAFT, launch_of
    from kvfence.contracts.draft.strategies import case_runs
    from kvfence.engine.casefile import write_case
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan
    from kvfence.engine.repro import run_repro
    from kvfence.engine.run import BoundRun

    session = Session(device, BUCKET_DIRTY, verifier="device")
    runs = case_runs(hst.just(CONFIG), kernel=BUCKET_DIRTY, max_batches=8).map(
        lambda run: BoundRun([launch_of(c) for c in run], run))  # the engine's launches, as a run binds them
    result = fuzz(session, runs, RunPlan(max_examples=40, seed=seed, shrink_seconds=0.0, targeting=False))
    assert result.case is not None and session.stats["batches"] >= 1
    assert DRAFT.runtime(result.case).launch().num_seqs == 4  # the planted bug's bucket, not a clean case blamed
    path = write_case(result.case, result.findings, out_dir=tmp_path, device=device)
    out = io.StringIO()
    assert run_repro(path, device=device, trust_case=True, in_process=True, out=out) == 1, out.getvalue()
    assert "GUARD_OVERWRITE" in out.getvalue() and "unrepeatable" not in out.getvalue()
    assert {f.kind.value for f in result.findings} == {"GUARD_OVERWRITE"}
