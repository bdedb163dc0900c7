"""Every finding kind, produced by a genuine bad write (a Triton store or a failing launch) in each
region, each paired with the correct kernel on the same case producing no finding."""

from pathlib import Path

import pytest

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.engine.findings import SEEN_BY_AUDIT, Kind

BAD = Path(__file__).parent / "targets" / "bad_writes.py"
BAD_VALUE = 777_777


def config(**kw):
    base = dict(topk=2, num_steps=2, page_size=1, ctx=8, max_bs=2, sizing="safe", layout="redzone", mode="graph")
    base.update(kw)
    return Config(**base)


_BATCH = Batch((5, 3), (2, 0), 11)


def run(make_session, kernel, cfg, batch=_BATCH):
    return make_session(kernel).check(Case(cfg, batch, kernel))


# (launcher, config overrides, expected kind, buffer, region)
CASES = [
    ("row_value", {}, Kind.VALUE_MISMATCH, "kv_indices", "row 0"),
    ("last_row_missing", {"topk": 1}, Kind.MISSING_WRITE, "kv_indices", "row 1"),
    ("slack_write", {}, Kind.STRAY_WRITE, "kv_indices", "row 0"),
    ("row_guard_write", {}, Kind.GUARD_OVERWRITE, "kv_indices", "guard after row 0"),
    ("front_guard_write", {}, Kind.GUARD_OVERWRITE, "kv_indices", "front guard"),
    ("tail_write", {}, Kind.GUARD_OVERWRITE, "kv_indices", "tail"),
    ("tail_write", {"layout": "production"}, Kind.GUARD_OVERWRITE, "kv_indices", "tail"),
    ("indptr_column0_write", {}, Kind.STRAY_WRITE, "kv_indptr", "row 0"),
    ("indptr_column0_zero", {}, Kind.STRAY_WRITE, "kv_indptr", "row 0"),
    ("indptr_value", {}, Kind.VALUE_MISMATCH, "kv_indptr", "row 0"),
    ("input_write", {}, Kind.STRAY_WRITE, "req_to_token", "row 0"),
]


@pytest.mark.cpu_only
@pytest.mark.parametrize("launcher, overrides, kind, buffer, region", CASES, ids=[c[0] + "-" + c[4] for c in CASES])
def test_bad_write_is_reported_where_it_landed(make_session, launcher, overrides, kind, buffer, region):
    cfg = config(**overrides)
    assert run(make_session, "reference", cfg) == []  # the correct kernel, same case: clean
    findings = run(make_session, f"{BAD}:{launcher}", cfg)
    hits = [f for f in findings if f.kind == kind and f.buffer == buffer and f.region == region]
    assert hits, f"expected {kind.value} in {buffer} {region}, got {[f.headline() for f in findings]}"
    if kind not in (Kind.MISSING_WRITE,):
        # The sample shows the value the bad store wrote (into an input too: the element the verdict names).
        written = 0 if launcher == "indptr_column0_zero" else BAD_VALUE
        assert any(found == written for f in hits for _, _, found in f.samples)
    # Nothing else is blamed: the one bad store (or missing row) is the only finding besides its
    # kv_indptr twin for the missing row.
    others = [f for f in findings if f not in hits]
    if launcher == "last_row_missing":
        assert [(f.kind, f.buffer, f.region) for f in others] == [(Kind.MISSING_WRITE, "kv_indptr", "row 1")]
    else:
        assert others == []


@pytest.mark.cpu_only
def test_missing_write_attributes_the_programs_of_the_row(make_session):
    findings = run(make_session, f"{BAD}:last_row_missing", config(topk=1))
    missing = next(f for f in findings if f.kind == Kind.MISSING_WRITE)
    assert missing.programs == [(1, 0, 0), (1, 1, 0)]
    # Row 1 uses topk*sum(L) + bs*2 = 8 + 4 = 12 elements, all unwritten (still poison).
    assert (missing.start, missing.stop) == (0, 12)
    assert all(found == -1 for _, _, found in missing.samples)


@pytest.mark.cpu_only
def test_failing_launch_is_a_launch_error(make_session):
    assert run(make_session, "reference", config()) == []
    findings = run(make_session, f"{BAD}:bad_uppers", config())
    assert [f.kind for f in findings] == [Kind.LAUNCH_ERROR]
    assert findings[0].detail


@pytest.mark.parametrize("layout, damage_region", [("redzone", "guard after row 0"), ("production", "tail")])
def test_sizing_violation_is_known_before_launch_and_its_damage_is_seen(make_session, layout, damage_region):
    """The ``prefix`` overflow: pre-fix CUDA-graph sizing (no topk factor) with long requests."""
    batch = Batch((8, 7), (1, 2), 3)
    assert run(make_session, "reference", config(sizing="safe", layout=layout), batch) == []
    findings = run(make_session, "reference", config(sizing="prefix", layout=layout), batch)
    violation = [f for f in findings if f.kind == Kind.SIZING_VIOLATION]
    # need = topk*sum(L) + bs*num_steps = 2*15 + 4*2 = 38 > width = max_bs*ctx = 16
    assert len(violation) == 1 and "need 38 > width 16" in violation[0].detail
    assert any(f.kind == Kind.GUARD_OVERWRITE and f.region == damage_region for f in findings)


def test_production_layout_row_overflow_is_hidden_in_the_next_row_but_the_tail_shows(make_session):
    """With contiguous rows the overflow of row s lands inside row s+1, which row s+1's programs then
    overwrite; only the last row's overflow reaches memory outside the buffer (the tail guard)."""
    batch = Batch((8, 7), (1, 2), 3)
    findings = run(make_session, "reference", config(sizing="prefix", layout="production"), batch)
    guard_regions = {f.region for f in findings if f.kind == Kind.GUARD_OVERWRITE}
    assert guard_regions == {"tail"}
    tail = next(f for f in findings if f.region == "tail")
    # Row 1's overflow: need 38 - width 16 = 22 elements. Row 0 (U(0) = 34 > 2 rows of 16) reaches
    # the tail too, so its last program wrote there beside the last row's: on the CPU the address audit saw both
    # store (the engine's verdict: ``writers``, seen); on CUDA the writers are inferred from the values found.
    assert tail.count == 22
    if tail.extra.get("writers") == SEEN_BY_AUDIT:
        assert (1, 1, 1) in tail.writers and (0, 1, 1) in tail.writers
        assert {s for s, _, _ in tail.writers} == {0, 1}
    else:
        assert tail.writers and {s for s, _, _ in tail.writers} <= {0, 1}
