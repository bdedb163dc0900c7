"""The fast structural generator: ``case_runs(bulk=N)`` draws the bulk of an example's batches with the
batch draw code fed by a seeded PRNG (``kvfence.contracts.draft.strategies.FastDraw``), and every failure it finds is
spliced back into a Hypothesis example and shrunk there (``kvfence.engine.loop``).

No kernel runs here except in the command-line tests (tiny configs under the interpreter); the rest
checks the strategies through Hypothesis's own choice replay and the fuzz loop through stub sessions.
"""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture.data import ConjectureData

from kvfence.contracts.draft.batch_draws import composite_batch, draw_batch, seq_len_bound
from kvfence.contracts.draft.fastdraw import FAST_SPEC, FastDraw, UnregisteredStrategy
from kvfence.contracts.draft.record import launch_of
from kvfence.contracts.draft.strategies import CaseRun, case_runs, configs
from kvfence.engine import launch as launches
from kvfence.engine import registry
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.loop import fuzz
from kvfence.engine.plan import RunPlan
from kvfence.engine.result import SPLICE_REPLAYED, config_key, read_key, structure_key
from kvfence.engine.run import BoundRun
from kvfence.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
PINNED = dict(topk=2, num_steps=3, page_size=1, ctx=512, max_bs=16)
#: Config strategies of both domains: the CPU's with the §6 fields (TRANSLATE draws a page-table seed),
#: the GPU's production sizes (lengths through ``sized``, padded buckets), and the pinned GPU config.
CONFIG_STRATEGIES = {"cpu-family": configs(family=True), "gpu-domain": configs(domain="gpu", max_bytes=2**30),
                     "gpu-domain-family": configs(domain="gpu", max_bytes=2**30, family=True),
                     "pinned": configs(**PINNED)}
FAST = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("domain", sorted(CONFIG_STRATEGIES))
@FAST
@given(data=st.data())
def test_every_strategy_the_batch_code_draws_is_registered(domain, data):
    """Under Hypothesis, every strategy ``draw_batch`` draws carries a ``FastDraw`` spec."""
    config = data.draw(CONFIG_STRATEGIES[domain])
    drawn = []

    def draw(strategy):
        drawn.append(strategy)
        return data.draw(strategy)

    draw_batch(draw, config, config.ctx, 1)
    unregistered = [s for s in drawn if getattr(s, FAST_SPEC, None) is None]
    assert drawn and not unregistered, unregistered


def test_an_unregistered_strategy_is_a_clear_error():
    with pytest.raises(UnregisteredStrategy, match="cannot draw text"):
        FastDraw(random.Random(0))(st.text())


@pytest.mark.parametrize("domain", sorted(CONFIG_STRATEGIES))
@FAST
@given(data=st.data(), seed=st.integers(0, 2**64 - 1))
def test_a_bulk_batch_is_what_hypothesis_draws_from_its_recorded_choices(domain, data, seed):
    """The splice property at the batch level: the recorded choices, replayed by Hypothesis through
    the strategy ``batches`` uses, give the same batch (lengths, rows, token and page-table seeds)."""
    config = data.draw(CONFIG_STRATEGIES[domain])
    bound = seq_len_bound(config, "ctx")
    source = FastDraw(random.Random(seed))
    batch = draw_batch(source, config, bound, 1)
    replay = ConjectureData.for_choices(tuple(source.choices))
    assert replay.draw(composite_batch(config, bound, 1)) == batch
    assert len(replay.nodes) == len(source.choices)  # every recorded choice used, no other


def _examples(strategy, n: int, seed: int = 0):
    """``n`` examples of ``strategy`` as Hypothesis generates them."""
    out = []

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example):
        out.append(example)

    from hypothesis import seed as hyp_seed

    hyp_seed(seed)(collect)()
    return out


