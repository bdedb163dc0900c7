"""``TableContract``: a contract described by its tables, answering every question of the engine from that.

A table contract (docs/contract.md §9: the FlashMLA and TRTLLM-MHA page-table builders, FA3's decode metadata)
writes a few lines of its own:

* ``cases(domain)``: a Hypothesis strategy of its cases (config and batch in one frozen value that shrinks
  toward the simplest launch), ``case_to_dict`` / ``case_from_dict`` (data, validated);
* ``tables(case, width)``: its buffers (``kvfence.contract.Table``: outputs guarded, inputs with poisoned
  guards), ``expected(case, width)``: the plain-Python oracle of every output element, ``need(case)``: the row
  width the launch needs, ``launch(kernel, buffers, case, width)``: its ABI;
* optionally ``findings_before_launch`` (arithmetic findings such as a truncated table), ``owner`` (the program
  the contract says writes an element), ``structural_key``, ``compile_key`` and ``elements``.

From those, this class answers the engine (``kvfence.contract.Contract``): a case of the engine is a
``Launch``, the contract's case bound to the row width its sizing gives it, with the kernel and mode it runs
in; one check allocates the guarded tables (``kvfence.engine.tables``), launches (in a captured CUDA graph in
graph mode on CUDA) and compares every element (``kvfence.engine.verdict``).

Kernel specs (``resolve_kernel``): ``reference`` (kvfence's own kernel), ``mutant:NAME`` (a planted bug),
``sglang==VERSION`` (the release's own kernel, extracted from its wheel as data: ``kvfence.release.upstream``),
or a plug-in ``file.py:attr`` / ``module:attr``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from kvfence.contract import Contract, Table  # noqa: F401 - Table: what a table contract's tables() returns
from kvfence.engine.findings import Finding, Kind
from kvfence.errors import BadInput, require

#: Kernel specs a case file may name and repro takes from it (none of them runs code the file chose).
TRUSTED_PREFIXES = ("reference", "mutant:", "sglang==")
#: A shipped sizing (``sglang==V:BACKEND:MODE:FORWARD_MODE``) is no named policy: its width is the release's
#: formula, recorded with the case (``kvfence.release.contract_shipped_matrix``).
SHIPPED_PREFIX = "sglang=="
MAX_WIDTH = 1 << 24
#: What an output element costs a check beside an input element: the plain-Python oracle builds each one (a
#: FlashMLA launch of four 52,412-page rows, 0.2M output and 0.3M input elements, took 0.5 s on a 2-core CPU
#: and, before the verdict's whole-tensor fast path, timed out at 5 s under 15 jobs on the H200).
OUTPUT_WEIGHT = 4


@dataclass(frozen=True)
class Launch:
    """A table contract's case as the engine checks it: the case, the row width its sizing gives it (or a
    release's recorded width), the kernel spec and the mode."""

    contract: str
    case: object
    width: int
    sizing: str
    kernel: str = "reference"
    mode: str = "eager"


