"""Throughput of kvfence, side by side with the kernel alone and with a naive harness.

    python benchmarks/throughput.py --json PATH [--device cuda|cpu] [--quick] [--skip-runs] [--only STAGES]

Measures, in one run (every rate counts only cases launched and verified, never cache hits), and
writes the whole ``--json`` file from that run alone (the H200 record: ``H200_COMMAND``):

* ``default_structural_cases_per_s``: the headline rate of the default ``python -m kvfence fuzz --device
  cuda`` (no pinned field: the GPU domain, default ``--jobs``, config-major batches) over a
  ``--max-seconds`` run: structurally distinct verified cases (config and lengths: what changes where
  the kernel writes; distinct across all jobs) per second of the whole command's wall time (process
  start, compiles and captures included); ``default_structurally_new_fraction`` is structural /
  verified cases, ``default_read_variant_cases`` the cases that only read other pool rows of a
  structure and ``default_token_variant_cases`` those that only re-drew its token table (neither is
  structural); ``default_examples_per_s`` and ``default_distinct_configs_per_s`` the Hypothesis
  examples and distinct configs per second; ``default_verified_cases_per_s`` counts every verified
  case; ``default_run`` keeps its summary;
* ``pinned_structural_cases_per_s`` (and the same companions): the same with a pinned small config
  (``SMALL``) and ``--jobs``;
* ``check_us_small``: kvfence's own check path on pre-drawn small cases (``Session.check_many`` in
  batches of 32: staging, one fused graph replay per case, one read-back per batch), per case, the median
  of 5 passes after a warm-up (``check_us_small_passes``: each pass);
* ``scale_mutants_caught_s``: for each scale mutant (``DOMAIN = "gpu"``), seconds from the start of the
  default fuzz command until its first finding (``first_failure_s`` of the merged summary);
* ``small_cases_per_s`` (and variants): one process, one Hypothesis example per case or up to 8;
* ``parent_cases_per_s_bulk`` / ``_no_bulk`` (and ``parent_structural_cases_per_s_*``,
  ``parent_cpu_share_*``): the fuzz loop's own cost in one process, a stub session judging the pinned
  config's cases (the GPU command's strategy, bulk on and off) clean at once (``parent_rate``);
* ``kernel_replay_us_large``: the kernel's own CUDA-graph replay for a large batch (256 requests x
  L 4096 x topk 8 x 5 steps), ``triton.testing.do_bench`` median; ``verify_us_large`` and
  ``prepare_us_large``: the on-device verification and re-poison graphs (do_bench medians);
  ``large_check_over_kernel``: what checking adds to that case as a fuzz run checks it (the fused
  per-case graph of prepare, kernel and verify, less the kernel's own replay) over the kernel's replay
  (``large_steps_check_over_kernel``: prepare and verify replayed as graphs of their own, a diagnostic);
  ``case_us_large``: a whole verified case through ``Session.check`` (CUDA events, median), and
  ``large_case_over_kernel`` that over the kernel's replay (the whole check, host side included);
* ``naive_s_large``: a naive harness on the same case (``naive_errors``: fresh poisoned buffers, eager
  launch, copy to the host, every element compared with the plain oracle's formulas, slack and
  kv_indptr included), warm, median of ``NAIVE_RUNS``;
* ``naive_over_kvfence_large`` / ``naive_over_kvfence_small``: that naive harness over kvfence's own
  check, both warm medians on the same cases (``naive_vs_kvfence``; on the CPU too, at interpreter sizes).

On ``--device cpu`` (the interpreter) only the small-case rate and the naive comparison are measured
(``--quick`` shrinks both).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from kvfence.provenance import stamped

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # result_file.py beside it

SMALL = dict(topk=2, num_steps=3, page_size=1, ctx=512, max_bs=16)
#: The one command that writes benchmarks/results/h200.json on the H200 (every key from that run; the
#: scale mutants, minutes of fuzzing each, go to their own file: ``--only scale``).
H200_COMMAND = ("python benchmarks/throughput.py --device cuda --only small,naive,parent,check_small,large,runs "
                "--json benchmarks/results/h200.json")
LARGE = dict(topk=8, num_steps=5, page_size=1, ctx=4096, max_bs=256)


def small_rate(device: str, examples: int, seed: int) -> dict:
    from result_file import draft_launches

    from kvfence.contracts.draft.session import Session
    from kvfence.contracts.draft.strategies import case_runs, cases, configs
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan

    session = Session(device, "reference")
    strategy = draft_launches(cases(configs(sizing="safe", **SMALL)))
    # Warm-up: compiles the kernels and captures every bucket's graphs.
    fuzz(session, strategy, RunPlan(max_examples=min(examples, 200), seed=seed + 1))
    out = {}
    for targeting, key in ((False, "small_cases_per_s"), (True, "small_cases_per_s_targeting")):
        rates = []
        for rep in range(3 if device == "cuda" else 1):
            result = fuzz(session, strategy, RunPlan(max_examples=examples, seed=seed + 2 + rep, targeting=targeting))
            assert not result.findings, [f.headline() for f in result.findings]
            rates.append(result.cases_per_s)
        out[key] = round(statistics.median(rates), 1)
        out[key.replace("per_s", "rates")] = [round(r, 1) for r in rates]
    # Throughput mode: up to 8 batches of the config per Hypothesis example
    # (kvfence.contracts.draft.strategies.case_runs).
    runs = draft_launches(case_runs(configs(sizing="safe", **SMALL), max_batches=8))
    rates = []
    for rep in range(3 if device == "cuda" else 1):
        result = fuzz(session, runs, RunPlan(max_examples=max(1, examples // 4), seed=seed + 7 + rep, targeting=False))
        assert not result.findings, [f.headline() for f in result.findings]
        rates.append(result.cases_per_s)
    out["small_cases_per_s_8_per_example"] = round(statistics.median(rates), 1)
    out["small_rates_8_per_example"] = [round(r, 1) for r in rates]
    return dict(out, small_examples=examples, small_session_stats=dict(session.stats))


#: Configs of the naive-vs-kvfence comparison under the interpreter (``--device cpu``): the CPU domain's
#: scale, and a smoke-test scale with ``--quick``.
SMALL_CPU = dict(topk=2, num_steps=3, page_size=1, ctx=32, max_bs=4)
LARGE_CPU = dict(topk=8, num_steps=5, page_size=1, ctx=48, max_bs=4)
SMALL_CPU_QUICK = dict(topk=2, num_steps=2, page_size=1, ctx=8, max_bs=2)
LARGE_CPU_QUICK = dict(topk=4, num_steps=2, page_size=1, ctx=16, max_bs=2)
#: Timed runs of each side (after one warm-up run); the median is reported.
NAIVE_RUNS = 3


def naive_errors(config, batch, kernel: str = "reference", device: str = "cuda") -> int:
    """One case checked the way a careful hand-written test would: fresh buffers filled with a poison
    (so a missing write is seen), an eager launch, everything copied to the host, and every element of
    every row compared with the plain oracle's formulas (``kvfence.contracts.draft.oracle``, program by program):
    each segment's values, the slack after the used length (must still hold the poison), and every
    kv_indptr column (column 0 and the columns past ``bs`` must still hold the poison). Returns the
    number of wrong elements (0: clean). No guards: a naive harness has none."""
    import torch

    from kvfence.contracts.draft import oracle
    from kvfence.contracts.draft.case import launch_batch
    from kvfence.contracts.draft.runner import slot_table
    from kvfence.contracts.draft.targets import resolve_kernel

    poison = -1
    lb = launch_batch(config, batch)
    topk, steps, m = config.topk, config.num_steps, lb.num_seqs
    table = slot_table(batch.token_seed, config.pool_rows, config.pool_len, device)
    kv_indices = torch.full((steps, config.row_width(m)), poison, dtype=torch.int32, device=device)
    kv_indptr = torch.full((steps, m * topk + 1), poison, dtype=torch.int32, device=device)
    resolve_kernel(kernel, device).launch(
        req_pool_indices=torch.tensor(lb.req_pool_indices, device=device), req_to_token=table,
        seq_lens=torch.tensor(lb.seq_lens, dtype=torch.int32, device=device), kv_indices=kv_indices,
        kv_indptr=kv_indptr, positions=torch.tensor(lb.positions, device=device), topk=topk, num_steps=steps,
        page_size=config.page_size)
    rows, ptr, tab = kv_indices.cpu().tolist(), kv_indptr.cpu().tolist(), table.cpu().tolist()
    bad = 0
    for s in range(steps):
        row = rows[s]
        for b, L in enumerate(lb.seq_lens):
            src = tab[lb.req_pool_indices[b]]
            for k in range(topk):
                start = oracle.segment_offset(lb.seq_lens, topk, s, b, k)
                e = oracle.draft_slot_start(L, k, topk, steps, config.page_size)
                expected = src[:L] + src[e:e + s + 1]
                got = row[start:start + L + s + 1]
                bad += sum(x != y for x, y in zip(got, expected)) + len(expected) - len(got)
        used = oracle.used_length(lb.seq_lens, topk, s)
        bad += sum(x != poison for x in row[used:])  # the slack: nothing may be written past U(s)
        want = [poison] * (m * topk + 1)
        for z in range(m * topk):
            col = z or m * topk
            want[col] = sum(lb.positions[:col]) + col * (s + 1)
        bad += sum(x != y for x, y in zip(ptr[s], want))
    return bad


#: (config, batch, device) -> the naive harness's median microseconds (measured once per process: the
#: large case costs seconds per run, and ``large`` and ``naive_vs_kvfence`` both report it).
_NAIVE_US: dict = {}


def _naive_us(config, batch, device: str) -> float:
    key = (config, batch, device)
    if key not in _NAIVE_US:
        assert naive_errors(config, batch, device=device) == 0  # the reference is clean (and this is the warm-up)
        _NAIVE_US[key] = statistics.median(_timed_us(lambda: naive_errors(config, batch, device=device), device,
                                                     NAIVE_RUNS, warm=False))
    return _NAIVE_US[key]


def naive_check(config, batch) -> float:
    """Seconds the naive harness takes on one case (CUDA), warm, median of ``NAIVE_RUNS``."""
    return _naive_us(config, batch, "cuda") / 1e6


def _timed_us(fn, device: str, runs: int, warm: bool = True) -> list:
    """Microseconds of ``runs`` calls of ``fn`` after one warm-up call (``warm=False``: the caller warmed
    it): CUDA events on the GPU (each side syncs on its own results before it returns), ``perf_counter``
    on the CPU."""
    import torch

    if warm:
        fn()
    out = []
    for _ in range(runs):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
    return out


def _small_cases(small: dict, count: int, seed: int) -> list:
    """``count`` graph-mode cases of the pinned small config, drawn as the fuzzer draws batches."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from kvfence.contracts.draft.case import Case
    from kvfence.contracts.draft.strategies import batches, configs

    drawn = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate], derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(configs(sizing="safe", **small).flatmap(lambda c: batches(c).map(lambda b: Case(c, b))))
    def collect(case):
        drawn.append(case)

    collect()
    return drawn[:count]