@pytest.mark.parametrize("domain", sorted(CONFIG_STRATEGIES))
def test_a_spliced_example_is_its_bulk_case_alone(domain):
    """``CaseRun.splice(i)`` replayed by Hypothesis through the same strategy is ``[run[i]]``; bulk
    structures are new within the example (against the Hypothesis-drawn batches too)."""
    strategy = case_runs(CONFIG_STRATEGIES[domain], max_batches=4, bulk=12)
    spliced = 0
    for run in _examples(strategy, 25):
        assert isinstance(run, CaseRun) and len(run) <= run.bulk_start + 12
        if run[0].config.is_family:
            assert len(run) == run.bulk_start  # a §6 config is verified on the host: never a bulk
            continue
        shapes = [(c.batch.seq_lens, c.batch.req_pool_indices) for c in run]
        assert len(set(shapes[run.bulk_start:])) == len(run) - run.bulk_start
        assert not set(shapes[run.bulk_start:]) & set(shapes[:run.bulk_start])
        assert {c.config for c in run} == {run[0].config}
        for i in range(run.bulk_start, len(run)):
            again = ConjectureData.for_choices(run.splice(i)).draw(strategy)
            assert list(again) == [run[i]] and again.bulk_start == 1
            spliced += 1
    assert spliced > 25 or domain.endswith("family")  # the switch is on most of the time


@FAST
@given(data=st.data())
def test_bulk_off_draws_exactly_the_batches_of_a_run_without_bulk(data):
    """The same choices give ``case_runs(bulk=0)`` (a plain list, no extra choice) and the
    Hypothesis-drawn head of ``case_runs(bulk=N)``: the bulk only adds after them."""
    plain = data.draw(case_runs(configs(domain="gpu", max_bytes=2**30), max_batches=6))
    assert type(plain) is list
    from hypothesis.control import _current_build_context

    choices = tuple(node.value for node in _current_build_context.value.data.nodes)
    first = ConjectureData.for_choices(choices)
    assert first.draw(case_runs(configs(domain="gpu", max_bytes=2**30), max_batches=6)) == plain
    with_bulk = ConjectureData.for_choices(choices + (0,)).draw(
        case_runs(configs(domain="gpu", max_bytes=2**30), max_batches=6, bulk=8))
    assert list(with_bulk) == plain and with_bulk.bulk_start == len(plain)


@FAST
@given(data=st.data())
def test_a_closed_bulk_gate_draws_exactly_what_bulk_off_draws(data):
    """Before ``bulk_after`` seconds, ``case_runs(bulk=N)`` consumes the same choices and gives the same
    cases as ``bulk=0`` (no switch choice, no bulk); once open, the same choices and a switch give the bulk."""
    plain = data.draw(case_runs(configs(domain="gpu", max_bytes=2**30), max_batches=6))
    from hypothesis.control import _current_build_context

    choices = tuple(node.value for node in _current_build_context.value.data.nodes)
    closed = ConjectureData.for_choices(choices)
    gated = closed.draw(case_runs(configs(domain="gpu", max_bytes=2**30), max_batches=6, bulk=8, bulk_after=3600))
    assert list(gated) == plain and len(closed.nodes) == len(choices)
    opened = ConjectureData.for_choices(choices + (1,)).draw(
        case_runs(configs(domain="gpu", max_bytes=2**30), max_batches=6, bulk=8, bulk_after=0))
    assert isinstance(opened, CaseRun) and list(opened)[:len(plain)] == plain


@pytest.mark.parametrize("after", [-1, True, float("nan"), "5"])
def test_bulk_after_is_validated(after):
    with pytest.raises(BadInput, match="bulk_after"):
        case_runs(configs(), bulk=8, bulk_after=after)


@pytest.mark.parametrize("bulk", [-1, True, 1.5, "8"])
def test_bulk_is_validated(bulk):
    with pytest.raises(BadInput, match="bulk"):
        case_runs(configs(), bulk=bulk)