class TableContract(Contract):
    """A contract written as tables, an element oracle and a launcher (see the module docstring)."""

    coverage_fields = ("page_size", "num_seqs", "need", "width", "failed")
    case_map = "kvfence.reports.table_map:case_map_html"

    # -- what a table contract writes ---------------------------------------------------------------------
    def cases(self, domain: str):
        """A Hypothesis strategy of this contract's cases on ``domain`` (``cpu`` or ``gpu``)."""
        raise NotImplementedError

    def case_to_dict(self, case) -> dict:
        raise NotImplementedError

    def case_from_dict(self, data: dict):
        """The case a case file holds; ``BadInput`` (one line) when it is malformed."""
        raise NotImplementedError

    def tables(self, case, width: int) -> List[Table]:
        raise NotImplementedError

    def expected(self, case, width: int) -> Dict[str, Dict[Tuple[int, int], int]]:
        """Plain-Python oracle: ``{output table: {(row, column): value}}``, every element the launch writes; a
        column at or past ``width`` is a write the contract asks for that the row cannot hold."""
        raise NotImplementedError

    def need(self, case) -> int:
        """The row width this launch needs."""
        raise NotImplementedError

    def launch(self, kernel, buffers: Dict[str, object], case, width: int) -> None:
        """Launch ``kernel`` (a jit function of this contract's ABI) on ``buffers`` (tensor views by table)."""
        raise NotImplementedError

    def findings_before_launch(self, case, width: int) -> list:
        return []

    def owner(self, case, table: str, row: int, column: int) -> Optional[Tuple[int, ...]]:
        """The program that the contract says writes (table, row, column), or None."""
        return None

    def structural_key(self, case, width: int) -> tuple:
        return (repr(self.case_to_dict(case)), width)

    def compile_key(self, case, width: int) -> tuple:
        """What a launch's compiled specialization depends on (its constexprs and shapes): a launch with a
        key the checking worker has not run yet may compile first, and gets the warm-up allowance on top of
        its time limit. The default (the structural key) errs towards allowing a compile."""
        return self.structural_key(case, width)

    def elements(self, case, width: int) -> int:
        """Roughly how much work one check of ``case`` is, in elements (its time limit scales with it): every
        input element, and each output element ``OUTPUT_WEIGHT`` times (the oracle builds it in Python)."""
        return sum((t.rows or 1) * t.width * (OUTPUT_WEIGHT if t.role == "output" else 1)
                   for t in self.tables(case, width))

    def config_key(self, case) -> tuple:
        """What ``case`` shares with the other launches of its config (what a server fixes before the batch:
        page size, context, ...): the distinct-config count and ``--keep-going``'s failure signatures (finding
        kinds and config) use it. By default the case's scalar fields but its seed."""
        return tuple((k, v) for k, v in sorted(self.case_to_dict(case).items())
                     if k != "seed" and not isinstance(v, (list, tuple, dict)))

    def num_seqs(self, case) -> int:
        """Rows the launch writes (requests): the first output table's rows."""
        out = [t for t in self.tables(case, 1) if t.role == "output"]
        return (out[0].rows or 1) if out else 1

    # -- the engine's questions ----------------------------------------------------------------------------
    def bind(self, case, sizing: str, kernel: str = "reference", mode: str = "eager",
             width: Optional[int] = None) -> Launch:
        """``case`` launched under the named ``sizing`` (or, for a release's shipped sizing, ``width``)."""
        if width is None:
            width = self.sizing(sizing)(case)
        require(type(width) is int and 0 <= width <= MAX_WIDTH,
                f"{self.name}: sizing {sizing!r} gives width {width!r}, not an integer in [0, 2**24]")
        return Launch(self.name, case, width, sizing, kernel, mode)

    def resolve(self, spec: str):
        """The kernel ``spec`` names (``resolve_kernel``): ``BadInput`` now, for a release without it."""
        return resolve_kernel(self, spec)

    def release_kernel(self, version: str) -> None:
        """Extract release ``version``'s kernel into the cache, as data (nothing imported):
        ``kvfence.release.upstream.Refused`` when the release has none or another signature."""
        upstream_kernel_file(self, f"sglang=={version}")

    def check_launch(self, launch: Launch, device: str) -> List[Finding]:
        """One launch checked in this process (the shipped-sizing matrix's witnesses)."""
        return TableSession(self, device).check(launch)

    def draws(self, plan):
        return self.cases(plan.domain).map(lambda case: self.bind(case, plan.sizing, plan.kernel, plan.mode))

    def check_plan(self, plan) -> None:
        super().check_plan(plan)
        require(plan.bulk_per_example == 0, f"--bulk-per-example: contract {self.name} draws no bulk")

    def session(self, plan, **options):
        return TableSession(self, plan.device)

    def codec(self, plan):
        return TableCodec(self)

    def worker_side(self, options: dict, device: str):
        session = TableSession(self, device)
        codec = TableCodec(self)

        def decode(message: dict):
            for data in message["launches"]:
                yield self.case_from_record(data)

        return session, decode, codec.group

    def check_spec(self, spec: str, what: str) -> None:
        if what == "sizing":
            require(isinstance(spec, str) and (spec in self.sizings or spec.startswith(SHIPPED_PREFIX)),
                    f"unknown sizing {spec!r} of contract {self.name}: choose from {', '.join(self.sizings)}")
        elif not (isinstance(spec, str) and spec.startswith(TRUSTED_PREFIXES)):
            super().check_spec(spec, what)

    def names_plugin(self, spec: str) -> bool:
        return spec not in self.sizings and not spec.startswith(TRUSTED_PREFIXES)

    def case_record(self, launch: Launch) -> dict:
        return {"case": _data(self.case_to_dict(launch.case)), "width": launch.width, "sizing": launch.sizing,
                "kernel": launch.kernel, "mode": launch.mode}

    def case_from_record(self, data) -> Launch:
        require(isinstance(data, dict), "case: expected a JSON object")
        unknown = sorted(set(data) - {"case", "width", "sizing", "kernel", "mode"})
        require(not unknown, f"case: unknown field(s) {', '.join(unknown)}")
        for key in ("sizing", "kernel"):
            require(isinstance(data.get(key), str) and data[key], f"case: {key} must be a non-empty string")
        require(data.get("mode", "eager") in ("graph", "eager"), "case: mode must be graph or eager")
        case = self.case_from_dict(data.get("case"))
        width = None
        if data["sizing"] not in self.sizings and data["sizing"].startswith(SHIPPED_PREFIX):
            width = data.get("width")  # the release's formula at this case, recorded when it was run
            require(type(width) is int and 0 <= width <= MAX_WIDTH,
                    "case: a shipped-sizing case needs its width, an integer in [0, 2**24]")
        return self.bind(case, data["sizing"], data["kernel"], data.get("mode", "eager"), width)

    def summary(self, launch: Launch) -> dict:
        return {"need": self.need(launch.case), "width": launch.width, "num_seqs": self.num_seqs(launch.case),
                "config": self.config_record(self.config_of(launch)), "case": self.case_record(launch)}

    def describe(self, launch: Launch, full: bool = False) -> str:
        data = self.case_to_dict(launch.case)
        shown = data if full else {k: v for k, v in data.items() if not isinstance(v, (list, tuple))}
        fields = " ".join(f"{k}={v}" for k, v in shown.items())
        return f"{self.name} {fields}; table width {launch.width} ({launch.sizing})"

    def config_of(self, launch: Launch):
        return (("sizing", launch.sizing), ("mode", launch.mode)) + tuple(self.config_key(launch.case))

    def config_record(self, config) -> dict:
        return {k: v for k, v in config}

    def structure_of(self, launch: Launch):
        """The structural key as one int, the same in every process (``--jobs`` merges count structures
        across jobs by it; a key holding None or a str would hash differently in each)."""
        import hashlib

        text = repr(self.structural_key(launch.case, launch.width)).encode()
        return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")

    def coverage_row(self, launch: Launch, failed: bool) -> tuple:
        case = launch.case
        return (getattr(case, "page_size", 0), self.num_seqs(case), self.need(case), launch.width, failed)

    def override(self, launch: Launch, *, kernel=None, sizing=None, mode=None, layout=None) -> Launch:
        require(layout is None, f"--layout: contract {self.name} has one layout (its tables, guarded)")
        width = launch.width if sizing is None and launch.sizing.startswith(SHIPPED_PREFIX) else None
        return self.bind(launch.case, sizing or launch.sizing, kernel or launch.kernel, mode or launch.mode, width)

    program_axes = "row,block"

    def setting_changes(self, original: Launch, launch: Launch):
        return [("mode", launch.mode, original.mode)] if launch.mode != original.mode else []

    def explain(self, launch: Launch) -> List[str]:
        need = self.need(launch.case)
        verdict = (f"need > width by {need - launch.width}: the table is too narrow" if need > launch.width
                   else f"fits ({launch.width - need} spare)")
        return [f"need   = {need} (the widest row the launch's lengths need)",
                f"width  = {launch.sizing}(case) = {launch.width}", f"=> {verdict}"]


