"""Throughput of kvfence, side by side with the kernel alone and with a naive harness.

    python benchmarks/throughput.py --json PATH [--device cuda|cpu] [--quick] [--skip-runs]

Measures, in one run (every rate counts only cases launched and verified, never cache hits):

* ``default_verified_cases_per_s``: the default ``python -m harness fuzz --device cuda`` (no pinned field:
  the GPU domain, default ``--jobs``, config-major batches) over a ``--max-seconds`` run, process start,
  compiles and captures included (wall time of the whole command); ``default_run`` keeps its summary;
* ``pinned_verified_cases_per_s``: the same with a pinned small config (``SMALL``) and ``--jobs``;
* ``check_us_small``: kvfence's own check path on pre-drawn small cases (``Session.check_many`` in
  batches of 32: staging, three graph replays per case, one read-back per batch), per case;
* ``scale_mutants_caught_s``: for each scale mutant (``DOMAIN = "gpu"``), seconds from the start of the
  default fuzz command until its first finding (``first_failure_s`` of the merged summary);
* ``small_cases_per_s`` (and variants): one process, one Hypothesis example per case or up to 8;
* ``kernel_replay_us_large``: the kernel's own CUDA-graph replay for a large batch (256 requests x
  L 4096 x topk 8 x 5 steps), ``triton.testing.do_bench`` median; ``verify_us_large`` and
  ``prepare_us_large``: the on-device verification and re-poison graphs (do_bench medians);
  ``case_us_large``: a whole verified case through ``Session.check`` (CUDA events, median);
* ``naive_s_large``: a naive harness on the same case: eager launch into plain tensors, copy everything
  to the host, Python loop over programs comparing each segment with the table.

On ``--device cpu`` (the interpreter) only the small-case rate is measured (``--quick`` shrinks it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = dict(topk=2, num_steps=3, page_size=1, ctx=512, max_bs=16)
LARGE = dict(topk=8, num_steps=5, page_size=1, ctx=4096, max_bs=256)


def small_rate(device: str, examples: int, seed: int) -> dict:
    from harness.fuzz import fuzz
    from harness.session import Session
    from strategies import case_runs, cases, configs

    session = Session(device, "reference")
    strategy = cases(configs(sizing="safe", **SMALL))
    # Warm-up: compiles the kernels and captures every bucket's graphs.
    fuzz(session, strategy, max_examples=min(examples, 200), seed=seed + 1)
    out = {}
    for targeting, key in ((False, "small_cases_per_s"), (True, "small_cases_per_s_targeting")):
        rates = []
        for rep in range(3 if device == "cuda" else 1):
            result = fuzz(session, strategy, max_examples=examples, seed=seed + 2 + rep, targeting=targeting)
            assert not result.findings, [f.headline() for f in result.findings]
            rates.append(result.cases_per_s)
        out[key] = round(statistics.median(rates), 1)
        out[key.replace("per_s", "rates")] = [round(r, 1) for r in rates]
    # Throughput mode: up to 8 batches of the config per Hypothesis example (strategies.case_runs).
    runs = case_runs(configs(sizing="safe", **SMALL), max_batches=8)
    rates = []
    for rep in range(3 if device == "cuda" else 1):
        result = fuzz(session, runs, max_examples=max(1, examples // 4), seed=seed + 7 + rep, targeting=False)
        assert not result.findings, [f.headline() for f in result.findings]
        rates.append(result.cases_per_s)
    out["small_cases_per_s_8_per_example"] = round(statistics.median(rates), 1)
    out["small_rates_8_per_example"] = [round(r, 1) for r in rates]
    return dict(out, small_examples=examples, small_session_stats=dict(session.stats))


def naive_check(config, batch) -> float:
    """Eager launch into plain tensors, copy to the host, Python loop over programs. Returns seconds."""
    import torch

    from harness import oracle
    from harness.case import launch_batch
    from harness.runner import slot_table
    from kernels.draft_kv_indices import generate_draft_decode_kv_indices, launch

    t0 = time.perf_counter()
    lb = launch_batch(config, batch)
    dev = "cuda"
    table = slot_table(batch.token_seed, config.pool_rows, config.pool_len, dev)
    width = config.row_width(lb.num_seqs)
    kv_indices = torch.zeros(config.num_steps, width, dtype=torch.int32, device=dev)
    kv_indptr = torch.zeros(config.num_steps, lb.num_seqs * config.topk + 1, dtype=torch.int32, device=dev)
    launch(generate_draft_decode_kv_indices, req_pool_indices=torch.tensor(lb.req_pool_indices, device=dev),
           req_to_token=table, seq_lens=torch.tensor(lb.seq_lens, dtype=torch.int32, device=dev),
           kv_indices=kv_indices, kv_indptr=kv_indptr, positions=torch.tensor(lb.positions, device=dev),
           topk=config.topk, num_steps=config.num_steps, page_size=config.page_size)
    rows, ptr, tab = kv_indices.cpu().tolist(), kv_indptr.cpu().tolist(), table.cpu().tolist()
    bad = 0
    for s in range(config.num_steps):
        row = rows[s]
        for b, L in enumerate(lb.seq_lens):
            src = tab[lb.req_pool_indices[b]]
            for k in range(config.topk):
                start = oracle.segment_offset(lb.seq_lens, config.topk, s, b, k)
                e = oracle.draft_slot_start(L, k, config.topk, config.num_steps, config.page_size)
                expected = src[:L] + src[e:e + s + 1]
                bad += sum(1 for x, y in zip(row[start:start + L + s + 1], expected) if x != y)
                z = b * config.topk + k or lb.num_seqs * config.topk
                bad += ptr[s][z] != sum(lb.positions[:z]) + z * (s + 1)
    assert bad == 0
    return time.perf_counter() - t0


def large(device: str) -> dict:
    import torch
    import triton.testing

    from harness.case import Batch, Case, Config
    from harness.device_verify import DeviceVerifier
    from harness.session import Session

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
    from harness.guarded import POISON

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
        "indptr_us": bench(lambda: verifier._indptr(runner.kv_indptr, positions=inputs.positions, counts=verifier.counts,
                                                    num_seqs=m, topk=c.topk, poison=POISON, poison_back=True)),
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
    # A whole verified case (staging copy, three graph replays, counters back), CUDA events, median.
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        assert session.check(case) == []
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    case_us = statistics.median(times)
    naive_s = naive_check(config, batch)
    bytes_out = config.num_steps * config.row_width(LARGE["max_bs"]) * 4
    return {
        "kernel_replay_us_large": round(kernel_us, 1),
        "verify_us_large": round(verify_us, 1),
        "prepare_us_large": round(prepare_us, 1),
        "case_us_large": round(case_us, 1),
        "large_verify_over_kernel": round(verify_us / kernel_us, 2),
        # The whole check of a replay (prepare + verify-and-re-poison) against the kernel's own replay.
        "large_check_over_kernel": round((prepare_us + verify_us) / kernel_us, 2),
        # The same from the fused per-case graph: (fused replay - kernel replay) / kernel replay.
        "fused_case_us_large": round(fused_us, 1),
        "large_fused_check_over_kernel": round((fused_us - kernel_us) / kernel_us, 2),
        "naive_s_large": round(naive_s, 2),
        "speedup_vs_naive": round(naive_s * 1e6 / case_us, 1),
        "large_kv_indices_mib": round(bytes_out / 2**20, 1),
        "large_verify_parts_us": parts,
    }


def _fuzz_cli(args, timeout: float) -> dict:
    """Run ``python -m harness fuzz ARGS --json`` as a user would; its summary plus the command's wall time."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "harness", "fuzz", *args, "--out", str(out), "--json", str(Path(tmp) / "s.json"),
               "--quiet"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
        doc = json.loads((Path(tmp) / "s.json").read_text())
    keys = ("examples", "generated_cases", "verified_cases", "cached_cases", "launches", "elapsed_s", "cases_per_s",
            "distinct_configs", "compiles", "captures", "compile_s", "capture_s", "jobs", "domain", "largest_config",
            "boundaries", "first_failure_s", "time_cut", "batches_per_example", "max_gpu_mem")
    return dict({k: doc.get(k) for k in keys}, wall_s=round(wall, 2), exit=proc.returncode,
                command="python -m harness fuzz " + " ".join(args),
                findings=sorted({f["kind"] for f in doc.get("findings", [])}))