# -- the fuzz loop ------------------------------------------------------------------------------------
def bound(drawn):
    """What the strategies draw (runner cases, or a ``CaseRun`` of them) as the engine's launches, the run's
    bulk bookkeeping (``bulk_start``, ``splice``) read through, as ``kvfence.engine.run.draws`` binds them."""
    if isinstance(drawn, list):
        return BoundRun([launch_of(c) for c in drawn], drawn)
    return launch_of(drawn)


class PlantedStub:
    """A session that finds the planted bug (a request of length ``RARE``) without launching anything."""

    RARE = 37

    def __init__(self):
        self.stats = {}
        self.checked = []

    def check(self, case):
        return self.check_many([case])[0]

    def check_many(self, cases):
        self.checked += cases
        return [[Finding(Kind.VALUE_MISMATCH, "kv_indices", "row 0", detail="planted")]
                if self.RARE in c.case.batch.seq_lens else [] for c in cases]


class CleanStub(PlantedStub):
    RARE = -1


def _fuzz(session, bulk: int, seed: int = 1, **kw):
    strategy = case_runs(configs(**PINNED), max_batches=8, bulk=bulk).map(bound)
    return fuzz(session, strategy,
                RunPlan(max_examples=kw.pop("max_examples", 3000), seed=seed, targeting=False,
                        shrink_seconds=kw.pop("shrink_seconds", 30.0)), **kw)


def test_a_bug_found_in_the_bulk_shrinks_to_the_minimal_case_and_no_further_from_it_than_hypothesis_alone():
    """The bulk's failure, spliced back into Hypothesis, shrinks to the minimal case: one request of the
    planted length, row 0, token seed 0. Hypothesis alone is the yardstick, not the answer: where its
    shrink stops depends on the first failure it draws, and its draws take integer constants from every
    local module the process has imported (``hypothesis.internal.conjecture.providers``), so under
    pytest-xdist a worker's earlier test files change them (it stopped at 13 requests there)."""
    bulk = _fuzz(PlantedStub(), 64)
    alone = _fuzz(PlantedStub(), 0)
    assert bulk.bulk_splice == SPLICE_REPLAYED and alone.bulk_splice is None
    found, yardstick = bulk.case.case, alone.case.case  # the launches' draft cases
    assert found.batch.seq_lens == (PlantedStub.RARE,) and PlantedStub.RARE in yardstick.batch.seq_lens
    assert found.config == yardstick.config
    assert ((bulk.case.sizing, bulk.case.mode, bulk.case.layout)
            == (alone.case.sizing, alone.case.mode, alone.case.layout))
    assert len(found.batch.seq_lens) <= len(yardstick.batch.seq_lens)
    assert found.batch.req_pool_indices == (0,) and found.batch.token_seed == 0
    assert bulk.examples_to_failure < alone.examples_to_failure
    assert "blob" in bulk.hypothesis and not bulk.shrink_cut


def test_a_splice_hypothesis_does_not_replay_is_reported_unshrunk(monkeypatch):
    """Where the spliced choices do not replay the bulk case (another Hypothesis's internals), the run
    reports the bulk failure as found, says why, and marks it possibly not minimal."""
    monkeypatch.setattr(CaseRun, "splice", lambda self, i: self.prefix + (2,))  # two batches, not the case
    result = _fuzz(PlantedStub(), 64)
    assert result.bulk_splice.startswith("the first failure (a bulk case) is reported unshrunk")
    assert PlantedStub.RARE in result.case.case.batch.seq_lens and result.findings and result.shrink_cut
    from kvfence.engine import summary
    from kvfence.reports.text import run_rows

    doc = summary.build(result, run={}, case_path="c.json")
    replayed = dict(doc, bulk_splice=SPLICE_REPLAYED)
    assert summary.merge([replayed, doc], run={}, elapsed_s=1.0)["bulk_splice"] == result.bulk_splice
    assert ["bulk failure", result.bulk_splice] in run_rows(doc)


class RoundTrips(PlantedStub):
    """Records each ``check_many`` call's size; the planted bug is a request of length ``RARE``."""

    RARE = 300

    def __init__(self):
        super().__init__()
        self.calls = []

    def check_many(self, cases):
        self.calls.append(len(cases))
        return super().check_many(cases)


