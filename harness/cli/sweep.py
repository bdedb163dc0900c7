"""``kvfence sweep``: the nightly job (kvfence.sanitizer.sweep).

``add_parser(sub)`` adds the subcommand to ``sub`` (kvfence.cli.build_parser) with this handler as its ``func``.
"""

from __future__ import annotations

from kvfence.cli.common import _exit_codes, _non_negative_int, _out_dir, _positive_int, _stderr
from kvfence.errors import require


def cmd_sweep(args) -> int:
    """The nightly job (kvfence.sanitizer.sweep): canary fuzzing, then compute-sanitizer on the cases it found."""
    from kvfence.engine import registry
    from kvfence.engine import run as pipeline
    from kvfence.engine.budget import default_budget
    from kvfence.engine.plan import RunPlan
    from kvfence.engine.probe import check_plugins
    from kvfence.sanitizer import tool as sanitizer
    from kvfence.sanitizer.sweep import run_sweep

    kernel_given = args.kernel is not None
    kernel = args.kernel or "reference"
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    require(tools and all(t in sanitizer.TOOLS for t in tools),
            f"--tools {args.tools!r}: choose from {', '.join(sanitizer.TOOLS)}")
    require(args.cases is None or args.max_examples is None, "--cases and --max-examples exclude each other")
    require(args.timeout > 0, f"--timeout {args.timeout:g}: expected a positive number of seconds")
    record = registry.get(args.contract)
    # The canary phase draws what the plain CPU-sized fuzz draws, with the pins the contract's options declare for
    # it (``Option.canary``: the draft's §6 fields off); the layout and the sizing as given. Anything the contract
    # cannot run is one line before anything runs.
    pins = {o.key: o.canary for o in record.options if o.canary is not None}
    sizing = args.sizing or "safe"

    def plan_for(device: str) -> RunPlan:
        return RunPlan(contract=record.name, kernel=kernel, sizing=sizing, device=device, mode=args.mode,
                       layout=args.layout, domain="cpu", pins=pins, max_bytes=default_budget(device))

    # A bad --kernel or --sizing is exit 2 naming it, before the tool and GPU checks (it needs neither).
    pipeline.record(plan_for("cpu"))
    if kernel_given:
        check_plugins(record, {"kernel": kernel, "sizing": sizing})
        # The contract's draws check the kernel against its ABI (the draft's: a @triton.jit function or a
        # launcher), as fuzz does before any launch; the probe above only imports it.
        pipeline.draws(plan_for("cpu"))
    return run_sweep(tools=tools, cases_dir=args.cases, max_examples=args.max_examples or 500, jobs=args.jobs,
                     plan_for=plan_for, out_dir=_out_dir(args.out), seed=args.seed, max_failing=args.max_failing,
                     sample=args.sample, timeout=args.timeout, announce=_stderr,
                     kernel_override=kernel if args.cases is not None and kernel_given else None,
                     matrix=args.matrix)


def add_parser(sub) -> None:
    sw = sub.add_parser("sweep", help="nightly: canary fuzzing, then compute-sanitizer on failing and sampled cases",
                        epilog=_exit_codes(zero="no canary or sanitizer finding",
                                           two="bad input, no GPU or no compute-sanitizer (one line on stderr)"))
    sw.add_argument("--tools", default=",".join(("memcheck", "initcheck", "racecheck", "synccheck")),
                    help="comma-separated compute-sanitizer tools")
    sw.add_argument("--cases", default=None,
                    help="re-run the case files in this folder instead of fuzzing (default: fuzz)")
    sw.add_argument("--max-examples", type=_positive_int, default=None, help="canary examples (default 500)")
    sw.add_argument("--jobs", type=_positive_int, default=1, help="sanitizer processes at a time")
    sw.add_argument("--sizing", default=None,
                    help="sizing policy of the canary phase, as fuzz --sizing (prefix: the pre-fix CUDA-graph "
                         "policy, W = max_bs*ctx, missing the topk factor; default: the contract's safe one)")
    sw.add_argument("--mode", default="eager", choices=["graph", "eager"],
                    help="eager: caching allocator off under the tools (memcheck sees overflows); graph: on")
    sw.add_argument("--layout", default="redzone", choices=["redzone", "production"], help="canary-phase layout")
    sw.add_argument("--max-failing", type=_positive_int, default=12, help="failing cases sent to the tools")
    sw.add_argument("--sample", type=_non_negative_int, default=3, help="passing cases sent to the tools")
    sw.add_argument("--timeout", type=float, default=300.0, help="seconds per sanitizer process")
    sw.add_argument("--seed", type=_non_negative_int, default=None, help="Hypothesis seed (default: random)")
    sw.add_argument("--out", default="reports/out", help="folder for sweep.json, sweep.html, cases/ and logs")
    sw.add_argument("--kernel", default=None,
                    help="kernel to sweep (as fuzz --kernel; default reference); with --cases it replaces the "
                         "kernel the case files name")
    from kvfence.engine import registry

    sw.add_argument("--contract", default=registry.default_name(), choices=registry.names(),
                    help="the contract the canary phase fuzzes (--cases: each file names its own)")
    sw.add_argument("--matrix", action="store_true",
                    help="also run the detection matrix (canaries vs memcheck variants per bug class, eager and "
                         "graph) into sweep.json / sweep.html")
    sw.set_defaults(func=cmd_sweep)
