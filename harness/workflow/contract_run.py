"""The generic engine for plug-in contracts (``kvfence.cases.contract``): kernels, one check, fuzz with
shrinking, case files, repro, and the self-test of a contract's mutants. It knows no contract by name.

* ``resolve_kernel(contract, spec)``: ``reference`` (kvfence's own kernel), ``mutant:NAME`` (a planted bug),
  ``sglang==VERSION`` (the release's own kernel, extracted from its wheel as data: ``kvfence.cases.upstream``),
  or a plug-in ``file.py:attr`` / ``module:attr``.
* ``check(...)``: the findings of one case: ``SIZING_VIOLATION`` (``need > width``) and the contract's own
  arithmetic findings before the launch, then the launch in guarded tables (a ``LAUNCH_ERROR`` if it raises)
  and the element-by-element verdict (``kvfence.verifying.tables``).
* ``fuzz(...)``: Hypothesis draws cases from the contract's strategy until one fails, shrinks it, and writes
  its case file (``OUT/cases/<hash>.json``) and ``OUT/summary.json``.
* ``repro(...)``: replays a case file. A case file is data: it names a contract, a named sizing and a kernel,
  and only ``reference``, ``mutant:NAME`` and ``sglang==VERSION`` are taken from it; a plug-in kernel must be
  given again with ``--kernel``.

Kernels run in a checking worker (``kvfence.workflow.worker``, the draft contract's worker, through
``ContractCodec``): a kernel or plug-in that kills, aborts, interrupts or hangs its process is the case's
``CRASH`` or ``HANG`` finding, never the end of the run. ``isolate=False`` checks in this process (the
self-test of kvfence's own mutants in the suite, and ``--in-process``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from kvfence.cases.contract import Contract
from kvfence.cases.findings import Finding, Kind
from kvfence.errors import BadInput, require

CASE_FORMAT = "kvfence-contract-case/1"
#: Kernel specs a case file may name and repro takes from it (none of them runs code the file chose).
TRUSTED_PREFIXES = ("reference", "mutant:", "sglang==")


# -- kernels --------------------------------------------------------------------------------------------------
_KERNELS: Dict[Tuple[str, str], object] = {}


def resolve_kernel(contract: Contract, spec: str):
    """The jit function ``spec`` names for ``contract`` (see the module docstring); ``BadInput`` otherwise.
    Resolved once per process: the same jit function keeps its compiled specializations across fuzz runs
    (the self-test's seeds), where a fresh one would load each again from Triton's disk cache."""
    key = (contract.name, spec)
    if key not in _KERNELS:
        _KERNELS[key] = _resolve(contract, spec)
    return _KERNELS[key]


def _resolve(contract: Contract, spec: str):
    from kvfence.cases import targets, upstream

    require(isinstance(spec, str) and spec, "--kernel: empty spec")
    if spec == "reference":
        return targets._load_attr(f"{contract.reference_kernel}:{contract.reference_attr}", "kernel")
    if spec.startswith("mutant:"):
        mutant = contract.mutant(spec.split(":", 1)[1])
        require(mutant.patch, f"mutant {mutant.name} of {contract.name} is a sizing mutant: run the reference "
                              f"kernel with --sizing {mutant.sizing}")
        from kvfence.workflow.mutants import build_kernel

        path = build_kernel(mutant.name, [list(p) for p in mutant.patch], reference=contract.reference_kernel)
        return targets._load_attr(f"{path}:{contract.reference_attr}", "kernel")
    if upstream.is_spec(spec):
        return targets._load_attr(f"{upstream_kernel_file(contract, spec)}:{contract.upstream.function}", "kernel")
    return targets._load_attr(spec, "kernel")


def upstream_kernel_file(contract: Contract, spec: str) -> Path:
    """The standalone module holding ``contract``'s kernel from release ``sglang==VERSION``, extracted from the
    wheel (never imported) into the cache, ``sglang-VERSION/contracts/<contract>.py``, on first use."""
    import tempfile
    import zipfile

    from kvfence.cases import upstream

    require(contract.upstream is not None, f"contract {contract.name} names no upstream kernel")
    version, _, attr = spec[len(upstream.SPEC_PREFIX):].partition(":")
    upstream.check_version(version)
    function = contract.upstream.function
    require(attr in ("", function), f"kernel {spec!r}: contract {contract.name} launches {function}, not {attr}")
    target = upstream.cache_root() / f"sglang-{version}" / "contracts" / f"{contract.name}.py"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="kvfence-wheel-") as tmp:
        wheel = upstream._find_wheel(version, None, upstream.offline_by_env(), Path(tmp),
                                     lambda m: print(m, file=sys.stderr, flush=True))
        try:
            with zipfile.ZipFile(wheel) as zf:
                names = set(zf.namelist())
                found = [p for p in contract.upstream.paths if p in names]
                require(found, f"sglang=={version} has no {function} for contract {contract.name} (looked in "
                               f"{', '.join(contract.upstream.paths)})")
                source = upstream.member_bytes(zf, found[0]).decode("utf-8")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, UnicodeDecodeError) as exc:
            raise BadInput(f"sglang=={version}: the wheel is unreadable: {exc}") from None
    require(f"def {function}(" in source, f"sglang=={version}: {found[0]} has no {function}")
    _check_signature(contract, version, source, function)  # before extraction: the more useful message
    text, functions = upstream.extract(source, found[0], roots=(function,))
    require(function in functions, f"sglang=={version}: {function} in {found[0]} is not a @triton.jit function")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(f'"""{function} of sglang=={version} ({found[0]}), extracted by kvfence. Generated."""\n'
                       + text, encoding="utf-8")
    os.replace(staging, target)
    return target


def _check_signature(contract: Contract, version: str, text: str, function: str) -> None:
    """A release whose kernel's parameters differ from the reference kernel's: one line (exit 2)."""
    import ast

    def params(source: str) -> List[str]:
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise BadInput(f"sglang=={version}: the module defining {function} does not parse: {exc.msg}") from None
        fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        require(fn, f"sglang=={version}: {function} is not a top-level function")
        return [a.arg for a in fn[0].args.args]

    ours = params(contract.reference_kernel.read_text())
    theirs = params(text)
    require(len(ours) == len(theirs),
            f"sglang=={version}: {function} takes {len(theirs)} parameters ({', '.join(theirs)}), the "
            f"{contract.name} ABI {len(ours)} ({', '.join(ours)}); kvfence does not know this signature")


# -- one case -------------------------------------------------------------------------------------------------
def check(contract: Contract, kernel, case, width: int, device: str, graph: bool = False) -> List[Finding]:
    from kvfence.running import tables as guarded
    from kvfence.verifying.tables import verdict

    findings: List[Finding] = []
    need = contract.need(case)
    if need > width:
        findings.append(Finding(Kind.SIZING_VIOLATION, "launch", "row width", width, need,
                                detail=f"need {need} > width {width}"))
    findings += contract.findings_before_launch(case, width)
    buffers = guarded.allocate_all(contract.tables(case, width), device)
    before = guarded.snapshot(buffers)
    try:
        guarded.launch(contract, kernel, buffers, case, width, device, graph)
    except Exception as exc:  # a kernel's compile or launch error is a finding, not kvfence's crash
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return findings + [Finding(Kind.LAUNCH_ERROR, "launch", "launch", detail=text)]
    return findings + verdict(contract, case, width, buffers, before, guarded.snapshot(buffers))


# -- the checking worker ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """One case and the row width it is launched with: what a contract's checking worker is sent."""

    case: object
    width: int


class ContractCodec:
    """A contract's launches on the worker protocol (``kvfence.workflow.worker.DraftCodec`` says the same of
    draft cases): each as its case file's ``case`` dict and its width, grouped by ``compile_key``. ``kernel``
    is the kernel spec the launches run with; the self-test changes it between rows, so that one worker
    serves them all (the worker resolves each spec once)."""

    engine = "contract"

    def __init__(self, contract: Contract, kernel: str):
        self.contract, self.kernel = contract, kernel
        self.kinds = tuple(contract.kinds)

    def encode(self, launches) -> dict:
        return {"kernel": self.kernel, "launches": [[self.contract.case_to_dict(x.case), x.width] for x in launches]}

    def group(self, launch: Launch):
        return self.kernel, self.contract.compile_key(launch.case, launch.width)

    def elements(self, launch: Launch) -> int:
        return self.contract.elements(launch.case, launch.width)


def worker_options(contract: Contract, graph: bool) -> dict:
    """What a checking worker needs to load ``contract`` as this process did: its registry entry and the
    import path it was found on."""
    from kvfence.cases import contract as registry

    return {"contract": contract.name, "entry": registry.entry(contract.name), "graph": graph,
            "sys_path": [p for p in sys.path if p]}


class _WorkerChecks:
    """The worker side's session: ``check(launch)`` through ``check``, with the kernel the message names
    (``kernel``, set by ``decode``); counts launches."""

    def __init__(self, contract: Contract, kernel: str, device: str, graph: bool):
        self.contract, self.device, self.graph = contract, device, graph
        self.kernel = resolve_kernel(contract, kernel)  # at start: an unresolvable kernel is BadInput now
        self.stats = {"launches": 0}

    def check(self, launch: Launch) -> List[Finding]:
        self.stats["launches"] += 1
        return check(self.contract, self.kernel, launch.case, launch.width, self.device, self.graph)


def worker_side(options: dict, device: str):
    """``kvfence.workflow.worker.WORKER_SIDES["contract"]``: load the contract and resolve its kernel here, in
    the worker (a plug-in's import runs in this process only), and decode each message's launches as case
    files are decoded (``case_from_dict`` validates them)."""
    from kvfence.cases import contract as registry

    for entry in reversed(options.get("sys_path", [])):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    registry.register(options["contract"], options["entry"])
    record = registry.get(options["contract"])
    session = _WorkerChecks(record, options["kernel"], device, bool(options["graph"]))

    def decode(message: dict):
        session.kernel = resolve_kernel(record, message.get("kernel", options["kernel"]))
        for case, width in message["launches"]:
            require(type(width) is int and width >= 0, f"a launch's width must be a non-negative int, got {width!r}")
            yield Launch(record.case_from_dict(case), width)

    return session, decode, lambda launch: record.compile_key(launch.case, launch.width)  # one kernel per message


def checking_worker(contract: Contract, kernel_spec: str, device: str, graph: bool, *,
                    case_timeout: Optional[float] = None):
    """A ``RemoteSession`` that checks ``contract``'s launches with ``kernel_spec`` in a worker process;
    ``BadInput`` now when the kernel cannot be resolved there (or its import kills the worker)."""
    from kvfence.workflow.worker import DEFAULT_CASE_TIMEOUT, RemoteSession

    return RemoteSession(device, kernel_spec, case_timeout=case_timeout or DEFAULT_CASE_TIMEOUT,
                         codec=ContractCodec(contract, kernel_spec), worker_options=worker_options(contract, graph))


def kinds_of(findings: List[Finding]) -> List[str]:
    return sorted({f.kind.value for f in findings})


# -- fuzz -----------------------------------------------------------------------------------------------------
@dataclass
class FuzzResult:
    contract: str
    kernel: str
    sizing: str
    device: str
    examples: int = 0
    structures: int = 0
    explore_s: float = 0.0
    first_failure_s: Optional[float] = None
    case: Optional[dict] = None
    width: Optional[int] = None
    findings: List[dict] = field(default_factory=list)
    headlines: List[str] = field(default_factory=list)
    case_file: Optional[str] = None

    @property
    def failed(self) -> bool:
        return self.case is not None

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["kinds"] = sorted({f["kind"] for f in self.findings})
        return d


class _Failed(Exception):
    pass


def fuzz(contract: Contract, kernel_spec: str, sizing: str, device: str, *, max_examples: int = 200,
         seed: int = 0, max_seconds: Optional[float] = None, shrink_seconds: float = 30.0,
         graph: bool = False, progress=None, fail_on: Optional[Tuple[str, ...]] = None,
         shrink: bool = True, isolate: bool = True, session=None,
         case_timeout: Optional[float] = None) -> FuzzResult:
    """Draw cases until one fails (or the budget ends), shrink it; ``FuzzResult`` says what was found.

    ``fail_on``: only findings of these kinds make a case fail (the self-test of a kernel mutant that shows
    under a buggy sizing, where every overflowing case has the sizing's own findings too). ``shrink=False``:
    the first failing case as drawn (the self-test asks only whether a bug is found, and Hypothesis's
    shrinker walks large GPU-domain cases for a long time even when no candidate is checked).

    ``isolate``: launch in a checking worker (``checking_worker``; ``session``: one already started, which
    the caller closes), so a kernel that dies or hangs is a ``CRASH`` or ``HANG`` finding; otherwise in this
    process."""
    policy = contract.sizing(sizing)
    owned = None
    if not isolate:
        kernel = resolve_kernel(contract, kernel_spec)
        checker = lambda case, width: check(contract, kernel, case, width, device, graph)  # noqa: E731
    else:
        if session is None:
            session = owned = checking_worker(contract, kernel_spec, device, graph, case_timeout=case_timeout)
        checker = lambda case, width: session.check(Launch(case, width))  # noqa: E731
    try:
        return _fuzz(contract, kernel_spec, sizing, device, policy, checker, max_examples=max_examples,
                     seed=seed, max_seconds=max_seconds, shrink_seconds=shrink_seconds, progress=progress,
                     fail_on=fail_on, shrink=shrink)
    finally:
        if owned is not None:
            owned.close()


def _fuzz(contract, kernel_spec, sizing, device, policy, checker, *, max_examples, seed, max_seconds,
          shrink_seconds, progress, fail_on, shrink) -> FuzzResult:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded

    result = FuzzResult(contract.name, kernel_spec, sizing, device)
    domain = "gpu" if device == "cuda" else "cpu"
    keys = set()
    failing: Dict[str, List[Finding]] = {}
    start = time.monotonic()
    state = {"found_at": None}

    @settings(max_examples=max_examples, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink) if shrink else
              (Phase.generate,), report_multiple_bugs=False)
    @seeded(seed)
    @given(contract.cases(domain))
    def probe(case):
        key = json.dumps(contract.case_to_dict(case), sort_keys=True)
        if key not in failing:
            _check_drawn(case, key)
        if key in failing:  # one raise site: Hypothesis calls a failure from another line a different bug
            raise _Failed(key)

    def _check_drawn(case, key):
        from hypothesis import assume

        now = time.monotonic() - start
        if state["found_at"] is None:
            assume(max_seconds is None or now < max_seconds)
        elif now - state["found_at"] > shrink_seconds:
            return  # the shrink budget is spent: only known failures still fail
        width = policy(case)
        findings = checker(case, width)
        if fail_on is not None and not {f.kind.value for f in findings} & set(fail_on):
            findings = []
        if state["found_at"] is None:
            result.examples += 1
            keys.add(contract.structural_key(case, width))
            if progress and result.examples % 25 == 0:
                progress(f"kvfence: {contract.name}: {result.examples} examples, {len(keys)} structures, "
                         f"{now:.0f} s")
        if findings:
            if state["found_at"] is None:
                state["found_at"] = time.monotonic() - start
            failing[key] = findings

    try:
        probe()
    except _Failed as exc:
        key = exc.args[0]
        case = contract.case_from_dict(json.loads(key))
        result.case, result.width = contract.case_to_dict(case), policy(case)
        result.findings = [f.to_dict() for f in failing[key]]
        result.headlines = [f.headline() for f in failing[key]]
        result.first_failure_s = state["found_at"]
    result.structures = len(keys)
    result.explore_s = (state["found_at"] if state["found_at"] is not None else time.monotonic() - start)
    return result