def test_an_example_is_checked_up_to_its_first_failing_chunk():
    """The Hypothesis-drawn cases go first on their own, then the bulk in chunks of ``BULK_CHECK_CHUNK``;
    checking stops at the first chunk that holds a failure (the example fails there; a dirty bulk would
    cost a full re-check per case), except under ``--keep-going`` (``known``), where a known failure
    passes and every case needs its verdict. The failing case is the same either way."""
    from hypothesis import strategies as hst

    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.engine.loop import BULK_CHECK_CHUNK

    config = Config(topk=1, num_steps=1, page_size=1, ctx=1024, max_bs=1)
    run = CaseRun([Case(config, Batch((length,), (0,), 0)) for length in range(1, 902)])
    run.bulk_start, run.bulk_choices, run.prefix = 1, [()] * 900, None  # one drawn case, then the bulk
    stop, every = RoundTrips(), RoundTrips()
    found = fuzz(stop, hst.just(bound(run)), RunPlan(max_examples=1, seed=0, targeting=False, shrink_seconds=0))
    full = fuzz(every, hst.just(bound(run)),
                RunPlan(max_examples=1, seed=0, targeting=False, shrink_seconds=0), known=set())
    assert found.case.case.batch.seq_lens == full.case.case.batch.seq_lens == (RoundTrips.RARE,)
    # Length 300 is bulk case 299: in the second chunk of 256.
    assert stop.calls == [1, BULK_CHECK_CHUNK, BULK_CHECK_CHUNK] and found.verified_cases == 1 + 2 * BULK_CHECK_CHUNK
    assert sum(every.calls) == 901 and every.calls[0] == 1 and max(every.calls) == BULK_CHECK_CHUNK


class SlowChecks(RoundTrips):
    """Every case takes ``SECONDS`` to check (an interpreter, a hard case), all clean."""

    SECONDS = 0.02

    def check_many(self, cases):
        import time

        time.sleep(self.SECONDS * len(cases))
        self.calls.append(len(cases))
        return [[] for _ in cases]


def test_the_time_budget_holds_within_one_chunk_when_every_case_is_slow():
    """900 bulk cases of 20 ms (18 s in all) under ``max_seconds=0.5``: chunks shrink to what one second
    checks and the budget is looked at between them, so the run ends about a chunk past its budget."""
    import time

    from hypothesis import strategies as hst

    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.engine.loop import CHUNK_TARGET_S

    config = Config(topk=1, num_steps=1, page_size=1, ctx=1024, max_bs=1)
    run = CaseRun([Case(config, Batch((length,), (0,), 0)) for length in range(1, 902)])
    run.bulk_start, run.bulk_choices, run.prefix = 1, [()] * 900, None
    slow = SlowChecks()
    start = time.monotonic()
    result = fuzz(slow, hst.just(bound(run)),
                  RunPlan(max_examples=10, seed=0, targeting=False, shrink_seconds=0, max_seconds=0.5))
    assert time.monotonic() - start < 0.5 + 2 * CHUNK_TARGET_S + 1, slow.calls
    assert result.time_cut and result.verified_cases < 900
    assert slow.calls[0] == 1 and max(slow.calls[1:]) <= CHUNK_TARGET_S / SlowChecks.SECONDS + 1


def test_the_bulk_never_launches_a_structure_the_run_has_verified():
    """Every repeat of a structure and its pool rows among the launched cases is a Hypothesis-drawn
    token variant: the bulk's repeats are skipped (``bulk_skipped``), and the counts say so (a new pool
    row assignment of a known structure is a read variant, not a structure)."""
    session = CleanStub()
    strategy = case_runs(configs(topk=1, num_steps=1, page_size=1, ctx=6, max_bs=2), max_batches=4, bulk=32).map(bound)
    result = fuzz(session, strategy, RunPlan(max_examples=60, seed=0, targeting=False, shrink_seconds=0))
    record = registry.get("draft")
    digest = config_key(launches.keys(record, session.checked[0]).config)
    keys = [read_key(record, digest, c) for c in session.checked]
    structures = {structure_key(digest, launches.keys(record, c).structure) for c in session.checked}
    repeats = len(keys) - len(set(keys))
    assert result.bulk_skipped > 0 and result.bulk_cases > 0 and not result.findings
    assert result.structural_cases == len(structures) and result.token_variant_cases == repeats
    assert result.read_variant_cases == len(set(keys)) - len(structures)
    assert repeats <= result.verified_cases - result.bulk_cases  # none of them from the bulk