def fuzz_runs(seconds: float, jobs, pinned_seconds: float) -> dict:
    """The default GPU command over ``seconds`` and a pinned small config with --jobs over ``pinned_seconds``."""
    out = {}
    default = _fuzz_cli(["--device", "cuda", "--max-examples", "100000000", "--max-seconds", str(seconds)],
                        timeout=seconds + 240)
    assert not default["findings"], default
    out["default_run"] = default
    out["default_verified_cases_per_s"] = round(default["verified_cases"] / default["wall_s"], 1)
    pinned_flags = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    pinned = _fuzz_cli(["--device", "cuda", "--max-examples", "100000000", "--max-seconds", str(pinned_seconds),
                        *pinned_flags] + (["--jobs", str(jobs)] if jobs else []), timeout=pinned_seconds + 240)
    assert not pinned["findings"], pinned
    out["pinned_run"] = pinned
    out["pinned_verified_cases_per_s"] = round(pinned["verified_cases"] / pinned["wall_s"], 1)
    return out


def scale_mutants(seconds: float) -> dict:
    """Seconds until the default GPU fuzz command catches each scale mutant (DOMAIN = "gpu")."""
    from harness.mutants import discover

    caught, runs = {}, {}
    for m in discover():
        if m.domain != "gpu":
            continue
        run = _fuzz_cli(["--device", "cuda", "--kernel", m.kernel, "--max-examples", "100000000", "--max-seconds",
                         str(seconds), "--shrink-seconds", "10"], timeout=seconds + 240)
        runs[m.name] = run
        caught[m.name] = run["first_failure_s"] if run["findings"] else None
    return {"scale_mutants_caught_s": caught, "scale_mutant_runs": runs}