def _data(value):
    """``value`` as JSON data holds it (tuples as lists), so a record reads the same before and after a file."""
    if isinstance(value, dict):
        return {k: _data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_data(v) for v in value]
    return value


# -- kernels --------------------------------------------------------------------------------------------------
_KERNELS: Dict[Tuple[str, str], object] = {}


def resolve_kernel(contract: TableContract, spec: str):
    """The jit function ``spec`` names for ``contract`` (see the module docstring); ``BadInput`` otherwise.
    Resolved once per process: the same jit function keeps its compiled specializations across runs."""
    key = (contract.name, spec)
    if key not in _KERNELS:
        _KERNELS[key] = _resolve(contract, spec)
    return _KERNELS[key]


def _resolve(contract: TableContract, spec: str):
    from kvfence.contracts.draft import targets
    from kvfence.release import upstream

    require(isinstance(spec, str) and spec, "--kernel: empty spec")
    if spec == "reference":
        return targets._load_attr(f"{contract.reference_kernel}:{contract.reference_attr}", "kernel")
    if spec.startswith("mutant:"):
        mutant = contract.mutant(spec.split(":", 1)[1])
        require(mutant.patch, f"mutant {mutant.name} of {contract.name} is a sizing mutant: run the reference "
                              f"kernel with --sizing {mutant.sizing}")
        reference = contract.reference_kernel
        path = targets.patched_kernel(mutant.name, [list(p) for p in mutant.patch], reference,
                                      f"{reference.stem}-{mutant.name}.py")
        return targets._load_attr(f"{path}:{contract.reference_attr}", "kernel")
    if upstream.is_spec(spec):
        return targets._load_attr(f"{upstream_kernel_file(contract, spec)}:{contract.upstream.function}", "kernel")
    return targets._load_attr(spec, "kernel")


