"""``python -m kvfence COMMAND``: the command line, one module for every subcommand.

Exit codes (``kvfence.errors``): 0 no finding, 1 findings, 2 bad input or unusable environment, always
as one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import textwrap
from pathlib import Path
from typing import List, Optional

from kvfence.errors import EXIT_BAD_INPUT, EXIT_CLEAN, EXIT_FINDINGS, BadInput, require


#: The name the command line gives itself: the console script is ``kvfence``; ``python -m kvfence``
#: passes its own name (``kvfence.__main__``), so usage lines show what the user actually typed.
PROG = "kvfence"

_BAD = "bad input or unusable environment (one line on stderr)"


def _exit_codes(zero: str = "no finding", one: Optional[str] = "findings", two: str = _BAD) -> str:
    """An epilog listing a command's exit codes (``kvfence.errors``)."""
    rows = [(EXIT_CLEAN, zero), (EXIT_FINDINGS, one), (EXIT_BAD_INPUT, two)]
    return "exit codes:\n" + "\n".join(f"  {code}  {text}" for code, text in rows if text)


#: Exit codes shared by every command; a command's epilog may state what 0 and 1 mean for it.
EXIT_CODES = _exit_codes()


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows every option's default.

    ``%(default)s`` is appended unless the help text already says what the default is (options whose
    default is ``None`` describe it in words, e.g. "default: drawn by Hypothesis"); a flag that only
    switches something on says "default: off". The epilog (exit codes) keeps its line breaks.
    """

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2 (no usage dump).

    Every parser (subcommands included, also ones added later) shows defaults in its help and, unless
    it states its own, the shared exit codes in its epilog.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("epilog", EXIT_CODES)
        # The formatter keeps line breaks (for the exit-code list), so long lines are wrapped here.
        for key in ("description", "epilog"):
            if kwargs.get(key):
                kwargs[key] = "\n".join(textwrap.fill(line, 88, break_on_hyphens=False,
                                                      subsequent_indent=" " * (len(line) - len(line.lstrip())))
                                        for line in kwargs[key].splitlines())
        super().__init__(*args, **kwargs)

    def error(self, message):
        # main() prints "kvfence: error: ..."; name only the command after the program (``fuzz: ...``).
        command = self.prog.split("kvfence", 1)[-1].strip()
        raise BadInput(f"{command}: {message}" if command else message)


def _int_at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``, with a one-line error naming ``what`` it must be."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "a non-negative integer")


def _seconds(minimum_exclusive: bool):
    """An argparse type: finite seconds, > 0 (``minimum_exclusive``) or >= 0; NaN and inf are refused."""

    def parse(text: str) -> float:
        import math

        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > 0 if minimum_exclusive else value >= 0)
        if not ok:
            what = "a positive" if minimum_exclusive else "a non-negative"
            raise argparse.ArgumentTypeError(f"expected {what} finite number of seconds, got {text!r}")
        return value

    return parse


def _shard(text: str):
    """An argparse type: ``--shard I/N`` (kvfence.workflow.campaign.parse_shard), one-line error otherwise."""
    from kvfence.workflow.campaign import parse_shard

    try:
        return parse_shard(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shard ")) from None


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _probe_folder(folder: Path, what: str, path) -> None:
    """Create and remove a temp file in ``folder`` (or its nearest existing parent, where the folder
    would be created): the only check that holds for root, read-only mounts and /proc alike."""
    import tempfile

    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvfence-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise BadInput(f"{what} {path}: cannot write in {probe}: {exc.strerror or exc}") from None


def _writable(path: Optional[str], what: str) -> Optional[Path]:
    """Fail before any work if an output path cannot be written (its folder must exist)."""
    if path is None:
        return None
    require(path.strip() != "", f"{what}: empty path (name a file)")  # Path("") would mean the current folder
    p = Path(path)
    require(p.parent.is_dir() if str(p.parent) else True, f"{what} {path}: folder {p.parent} does not exist")
    require(not p.is_dir(), f"{what} {path} is a directory")
    require(not p.exists() or p.is_file(), f"{what} {path}: not a regular file")
    _probe_folder(p.parent if str(p.parent) else Path("."), what, path)
    return p


# -- fuzz ---------------------------------------------------------------------------------------------
def _add_worker_args(p: argparse.ArgumentParser) -> None:
    """Where cases run (kvfence.workflow.worker): a worker process that may crash or hang, or this process."""
    from kvfence.workflow.worker import DEFAULT_CASE_TIMEOUT

    p.add_argument("--case-timeout", type=_seconds(True), default=DEFAULT_CASE_TIMEOUT,
                   help="seconds a small case may run before it is a HANG (scaled up by the case's size)")
    p.add_argument("--in-process", action="store_true",
                   help="launch kernels in this process instead of a worker (debugging: a crash ends the run)")


def _add_target_args(p: argparse.ArgumentParser, *, sizing_default: Optional[str] = "safe") -> None:
    p.add_argument("--kernel", default="reference",
                   help="kernel under test: reference, reference-blocked, package.module:attr or path/file.py:attr")
    p.add_argument("--sizing", default=sizing_default,
                   help="row-width policy of kv_indices: eager, fixed, prefix (the pre-fix CUDA-graph policy, "
                        "W = max_bs*ctx, missing the topk factor), safe, window-fixed / window-no-topk (the window "
                        "rail's, W = max_bs*topk*w / max_bs*w), or module:attr / file.py:attr")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="cpu: Triton interpreter; cuda: compiled kernels in CUDA graphs; auto: cuda when present")
    p.add_argument("--no-audit", action="store_true",
                   help="CPU only: turn off the interpreter address audit (OOB_READ/OOB_WRITE; on by default)")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", default="graph", choices=["graph", "eager"],
                   help="graph: buffers sized once at max_bs, batches padded to a capture bucket; "
                        "eager: buffers sized per batch")
    p.add_argument("--layout", default="redzone", choices=["redzone", "production"],
                   help="redzone: a guard after every step row; production: rows contiguous, as upstream")
    p.add_argument("--seq-len-limit", default="ctx", choices=["ctx", "ctx-steps"],
                   help="longest request: ctx, or ctx-steps (requests keep num_steps of draft headroom)")
    for flag in ("--topk", "--num-steps", "--page-size", "--ctx", "--max-bs"):
        p.add_argument(flag, type=_positive_int, default=None,
                       help="pin this config field (default: drawn by Hypothesis)")


def _add_family_args(p: argparse.ArgumentParser) -> None:
    """docs/contract.md §6: the newer kernel family's fields, pinned like --topk (drawn when the kernel
    under test takes them, off for a classic-ABI kernel)."""
    p.add_argument("--contract", default="draft", choices=["draft", "window-rail"],
                   help="which kernel contract: the draft kernel, or the sliding-window read rail (needs --window)")
    p.add_argument("--window", type=_non_negative_int, default=None,
                   help="pin window_size, the sliding window (0: none; default: drawn when the kernel takes it)")
    p.add_argument("--sink", type=_non_negative_int, default=None,
                   help="pin sink_size, the attention sinks kept beside the window (default: drawn when the kernel "
                        "takes it)")
    p.add_argument("--entry-page-size", type=_positive_int, default=None,
                   help="pin ENTRY_PAGE_SIZE, tokens per req_to_token entry, a power of two (default: drawn when "
                        "the kernel takes it)")
    p.add_argument("--translate", choices=["on", "off"], default=None,
                   help="pin TRANSLATE, reads through a drawn v2p page table (default: drawn when the kernel "
                        "takes it)")
    p.add_argument("--family", choices=["auto", "on", "off"], default="auto",
                   help="draw the §6 fields (window, sinks, entry page size, translation) for a kernel that takes "
                        "them: auto = on the CPU domain, off on the GPU domain, where §6 cases are verified on the "
                        "host and would take most of a production-scale run (default: auto)")


def _family_pins(args) -> dict:
    """The §6 pins of ``args`` (None: drawn), as ``kvfence.strategies.configs`` keywords."""
    translate = getattr(args, "translate", None)
    return dict(window_size=getattr(args, "window", None), sink_size=getattr(args, "sink", None),
                entry_page_size=getattr(args, "entry_page_size", None),
                translate=None if translate is None else translate == "on",
                contract=getattr(args, "contract", "draft"))


def _draws_family(args, domain) -> bool:
    """Whether the §6 fields are drawn: the kernel takes them (``_check_family``) and ``--family`` is on,
    or auto on the CPU domain (on the GPU domain §6 cases are checked by the host verdict, ~100x the
    device verifier's cost per case, so auto leaves them to ``--family on`` or a pinned field there)."""
    family = getattr(args, "family", "auto")
    return bool(getattr(args, "draw_family", False)) and (family == "on" or domain.name == "cpu")


def _config_strategy(args, domain, max_bytes):
    from kvfence.strategies import configs

    return configs(topk=args.topk, num_steps=args.num_steps, page_size=args.page_size, ctx=args.ctx,
                   max_bs=args.max_bs, sizing=args.sizing, layout=args.layout, mode=args.mode, domain=domain,
                   max_bytes=max_bytes, family=_draws_family(args, domain), **_family_pins(args))


def _check_family(args) -> None:
    """§6 flags against the kernel under test (one line, exit 2): the rail needs --window, and a kernel
    must declare every §6 parameter a pin sets. Sets ``args.draw_family``: draw the §6 fields when the
    kernel takes them all (kvfence's reference, SGLang 0.5.2x), never for a classic-ABI kernel."""
    from kvfence.cases.case import Config
    from kvfence.cases.targets import kernel_capabilities

    pins = _family_pins(args)
    require(not (pins["contract"] == "window-rail" and not pins["window_size"]),
            "--contract window-rail needs --window W (W >= 1): the rail's window is part of its ABI")
    caps = kernel_capabilities(args.kernel)
    probe = Config(topk=1, num_steps=1, window_size=pins["window_size"] or 0, sink_size=pins["sink_size"] or 0,
                   entry_page_size=pins["entry_page_size"] or 1, translate=bool(pins["translate"]),
                   contract=pins["contract"])
    caps.check_config(args.kernel, probe)
    family = getattr(args, "family", "auto")
    require(family != "on" or caps.family,
            f"--family on: kernel {args.kernel!r} does not take the §6 parameters (a classic-ABI kernel)")
    args.draw_family = caps.family and family != "off"


def _out_dir(path: str) -> Path:
    """``--out``: must be a folder or not exist yet (created only once all input has been validated)."""
    require(path.strip() != "", "--out: empty path (name a folder)")  # Path("") would mean the current folder
    p = Path(path)
    require(not p.exists() or p.is_dir(), f"--out {path}: exists and is not a directory")
    _probe_folder(p, "--out", path)
    return p


#: What ``fuzz --resume`` uses; any other flag set away from its default is refused (it would be ignored).
_RESUME_FLAGS = {"out", "device", "json", "quiet", "resume", "in_process", "case_timeout"}


def _check_resume_flags(args) -> None:
    ignored = sorted(dest for dest, default in args.fuzz_defaults.items()
                     if dest not in _RESUME_FLAGS and getattr(args, dest) != default)
    require(not ignored, f"--resume only collects cases left in flight by runs that died; it would ignore "
                         f"{', '.join('--' + d.replace('_', '-') for d in ignored)}: drop them or run without --resume")


def _make_session(args, device: str, max_bytes: Optional[int]):
    """The checking session: a worker process (default; crashes and hangs become findings, kvfence.workflow.worker)
    or, with ``--in-process``, this process itself (for debugging the harness). The worker starts in the
    background (torch and the CUDA context load while this process builds its strategies); the caller
    joins it with ``wait_ready()`` before the first example."""
    audit = False if args.no_audit else None
    if args.in_process:
        from kvfence.verifying.session import Session

        return Session(device, args.kernel, audit=audit, max_bytes=max_bytes)
    from kvfence.workflow.worker import RemoteSession

    return RemoteSession(device, args.kernel, audit=audit, max_bytes=max_bytes, case_timeout=args.case_timeout,
                         background=True)


#: The default budgets: the CPU's interpreter checks an example budget; on CUDA the plain command checks
#: what the machine can check in ``DEFAULT_GPU_SECONDS`` (on every core, ``_default_jobs``).
DEFAULT_MAX_EXAMPLES = 100
DEFAULT_GPU_SECONDS = 60.0


def _resolve_budget(args, device: str) -> None:
    """Fill in ``--max-examples`` / ``--max-seconds``: a time budget alone bounds the run by time
    (examples unbounded); with neither, CUDA gets ``DEFAULT_GPU_SECONDS``, the CPU ``DEFAULT_MAX_EXAMPLES``."""
    from kvfence.workflow.progress import UNBOUNDED_EXAMPLES

    if args.max_examples is None and args.max_seconds is None and device == "cuda":
        args.max_seconds = DEFAULT_GPU_SECONDS
    if args.max_examples is None:
        args.max_examples = UNBOUNDED_EXAMPLES if args.max_seconds is not None else DEFAULT_MAX_EXAMPLES


#: Examples a ``--jobs`` child should get at least, so process start-up does not dominate a short run.
MIN_EXAMPLES_PER_JOB = 50
#: Batches of one config per Hypothesis example on CUDA (config-major: compile and capture once, replay many).
GPU_BATCHES_PER_EXAMPLE = 32


def _default_jobs(device: str, max_examples: int, max_seconds) -> int:
    """All useful CPU cores on CUDA (one left for the parent and the driver), fewer when the example
    budget is too small to keep them busy; one process on the CPU (the interpreter is the bottleneck)."""
    if device != "cuda":
        return 1
    cores = max(1, (os.cpu_count() or 2) - 1)
    if max_seconds is not None:
        return min(cores, 16)
    return max(1, min(cores, 16, max_examples // MIN_EXAMPLES_PER_JOB))


def _resolve_run_shape(args, device: str):
    """Domain, jobs, batches per example and memory budget of a fuzz run (validated, one-line errors)."""
    from kvfence.cases.budget import default_budget, parse_size
    from kvfence.cases.domain import domain_named

    scale = args.scale or ("gpu" if device == "cuda" else "cpu")
    require(not (scale == "gpu" and device != "cuda"),
            "--scale gpu needs --device cuda: production-sized launches under the interpreter would take hours")
    domain = domain_named(scale)
    jobs = args.jobs if args.jobs is not None else _default_jobs(device, args.max_examples, args.max_seconds)
    from kvfence.workflow.jobs import JOB_MEMORY_BYTES, JOBS_PER_CORE, max_jobs  # before anything is sized by jobs

    require(jobs <= max_jobs(), f"--jobs {jobs}: this machine can hold at most {max_jobs()} jobs ({JOBS_PER_CORE} per "
                                f"CPU core, {JOB_MEMORY_BYTES >> 30} GiB of available memory each)")
    require(not (args.resume and jobs > 1), "--resume collects crashed cases of one folder; it takes no --jobs")
    per_example = args.batches_per_example or (GPU_BATCHES_PER_EXAMPLE if device == "cuda" else 1)
    max_bytes = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else default_budget(device, jobs)
    return domain, jobs, per_example, max_bytes


def _child_args(parser, args, *, seed: int, max_examples: int, max_bytes: int) -> List[str]:
    """The flags a ``--jobs`` child gets: the parent's, except those each child gets its own value of."""
    own = {"jobs", "seed", "out", "max_examples", "json", "quiet", "max_gpu_mem", "progress_file", "resume"}
    argv = []
    for action in parser._actions:
        if not action.option_strings or action.dest in own or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value is None or value is False or value == action.default:
            continue
        argv += [action.option_strings[0]] if value is True else [action.option_strings[0], str(value)]
    return argv + ["--jobs", "1", "--seed", str(seed), "--max-examples", str(max_examples), "--quiet",
                   "--max-gpu-mem", str(max_bytes)]


def cmd_fuzz(args) -> int:
    from kvfence.device import select
    from kvfence.cases.targets import resolve_sizing

    if args.resume:
        _check_resume_flags(args)
    json_path = _writable(args.json, "--json")
    out_dir = _out_dir(args.out)
    require(args.max_seconds is None or (args.max_seconds > 0 and args.max_seconds == args.max_seconds),
            f"--max-seconds {args.max_seconds}: expected a positive number of seconds")
    if not args.progress_file:  # a --jobs child's plug-ins were checked by its parent
        from kvfence.workflow.probe import check_plugins

        check_plugins({"kernel": args.kernel, "sizing": args.sizing})  # their import cannot end this process
    resolve_sizing(args.sizing)  # unknown policy: exit 2 before anything runs
    # Only the process that launches kernels imports torch: the supervisor and a --jobs parent do not.
    device = select(args.device, announce=_stderr, prepare=bool(args.in_process))
    _check_family(args)  # §6 flags against the kernel: exit 2 before anything runs
    _resolve_budget(args, device)
    domain, jobs, per_example, max_bytes = _resolve_run_shape(args, device)
    session = None
    if jobs == 1 and not args.resume:
        if out_dir.is_dir():  # another run in this folder: refused now, before a worker starts
            _lock_out(out_dir)
        # Start-up off the critical path: the worker starts first, everything else happens meanwhile.
        session = _make_session(args, device, max_bytes)
    try:
        return _fuzz_prepared(args, device, session, json_path, out_dir, domain, jobs, per_example, max_bytes)
    finally:
        if hasattr(session, "close"):
            session.close()


def _fuzz_prepared(args, device: str, session, json_path: Optional[Path], out_dir: Path, domain, jobs: int,
                   per_example: int, max_bytes: int) -> int:
    """``cmd_fuzz`` once the device is chosen and the worker is starting: strategies, database, the run."""
    from kvfence.strategies import case_runs, cases

    from kvfence.workflow import campaign

    # Validates every pinned field and the budget now (BadInput), not inside Hypothesis.
    config_strategy, shard_info = _config_strategy(args, domain, max_bytes), None
    if args.shard is not None:  # this host's part of the config space (kvfence.workflow.campaign)
        config_strategy, shard_info = campaign.shard_configs(
            args.shard, lambda **pins: _config_strategy(argparse.Namespace(**{**vars(args), **pins}), domain, max_bytes),
            {name: getattr(args, name) for name in campaign.CELL_FIELDS}, campaign.cell_domains(domain))
    if per_example > 1:
        strategy = case_runs(config_strategy, kernel=args.kernel, seq_len_limit=args.seq_len_limit,
                             max_batches=per_example)
    else:
        strategy = cases(config_strategy, kernel=args.kernel, seq_len_limit=args.seq_len_limit)
    strategy.validate()
    from kvfence.cases.case import Config

    # The sizing policy on the smallest config the pinned fields allow: a bool, non-int or huge width is
    # refused now (one line), not in the middle of the run.
    from kvfence.kernels.sizing import WINDOW_POLICIES

    Config(topk=args.topk or 1, num_steps=args.num_steps or 1, page_size=args.page_size or 1,
           ctx=args.ctx or (args.num_steps or 1) + 1, max_bs=args.max_bs or 1, sizing=args.sizing,
           layout=args.layout, mode=args.mode,
           window_size=args.window if args.window is not None else int(args.sizing in WINDOW_POLICIES),
           sink_size=args.sink or 0, contract=args.contract).row_width(1)
    seed, seed_source = (args.seed, "given") if args.seed is not None else (random.getrandbits(32), "random")
    run = {"device": device, "kernel": args.kernel, "sizing": args.sizing, "mode": args.mode, "layout": args.layout,
           "seq_len_limit": args.seq_len_limit, "seed": seed, "seed_source": seed_source, "resume": bool(args.resume),
           "jobs": jobs, "batches_per_example": per_example, "domain": domain.name, "domain_text": domain.describe(),
           "max_gpu_mem": max_bytes, "checking": "in-process" if args.in_process else "worker",
           # docs/contract.md §6: the contract, and the §6 fields pinned or drawn (None: drawn, if the kernel takes them)
           "contract": args.contract, "family_drawn": _draws_family(args, domain),
           "family_pins": {k: v for k, v in _family_pins(args).items() if k != "contract" and v is not None}}
    # The example database: a malformed URL here, an unreachable Redis below, both before any work.
    if args.database is None:
        args.database = campaign.default_database(out_dir)  # --jobs children share it
    db_spec = campaign.parse_database(args.database)
    if db_spec.password:  # --jobs children get it from the environment, never on their command line
        os.environ[campaign.REDIS_PASSWORD_ENV] = db_spec.password
        args.database = db_spec.display
    if jobs > 1:
        database = campaign.open_database(db_spec)
        db_key = campaign.database_key(kernel=args.kernel, sizing=args.sizing,
                                       domain=campaign.fuzz_domain(args, domain, per_example))
        run["campaign"] = campaign.summary_block(db_spec, db_key, shard_info, None,
                                                 campaign.stored_failures(database, db_key))
        return _fuzz_jobs(args, device, run, out_dir, json_path, max_bytes)
    previous = _previous_summary(out_dir) if args.resume else None
    if out_dir.is_dir():  # another run in this folder: refused now
        _lock_out(out_dir)
    database = None if args.resume else campaign.open_database(db_spec)
    db_key = campaign.database_key(kernel=args.kernel, sizing=args.sizing,
                                   domain=campaign.fuzz_domain(args, domain, per_example))
    run["campaign"] = campaign.summary_block(db_spec, db_key if database is not None else None, shard_info,
                                             campaign.shard_seed(seed, args.shard),
                                             campaign.stored_failures(database, db_key))
    if hasattr(session, "wait_ready"):
        session.wait_ready()  # resolves the kernel in the worker: BadInput here, before the first example
    return _fuzz_run(args, device, strategy, session, out_dir, json_path, previous, run, domain,
                     database=database, db_key=db_key, db_spec=db_spec)


def _lock_out(out_dir: Path) -> None:
    """Create ``--out`` and hold its lock (kvfence.workflow.outlock): a second run into it is refused, exit 2."""
    from kvfence.workflow import outlock

    outlock.acquire(out_dir, announce=_stderr)


#: Errnos of storage that stopped taking writes: a full disk or quota, a filesystem remounted read-only.
_FULL_DISK = ("ENOSPC", "EDQUOT", "EROFS", "EFBIG", "EIO")


def _fuzz_command(args) -> int:
    """``fuzz``: ``cmd_fuzz``, then the ``--out`` lock it took is released however it ended."""
    from kvfence.running import interrupt
    from kvfence.workflow import outlock

    interrupt.defer()  # a signal from now on is never lost: the run ends as interrupted, outputs written
    try:
        code = cmd_fuzz(args)
        signalled = interrupt.pending()  # e.g. while the outputs were being written: they were, in full
        return interrupt.exit_code_for(signalled) if signalled else code
    except OSError as exc:
        # Storage that stopped taking writes mid-run (journal, case file): one line, never a traceback.
        # Other OSErrors are not the disk's doing and stay loud.
        import errno as errno_mod

        if exc.filename is None or exc.errno not in {getattr(errno_mod, name, None) for name in _FULL_DISK}:
            raise
        raise _output_failure(exc.filename, exc) from None
    finally:
        outlock.release_all()


def _previous_summary(out_dir: Path) -> Optional[dict]:
    """``--resume`` adds to the folder's summary.json: it must be readable (or absent) before any work."""
    from kvfence.cases.casefile import parse_json_file
    from kvfence.reports.summary import validate

    where = out_dir / "summary.json"
    if not where.exists():
        return None
    try:
        return validate(parse_json_file(where, "summary"), str(where))
    except BadInput as exc:
        raise BadInput(f"--resume adds to {where}, which cannot be read: {exc}") from None


def _fuzz_run(args, device: str, strategy, session, out_dir: Path, json_path: Optional[Path], previous, run: dict,
              domain, *, database, db_key, db_spec) -> int:
    from kvfence.workflow.fuzz import FuzzResult, fuzz
    from kvfence.running.interrupt import exit_code_for, signals_interrupt
    from kvfence.running.journal import Journal, recover
    from kvfence.workflow.outdir import set_aside_earlier_cases

    _lock_out(out_dir)
    seed = run["seed"]
    if not args.resume:  # --resume adds to the folder's results: its case files stay where they are
        # Before anything is written: the folder's case files from earlier runs go to cases/earlier/<time>/.
        args.earlier_cases = set_aside_earlier_cases(out_dir)
        if args.earlier_cases:
            _stderr(f"kvfence: {args.earlier_cases['count']} case file(s) of an earlier run moved to "
                    f"{args.earlier_cases['folder']}")
    # Cases in flight when an earlier run's process died: CRASH findings (an unusable slot is set aside, said here).
    crashes = recover(out_dir, report=lambda line: _stderr(f"kvfence: {line}"))
    for crash in crashes:
        _stderr(f"kvfence: CRASH: a run died launching a case: {crash.path}")
    if args.resume:
        result = FuzzResult()
        print(f"kvfence fuzz --resume: {len(crashes)} crashed case(s) recovered from {out_dir}")
    else:
        from kvfence.workflow.progress import Progress

        progress = None if args.quiet else Progress(args.max_examples, seconds=args.max_seconds)
        callback = progress.update if progress else None
        if args.progress_file:
            from kvfence.workflow.jobs import POLL_S, write_progress

            callback = lambda r, path=Path(args.progress_file): write_progress(path, r)  # noqa: E731
        # SIGINT/SIGTERM end fuzz() cleanly (kvfence.running.interrupt); the journal slot closes as on any exit.
        with Journal(out_dir, device=device) as journal, signals_interrupt():
            run_fuzz, keep_going = fuzz, {}
            if args.keep_going:  # phases until the budgets are spent; each new failure saved at once
                from kvfence.workflow.keepgoing import fuzz_keep_going

                run_fuzz = fuzz_keep_going
                keep_going = {"on_failure": lambda failure: _save_failure(args, run, device, out_dir, failure)}
            try:
                result = run_fuzz(session, strategy, max_examples=args.max_examples, on_first_failure=_announcer(),
                              seed=run["campaign"]["hypothesis_seed"], database=database, database_key=db_key,
                              shrink_seconds=args.shrink_seconds, journal=journal, targeting=not args.no_target,
                              progress=callback, max_seconds=args.max_seconds,
                              progress_every_s=POLL_S if args.progress_file else (progress.every_s if progress else 2.0),
                              **keep_going)
            finally:
                if progress:
                    progress.close()
        if result.interrupted:
            _stderr(f"kvfence: {result.interrupted}: run stopped; writing what was checked")
        if run["campaign"]["stored_failures_at_start"]:
            print(f"kvfence fuzz: replayed {run['campaign']['stored_failures_at_start']} stored failure(s) "
                  f"from {db_spec.display} first")
        print(f"kvfence fuzz: {result.verified_cases} cases verified ({result.cached_cases} from cache) in "
              f"{result.elapsed_s:.1f}s ({result.cases_per_s:.1f} verified cases/s, {result.structural_cases_per_s:.1f} "
              f"structurally distinct/s) on {device}, kernel {args.kernel}, "
              f"sizing {args.sizing}, mode {args.mode}, layout {args.layout}, domain {domain.name}, "
              f"seed {'random (%d)' % seed if run['seed_source'] == 'random' else seed}")
    run = dict(run, interrupted=result.interrupted, **_phases(session, result))
    if session is not None and not args.in_process:
        run["worker"] = {k: v for k, v in session.stats.items()}
    code = _fuzz_outputs(args, device, result, crashes, out_dir, json_path, run, previous=previous)
    return exit_code_for(result.interrupted) if result.interrupted else code


def _clear_progress_line() -> None:
    """On a terminal, erase the progress line (kvfence.workflow.progress) before a line of its own."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[2K")


#: How the first verdict begins on stderr (benchmarks/first_verdict.py times the command to this line).
FIRST_FAILURE = "kvfence: first failure"


def _announce(at: Optional[float], text: Optional[str]) -> None:
    """The first verdict, as soon as it is known (shrinking it may take ``--shrink-seconds`` more)."""
    from kvfence.running.clock import since_start

    _clear_progress_line()
    _stderr(f"{FIRST_FAILURE} {since_start(at):.2f}s into the command: {text}; shrinking it")


def _announcer():
    """``fuzz(on_first_failure=)`` for one process: the run's first failure only (``--keep-going`` runs
    phases, each with a first failure of its own, and saves each at once)."""
    done = []

    def announce(result) -> None:
        if not done:
            done.append(True)
            _announce(result.first_failure_at, result.first_failure_text)

    return announce


def _announce_job_failure(doc: dict) -> None:
    """``--jobs``: the first failure any job found (its progress file), as soon as the parent sees it."""
    _announce(doc.get("first_failure_at"), doc.get("first_failure_text"))


def _phases(session, result) -> dict:
    """Seconds from the command's start (kvfence.running.clock) to the worker's ready and the first launch."""
    from kvfence.running.clock import since_start

    return {"startup_s": since_start(getattr(session, "ready_at", None)),
            "first_launch_s": since_start(result.first_launch_at)}


def _fuzz_jobs(args, device: str, run: dict, out_dir: Path, json_path: Optional[Path], max_bytes: int) -> int:
    """``--jobs N``: N child fuzz processes (kvfence.workflow.jobs), merged into one summary, report and case folder."""
    import time

    from kvfence.workflow.jobs import adopt_case_files, run_jobs
    from kvfence.workflow.progress import Progress
    from kvfence.reports import summary as summary_mod

    jobs = run["jobs"]
    share = [args.max_examples // jobs + (i < args.max_examples % jobs) for i in range(jobs)]
    require(min(share) >= 1, f"--jobs {jobs} is more than --max-examples {args.max_examples}")
    child_args = [_child_args(args._parser, args, seed=run["seed"] + i, max_examples=share[i], max_bytes=max_bytes)
                  for i in range(jobs)]
    _lock_out(out_dir)
    from kvfence.workflow.outdir import set_aside_earlier_cases

    earlier = set_aside_earlier_cases(out_dir)  # this run's report shows only this run's case files
    if earlier:
        _stderr(f"kvfence: {earlier['count']} case file(s) of an earlier run moved to {earlier['folder']}")
    progress = None if args.quiet else Progress(args.max_examples, seconds=args.max_seconds)
    from kvfence.running.clock import command_start

    start, started_at = time.perf_counter(), command_start()
    try:
        docs, problems, crashes, interrupted = run_jobs(child_args, out_dir, device=device,
                                                        progress=progress.update if progress else None,
                                                        on_first_failure=_announce_job_failure)
    finally:
        if progress:
            progress.close()
    elapsed = time.perf_counter() - start
    for line in problems:
        _stderr(f"kvfence: {line}")
    adopt_case_files(docs, out_dir)
    doc = summary_mod.merge(docs, run=run, elapsed_s=elapsed, started_at=started_at)
    doc["job_problems"] = problems
    doc["earlier_cases"] = earlier
    doc["interrupted"] = interrupted
    for crash in crashes:
        p = str(crash.path)
        doc["findings"].append(dict(crash.finding.to_dict(), case=p))
        doc["cases"][p] = summary_mod.case_record(p, crash.case, [crash.finding], source="journal")
    adopt_case_files([doc], out_dir)
    print(f"kvfence fuzz: {jobs} jobs, {doc['verified_cases']} cases verified ({doc['cached_cases']} from cache) in "
          f"{elapsed:.1f}s ({doc['cases_per_s']:.1f} verified cases/s, {doc['structural_cases_per_s']:.1f} "
          f"structurally distinct/s) on {device}, kernel {args.kernel}, "
          f"sizing {args.sizing}, domain {run['domain']}")
    for path, record in doc["cases"].items():
        print(f"{', '.join(record['kinds'])}: {path}")
    if not doc["findings"]:
        print("no findings")
    if interrupted:
        _stderr(f"kvfence: {interrupted}: jobs stopped; merged what they had checked")
    code = _write_summary(doc, out_dir, json_path)
    if interrupted:
        from kvfence.running.interrupt import exit_code_for

        return exit_code_for(interrupted)
    return EXIT_FINDINGS if problems and code == EXIT_CLEAN else code


def _output_failure(path, exc: OSError, doc: Optional[dict] = None) -> BadInput:
    """The one-line error for an output that cannot be written (full disk, read-only filesystem, ...):
    the path, the errno, and where the run's findings already are (case files are written first)."""
    import errno as errno_mod

    name = errno_mod.errorcode.get(exc.errno, f"errno {exc.errno}") if exc.errno else type(exc).__name__
    text = f"cannot write {path}: {exc.strerror or exc} ({name})"
    cases = sorted((doc or {}).get("cases") or {})
    if cases:
        shown = ", ".join(cases[:3]) + (f" and {len(cases) - 3} more" if len(cases) > 3 else "")
        text += (f"; the run has {len(doc['findings'])} finding(s), saved before this in {len(cases)} case "
                 f"file(s): {shown}")
    elif doc is not None and doc.get("findings"):
        text += f"; the run has {len(doc['findings'])} finding(s) (printed above)"
    return BadInput(text)


class _output_errors:
    """``with _output_errors(path, doc):`` turns an ``OSError`` of writing ``path`` into ``_output_failure``."""

    def __init__(self, path, doc: Optional[dict] = None):
        self.path, self.doc = path, doc

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, OSError):
            raise _output_failure(self.path, exc, self.doc) from None
        return False


def _write_summary(doc: dict, out_dir: Path, json_path: Optional[Path], *, previous: Optional[dict] = None) -> int:
    """summary.json (and --json), report.md / report.html, the table on stdout; the exit code.

    With ``previous`` (``fuzz --resume``) the doc is added to that summary rather than replacing it, and
    the exit code says whether this run found anything new."""
    from kvfence.cases import casefile
    from kvfence.reports import summary as summary_mod
    from kvfence.reports.render import write_reports

    new_findings = bool(doc["findings"])
    from kvfence.running.interrupt import pending

    if pending() and not doc.get("interrupted"):  # a signal after checking ended: the outputs still say so
        doc["interrupted"] = pending()
    if previous is not None:  # README: "Resuming into a folder"
        doc = summary_mod.merge_resumed(previous, doc)
    text = json.dumps(doc, indent=1) + "\n"
    # A disk that fills up (or turns read-only) now, after the case files, is one line and exit 2.
    with _output_errors(out_dir / "summary.json", doc):
        casefile.atomic_write_text(out_dir / "summary.json", text)
    if json_path is not None:
        with _output_errors(json_path, doc):
            casefile.atomic_write_text(json_path, text)
    with _output_errors(out_dir / "report.md", doc):
        written = write_reports(doc, out_dir)
    print()
    print(summary_mod.text_table(doc))
    print(f"\nreports: {out_dir / 'summary.json'}, {written['md']}, {written['html']}")
    if written["plot_skipped"]:
        _stderr(f"kvfence: coverage plot skipped: {written['plot_skipped']}")
    return EXIT_FINDINGS if new_findings else EXIT_CLEAN


def _case_extras(args, run: dict, *, interrupted: Optional[str], shrink_cut: bool) -> dict:
    """What a fuzz case file records besides the case: how it was found and how far it was shrunk."""
    extras = {"fuzz": {"seed": run["seed"], "seq_len_limit": args.seq_len_limit, "max_examples": args.max_examples,
                       "domain": run["domain"]}}
    if interrupted:
        extras["interrupted"] = {"signal": interrupted, "shrunk": False,
                                 "note": "the run was stopped before shrinking finished: the case may not be minimal"}
    if shrink_cut:
        extras["shrink"] = {"cut": True, "shrink_seconds": args.shrink_seconds,
                            "note": "shrunk as far as it got within --shrink-seconds: the case may not be minimal"}
    return extras


def _save_failure(args, run: dict, device: str, out_dir: Path, failure) -> str:
    """``--keep-going``: write one distinct failure's case file as soon as it is found; its path."""
    from kvfence.cases import casefile

    extras = _case_extras(args, run, interrupted=failure.interrupted, shrink_cut=failure.shrink_cut)
    extras["hypothesis"] = failure.hypothesis or {"unavailable": "the final replay did not run"}
    extras["fuzz"]["keep_going_phase"] = failure.phase + 1
    where = out_dir / casefile.CASES_DIR / f"{casefile.case_hash(failure.case)}.json"
    try:
        return str(casefile.write_case(failure.case, failure.findings, out_dir=out_dir, device=device,
                                       source="fuzz", extras=extras))
    except OSError as exc:
        from kvfence.cases.casefile import format_failure

        print(format_failure(failure.case, failure.findings, limit=20))  # the finding is never lost
        raise _output_failure(where, exc, {"findings": failure.findings}) from None


def _fuzz_outputs(args, device: str, result, crashes, out_dir: Path, json_path: Optional[Path], run: dict, *,
                  previous: Optional[dict] = None) -> int:
    """The fuzz run's outputs: case file, summary table, summary.json (and --json), report.md/html."""
    from kvfence.cases import casefile
    from kvfence.reports import summary as summary_mod

    case_path = None
    if result.failures:  # --keep-going: every distinct failure already has its case file
        from kvfence.cases.casefile import format_failure

        for failure in result.failures:
            print(format_failure(failure.case, failure.findings, limit=20))
            print(f"  case file: {failure.path}")
        case_path = result.failures[0].path
    elif result.findings:
        from kvfence.cases.casefile import format_failure

        extras = _case_extras(args, run, interrupted=result.interrupted, shrink_cut=result.shrink_cut)
        extras["hypothesis"] = result.hypothesis or {"unavailable": "the final replay did not run"}
        print(format_failure(result.case, result.findings, limit=20))  # first: the finding is never lost
        with _output_errors(out_dir / casefile.CASES_DIR / f"{casefile.case_hash(result.case)}.json",
                            {"findings": result.findings}):
            case_path = str(casefile.write_case(result.case, result.findings, out_dir=out_dir, device=device,
                                                source="fuzz", extras=extras))
        if result.shrink_cut:
            print(f"(shrinking stopped after --shrink-seconds {args.shrink_seconds:g}; the case may not be minimal)")
        if result.interrupted:
            print(f"(interrupted by {result.interrupted} before shrinking finished; the case may not be minimal)")
    elif not crashes:
        print("no findings")
    from kvfence.running.clock import command_start

    doc = summary_mod.build(result, run=run, case_path=case_path, crashes=crashes, versions=casefile.versions(),
                            earlier=getattr(args, "earlier_cases", None), started_at=command_start())
    if result.keep_going is not None:
        for failure in result.failures[1:]:
            doc["findings"] += [dict(f.to_dict(), case=failure.path) for f in failure.findings]
            doc["cases"][failure.path] = summary_mod.case_record(failure.path, failure.case, failure.findings,
                                                                 source="fuzz")
        doc["keep_going"] = result.keep_going
        print(f"kvfence fuzz --keep-going: {result.keep_going['distinct_failures']} distinct failure(s) in "
              f"{result.keep_going['phases']} phase(s) ({result.keep_going['duplicates']} found again and dropped)")
    return _write_summary(doc, out_dir, json_path, previous=previous)


# -- repro / report -------------------------------------------------------------------------------------
def cmd_repro(args) -> int:
    from kvfence.workflow.probe import check_plugins
    from kvfence.workflow.repro import run_repro

    check_plugins({"kernel": args.kernel, "sizing": args.sizing})  # their import cannot end this process

    return run_repro(args.file, device=args.device, kernel=args.kernel, sizing=args.sizing, mode=args.mode,
                     layout=args.layout, absorb=not args.no_absorb, verbose=args.verbose, out=sys.stdout,
                     announce=_stderr, trust_case=args.trust_case, in_process=args.in_process,
                     case_timeout=args.case_timeout)


def cmd_report(args) -> int:
    from kvfence.cases.casefile import parse_json_file
    from kvfence.reports.render import write_reports
    from kvfence.reports.summary import validate

    require((args.dir is None) != (args.merge is None), "report: name one run folder DIR, or --merge DIR... --out OUT")
    if args.merge is not None:
        from kvfence.reports.merge import merge

        from kvfence.workflow import outlock

        out = _out_dir(args.out)
        try:  # the --out lock of fuzz, taken once every input is validated: no run and no merge write over it
            doc = merge([Path(d) for d in args.merge], out, before_writing=lambda: _lock_out(out))
            with _output_errors(out / "report.md", doc):
                written = write_reports(doc, out)
        finally:
            outlock.release_all()
        print(f"kvfence report --merge: {len(args.merge)} runs, {doc['examples']} examples, "
              f"{len(doc['cases'])} distinct failing case(s) ({doc['merged']['duplicate_cases']} duplicate(s) "
              f"dropped): {out / 'summary.json'}, {written['md']}, {written['html']}")
        if written["plot_skipped"]:
            _stderr(f"kvfence: coverage plot skipped: {written['plot_skipped']}")
        return EXIT_FINDINGS if doc["findings"] else EXIT_CLEAN
    folder = Path(args.dir)
    require(folder.is_dir(), f"report {args.dir}: no such directory")
    where = folder / "summary.json"
    doc = validate(parse_json_file(where, "summary"), str(where))
    written = write_reports(doc, folder)
    print(f"kvfence report: {written['md']}, {written['html']}")
    if written["plot_skipped"]:
        _stderr(f"kvfence: coverage plot skipped: {written['plot_skipped']}")
    return EXIT_FINDINGS if doc["findings"] else EXIT_CLEAN


# -- mutants ------------------------------------------------------------------------------------------
def cmd_mutants(args) -> int:
    """The mutation self-test (kvfence.workflow.mutants): exit 0 when every mutant is caught on its domain in
    enough seeds, scale mutants stay unreachable on the CPU domain, and the reference is clean."""
    from kvfence.cases.budget import default_budget, parse_size
    from kvfence.device import select
    from kvfence.workflow.mutants import format_table, run_all, verdict_text

    if args.verifiers == "both":
        return _mutants_both_verifiers(args)
    device = select(args.device, announce=_stderr)
    json_path = _writable(args.json, "--json")
    max_bytes = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else default_budget(device)
    seeds = range(args.seed, args.seed + args.seeds)
    partial = {}

    def progress(r):
        # Called after every seed; the finished mutant is printed, and with --json every result so far
        # is kept in JSON.partial, so a self-test cut short by a time limit still leaves its numbers.
        if json_path is not None:
            partial[f"{r.name}@{r.ran_on}"] = r.to_dict()
            casefile.atomic_write_text(Path(str(json_path) + ".partial"), json.dumps(partial, indent=1) + "\n")
        if not args.quiet and len(r.seeds) == len(seeds):
            _stderr(f"kvfence: {r.name} ({r.ran_on} domain): {verdict_text(r)} ({r.seconds:.1f}s)")

    from kvfence.cases import casefile

    report = run_all(device, max_examples=args.max_examples, seeds=seeds, names=args.only or None,
                     audit=False if args.no_audit else None, progress=progress, max_bytes=max_bytes,
                     verifier=args.verifiers)
    print(format_table(report))
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return EXIT_CLEAN if report.passed else EXIT_FINDINGS


def _mutants_both_verifiers(args) -> int:
    """``mutants --verifiers both`` (kvfence.workflow.compare): the device verifier and the oracle path on the same
    cases of every mutant, planted bad write and the reference; exit 1 on any disagreement."""
    from kvfence.cases import casefile
    from kvfence.workflow import compare
    from kvfence.cases.budget import parse_size
    from kvfence.device import select

    require(args.seeds == 1, "--seeds applies to the mutation self-test; --verifiers both draws --max-examples "
                             "cases per target from --seed")
    require(not args.no_audit, "--no-audit: with --verifiers both the audit only guards host memory and is not compared")
    device = select(args.device, announce=_stderr)
    json_path = _writable(args.json, "--json")
    max_bytes = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else None

    def progress(report, row):
        # After every target: with --json the rows so far are kept in JSON.partial (a time limit keeps them).
        if json_path is not None:
            casefile.atomic_write_text(Path(str(json_path) + ".partial"), json.dumps(report.to_dict(), indent=1) + "\n")
        if not args.quiet:
            _stderr(f"kvfence: {row.target.name} ({row.target.domain} domain): {compare.row_verdict(row)}, "
                    f"{row.cases} cases, {row.dirty} dirty ({row.seconds:.1f}s)")

    report = compare.run(device, max_examples=args.max_examples or compare.DEFAULT_EXAMPLES, seed=args.seed,
                         names=args.only or None, max_bytes=max_bytes, progress=progress)
    print(compare.format_table(report))
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return EXIT_CLEAN if report.passed else EXIT_FINDINGS


# -- sweep -------------------------------------------------------------------------------------------
def cmd_sweep(args) -> int:
    """The nightly job (kvfence.tools.sweep): canary fuzzing, then compute-sanitizer on the cases it found."""
    from kvfence.tools import sanitizer
    from kvfence.tools.sweep import run_sweep

    args.kernel_given = args.kernel is not None
    args.kernel = args.kernel or "reference"
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    require(tools and all(t in sanitizer.TOOLS for t in tools),
            f"--tools {args.tools!r}: choose from {', '.join(sanitizer.TOOLS)}")
    require(args.cases is None or args.max_examples is None, "--cases and --max-examples exclude each other")
    require(args.timeout > 0, f"--timeout {args.timeout:g}: expected a positive number of seconds")
    from kvfence.cases.targets import check_kernel_spec, resolve_sizing

    resolve_sizing(args.sizing)
    # A bad --kernel is exit 2 naming the kernel, before the tool and GPU checks (it needs neither).
    check_kernel_spec(args.kernel)

    def strategy():
        from kvfence.strategies import cases, configs

        return cases(configs(sizing=args.sizing, mode=args.mode, layout=args.layout), kernel=args.kernel,
                     seq_len_limit="ctx")

    return run_sweep(tools=tools, cases_dir=args.cases, max_examples=args.max_examples or 500, jobs=args.jobs,
                     strategy_factory=strategy, out_dir=_out_dir(args.out), seed=args.seed,
                     max_failing=args.max_failing, sample=args.sample, timeout=args.timeout, announce=_stderr,
                     kernel=args.kernel,
                     kernel_override=args.kernel if args.cases is not None and args.kernel_given else None,
                     matrix=args.matrix)


# -- upstream ----------------------------------------------------------------------------------------
def cmd_upstream(args) -> int:
    """``upstream fetch VERSION``: SGLang's kernels from its wheel into the cache (kvfence.cases.upstream)."""
    from kvfence.cases import upstream

    entry = upstream.fetch(args.version, wheel=args.wheel, offline=True if args.offline else None,
                           refresh=args.refresh, announce=_stderr)
    _stderr(f"kvfence: {upstream.describe(entry)}")
    print(entry.module_path)
    return EXIT_CLEAN


def cmd_upstream_sizing(args) -> int:
    """``upstream sizing VERSION``: the release's shipped sizing per backend (kvfence.cases.shipped)."""
    from kvfence.cases import shipped
    from kvfence.cases import shipped_sizing
    from kvfence.reports.shipped_matrix import sizing_lines

    record = shipped_sizing.load_record(args.version)
    require(record["backends"], f"sglang=={args.version} has no draft backend (no class launches "
                                f"{shipped.DRAFT_KERNEL})")
    print("\n".join(sizing_lines(args.version, record)))
    return EXIT_CLEAN


def cmd_upstream_shipped(args, out_dir, offline: bool) -> int:
    """``upstream matrix --shipped``: each release's backends under their own sizing (kvfence.workflow.shipped_matrix)."""
    from kvfence.device import select
    from kvfence.workflow import release_matrix as rm
    from kvfence.workflow import shipped_matrix as sm
    from kvfence.reports.shipped_matrix import markdown, write

    versions = rm.parse_versions(args.versions, rm.known_releases(offline, announce=_stderr))
    device = select(args.device, announce=_stderr)
    domain = sm.Domain(ctx=args.shipped_ctx, num_steps=args.shipped_steps, max_bs=args.shipped_max_bs,
                       max_topk=args.shipped_max_topk, ordinary_only=args.shipped_lengths == "ordinary")
    doc = sm.run(versions, domain=domain, device=device, offline=offline, out=out_dir, progress=_stderr)
    report = write(doc, out_dir)
    (out_dir / "shipped.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(markdown(doc), end="")
    print(f"kvfence upstream matrix --shipped: {len(versions)} release(s) in {doc['elapsed_s']} s; report {report}")
    return doc["exit_code"]


def cmd_upstream_matrix(args) -> int:
    """``upstream matrix``: fuzz every release x sizing x contract cell (kvfence.workflow.release_matrix)."""
    from kvfence.workflow import release_matrix as rm
    from kvfence.cases.budget import parse_size
    from kvfence.device import select
    from kvfence.cases.upstream import offline_by_env
    from kvfence.reports.release_matrix import headline, write

    json_path = _writable(args.json, "--json")
    out_dir = _out_dir(args.out)
    if args.shipped:
        return cmd_upstream_shipped(args, out_dir, bool(args.offline) or offline_by_env())
    sizings = rm.check_sizings(rm.split_list(args.sizing, "--sizing"))
    contracts = rm.check_contracts(rm.split_list(args.contracts, "--contracts"))
    max_gpu_mem = parse_size(args.max_gpu_mem) if args.max_gpu_mem is not None else None
    offline = bool(args.offline) or offline_by_env()
    versions = rm.parse_versions(args.versions, rm.known_releases(offline, announce=_stderr))
    if args.fetch_only:  # fill the cache for an offline host (e.g. a GPU machine without network)
        releases = [rm.prepare(v, offline, _stderr) for v in versions]
        for r in releases:
            print(f"{r.version}: {r.status or 'testable'}: {r.reason or r.source_path + ' ' + str(r.abis)}")
        failed = [r for r in releases if r.status in ("error", "not-cached")]
        if failed:
            raise BadInput(f"{len(failed)} of {len(releases)} release(s) not in the cache: "
                           f"{failed[0].version}: {failed[0].reason}")
        return EXIT_CLEAN
    device = select(args.device, announce=_stderr)
    jobs = args.jobs or (max(1, min(8, (os.cpu_count() or 2) // 2)) if device == "cuda" else 1)
    if max_gpu_mem is None and device == "cuda":
        from kvfence.cases.budget import default_budget

        max_gpu_mem = default_budget(device, jobs)  # cells share the GPU: each gets its part
    settings = rm.Settings(device=device, max_examples=args.max_examples, seed=args.seed,
                           shrink_seconds=args.shrink_seconds, cell_timeout=args.cell_timeout, max_gpu_mem=max_gpu_mem)
    _stderr(f"kvfence: upstream matrix: {len(versions)} release(s) x {len(sizings)} sizing(s) x "
            f"{len(contracts)} contract(s) on {device}, {args.max_examples} examples per cell, {jobs} cell(s) at once")
    doc, interrupted = rm.run(versions=versions, sizings=sizings, contracts=contracts, settings=settings,
                              offline=offline, out=out_dir, json_path=json_path, jobs=jobs, progress=_stderr,
                              write=write)
    print(f"kvfence upstream matrix: {headline(doc)}; report {out_dir / 'report.md'}")
    if interrupted:
        from kvfence.running.interrupt import exit_code_for

        return exit_code_for(interrupted)
    return doc["exit_code"]


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="kvfence: differential fuzzing and memory-safety "
                     "harness for the EAGLE draft-decode kv-indices kernel",
                     epilog=f"Run '{prog} COMMAND --help' for a command's flags and exit codes.\n\n{EXIT_CODES}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    fz = sub.add_parser("fuzz", help="fuzz the kernel against the oracle inside guarded buffers",
                        description="Fuzz the kernel against the oracle inside guarded buffers; a failure is "
                                    "shrunk and saved as a case file under --out/cases/.",
                        epilog=_exit_codes(one="findings (the shrunk case file and the reports are written)"))
    _add_target_args(fz)
    _add_config_args(fz)
    _add_family_args(fz)
    fz.add_argument("--max-examples", type=_positive_int, default=None,
                    help=f"Hypothesis examples to generate (default: {DEFAULT_MAX_EXAMPLES} on the CPU; on CUDA no "
                         f"example budget, the run is bounded by --max-seconds)")
    fz.add_argument("--seed", type=_non_negative_int, default=None,
                    help="Hypothesis seed for a repeatable run (default: random)")
    fz.add_argument("--shrink-seconds", type=_seconds(False), default=60.0, help="time budget for shrinking a failure (0: report the first failing case unshrunk)")
    fz.add_argument("--json", default=None, help="also write the JSON summary here (default: only --out/summary.json)")
    fz.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    fz.add_argument("--batches-per-example", type=_positive_int, default=None,
                    help=f"up to N batches of one config per Hypothesis example (config-major: one compile and "
                         f"capture, many replays; default {GPU_BATCHES_PER_EXAMPLE} on CUDA, 1 on the CPU)")
    fz.add_argument("--scale", default=None, choices=["cpu", "gpu"],
                    help="config space: cpu (interpreter-sized: ctx <= 48, max_bs <= 4) or gpu (production-sized: "
                         "max_bs <= 256 in SGLang's capture buckets, ctx <= 131072, topk and steps <= 16, pages "
                         "1-128); default gpu on CUDA, cpu on the CPU")
    fz.add_argument("--max-gpu-mem", default=None, metavar="SIZE",
                    help="device memory one config may take (e.g. 8G, 512M); larger draws are shrunk to fit; "
                         "default 60%% of free GPU memory split over the jobs (4G per job on the CPU)")
    fz.add_argument("--jobs", type=_positive_int, default=None,
                    help="fuzzing processes sharing the GPU(s), merged into one run (default on CUDA: the CPU cores "
                         f"less one, at most 16, and under an example budget one per {MIN_EXAMPLES_PER_JOB} examples; "
                         "1 on the CPU); at most 2 per CPU core and one per GiB of available memory")
    fz.add_argument("--max-seconds", type=float, default=None,
                    help=f"stop exploring after this many seconds (shrinking a failure has --shrink-seconds; "
                         f"default {DEFAULT_GPU_SECONDS:g} on CUDA when --max-examples is not given, none on the CPU); "
                         f"the summary's ended_by says which budget ended the run")
    fz.add_argument("--progress-file", default=None, help=argparse.SUPPRESS)  # --jobs children report here
    fz.add_argument("--no-target", action="store_true",
                    help="skip Hypothesis's target phase on need/width (faster generation, less pressure on limits)")
    fz.add_argument("--keep-going", action="store_true",
                    help="after a failure is shrunk and saved, go on looking for other failures until --max-examples "
                         "or --max-seconds is spent; each distinct failure (finding kinds + config) gets a case file")
    fz.add_argument("--out", default="reports/out",
                    help="folder for cases/, summary.json, report.md and report.html; an earlier run's case "
                         "files there are moved to cases/earlier/<time>/")
    fz.add_argument("--resume", action="store_true",
                    help="only collect cases left in flight by runs that died (reported as CRASH); no new fuzzing")
    fz.add_argument("--database", default=None,
                    help="Hypothesis example database: none, a directory, or redis://HOST:PORT/DB; its failures "
                         "are replayed first (default: OUT/.hypothesis)")
    fz.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                    help="fuzz only shard I of N (1-based): a disjoint part of the config space and seeds "
                         "(default: all of it)")
    _add_worker_args(fz)
    fz.set_defaults(func=_fuzz_command, _parser=fz,
                    fuzz_defaults={a.dest: a.default for a in fz._actions if a.dest != "help"})

    rp = sub.add_parser("repro", help="re-run one case file and print the diff (exit 1 if a finding reproduces)",
                        description="Re-run one case file and print the diff against the oracle.",
                        epilog=_exit_codes(zero="the case passes", one="a finding reproduces"))
    rp.add_argument("file", help="a case file, e.g. reports/out/cases/<hash>.json")
    rp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="cpu: Triton interpreter; cuda: compiled kernel; auto: cuda when present")
    rp.add_argument("--kernel", default=None,
                    help="run another kernel on this case, does my fix work? (default: the case file's kernel)")
    rp.add_argument("--sizing", default=None,
                    help="run this case under another sizing policy (default: the case file's)")
    rp.add_argument("--mode", default=None, choices=["graph", "eager"],
                    help="run this case in another mode (default: the case file's)")
    rp.add_argument("--layout", default=None, choices=["redzone", "production"],
                    help="run it in another layout (default: the case file's)")
    rp.add_argument("--no-absorb", action="store_true",
                    help="guards of MIN_GUARD only: an overflow leaves the allocation (for compute-sanitizer runs)")
    rp.add_argument("--verbose", action="store_true", help="every element of each finding and each program's segment")
    rp.add_argument("--trust-case", action="store_true",
                    help="import the kernel/sizing plug-ins the case file names (never done without this or --kernel/--sizing)")
    _add_worker_args(rp)
    rp.set_defaults(func=cmd_repro)

    rr = sub.add_parser("report", help="re-render report.md and report.html from DIR/summary.json, or merge runs",
                        epilog=_exit_codes(zero="reports written; the run (or the merged runs) has no finding",
                                           one="reports written; the run (or the merged runs) has findings",
                                           two="bad input, e.g. no valid DIR/summary.json (one line on stderr)"))
    rr.add_argument("dir", nargs="?", default=None, help="a fuzz --out folder holding summary.json")
    rr.add_argument("--merge", nargs="+", metavar="DIR", default=None,
                    help="merge these fuzz --out folders (hosts, shards, nights) into one report; identical "
                         "failing cases are kept once (default: off)")
    rr.add_argument("--out", default="reports/merged", help="folder of the merged report")
    rr.set_defaults(func=cmd_report)

    mu = sub.add_parser("mutants", help="mutation self-test: every kernels/mutants/ bug must be detected",
                        description="Fuzz every bug in kernels/mutants/ under a fixed budget and several seeds, with "
                                    "unpinned draws from the domain it belongs to (cpu or gpu), then the reference "
                                    "kernel (safe sizing) over the same domains, which must stay clean.",
                        epilog=_exit_codes(zero="every mutant detected in >= 95% of the seeds on its domain, scale "
                                                "mutants unreachable on the CPU domain, the reference clean "
                                                "(--verifiers both: every case agrees, every planted write seen)",
                                           one="a mutant missed too often, or a finding on the reference "
                                               "(--verifiers both: a disagreement, or a target never dirty)"))
    mu.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="cpu: Triton interpreter; cuda: compiled kernels; auto: cuda when present")
    mu.add_argument("--max-examples", type=_positive_int, default=None,
                    help="example budget per mutant and seed (default: 60 on the CPU domain, 100 on the GPU "
                         "domain; with --verifiers both, configs per target, each a run of batches, default 8)")
    mu.add_argument("--seed", type=_non_negative_int, default=0, help="first Hypothesis seed (default 0)")
    mu.add_argument("--seeds", type=_positive_int, default=1,
                    help="run each mutant under this many seeds (seed, seed+1, ...) and report its detection rate; "
                         "a mutant passes when detected in >= 95%% of them")
    mu.add_argument("--max-gpu-mem", default=None, metavar="SIZE", help="memory budget per config (as for fuzz)")
    mu.add_argument("--only", nargs="+", metavar="NAME",
                    help="run only these mutants, by file stem (default: every mutant); with --verifiers both "
                         "also 'reference' or a planted write of kernels/planted.py")
    mu.add_argument("--verifiers", default="auto", choices=["auto", "oracle", "device", "both"],
                    help="the verifier of the self-test's sessions (auto: device on CUDA, oracle on the CPU); "
                         "both: instead of the self-test, judge every mutant, planted bad write and the reference "
                         "on both paths, same cases, and compare verdicts, counters and findings (exit 1 on any "
                         "disagreement)")
    mu.add_argument("--json", default=None, help="write the results here (default: not written)")
    mu.add_argument("--no-audit", action="store_true", help="CPU only: turn off the interpreter address audit")
    mu.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    mu.set_defaults(func=cmd_mutants)

    sw = sub.add_parser("sweep", help="nightly: canary fuzzing, then compute-sanitizer on failing and sampled cases",
                        epilog=_exit_codes(zero="no canary or sanitizer finding",
                                           two="bad input, no GPU or no compute-sanitizer (one line on stderr)"))
    sw.add_argument("--tools", default=",".join(("memcheck", "initcheck", "racecheck", "synccheck")),
                    help="comma-separated compute-sanitizer tools")
    sw.add_argument("--cases", default=None,
                    help="re-run the case files in this folder instead of fuzzing (default: fuzz)")
    sw.add_argument("--max-examples", type=_positive_int, default=None, help="canary examples (default 500)")
    sw.add_argument("--jobs", type=_positive_int, default=1, help="sanitizer processes at a time")
    sw.add_argument("--sizing", default="safe",
                    help="sizing policy of the canary phase, as fuzz --sizing (prefix: the pre-fix CUDA-graph "
                         "policy, W = max_bs*ctx, missing the topk factor)")
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
    sw.add_argument("--matrix", action="store_true",
                    help="also run the detection matrix (canaries vs memcheck variants per bug class, eager and "
                         "graph) into sweep.json / sweep.html")
    sw.set_defaults(func=cmd_sweep)

    up = sub.add_parser("upstream", help="SGLang's own kernels, extracted from its PyPI wheel (--kernel sglang==V)",
                        description="SGLang's own kernels, extracted from its PyPI wheel without installing or "
                                    "importing SGLang; fuzz them with --kernel sglang==VERSION.",
                        epilog=_exit_codes(one=None))
    up_sub = up.add_subparsers(dest="upstream_command", metavar="ACTION", parser_class=_Parser)
    up_sub.required = True
    uf = up_sub.add_parser("fetch", help="download the sglang==VERSION wheel (no install), extract its kernels "
                           "into the cache ($KVFENCE_CACHE or ~/.cache/kvfence) and print the module's path",
                           description="Download the sglang==VERSION wheel (no install), extract its kernels into "
                                       "the cache ($KVFENCE_CACHE or ~/.cache/kvfence) and print the module's path.",
                           epilog=_exit_codes(zero="extracted (or already cached)", one=None))
    uf.add_argument("version", help="a release, e.g. 0.5.23")
    uf.add_argument("--wheel", default=None, help="extract from this wheel file instead of downloading")
    uf.add_argument("--offline", action="store_true", help="never download (also KVFENCE_OFFLINE=1): cache only")
    uf.add_argument("--refresh", action="store_true", help="extract again even if the cache has this release")
    uf.set_defaults(func=cmd_upstream)
    um = up_sub.add_parser(
        "matrix", help="fuzz every release of a version range under every sizing and contract: a table of which "
                       "release is safe under which sizing",
        description="Fuzz SGLang's kernel of every release in --versions under every --sizing and --contracts, "
                    "one cell each, with the same example budget and seed; each cell is its own fuzz process, so "
                    "a crash or hang is that cell's result. Writes report.md, report.html and, per failing cell, "
                    "case files under OUT/<version>/<sizing>-<contract>/cases/. Cell statuses: clean, findings "
                    "(with kinds), not applicable (no such kernel or contract), ABI unsupported, error, not cached.",
        epilog=_exit_codes(zero="every applicable cell of a correct sizing (safe; window-fixed for the rail) is "
                                "clean; findings under prefix, fixed or window-no-topk are expected and only reported",
                           one="a correct-sizing cell has findings (a bug in that release) or could not be checked "
                               "(error: refused, crashed outside a case, or past --cell-timeout)",
                           two="bad input (unknown version, empty range, unknown sizing or contract, nothing "
                               "cached offline; one line on stderr)"))
    um.add_argument("--versions", required=True,
                    help="required: releases, as A..B (inclusive, post releases included), a version, or a comma "
                         "list of both, e.g. 0.4.0..0.5.23 or 0.4.8,0.5.1..0.5.23; expanded against the releases "
                         "the package index lists and the cache has (no default)")
    um.add_argument("--sizing", default="prefix,fixed,safe", help="comma list of builtin sizings")
    um.add_argument("--contracts", default="draft",
                    help="comma list of contracts (draft, window-rail); one this build or a release lacks is a "
                         "not-applicable cell")
    um.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="cpu: Triton interpreter; cuda: compiled kernels in CUDA graphs; auto: cuda when present")
    um.add_argument("--max-examples", type=_positive_int, default=50, help="Hypothesis examples per cell")
    um.add_argument("--seed", type=_non_negative_int, default=0, help="Hypothesis seed of every cell")
    um.add_argument("--shrink-seconds", type=_seconds(False), default=10.0, help="shrink budget of a failing cell")
    um.add_argument("--cell-timeout", type=_seconds(True), default=600.0,
                    help="seconds a cell's fuzz may run before it is killed (an error cell)")
    um.add_argument("--jobs", type=_positive_int, default=None,
                    help="cells fuzzed at once (default: 1 on the CPU; half the CPU cores, at most 8, on CUDA)")
    um.add_argument("--max-gpu-mem", default=None, metavar="SIZE",
                    help="device memory per cell (default: 60%% of free GPU memory split over --jobs)")
    um.add_argument("--offline", action="store_true",
                    help="never download (also KVFENCE_OFFLINE=1): releases not in the cache are 'not cached' cells")
    um.add_argument("--json", default=None, help="also write every cell here (default: only OUT/matrix.json)")
    um.add_argument("--fetch-only", action="store_true",
                    help="only fetch the releases into the cache and print what each is (testable, no kernel, ABI "
                         "unsupported): prepares a cache for an offline host; fuzzes nothing, exit 0 or 2")
    um.add_argument("--out", default="reports/upstream-matrix",
                    help="folder for report.md, report.html, matrix.json and each cell's fuzz output")
    um.add_argument("--shipped", action="store_true",
                    help="instead of builtin sizings: each release's backends under their own shipped sizing "
                         "(sglang==VERSION:BACKEND), one column per backend x mode; exit 1 on a silent overflow")
    um.add_argument("--shipped-ctx", type=_positive_int, default=64, help="--shipped: the context length (ctx)")
    um.add_argument("--shipped-steps", type=_positive_int, default=3, help="--shipped: speculative num_steps")
    um.add_argument("--shipped-max-bs", type=_positive_int, default=4, help="--shipped: largest capture bucket")
    um.add_argument("--shipped-max-topk", type=_positive_int, default=4, help="--shipped: largest topk searched")
    um.add_argument("--shipped-lengths", choices=["all", "ordinary"], default="all",
                    help="--shipped: request lengths searched: all (up to ctx) or ordinary (up to ctx - num_steps, "
                         "a deployment whose requests never come within num_steps of the context length)")
    um.set_defaults(func=cmd_upstream_matrix)
    us = up_sub.add_parser(
        "sizing", help="print how sglang==VERSION sizes the draft kernel's buffer, per backend (read, never run)",
        description="Print, per draft backend of sglang==VERSION (every class that launches the kernel, and its "
                    "subclasses), the graph-mode and eager-mode row widths as formulas, what the CUDA-graph runner "
                    "passes as max_bs, the host check, a topk > 1 refusal, and the source lines they came from.",
        epilog=_exit_codes(zero="printed", one=None))
    us.add_argument("version", help="a release, e.g. 0.5.23 (fetched into the cache unless offline)")
    us.set_defaults(func=cmd_upstream_sizing)
    return parser


def main(argv: Optional[List[str]] = None, prog: str = PROG) -> int:
    """Run one command; ``prog`` is the name usage lines show (``kvfence`` or ``python -m kvfence``)."""
    from kvfence.running.clock import command_clock

    with command_clock():  # children (--jobs, checking workers) time their phases from this command's start
        return _run(argv, prog)


def _run(argv: Optional[List[str]], prog: str) -> int:
    try:
        parser = build_parser(prog)
        args = parser.parse_args(argv)
        if args.command is None:
            # No command: the command list, on stderr with exit 2 so a script that lost its arguments
            # does not pass silently.
            parser.print_help(sys.stderr)
            return EXIT_BAD_INPUT
        return args.func(args)
    except BadInput as exc:
        _stderr(f"kvfence: error: {exc}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:  # kvfence.running.interrupt.Interrupted carries SIGTERM's 143
        _stderr("kvfence: interrupted")
        return getattr(exc, "exit_code", 130)