def test_bulk_counts_reach_the_summary():
    from kvfence.engine import summary

    result = _fuzz(CleanStub(), 16, max_examples=10)
    doc = summary.build(result, run={}, case_path=None)
    assert doc["bulk_cases"] == result.bulk_cases > 0 and doc["bulk_skipped"] == result.bulk_skipped
    merged = summary.merge([doc, doc], run={}, elapsed_s=1.0)
    assert merged["bulk_cases"] == 2 * result.bulk_cases
    assert summary.validate(json.loads(json.dumps(merged)), "merged") is not None


# -- the command line ---------------------------------------------------------------------------------
TINY = ["--topk", "1", "--num-steps", "1", "--page-size", "1", "--ctx", "16", "--max-bs", "2", "--family", "off"]
RARE_KERNEL = "tests/targets/bad_writes.py:rare_length_value"


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "kvfence", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def _case_file(out: Path) -> dict:
    files = sorted((out / "cases").glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


@pytest.mark.interpreter  # the planted bug reads on the host: --device cpu in a subprocess
@pytest.mark.long
def test_fuzz_with_bulk_saves_the_minimal_case_file_and_it_replays(tmp_path):
    """On the interpreter: a bug the bulk meets first ends as the case file Hypothesis alone gives, whose
    ``repro`` exits 1; the reference kernel passes with the bulk on."""
    bulk_out, alone_out, clean_out = tmp_path / "bulk", tmp_path / "alone", tmp_path / "clean"
    found = _cli("fuzz", "--device", "cpu", "--kernel", RARE_KERNEL, *TINY, "--bulk-per-example", "16", "--seed", "3",
                 "--max-examples", "100", "--out", str(bulk_out), "--quiet")
    assert found.returncode == 1, found.stdout[-2000:] + found.stderr[-2000:]
    doc = json.loads((bulk_out / "summary.json").read_text())
    assert doc["bulk_splice"] == SPLICE_REPLAYED and doc["bulk_cases"] > 0 and doc["bulk_per_example"] == 16
    alone = _cli("fuzz", "--device", "cpu", "--kernel", RARE_KERNEL, *TINY, "--seed", "3", "--max-examples", "400",
                 "--out", str(alone_out), "--quiet")
    assert alone.returncode == 1, alone.stdout[-2000:] + alone.stderr[-2000:]
    case, reference = _case_file(bulk_out), _case_file(alone_out)
    assert case["case"] == reference["case"] and case["case"]["case"]["batch"]["seq_lens"] == [11]
    assert {f["kind"] for f in case["findings"]} == {"VALUE_MISMATCH"}
    path = next((bulk_out / "cases").glob("*.json"))
    assert _cli("repro", str(path), "--device", "cpu", "--kernel", RARE_KERNEL).returncode == 1
    clean = _cli("fuzz", "--device", "cpu", *TINY, "--bulk-per-example", "16", "--seed", "3", "--max-examples", "5",
                 "--out", str(clean_out), "--quiet")
    assert clean.returncode == 0, clean.stdout[-2000:] + clean.stderr[-2000:]
    assert json.loads((clean_out / "summary.json").read_text())["bulk_cases"] > 0


def test_bulk_per_example_must_be_a_count(tmp_path):
    bad = _cli("fuzz", "--bulk-per-example", "-1", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "--bulk-per-example" in bad.stderr and "Traceback" not in bad.stderr