def write_case(out_dir: Path, result: FuzzResult, graph: bool) -> Path:
    doc = {"format": CASE_FORMAT, "contract": result.contract, "kernel": result.kernel, "sizing": result.sizing,
           "device": result.device, "mode": "graph" if graph else "eager", "width": result.width,
           "case": result.case, "findings": result.findings}
    digest = hashlib.sha256(json.dumps(doc["case"], sort_keys=True).encode()).hexdigest()[:12]
    path = out_dir / "cases" / f"{result.contract}-{digest}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path


def write_report(out_dir: Path, case_file: Path) -> Path:
    """``OUT/report.html``: the table map of the case file (kvfence.reports.table_map), from the file alone."""
    from kvfence.reports.table_map import report_html

    record, case, doc = load_case(case_file)
    doc = dict(doc, case_file=str(case_file))
    path = out_dir / "report.html"
    path.write_text(report_html(doc, record, case), encoding="utf-8")
    return path


def is_case_file(doc) -> bool:
    return isinstance(doc, dict) and doc.get("format") == CASE_FORMAT


def load_case(path: Path):
    """``(contract, case, doc)`` of a contract case file; ``BadInput`` naming what is wrong."""
    from kvfence.cases import contract as registry

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"case file {path}: unreadable: {exc}") from None
    require(is_case_file(doc), f"case file {path}: not a {CASE_FORMAT} file")
    for key in ("contract", "kernel", "sizing"):
        require(isinstance(doc.get(key), str), f"case file {path}: {key} must be a string")
    record = registry.get(doc["contract"])
    return record, record.case_from_dict(doc.get("case")), doc