def naive_vs_kvfence(device: str, quick: bool = False, seed: int = 0) -> dict:
    """The naive harness against kvfence, both warm, median of ``NAIVE_RUNS``, on the same cases:

    * large: one case (256 requests x L 4096 x topk 8 x 5 steps on CUDA; the CPU domain's largest on the
      CPU), naive vs ``Session.check`` (kvfence's default path: the device verifier on CUDA);
    * small: cases of the pinned small config, naive one by one vs ``Session.check_many`` on all of them
      (kvfence's batched path), per case.

    Both sides check the same elements: values, missing writes, the slack after the used length and
    every kv_indptr column (kvfence also guards and inputs). Each side must find the reference clean.
    """
    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.session import Session

    if device == "cuda":
        large_cfg, small_cfg = LARGE, SMALL
    else:
        large_cfg, small_cfg = (LARGE_CPU_QUICK, SMALL_CPU_QUICK) if quick else (LARGE_CPU, SMALL_CPU)
    config = Config(sizing="safe", **large_cfg)
    batch = Batch(tuple([config.ctx] * config.max_bs), tuple(range(1, config.max_bs + 1)), 12345)
    case = Case(config, batch)
    session = Session(device, "reference")
    assert session.check(case) == []
    naive_large = _naive_us(config, batch, device)
    # kvfence's check is short on a GPU: more runs for a stable median (as many as the naive on the CPU).
    kvfence_large = statistics.median(_timed_us(lambda: session.check(case), device,
                                                NAIVE_RUNS * (10 if device == "cuda" else 1)))

    cases = _small_cases(small_cfg, 32 if device == "cuda" else (4 if quick else 16), seed)

    def naive_small():
        assert all(naive_errors(c.config, c.batch, device=device) == 0 for c in cases)

    def kvfence_small():
        assert all(f == [] for f in session.check_many(cases))

    naive_small_us = statistics.median(_timed_us(naive_small, device, NAIVE_RUNS)) / len(cases)
    kvfence_small_us = statistics.median(_timed_us(kvfence_small, device, NAIVE_RUNS)) / len(cases)
    return {
        "naive_us_large": round(naive_large, 1), "kvfence_us_large": round(kvfence_large, 1),
        "naive_over_kvfence_large": round(naive_large / kvfence_large, 1),
        "naive_us_small": round(naive_small_us, 1), "kvfence_us_small": round(kvfence_small_us, 1),
        "naive_over_kvfence_small": round(naive_small_us / kvfence_small_us, 1),
        "naive_cases_small": len(cases), "naive_runs": NAIVE_RUNS,
        "naive_large_config": large_cfg, "naive_small_config": small_cfg,
    }


