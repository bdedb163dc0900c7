"""docs/contract.md §6 end to end: the case model's new fields and their bad inputs, old case files,
the drawn page table, the rail's overlapping padding segments, which kernels may run a §6 config, sizing with
window parameters, the host verdict for §6 configs under the device verifier, the strategies' reach, and each new
path's detection: a buggy kernel caught, the reference clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

from kvfence.contracts.draft import draws
from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import DRAFT, WINDOW_RAIL, launch_of
from kvfence.contracts.draft.session import host_verdict
from kvfence.contracts.draft.strategies import cases, configs
from kvfence.contracts.draft.tokens import req_to_token_rows, table_entry, v2p_table
from kvfence.engine import casefile
from kvfence.errors import BadInput
from tests.test_scale import _draw_all

ROOT = Path(__file__).resolve().parents[1]
CLASSIC = f"{ROOT / 'tests' / 'targets' / 'classic_kernel.py'}:classic"
LAUNCHER = f"{ROOT / 'tests' / 'targets' / 'bad_writes.py'}:_reference"
#: A folder of release wheels for the tests that read real releases (none: they skip; docs/tests.md).
WHEELS = Path(os.environ["KVFENCE_TEST_WHEELS"]) if os.environ.get("KVFENCE_TEST_WHEELS") else None
SGLANG_0_5_23 = sorted(WHEELS.glob("sglang-0.5.23-*.whl")) if WHEELS is not None and WHEELS.is_dir() else []


# -- the case model ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, needle", [
    (dict(entry_page_size=3), "entry_page_size must be a power of two"),
    (dict(entry_page_size=128), "entry_page_size must be a power of two"),
    (dict(sink_size=2), "needs a window"),
    (dict(window_size=-1), "window_size must be a non-negative integer"),
    (dict(window_size=True), "window_size must be a non-negative integer"),
    (dict(translate="yes"), "translate must be true or false"),
    (dict(contract="rail"), "contract must be one of draft, window-rail"),
    (dict(contract="window-rail"), "window-rail needs window_size > 0"),
    (dict(contract="window-rail", window_size=2, sink_size=1), "the window rail has no sinks"),
])
def test_bad_family_fields_are_one_line_bad_input(fields, needle):
    with pytest.raises(BadInput) as err:
        Config(topk=1, num_steps=1, **fields)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_defaults_are_todays_config_and_old_case_files_load():
    config = Config(topk=2, num_steps=2)
    assert not config.is_family and config.family_dict() == {}
    assert set(config.to_dict()) == {"topk", "num_steps", "page_size", "ctx", "max_bs", "buckets", "sizing",
                                     "layout", "mode"}
    case = Case(config, Batch((3,), (1,), 7))
    assert "v2p_seed" not in case.batch.to_dict()
    # An old (pre-§6) case file: none of the new keys; it loads, with every §6 field at its default.
    doc = casefile.document(launch_of(case), [], device="cpu", source="test")
    loaded = DRAFT.runtime(casefile.from_document(json.loads(json.dumps(doc))).case)
    assert loaded.config == config and loaded.batch == case.batch
    assert pool_and_oracle_are_classic(loaded)


def pool_and_oracle_are_classic(case):
    from kvfence.contracts.draft import oracle
    from kvfence.contracts.draft.tokens import slot_id

    c, lb = case.config, case.launch()
    rows = [[slot_id(case.batch.token_seed, r * c.pool_len + t) for t in range(c.pool_len)] for r in range(c.pool_rows)]
    classic = oracle.expected_writes(lb.seq_lens, lb.req_pool_indices, lb.positions, rows, c.topk, c.num_steps,
                                     c.page_size)
    return req_to_token_rows(c, case.batch.token_seed) == rows and case.expected().kv_indices == classic.kv_indices


def test_family_case_files_round_trip_and_bad_fields_exit_2_on_load(tmp_path):
    config = Config(topk=2, num_steps=3, page_size=4, ctx=12, max_bs=2, window_size=3, sink_size=1,
                    entry_page_size=2, translate=True)
    case = Case(config, Batch((9, 2), (0, 2), 5, 1234))
    doc = json.loads(json.dumps(casefile.document(launch_of(case), [], device="cpu", source="test")))
    loaded = DRAFT.runtime(casefile.from_document(doc).case)
    assert loaded.config == config and loaded.batch.v2p_seed == 1234
    doc["case"]["case"]["config"]["entry_page_size"] = 6
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "kvfence", "repro", str(path), "--device", "cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "entry_page_size must be a power of two" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_page_granular_rows_and_the_virtual_table():
    config = Config(topk=2, num_steps=3, page_size=4, ctx=10, max_bs=2, entry_page_size=4)
    assert config.pool_cols == -(-config.pool_len // 4)
    entries = [table_entry(config, 3, i) for i in range(config.pool_rows * config.pool_cols)]
    assert len(set(entries)) == len(entries) and max(entries) * 4 + 3 < 2**30
    translated = Config(topk=2, num_steps=3, page_size=4, ctx=10, max_bs=2, entry_page_size=2, translate=True)
    n = translated.pool_rows * translated.pool_cols
    assert sorted(table_entry(translated, 9, i) for i in range(n)) == list(range(n))  # a permutation of [0, N)
    assert translated.v2p_pages == -(-n * 2 // 4)


def test_the_drawn_page_table_has_negative_sink_and_far_pages_and_shrinks_to_the_identity():
    import torch

    from kvfence.contracts.draft.runner import v2p_tensor

    config = Config(topk=2, num_steps=2, page_size=2, ctx=40, max_bs=4, translate=True)
    assert v2p_table(config, 0) == list(range(config.v2p_pages))
    table = v2p_table(config, 77)
    assert table[0] == 0  # the page-0 sink
    assert any(p < 0 for p in table) and any(p == 0 for p in table[1:])
    assert any(p * config.page_size >= 2**30 for p in table)  # far pages
    assert all(p * config.page_size + config.page_size - 1 < 2**31 for p in table)
    assert v2p_tensor(config, 77, "cpu").tolist() == table
    assert v2p_tensor(config, 0, "cpu").tolist() == v2p_table(config, 0)
    from kvfence.contracts.draft.runner import slot_table

    for c in (config, Config(topk=1, num_steps=1, entry_page_size=8)):
        flat = slot_table(5, c.pool_rows, c.pool_cols, "cpu", c).view(-1).tolist()
        assert flat == [table_entry(c, 5, i) for i in range(len(flat))]
    assert torch.equal(slot_table(5, 3, 4, "cpu"), slot_table(5, 3, 4, "cpu", Config(topk=1, num_steps=1)))


# -- the rail's graph padding ----------------------------------------------------------------------------
def test_rail_padding_segments_overlap_and_either_writers_value_is_accepted(make_session):
    # Graph padding (L = 1, position 0) with n < w: a padded branch's window (min(1 + n, w)) is one longer
    # than its base step (min(n, w)), so two programs store to some elements: the oracle accepts either value.
    config = Config(topk=2, num_steps=2, ctx=8, max_bs=4, contract="window-rail", window_size=5)
    case = Case(config, Batch((6, 2, 3), (1, 2, 3), 3))  # 3 requests -> bucket 4: one padded request
    assert case.launch().num_seqs == 4
    assert case.need() == case.used()[-1] > sum(min(p + 2, 5) for p in case.launch().positions)
    expected = WINDOW_RAIL.expected(launch_of(case))["window_kv_indices"]
    either = {key: value for key, value in expected.items() if isinstance(value, frozenset)}
    assert either and all(len(v) == 2 for v in either.values())
    obs = make_session("reference").observe(case)
    assert host_verdict(obs) == []
    # Either value is accepted by the engine's verdict (a GPU may run the programs in any order); a third value is
    # a finding.
    (row, column), values = next(iter(either.items()))
    flat = obs.kv_indices.position(row, column)
    for value, clean in ((min(values), True), (max(values), True), (12345, False)):
        obs.after["window_kv_indices"][flat] = value
        assert (host_verdict(obs) == []) == clean


# -- which kernel may run what -------------------------------------------------------------------------
@pytest.mark.parametrize("spec, fields, needle", [
    (CLASSIC, dict(window_size=3), "lacks window_size"),
    (CLASSIC, dict(translate=True), "lacks v2p, TRANSLATE"),
    (CLASSIC, dict(window_size=2, contract="window-rail"), "implements the draft contract, not window-rail"),
    (LAUNCHER, dict(entry_page_size=2), "lacks ENTRY_PAGE_SIZE"),
])
def test_a_kernel_without_the_parameters_is_refused_in_one_line(device, spec, fields, needle):
    from kvfence.contracts.draft.session import Session

    config = Config(topk=1, num_steps=1, ctx=4, max_bs=1, **fields)
    with pytest.raises(BadInput) as err:
        Session(device, spec).check(Case(config, Batch((2,), (0,))))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_classic_kernels_get_no_family_draws_and_the_reference_gets_them():
    from kvfence.contracts.draft.targets import kernel_capabilities

    assert not kernel_capabilities(CLASSIC).family and not kernel_capabilities(LAUNCHER).family
    assert kernel_capabilities("reference").family
    assert kernel_capabilities("reference").contracts == ("draft", "window-rail")


@pytest.mark.parametrize("flag, drawn", [("auto", True), ("off", False), ("on", True)])
def test_family_flag_decides_the_draws_per_domain(flag, drawn):
    """--family: auto draws the §6 fields in every example on the CPU domain and in the GPU domain's
    share there (host-verified); on and off decide on both; on with a classic-ABI kernel is one-line bad
    input."""
    from kvfence.contracts.draft.domain import GPU_FAMILY_SHARE

    cpu = _plan(flag)
    gpu = cpu.with_(device="cuda", domain="gpu")
    assert (draws.family_share(cpu.draw_domain()) > 0) is drawn
    assert (draws.family_share(gpu.draw_domain()) > 0) is drawn
    assert draws.family_share(cpu.draw_domain()) == float(drawn)
    assert draws.family_share(gpu.draw_domain()) == {"auto": GPU_FAMILY_SHARE, "on": 1.0, "off": 0.0}[flag]
    with pytest.raises(BadInput) as err:
        draws.check(DRAFT, cpu.with_(kernel=CLASSIC, pins={"family": "on"}).draw_domain())
    assert "--family on" in str(err.value) and "\n" not in str(err.value)


# -- sizing --------------------------------------------------------------------------------------------
def test_window_policies_and_four_argument_plugins(tmp_path):
    from kvfence.contracts.draft.sizing import resolve_sizing

    plugin = tmp_path / "sizing_plugin.py"
    plugin.write_text("def four(n, topk, ctx, num_steps):\n    return n * topk * (ctx + num_steps)\n"
                      "def windowed(n, topk, ctx, num_steps, *, window_size=0, sink_size=0):\n"
                      "    return n * topk * (min(ctx, window_size + sink_size) + num_steps)\n")
    rail = Config(topk=3, num_steps=2, ctx=20, max_bs=2, contract="window-rail", window_size=5, sizing="window-fixed")
    assert rail.row_width(2) == 2 * 3 * 5
    assert Config(**{**rail.to_dict(), "buckets": (1, 2), "sizing": "window-no-topk"}).row_width(2) == 2 * 5
    window = dict(topk=2, num_steps=2, ctx=20, max_bs=2, window_size=4, sink_size=1)
    assert Config(**window, sizing=f"{plugin}:four").row_width(2) == 2 * 2 * 22  # no window kwargs for it
    assert Config(**window, sizing=f"{plugin}:windowed").row_width(2) == 2 * 2 * (5 + 2)
    with pytest.raises(BadInput, match="window-fixed needs a window"):
        resolve_sizing("window-fixed")(2, 2, 8, 2)


def test_window_need_is_clipped():
    config = Config(topk=2, num_steps=3, ctx=20, max_bs=2, window_size=4, sink_size=1)
    case = Case(config, Batch((17, 2), (0, 1)))
    # topk*sum(L') + bs*num_steps with L' = (min(17, 5), min(2, 5)) = (5, 2); bs = 2*2.
    assert case.sizing_summary()["need"] == 2 * (5 + 2) + 4 * 3


# -- the device verifier's routing -----------------------------------------------------------------------
def test_family_configs_are_verified_on_the_host_and_counted(device):
    from kvfence.contracts.draft.session import Session

    session = Session(device, "reference", verifier="device")
    classic = Case(Config(topk=2, num_steps=2, ctx=8, max_bs=2), Batch((5, 3), (0, 1)))
    family = Case(Config(topk=2, num_steps=2, ctx=8, max_bs=2, window_size=3), Batch((5, 3), (0, 1)))
    assert session.check(classic) == [] and session.stats["fast_clean"] == 1
    assert session.check(family) == []
    assert session.stats["host_verified_cases"] == 1 and session.stats["fast_clean"] == 1
    # The host path really checks: a kernel that drops the sinks is caught there.

    buggy = Session(device, "mutant:window_sinks_dropped", verifier="device")
    sinks = Case(Config(topk=1, num_steps=1, ctx=8, max_bs=1, window_size=2, sink_size=1), Batch((6,), (0,)))
    assert buggy.check(sinks) and buggy.stats["host_verified_cases"] == 1


# -- detection per new path: the buggy kernel caught, the reference clean ---------------------------
DETECTIONS = [  # mutant, config fields, batch (seq_lens), v2p_seed
    ("window_offsets_unclipped", dict(topk=1, num_steps=1, window_size=2), (6, 3), 0),
    ("window_sinks_dropped", dict(topk=1, num_steps=1, window_size=2, sink_size=1), (6,), 0),
    ("window_recent_off_by_one", dict(topk=1, num_steps=1, window_size=2), (6,), 0),
    ("entry_page_no_offset", dict(topk=1, num_steps=1, entry_page_size=2), (3,), 0),
    ("translate_page_unscaled", dict(topk=1, num_steps=1, page_size=2, translate=True), (4,), 0),
    ("translate_negative_unclipped", dict(topk=2, num_steps=2, page_size=1, translate=True, max_bs=4), (8, 8, 8, 8), 4),
    ("rail_prefix_from_start", dict(topk=1, num_steps=1, contract="window-rail", window_size=2), (5,), 0),
    ("rail_chain_from_zero", dict(topk=2, num_steps=3, contract="window-rail", window_size=1), (2,), 0),
    ("rail_indptr_without_chain", dict(topk=1, num_steps=1, contract="window-rail", window_size=4), (2,), 0),
]


@pytest.mark.parametrize("mutant, fields, lens, v2p_seed", DETECTIONS, ids=[d[0] for d in DETECTIONS])
def test_each_new_path_catches_its_bug_and_passes_the_reference(make_session, mutant, fields, lens, v2p_seed):

    fields = dict(dict(ctx=8, max_bs=2), **fields)
    config = Config(**fields)
    if v2p_seed:
        # A seed whose table gives a page a request reads a negative id.
        v2p_seed = next(seed for seed in range(1, 500) if any(p < 0 for p in v2p_table(config, seed)[:8]))
    case = Case(config, Batch(lens, tuple(range(len(lens))), 0, v2p_seed))
    assert make_session("reference").check(case) == []
    findings = make_session(f"mutant:{mutant}").check(case)
    assert findings, f"{mutant} not caught on {case}"


def test_the_rail_sizing_without_topk_overflows_and_window_fixed_holds(make_session):
    base = dict(topk=2, num_steps=2, ctx=8, max_bs=2, contract="window-rail", window_size=4)
    batch = Batch((8, 8), (0, 1))
    assert make_session("reference").check(Case(Config(**base, sizing="window-fixed"), batch)) == []
    kinds = {f.kind.name for f in make_session("reference").check(Case(Config(**base, sizing="window-no-topk"), batch))}
    assert "SIZING_VIOLATION" in kinds


# -- strategies ------------------------------------------------------------------------------------------
def test_strategies_reach_every_new_path_and_stay_classic_without_family():
    seen = set()

    @settings(max_examples=300, database=None)
    @given(cases(configs(family=True)), cases(configs()))
    def run(case, classic):
        assert not classic.config.is_family and not classic.batch.v2p_seed
        c, lens = case.config, case.batch.seq_lens
        if c.window_size:
            seen.add("window<L" if max(lens) > c.window_size + c.sink_size else "window>=L")
        if c.sink_size and c.sink_size > min(lens):
            seen.add("sink>L")
        if c.entry_page_size > 1:
            seen.add("E>1")
        if c.translate:
            seen.add("translate")
            if case.batch.v2p_seed and any(p < 0 for p in v2p_table(c, case.batch.v2p_seed)):
                seen.add("negative page")

    run()
    assert seen == {"window<L", "window>=L", "sink>L", "E>1", "translate", "negative page"}


# -- the GPU domain's share of §6 examples (kvfence.contracts.draft.domain: GPU_FAMILY_SHARE) ----------------------
def _plan(family: str, kernel: str = "reference", **changes):
    """The run plan of a ``fuzz`` command with ``--family`` set (nothing else pinned), checked by the draft
    record as the command checks it; ``changes``: other plan fields (device, domain, max_bytes, pins)."""
    from kvfence.engine.plan import RunPlan

    pins = dict(changes.pop("pins", {}), family=family)
    plan = RunPlan(kernel=kernel, pins=pins, **changes)
    draws.check(DRAFT, plan.draw_domain())
    return plan


def test_the_gpu_domain_draws_family_configs_at_its_share_under_the_host_verdict_bound():
    """The plain GPU command's config strategy (``--family auto``): about one example in four is a §6
    config, each within the host verdict's 16 MiB, while the others keep production sizes; ``off``
    never draws a §6 field, ``on`` in every example, as before (a few draw every field at its default). No kernel
    runs."""
    from kvfence.contracts.draft.domain import GPU_FAMILY_SHARE, HOST_VERDICT_MAX_BYTES
    from kvfence.contracts.draft.runner_buffers import config_bytes

    gpu = dict(device="cuda", domain="gpu", max_bytes=4 << 30)
    auto = _draw_all(draws.configs(DRAFT, _plan("auto", **gpu).draw_domain()), 600)
    family = [c for c in auto if c.is_family]
    # A generous bound: Hypothesis leans toward code 0 ("no §6") and mutates earlier examples, and a share
    # example whose every field came out at its default is no §6 config: at one in four, 0.13 of these
    # 600 configs.
    assert GPU_FAMILY_SHARE / 4 <= len(family) / len(auto) <= 2 * GPU_FAMILY_SHARE, len(family)
    assert all(config_bytes(c) <= HOST_VERDICT_MAX_BYTES for c in family)
    assert {"window", "E>1", "translate"} <= {k for c in family for k, on in (
        ("window", c.window_size > 0), ("E>1", c.entry_page_size > 1), ("translate", c.translate)) if on}
    assert max(config_bytes(c) for c in auto if not c.is_family) > 16 * HOST_VERDICT_MAX_BYTES
    assert draws.family_share(_plan("auto", **gpu).draw_domain()) == GPU_FAMILY_SHARE
    off = _draw_all(draws.configs(DRAFT, _plan("off", **gpu).draw_domain()), 200)
    assert not any(c.is_family for c in off) and draws.family_share(_plan("off", **gpu).draw_domain()) == 0
    on = _draw_all(draws.configs(DRAFT, _plan("on", **gpu).draw_domain()), 100)
    assert sum(c.is_family for c in on) >= 75 and draws.family_share(_plan("on", **gpu).draw_domain()) == 1
    # A classic-ABI kernel takes no §6 field: auto draws none for it.
    assert draws.family_share(_plan("auto", CLASSIC, **gpu).draw_domain()) == 0


def test_pins_larger_than_the_bound_keep_the_share_at_the_smallest_config_they_allow():
    from kvfence.contracts.draft.domain import HOST_VERDICT_MAX_BYTES
    from kvfence.contracts.draft.runner_buffers import config_bytes

    drawn = _draw_all(configs(domain="gpu", family="auto", ctx=131072, max_bs=256, topk=4, num_steps=5), 200)
    family = [c for c in drawn if c.is_family]
    assert family and all(c.ctx == 131072 and c.max_bs == 256 for c in drawn)
    assert min(config_bytes(c) for c in family) > HOST_VERDICT_MAX_BYTES  # the pins need more than the bound


def test_family_examples_hold_few_batches_and_classic_ones_keep_theirs():
    from kvfence.contracts.draft.domain import FAMILY_MAX_BATCHES
    from kvfence.contracts.draft.strategies import case_runs, family_batches

    assert family_batches(Config(topk=1, num_steps=1, window_size=2), 32) == FAMILY_MAX_BATCHES
    assert family_batches(Config(topk=1, num_steps=1, contract="window-rail", window_size=2), 2) == 2
    assert family_batches(Config(topk=1, num_steps=1), 32) == 32
    counts = {True: [], False: []}

    @settings(max_examples=150, database=None, deadline=None, derandomize=True)
    @given(case_runs(configs(domain="gpu", family="auto", max_bytes=1 << 30), max_batches=32))
    def run(runs):
        counts[runs[0].config.is_family].append(len(runs))

    run()
    assert counts[True] and max(counts[True]) <= FAMILY_MAX_BATCHES
    assert max(counts[False]) > FAMILY_MAX_BATCHES


def test_auto_on_the_cpu_domain_draws_exactly_what_family_on_draws():
    assert _draw_all(configs(family="auto"), 60) == _draw_all(configs(family=True), 60)


@pytest.mark.parametrize("family", ["yes", 1, None])
def test_configs_family_bad_value_is_one_line_bad_input(family):
    with pytest.raises(BadInput) as err:
        configs(family=family)
    assert "family" in str(err.value) and "\n" not in str(err.value)


def _plain_gpu_strategy(kernel: str, family: str):
    """The plain GPU command's strategy as the interpreter can run it in seconds: the GPU domain's share,
    bound and capture-list buckets, with contexts narrowed to the CPU domain's and a small launch pinned
    (topk 1, two steps, page 1, two requests: a production-sized §2 example would take hours under the
    interpreter), 4 batches per example."""
    import dataclasses

    from kvfence.contracts.draft.domain import CPU, GPU
    from kvfence.contracts.draft.strategies import case_runs, configs

    plan = _plan(family, pins=dict(topk=1, num_steps=2, page_size=1, max_bs=2))
    narrowed = dataclasses.replace(GPU, max_ctx=CPU.max_ctx)
    return case_runs(configs(topk=1, num_steps=2, page_size=1, max_bs=2, domain=narrowed,
                             family=draws.family_draws(plan.draw_domain())), kernel=kernel, max_batches=4)


def test_the_plain_gpu_domain_strategy_now_catches_a_family_mutant_and_the_reference_passes(make_session):
    """A §6 mutant (page-granular rows read without ``+ p mod E``) under the GPU domain's draws
    (``--family auto``): caught, by a kind it declares, in a §6 config of the share; unreachable with
    ``--family off``; the reference is clean under the same draws."""
    from kvfence.engine.loop import damage_kinds, fuzz
    from kvfence.engine.plan import RunPlan

    (m,) = [m for m in DRAFT.mutants if m.name == "entry_page_no_offset"]
    kernel = f"mutant:{m.name}"

    def run(kernel, family, budget):
        strategy = _plain_gpu_strategy(kernel, family).map(lambda run: [launch_of(c) for c in run])
        return fuzz(make_session(kernel), strategy,
                    RunPlan(max_examples=budget, seed=0, shrink_seconds=0.0, targeting=False))

    caught = run(kernel, "auto", 300)  # found in 15-39 examples under seeds 0-2
    assert set(damage_kinds(caught.findings)) & set(m.detects), caught.findings
    assert caught.case is not None and caught.case.case.config.entry_page_size > 1
    assert run(kernel, "off", 60).findings == []
    assert run("reference", "auto", 60).findings == []


# -- the command line ----------------------------------------------------------------------------------
def kvfence(*args):
    return subprocess.run([sys.executable, "-m", "kvfence", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.interpreter  # runs --device cpu in a subprocess
@pytest.mark.parametrize("flags, needle", [
    (["--sink", "2"], "needs a window"),
    (["--entry-page-size", "3"], "entry_page_size must be a power of two"),
    (["--translate", "maybe"], "--translate"),
    (["--window", "3", "--kernel", CLASSIC], "lacks window_size"),
    (["--sizing", "window-fixed", "--window", "0"], "window-fixed needs a window"),
])
def test_fuzz_bad_family_flags_exit_2_in_one_line(tmp_path, flags, needle):
    proc = kvfence("fuzz", "--device", "cpu", "--max-examples", "2", "--out", str(tmp_path / "o"), "--quiet", *flags)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_fuzz_the_rail_with_a_sizing_bug_finds_it_and_the_fix_is_clean(tmp_path):
    common = ["fuzz", "--device", "cpu", "--max-examples", "30", "--seed", "1", "--quiet", "--shrink-seconds", "5",
              "--contract", "window-rail", "--window", "3", "--topk", "2"]
    bad = kvfence(*common, "--sizing", "window-no-topk", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 1 and "SIZING_VIOLATION" in bad.stdout, bad.stdout + bad.stderr
    good = kvfence(*common, "--sizing", "window-fixed", "--out", str(tmp_path / "good"))
    assert good.returncode == 0, good.stdout + good.stderr
    summary = json.loads((tmp_path / "good" / "summary.json").read_text())
    assert summary["contract"] == "window-rail" and summary["pins"] == {"window": 3, "topk": 2}


# -- SGLang 0.5.23's own kernels on every new path (needs its extracted cache) ---------------------------
@pytest.mark.skipif(not SGLANG_0_5_23, reason="no sglang-0.5.23 wheel in $KVFENCE_TEST_WHEELS "
                                                "(pip download sglang==0.5.23 --no-deps)")
@pytest.mark.parametrize("attr, contract", [("", "draft"), (":generate_draft_decode_window_kv_indices", "window-rail")])
def test_sglang_0_5_23_is_clean_on_the_family(device, monkeypatch, tmp_path, attr, contract):
    from kvfence.contracts.draft.session import Session

    monkeypatch.setenv("KVFENCE_WHEEL_DIR", str(WHEELS))  # the kernel extracted from the wheel into a fresh cache
    monkeypatch.setenv("KVFENCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVFENCE_OFFLINE", "1")
    session = Session(device, f"sglang==0.5.23{attr}")
    assert session.kernel.capabilities.family

    @settings(max_examples=25, database=None, deadline=None)
    @given(cases(configs(family=True, contract=contract)))
    def run(case):
        assert session.check(case) == [], case

    run()