def _width(record: Contract, policy_name: str, case, doc: dict, path: Path) -> int:
    """The row width of a replay: a named sizing's, or, for a witness of a release's shipped sizing
    (``sglang==V:BACKEND:MODE:FORWARD_MODE``, kvfence.workflow.contract_shipped_matrix), the width the file
    records (the release's formula at the case's context, page size and draft tokens)."""
    if policy_name in record.sizings or not policy_name.startswith("sglang=="):
        return record.sizing(policy_name)(case)
    width = doc.get("width")
    require(type(width) is int and 0 <= width <= 1 << 24,
            f"case file {path}: a shipped-sizing case needs its width, an integer in [0, 2**24]")
    return width


def repro(path: Path, *, kernel: Optional[str], sizing: Optional[str], device: str, graph: Optional[bool],
          verbose: bool = False, in_process: bool = False, case_timeout: Optional[float] = None) -> int:
    """Replay a case file and print its findings (1 reproduces, 0 passes). The launch runs in a checking
    worker, so a case that kills or stalls its process prints its ``CRASH`` or ``HANG`` (``in_process``:
    here)."""
    record, case, doc = load_case(path)
    spec = kernel or doc["kernel"]
    require(kernel is not None or spec.startswith(TRUSTED_PREFIXES),
            f"case file {path} names the plug-in kernel {spec!r}: a case file never makes kvfence import code; "
            f"pass --kernel {spec} to run it")
    policy_name = sizing or doc["sizing"]
    width = _width(record, policy_name, case, doc, path)
    use_graph = (doc.get("mode") == "graph") if graph is None else graph
    require(not use_graph or device == "cuda", "--mode graph needs --device cuda (a captured CUDA graph)")
    if in_process:
        findings = check(record, resolve_kernel(record, spec), case, width, device, use_graph)
    else:
        with checking_worker(record, spec, device, use_graph, case_timeout=case_timeout) as worker:
            findings = worker.check(Launch(case, width))
    print(f"kvfence repro: {record.name}, kernel {spec}, sizing {policy_name} (width {width}), need "
          f"{record.need(case)}, {'graph' if use_graph else 'eager'} on {device}")
    for f in findings[: None if verbose else 12]:
        print("  " + f.headline())
    if not verbose and len(findings) > 12:
        print(f"  ... {len(findings) - 12} more (--verbose)")
    print("reproduces" if findings else "passes")
    return 1 if findings else 0