def upstream_kernel_file(contract: TableContract, spec: str) -> Path:
    """The standalone module holding ``contract``'s kernel from release ``sglang==VERSION``, extracted from the
    wheel (never imported) into the cache, ``sglang-VERSION/contracts/<contract>.py``, on first use."""
    import tempfile
    import zipfile

    from kvfence.release import upstream

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
                if not found:
                    raise upstream.Refused(f"sglang=={version} has no {function} for contract {contract.name} "
                                           f"(looked in {', '.join(contract.upstream.paths)})", upstream.NO_KERNEL)
                source = upstream.member_bytes(zf, found[0]).decode("utf-8")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, UnicodeDecodeError) as exc:
            raise BadInput(f"sglang=={version}: the wheel is unreadable: {exc}") from None
    if f"def {function}(" not in source:
        raise upstream.Refused(f"sglang=={version}: {found[0]} has no {function}", upstream.NO_KERNEL)
    _check_signature(contract, version, source, function)  # before extraction: the more useful message
    text, functions = upstream.extract(source, found[0], roots=(function,))
    require(function in functions, f"sglang=={version}: {function} in {found[0]} is not a @triton.jit function")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(f'"""{function} of sglang=={version} ({found[0]}), extracted by kvfence. Generated."""\n'
                       + text, encoding="utf-8")
    os.replace(staging, target)
    return target


def _check_signature(contract: TableContract, version: str, text: str, function: str) -> None:
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

    from kvfence.release import upstream

    ours = params(contract.reference_kernel.read_text())
    theirs = params(text)
    if len(ours) != len(theirs):
        raise upstream.Refused(f"sglang=={version}: {function} takes {len(theirs)} parameters ({', '.join(theirs)}), "
                               f"the {contract.name} ABI {len(ours)} ({', '.join(ours)}); kvfence does not know this "
                               "signature", upstream.ABI_UNSUPPORTED)


# -- one check --------------------------------------------------------------------------------------------------
def check(contract: TableContract, kernel, case, width: int, device: str, graph: bool = False) -> List[Finding]:
    """The findings of one launch: ``SIZING_VIOLATION`` (``need > width``) and the contract's own arithmetic
    findings, then the launch in guarded tables (a ``LAUNCH_ERROR`` if it raises) and the element-by-element
    verdict."""
    from kvfence.engine import tables as guarded
    from kvfence.engine.verdict import verdict

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


class TableSession:
    """A table contract's checker in this process: each ``Launch`` through ``check`` with the kernel it names
    (resolved once per spec), captured in a CUDA graph in graph mode on CUDA; counts launches."""

    def __init__(self, contract: TableContract, device: str):
        self.contract, self.device = contract, device
        self.stats = {"launches": 0}

    def check(self, launch: Launch) -> List[Finding]:
        kernel = resolve_kernel(self.contract, launch.kernel)
        self.stats["launches"] += 1
        return check(self.contract, kernel, launch.case, launch.width, self.device,
                     launch.mode == "graph" and self.device == "cuda")


class TableCodec:
    """A table contract's launches on the checking worker's wire: each as its case record, one run per
    (kernel, compiled specialization)."""

    def __init__(self, contract: TableContract):
        self.contract = contract
        self.kinds = tuple(contract.kinds)

    def encode(self, launches) -> dict:
        return {"launches": [self.contract.case_record(x) for x in launches]}

    def group(self, launch: Launch):
        return launch.kernel, launch.mode, self.contract.compile_key(launch.case, launch.width)

    def elements(self, launch: Launch) -> int:
        return self.contract.elements(launch.case, launch.width)