def large(device: str, naive: bool = True) -> dict:
    import torch
    import triton.testing

    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.device_verify import DeviceVerifier
    from kvfence.contracts.draft.session import Session

    config = Config(sizing="safe", **LARGE)
    batch = Batch(tuple([LARGE["ctx"]] * LARGE["max_bs"]), tuple(range(1, LARGE["max_bs"] + 1)), 12345)
    case = Case(config, batch)
    session = Session(device, "reference")
    assert session.check(case) == [] and session.stats["fast_clean"] == 1
    runner = session.runner(config)
    verifier: DeviceVerifier = session._device_verifiers[runner]
    prepare, kernel, verify = verifier._steps(case.launch().num_seqs)
    kernel_us = triton.testing.do_bench(kernel, warmup=25, rep=200, return_mode="median") * 1e3
    verify_us = triton.testing.do_bench(verify, warmup=25, rep=200, return_mode="median") * 1e3
    prepare_us = triton.testing.do_bench(prepare, warmup=25, rep=200, return_mode="median") * 1e3
    # The graph a fuzz run replays per case (prepare, kernel, verify in one), with the cursor put back
    # on row 0 before each replay (one extra tiny launch, counted against kvfence).
    fused = verifier._case_graph(case.launch().num_seqs)
    fused_us = triton.testing.do_bench(lambda: (verifier.cursor.zero_(), fused()), warmup=25, rep=200,
                                       return_mode="median") * 1e3
    # Where verification time goes: each verify kernel alone (direct launches, do_bench medians).
    from kvfence.engine.tables import POISON

    c, m, inputs = config, case.launch().num_seqs, runner.inputs

    def segments(poison_back):
        return lambda: verifier._segments(
            runner.kv_indices, seq_lens=inputs.seq_lens[:m], req_pool_indices=inputs.req_pool_indices[:m],
            rows=verifier.rows, cursor=verifier.cursor, counts=verifier.counts, pool_len=inputs.req_to_token.shape[1],
            topk=c.topk, num_steps=c.num_steps, page_size=c.page_size, poison_back=poison_back, poison=POISON)

    bench = lambda fn: round(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3, 1)  # noqa: E731
    verifier.cursor.zero_()
    parts = {
        "segments_us": bench(segments(False)),
        "segments_poison_back_us": bench(segments(True)),
        "indptr_us": bench(lambda: verifier._indptr(runner.kv_indptr, positions=inputs.positions,
                                                    counts=verifier.counts, num_seqs=m, topk=c.topk, poison=POISON,
                                                    poison_back=True)),
        "outside_kv_indices_us": bench(lambda: verifier._outside(runner.kv_indices, counts=verifier.counts, slot=2,
                                                                 rows=verifier.rows, cursor=verifier.cursor,
                                                                 num_seqs=m, topk=c.topk, poison=POISON)),
        "inputs_us": bench(lambda: verifier._inputs(rows=verifier.rows, cursor=verifier.cursor,
                                                    seq_lens=inputs.seq_lens, req_pool_indices=inputs.req_pool_indices,
                                                    positions=inputs.positions, req_to_token=inputs.req_to_token,
                                                    counts=verifier.counts, max_bs=c.max_bs, topk=c.topk)),
    }
    runner.kv_indices.reset()
    runner.kv_indptr.reset()
    # A whole verified case (staging copy, one fused graph replay, counters back), CUDA events, median.
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        assert session.check(case) == []
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    case_us = statistics.median(times)
    naive_s = naive_check(config, batch) if naive else float("nan")  # naive=False: kvfence's own timings only
    bytes_out = config.num_steps * config.row_width(LARGE["max_bs"]) * 4
    return {
        "kernel_replay_us_large": round(kernel_us, 1),
        "verify_us_large": round(verify_us, 1),
        "prepare_us_large": round(prepare_us, 1),
        "case_us_large": round(case_us, 1),
        "large_verify_over_kernel": round(verify_us / kernel_us, 2),
        # The check a fuzz run adds to a case (prepare + verify-and-re-poison, as the fused per-case graph
        # runs them: verification passes in parallel branches, one graph launch) over the kernel's own
        # replay: (fused replay - kernel replay) / kernel replay.
        "fused_case_us_large": round(fused_us, 1),
        "large_check_over_kernel": round((fused_us - kernel_us) / kernel_us, 2),
        # The same check as two graphs of their own, prepare and verify replayed apart (each with its own
        # graph launch, the verify graph's branches joined inside it): a diagnostic of the parts.
        "large_steps_check_over_kernel": round((prepare_us + verify_us) / kernel_us, 2),
        # A whole verified case through Session.check (staging copy, the fused graph, counters back, the
        # host's share included) over the kernel's replay: what one case costs beside the kernel alone.
        "large_case_over_kernel": round(case_us / kernel_us, 2),
        "naive_s_large": round(naive_s, 2),
        "speedup_vs_naive": round(naive_s * 1e6 / case_us, 1),
        "large_kv_indices_mib": round(bytes_out / 2**20, 1),
        "large_verify_parts_us": parts,
    }