# -- the self-test of a contract's mutants ----------------------------------------------------------------------
def self_test(contract: Contract, device: str, *, seeds, max_examples: int, names: Optional[List[str]] = None,
              progress=None, on_row=None, isolate: bool = True) -> dict:
    """Each mutant fuzzed over ``seeds`` (a kernel mutant under the safe sizing, a sizing mutant as the
    reference kernel under its sizing; on CUDA in captured graphs); detected when the failure's kinds include
    one it declares. The reference must be clean under the safe sizing on every seed. ``on_row(report)`` is
    called after each row with the report so far (``complete`` false), so a run cut short keeps the rows it
    finished. ``isolate``: every row checks in one checking worker (``fuzz``), its kernel set per row."""
    # (row, kernel, sizing, kinds it must be found by, kinds that alone make a case fail). A kernel mutant
    # that shows only under a buggy sizing is searched for its own kinds, and paired with the reference under
    # the same sizing and filter, which must stay clean.
    targets = [("reference", "reference", contract.safe_sizing, (), None)]
    for m in contract.mutants:
        if names and m.name not in names:
            continue
        both = bool(m.patch and m.sizing)
        if both:
            targets.append((f"reference under {m.sizing}, {'/'.join(m.detects)} only", "reference", m.sizing,
                            (), m.detects))
        targets.append((m.name, f"mutant:{m.name}" if m.patch else "reference", m.sizing or contract.safe_sizing,
                        m.detects, m.detects if both else None))
    rows = []
    worker = checking_worker(contract, "reference", device, device == "cuda") if isolate else None

    def report(complete: bool) -> dict:
        passed = complete and all(r["good"] == r["seeds"] if not r["detects"] else r["good"] >= 0.95 * r["seeds"]
                                  for r in rows)
        return {"contract": contract.name, "device": device, "max_examples": max_examples, "seeds": list(seeds),
                "passed": passed, "complete": complete, "rows_planned": len(targets), "rows": rows}

    try:
        for name, kernel, sizing, detects, fail_on in targets:
            runs, row_start = [], time.monotonic()
            if worker is not None:
                worker.codec.kernel = kernel
            for s in seeds:
                r = fuzz(contract, kernel, sizing, device, max_examples=max_examples, seed=s, shrink_seconds=0,
                         graph=device == "cuda", fail_on=fail_on, shrink=False, isolate=isolate, session=worker)
                kinds = r.to_dict()["kinds"]
                clean_row = not detects
                ok = (not r.failed) if clean_row else bool(set(kinds) & set(detects))
                runs.append({"seed": s, "clean" if clean_row else "detected": ok, "kinds": kinds,
                             "examples": r.examples, "search_s": r.first_failure_s})
                if progress:
                    progress(f"kvfence: {contract.name} {name} seed {s}: {'ok' if ok else 'NOT OK'} {kinds}")
            good = sum(1 for x in runs if x.get("detected", x.get("clean")))
            rows.append({"name": name, "kernel": kernel, "sizing": sizing, "detects": list(detects),
                         "fail_on": list(fail_on) if fail_on else None, "good": good, "seeds": len(runs),
                         "seconds": round(time.monotonic() - row_start, 1), "runs": runs})
            if on_row is not None:
                on_row(report(False))
    finally:
        if worker is not None:
            worker.close()
    return report(True)