def check_small(device: str, cases: int = 4096, batch: int = 32) -> dict:
    """kvfence's check path alone on pre-drawn small cases: ``Session.check_many`` per batch of one config."""
    from hypothesis import HealthCheck, Phase, given, settings

    from harness.session import Session
    from strategies import case_runs, configs

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
    t0 = time.perf_counter()
    for runs in drawn:
        assert all(f == [] for f in session.check_many(runs))
    elapsed = time.perf_counter() - t0
    return {"check_us_small": round(elapsed / total * 1e6, 1), "check_small_cases": total,
            "check_small_batches": len(drawn), "check_small_stats": dict(session.stats)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="fewer examples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each fuzz-command run (CUDA)")
    parser.add_argument("--jobs", type=int, default=None, help="--jobs of the pinned run (default: fuzz's default)")
    parser.add_argument("--pinned-seconds", type=float, default=None, help="length of the pinned run (default --seconds)")
    parser.add_argument("--scale-seconds", type=float, default=None,
                        help="--max-seconds of each scale-mutant run (default --seconds)")
    parser.add_argument("--skip-runs", action="store_true", help="skip the fuzz-command runs and the scale mutants")
    args = parser.parse_args(argv)

    from harness.device import select
    from harness.errors import BadInput

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
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"throughput: {', '.join(k for k in results if not isinstance(results[k], (dict, list)))} done",
              file=sys.stderr, flush=True)

    stage(small_rate(device, examples, args.seed))
    if device == "cuda":
        stage(check_small(device))
        stage(large(device))
        if not args.skip_runs:
            stage(fuzz_runs(args.seconds, args.jobs, args.pinned_seconds or args.seconds))
            stage(scale_mutants(args.scale_seconds or args.seconds))
    else:
        out.update({k: None for k in ("kernel_replay_us_large", "verify_us_large", "large_verify_over_kernel",
                                      "naive_s_large", "speedup_vs_naive")})
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    width = max(len(k) for k in out)
    for k, v in out.items():
        if not isinstance(v, list) and not k.endswith("_run") and k != "scale_mutant_runs":
            print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