def _fuzz_cli(args, timeout: float) -> dict:
    """Run ``python -m kvfence fuzz ARGS --json`` as a user would; its summary plus the command's wall time."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "kvfence", "fuzz", *args, "--out", str(out), "--json", str(Path(tmp) / "s.json"),
               "--quiet"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
        doc = json.loads((Path(tmp) / "s.json").read_text())
    keys = ("examples", "generated_cases", "verified_cases", "cached_cases", "launches", "elapsed_s", "cases_per_s",
            "structural_cases", "read_variant_cases", "token_variant_cases", "structural_cases_per_s",
            "examples_per_s", "distinct_configs", "distinct_configs_per_s", "compiles", "captures", "compile_s",
            "capture_s", "jobs", "domain", "largest_config",
            "boundaries", "first_failure_s", "time_cut", "batches_per_example", "max_gpu_mem",
            "bulk_per_example", "bulk_cases", "bulk_skipped")
    return dict({k: doc.get(k) for k in keys}, wall_s=round(wall, 2), exit=proc.returncode,
                command="python -m kvfence fuzz " + " ".join(args),
                findings=sorted({f["kind"] for f in doc.get("findings", [])}))


def run_rates(name: str, run: dict) -> dict:
    """The rates of one fuzz-command run (``_fuzz_cli``), over the command's wall time: every verified
    case, the structurally distinct ones (the headline), and the fraction that was structurally new."""
    wall, verified, structural = run["wall_s"], run["verified_cases"], run["structural_cases"]
    return {f"{name}_run": run,
            f"{name}_structural_cases_per_s": round(structural / wall, 1),
            f"{name}_structurally_new_fraction": round(structural / verified, 3) if verified else None,
            f"{name}_read_variant_cases": run["read_variant_cases"],
            f"{name}_token_variant_cases": run["token_variant_cases"],
            f"{name}_examples_per_s": round(run["examples"] / wall, 1),
            f"{name}_distinct_configs_per_s": round(run["distinct_configs"] / wall, 2),
            f"{name}_bulk_cases": run.get("bulk_cases"),
            f"{name}_distinct_configs": run["distinct_configs"],
            f"{name}_verified_cases_per_s": round(verified / wall, 1)}


def fuzz_runs(seconds: float, jobs, pinned_seconds: float, device: str = "cuda") -> dict:
    """The default GPU command over ``seconds`` and a pinned small config with --jobs over ``pinned_seconds``."""
    default = _fuzz_cli(["--device", device, "--max-examples", "100000000", "--max-seconds", str(seconds)],
                        timeout=seconds + 240)
    assert not default["findings"], default
    pinned_flags = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    pinned = _fuzz_cli(["--device", device, "--max-examples", "100000000", "--max-seconds", str(pinned_seconds),
                        *pinned_flags] + (["--jobs", str(jobs)] if jobs else []), timeout=pinned_seconds + 240)
    assert not pinned["findings"], pinned
    return {**run_rates("default", default), **run_rates("pinned", pinned)}


def scale_mutants(seconds: float) -> dict:
    """Seconds until the default GPU fuzz command catches each scale mutant (the draft contract's mutants of
    ``domain`` gpu, each run as ``--kernel mutant:NAME``)."""
    from kvfence.engine import registry

    caught, runs = {}, {}
    for m in registry.get("draft").mutants:
        if m.domain != "gpu":
            continue
        flags = (["--kernel", f"mutant:{m.name}"] if (m.patch or m.kernel) else []) + (
            ["--sizing", m.sizing] if m.sizing else [])
        run = _fuzz_cli(["--device", "cuda", *flags, "--max-examples", "100000000", "--max-seconds",
                         str(seconds), "--shrink-seconds", "10"], timeout=seconds + 240)
        runs[m.name] = run
        caught[m.name] = run["first_failure_s"] if run["findings"] else None
    return {"scale_mutants_caught_s": caught, "scale_mutant_runs": runs}


def check_small(device: str, cases: int = 4096, batch: int = 32, passes: int = 5) -> dict:
    """kvfence's check path alone on pre-drawn small cases: ``Session.check_many`` per batch of one config,
    the median of ``passes`` timed passes over all of them (each pass's per-case time is kept too)."""
    from hypothesis import HealthCheck, Phase, given, settings

    from kvfence.contracts.draft.session import Session
    from kvfence.contracts.draft.strategies import case_runs, configs

    drawn = []

    @settings(max_examples=cases // batch, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case_runs(configs(sizing="safe", **SMALL), max_batches=batch))
    def collect(runs):
        drawn.append(runs)

    collect()
    session = Session(device, "reference")
    for runs in drawn[:4]:
        assert all(f == [] for f in session.check_many(runs))  # warm-up: compile and capture every bucket
    total = sum(len(r) for r in drawn)
    per_case = []
    for _ in range(passes):
        t0 = time.perf_counter()
        for runs in drawn:
            assert all(f == [] for f in session.check_many(runs))
        per_case.append((time.perf_counter() - t0) / total * 1e6)
    return {"check_us_small": round(statistics.median(per_case), 1),
            "check_us_small_passes": [round(x, 1) for x in per_case], "check_small_cases": total,
            "check_small_batches": len(drawn), "check_small_stats": dict(session.stats)}


class _CleanStub:
    """A session that judges every case clean at once: what is left is the parent's own cost."""

    stats: dict = {}

    def check(self, case):
        return []

    def check_many(self, cases):
        return [[] for _ in cases]


#: The bulk of ``parent_rate``'s bulk-on run (``--bulk-per-example 256``; the GPU default is off).
PARENT_BULK = 256


def parent_rate(seconds: float = 10.0, seed: int = 0) -> dict:
    """The fuzz loop's own cost per case in one process (``parent_cases_per_s_*``): the GPU command's
    strategy for the pinned small config (``GPU_BATCHES_PER_EXAMPLE`` Hypothesis batches, and a bulk
    of ``PARENT_BULK`` on or off) checked by a stub session that judges every case clean at
    once, over ``seconds`` each: generation, the verdict cache, counting and stats, nothing launched.
    ``parent_cpu_share_*`` is the process's CPU time over wall time (below 1 on a shared machine)."""
    from result_file import draft_launches

    from kvfence.cli.fuzz import GPU_BATCHES_PER_EXAMPLE
    from kvfence.contracts.draft.strategies import case_runs, configs
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan

    out = {}
    for name, bulk in (("bulk", PARENT_BULK), ("no_bulk", 0)):
        strategy = draft_launches(case_runs(configs(sizing="safe", **SMALL), max_batches=GPU_BATCHES_PER_EXAMPLE,
                                            bulk=bulk))
        cpu0, t0 = time.process_time(), time.perf_counter()
        result = fuzz(_CleanStub(), strategy,
                      RunPlan(max_examples=10**9, seed=seed, max_seconds=seconds, shrink_seconds=0))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        out[f"parent_cases_per_s_{name}"] = round(result.verified_cases / wall, 1)
        out[f"parent_structural_cases_per_s_{name}"] = round(result.structural_cases / wall, 1)
        out[f"parent_cpu_share_{name}"] = round(cpu / wall, 2)
    return out


#: The stages of a run, in order (``--only``); check_small, large, runs and scale need CUDA.
STAGES = ("small", "naive", "parent", "check_small", "large", "runs", "scale")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="fewer examples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each fuzz-command run (CUDA)")
    parser.add_argument("--jobs", type=int, default=None, help="--jobs of the pinned run (default: fuzz's default)")
    parser.add_argument("--pinned-seconds", type=float, default=None,
                        help="length of the pinned run (default --seconds)")
    parser.add_argument("--scale-seconds", type=float, default=None,
                        help="--max-seconds of each scale-mutant run (default --seconds)")
    parser.add_argument("--skip-runs", action="store_true", help="skip the fuzz-command runs and the scale mutants")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated stages to run, of {','.join(STAGES)} (default: all that apply; "
                             "without naive, the large stage skips its naive check)")
    args = parser.parse_args(argv)

    from kvfence.device import select
    from kvfence.errors import BadInput

    only = set(STAGES) if args.only is None else {x.strip() for x in args.only.split(",") if x.strip()}
    if not only or only - set(STAGES):
        print(f"throughput: error: --only {args.only!r}: choose from {', '.join(STAGES)}", file=sys.stderr)
        return 2
    if args.skip_runs:
        only -= {"runs", "scale"}
    try:
        device = select(args.device)
    except BadInput as exc:
        print(f"throughput: error: {exc}", file=sys.stderr)
        return 2
    import torch
    import triton

    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
           "torch": torch.__version__, "triton": triton.__version__,
           "command": "python benchmarks/throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    examples = (300 if args.quick else 2000) if device == "cuda" else (20 if args.quick else 100)
    def stage(results: dict) -> None:
        # Written after every stage: a run cut short by a time limit still leaves what it measured.
        out.update(results)
        Path(args.json).write_text(json.dumps(stamped(out), indent=2) + "\n")
        print(f"throughput: {', '.join(k for k in results if not isinstance(results[k], (dict, list)))} done",
              file=sys.stderr, flush=True)

    if "small" in only:
        stage(small_rate(device, examples, args.seed))
    if "naive" in only:
        stage(naive_vs_kvfence(device, args.quick, args.seed))
    if "parent" in only:
        stage(parent_rate(3.0 if args.quick else 10.0, args.seed))
    if device == "cuda":
        if "check_small" in only:
            stage(check_small(device))
        if "large" in only:
            stage(large(device, naive="naive" in only))
        if "runs" in only:
            stage(fuzz_runs(args.seconds, args.jobs, args.pinned_seconds or args.seconds))
        if "scale" in only:
            stage(scale_mutants(args.scale_seconds or args.seconds))
    else:
        out.update({k: None for k in ("kernel_replay_us_large", "verify_us_large", "large_verify_over_kernel",
                                      "naive_s_large", "speedup_vs_naive")})
    Path(args.json).write_text(json.dumps(stamped(out), indent=2) + "\n")
    width = max(len(k) for k in out)
    for k, v in out.items():
        if not isinstance(v, list) and not k.endswith("_run") and k != "scale_mutant_runs":
            print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
