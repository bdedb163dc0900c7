"""What a kvfence contract provides: the one interface between the engine and a kernel family.

Read this first when adding a contract (docs/contract.md §9, "Contracts as plug-ins"). A contract is a record,
an instance of a ``Contract`` subclass, that says everything kernel-specific. The engine (the fuzz loop, the
checking worker, ``--jobs``, the journal, case files, repro, the summary and report, the self-test, the
matrices) knows no contract by name: it finds records through the entry-point group ``kvfence.contracts``
(``name = "module:attr"``), kvfence's own five included (``pyproject.toml``), and asks them the questions
below. Another package adds a contract the same way, with no edit to kvfence.

A record answers two kinds of question.

**What the contract is** (data a reader checks against docs/contract.md): ``name``, ``section`` (where the
contract is stated), ``kinds`` (finding kinds beyond ``kvfence.engine.findings.Kind``), ``reference_kernel`` /
``reference_attr`` (kvfence's own Triton kernel), ``upstream`` (where SGLang's wheels define the kernel, for
``--kernel sglang==VERSION``), ``sizings`` (named row-width policies) and ``safe_sizing``, ``mutants`` (planted
bugs with the kinds they must be caught by), ``shipped_sites`` (where SGLang's backends size the table, read
from each wheel) and ``pins`` (which of the command line's config flags it takes).

**What the engine asks** about one of its *cases*. A case is the record's own frozen, hashable value, complete
for one launch (config, batch, sizing, kernel, mode), with two attributes the engine reads directly:
``contract`` (the record's name) and ``kernel`` (the kernel spec it runs). Everything else goes through the
record:

==========================  ================================================================================
draws(plan)                 a Hypothesis strategy of cases, or of lists of cases of one config, for a run
check_plan(plan)            refuse, in one line, a run the contract cannot make (a flag it does not take, ...)
shard_fields(plan),         the config cells ``--shard`` deals out; the example database key's domain part;
database_domain(plan, s),   what the run summary records of the contract's own choices
run_record(plan)
session(plan)               an in-process checker: ``check(case) -> [Finding]``, optionally ``check_many``,
                            and ``stats``
codec(plan) /               a case list on the checking worker's wire, and the worker's end of it
worker_side(options, dev)   (``kvfence.engine.worker``: a kernel that dies or hangs is its case's finding)
case_record(case) /         the case as JSON data and back (validated: ``BadInput``), for case files, the
case_from_record(data)      journal and the wire; a case file never makes kvfence import what it names
summary(case)               need, width, rows launched, and the config and batch as data, for summaries
describe(case, full)        one line naming the case's config (``full``: its batch too)
config_of(case)             what the case shares with the others of its config (a hashable key; distinct
                            configs and ``--keep-going`` signatures count these), ``config_record(config)``
                            its data and ``config_bytes(config)`` its memory
structure_of(case)          what changes where the kernel writes (the structural rate counts these)
read_variant_of(case)       what else changes which input elements are read, not where anything is written
                            (the draft's pool rows): a case new only in this is a read variant, counted
                            apart from the structural rate; None (the default) when nothing is
utilisation(case)           need / width, the quantity Hypothesis's target phase climbs
coverage_fields /           one row of the coverage plot per explored case: the first field names the
coverage_row(case, failed)  panel; ``num_seqs``, ``need``, ``width`` and ``failed`` are always there
boundaries(case)            the edge classes the case sits on (the summary counts them)
override(case, ...)         the case under another kernel, sizing, mode or layout (``repro`` tries a fix)
explain(case)               lines of arithmetic ``repro`` prints (need against width)
case_map                    ``module:attr`` of the function drawing a case file's buffer map in report.html
==========================  ================================================================================

The page-table builders (``kvfence.contracts.tables.TableContract``) answer the engine's questions from a
smaller description (tables, a plain-Python oracle of every element, a launcher); the draft kernel's record
(``kvfence.contracts.draft.record``) answers them with its CUDA-graph runner and device verifier. Both are records
of this one class.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from kvfence.engine.findings import ContractKind  # noqa: F401 - a contract's kinds are declared with it
from kvfence.errors import BadInput, require

ENTRY_POINT_GROUP = "kvfence.contracts"
#: Programs ``repro --verbose`` lists per finding (its expected owners, and each one's segment where the
#: contract's ``replay_detail`` shows them); 6 without ``--verbose``.
VERBOSE_PROGRAMS = 32
#: Fields every contract's coverage rows carry (the report's plot reads them by name).
COVERAGE_REQUIRED = ("num_seqs", "need", "width", "failed")


@dataclass(frozen=True)
class Table:
    """One buffer of a launch. ``rows is None``: a 1-D buffer of ``width`` elements.

    ``role`` is ``output`` (the kernel writes it: rows start as poison, guards hold canaries) or ``input``
    (the kernel only reads it: rows hold ``contents``, guards hold poison a read past a row returns).
    """

    name: str
    width: int
    rows: Optional[int] = None
    role: str = "output"
    contents: Optional[Sequence] = None  # inputs: a list of rows (or a flat list when rows is None)
    dtype: str = "int32"

    def __post_init__(self):
        require(self.role in ("output", "input"), f"table {self.name}: role must be output or input")
        require(self.width >= 0 and (self.rows is None or self.rows >= 0), f"table {self.name}: negative shape")
        require(self.role == "output" or self.contents is not None, f"input table {self.name} has no contents")


@dataclass(frozen=True)
class ContractMutant:
    """A planted bug: ``patch`` is a list of (reference text, mutated text) pairs applied to the contract's
    reference kernel file (each matching exactly once); ``detects`` the finding kinds that count."""

    name: str
    doc: str
    detects: Tuple[str, ...]
    patch: Tuple[Tuple[str, str], ...] = ()
    #: The named policy the mutant runs under (default: the safe one). Without a patch: a sizing mutant, the
    #: reference kernel under this buggy policy; with one: a kernel bug that shows only under this policy.
    sizing: Optional[str] = None


@dataclass(frozen=True)
class Upstream:
    """Where SGLang's wheels define the contract's kernel: the function name and candidate module paths."""

    function: str
    paths: Tuple[str, ...]


@dataclass(frozen=True)
class ShippedSite:
    """Where one SGLang backend sizes the table this contract's kernel writes, for one CUDA-graph mode and
    forward mode, as expression texts a reader finds in the release's wheel (``kvfence.release.contract_shipped``).

    ``width``: the row width in pages, as the backend spells it (found by its text in ``cls``'s methods, or in
    ``within`` only; ``cls``'s bases in the wheel are searched too). ``delta``: the tokens the launch adds to
    each committed length (``"0"`` for none), found inside ``evidence`` (an expression or statement of the
    class that shows the lengths getting it) when given. ``symbols``: names this site gives a quantity (stated here, a
    fact of the backend: e.g. tokens per request in target verify are the draft tokens). ``page_sizes``: the
    page sizes the backend runs with."""

    backend: str          # SGLang's --attention-backend name
    cls: str              # the backend class
    mode: str             # graph | eager
    forward_mode: str     # decode | target_verify | draft_extend
    width: str
    delta: str
    page_sizes: Tuple[int, ...]
    within: str = ""
    evidence: str = ""
    symbols: Tuple[Tuple[str, str], ...] = ()
    note: str = ""


class Contract(abc.ABC):
    """The record of one kernel contract (see the module docstring for what the engine asks of it)."""

    name: str = ""
    section: str = ""
    kinds: Tuple[str, ...] = ()
    reference_kernel: Path
    reference_attr: str = ""
    upstream: Optional[Upstream] = None
    sizings: Mapping[str, Callable] = {}
    #: The sizing a reference run must be clean under (and the command line's default for this contract).
    safe_sizing: str = "safe"
    mutants: Tuple[ContractMutant, ...] = ()
    shipped_sites: Tuple[ShippedSite, ...] = ()
    #: The command line's config flags (``RunPlan.pins`` keys) this contract takes; any other set flag is
    #: refused in one line rather than ignored.
    pins: Tuple[str, ...] = ()
    #: Columns of a coverage row (``coverage_row``); the first names the plot's panels.
    coverage_fields: Tuple[str, ...] = ()
    #: ``module:attr`` of ``f(summary_record, case_file_document) -> HTML`` drawing one case file's buffers in
    #: report.html (found by name, as an entry point is: the reports never import a contract).
    case_map: str = ""
    #: Planted kernel mutants the self-test builds from ``mutants`` (False: the contract lists them elsewhere,
    #: as the draft kernel's ``kvfence.kernels.draft.planted`` does).
    planted_from_patches: bool = True

    # -- drawing --------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def draws(self, plan):
        """A Hypothesis strategy for the run ``plan`` (``kvfence.engine.plan.RunPlan``): cases, or lists of cases
        of one config (one example checks them as one run of one compiled, captured config)."""

    def check_plan(self, plan) -> None:
        """``BadInput`` (one line) for a run this contract cannot make, before anything runs."""
        unknown = sorted(k for k, v in plan.pins.items() if v is not None and k not in self.pins)
        require(not unknown, f"--contract {self.name} takes no {', '.join('--' + k.replace('_', '-') for k in unknown)}")
        self.sizing(plan.sizing)

    def check_kernel(self, spec: str) -> None:
        """Import and check a plug-in kernel spec (``BadInput`` when it names no kernel of this contract's ABI);
        done first in a throwaway process (``kvfence.engine.probe``), so an import that ends its process
        cannot end kvfence's."""
        from kvfence.contracts.draft.targets import _load_attr

        _load_attr(spec, "kernel")

    def sizing(self, name: str) -> Callable:
        require(name in self.sizings, f"contract {self.name}: unknown sizing {name!r}: choose from "
                                      f"{', '.join(self.sizings)}")
        return self.sizings[name]

    def shard_fields(self, plan) -> Dict[str, tuple]:
        """The config fields a ``--shard`` deals out in cells, each with the values it ranges over on the plan's
        domain, simplest first (a pinned field: its one value); none: the contract cannot be sharded."""
        return {}

    def database_domain(self, plan, shard) -> dict:
        """Everything that changes what a drawn choice sequence means, for the example database's key."""
        return {"contract": self.name, "mode": plan.mode, "domain": plan.domain, "pins": dict(plan.pins),
                "shard": str(shard) if shard is not None else None}

    def run_record(self, plan) -> dict:
        """What the run summary says of this contract's own choices (besides kernel, sizing, mode, domain)."""
        return {}

    def sizing_applies(self, name: str) -> bool:
        """Whether the named sizing sizes this contract's rows (a release matrix cell pairs them)."""
        return name in self.sizings

    def release_kernel(self, version: str) -> None:
        """Make SGLang release ``version``'s kernel of this contract ready from its wheel, as data (extracted
        into the cache, never imported): ``kvfence.release.upstream.Refused`` (``NO_KERNEL``, ``ABI_UNSUPPORTED``)
        when the release has none or one of another signature; ``BadInput`` for anything else."""
        raise BadInput(f"contract {self.name} names no kernel in SGLang's wheels")

    def mutant(self, name: str) -> ContractMutant:
        known = {m.name: m for m in self.mutants}
        require(name in known, f"contract {self.name}: unknown mutant {name!r}: choose from {', '.join(known)}")
        return known[name]

    # -- checking -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def session(self, plan, **options):
        """A checker in this process for ``plan``'s kernel and device (``options``: the contract's own, as its
        worker side reads them)."""

    @abc.abstractmethod
    def codec(self, plan):
        """The wire form of this contract's cases (``encode(cases) -> dict``, ``group(case)``,
        ``elements(case)``, ``kinds``) for a checking worker of ``plan``."""

    def worker_options(self, plan) -> dict:
        """What this contract's worker side needs beyond the device and kernel (JSON data)."""
        return {}

    @abc.abstractmethod
    def worker_side(self, options: dict, device: str):
        """The checking worker's end: ``(session, decode(message) -> cases, group(case) -> run key)``."""

    # -- cases as data --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def case_record(self, case) -> dict:
        """The case as JSON data, complete enough to replay it."""

    @abc.abstractmethod
    def case_from_record(self, data):
        """The case ``case_record`` wrote; ``BadInput`` (one line) when ``data`` is malformed."""

    def case_sizing(self, case) -> str:
        """The sizing spec the case names (a plug-in spec is data until the user names it again)."""
        return case.sizing

    def check_spec(self, spec: str, what: str) -> None:
        """``BadInput`` unless ``spec`` is a ``what`` (``kernel`` or ``sizing``) this contract knows by name or
        looks like a plug-in spec: syntax only, a case file's plug-in is never imported on load."""
        from kvfence.contracts.draft.targets import check_spec

        check_spec(spec, what)

    def names_plugin(self, spec: str) -> bool:
        """Whether a kernel or sizing spec names user code (``module:attr`` / ``file.py:attr``), which a case file
        never makes kvfence import: ``repro`` asks for it again."""
        from kvfence.contracts.draft.targets import is_plugin

        return is_plugin(spec)

    @abc.abstractmethod
    def summary(self, case) -> dict:
        """``need``, ``width``, ``num_seqs`` (rows launched) and ``config`` (data), plus anything the contract's
        report shows, for summaries and case files."""

    @abc.abstractmethod
    def describe(self, case, full: bool = False) -> str:
        ...

    # -- bookkeeping of a run ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def config_of(self, case):
        ...

    @abc.abstractmethod
    def config_record(self, config) -> dict:
        ...

    def config_bytes(self, config) -> int:
        return 0

    @abc.abstractmethod
    def structure_of(self, case):
        ...

    def read_variant_of(self, case):
        return None

    def utilisation(self, case) -> float:
        s = self.summary(case)
        return s["need"] / s["width"] if s["width"] else float(s["need"] > 0)

    @abc.abstractmethod
    def coverage_row(self, case, failed: bool) -> tuple:
        ...

    def boundaries(self, case) -> Iterable[str]:
        return ()

    # -- repro ----------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def override(self, case, *, kernel: Optional[str] = None, sizing: Optional[str] = None,
                 mode: Optional[str] = None, layout: Optional[str] = None):
        """``case`` under another kernel, sizing, mode or layout; ``BadInput`` for one it cannot take."""

    #: What a program's grid coordinates are called in repro's lines (``expected owners (s,b,k)``).
    program_axes: str = "program"
    #: ``repro`` flags that lay a case out as production does for compute-sanitizer (``kvfence sweep``): an
    #: overflow must leave the allocation for memcheck to see it (the draft kernel: contiguous rows, no guard).
    sanitizer_flags: Tuple[str, ...] = ()

    def case_mode(self, case) -> str:
        """``graph`` or ``eager``: how the case is launched (the sweep picks the allocator by it)."""
        return getattr(case, "mode", "eager")

    def kernel_name(self, spec: str) -> Optional[str]:
        """The name of the CUDA kernel ``spec`` launches, for compute-sanitizer's kernel filter; None (check
        every kernel) for a plug-in, whose kernel names kvfence does not know."""
        if spec == "reference" or spec.startswith("mutant:"):
            return self.reference_attr or None
        if spec.startswith("sglang==") and self.upstream is not None:
            return self.upstream.function
        return None

    def repro_header(self, case) -> List[str]:
        """The lines ``repro`` opens with, after the file's name: the case, described in full."""
        return [f"case    {self.describe(case, full=True)}"]

    def setting_changes(self, original, case) -> List[Tuple[str, object, object]]:
        """``(name, new, old)`` of every setting besides kernel and sizing that ``override`` changed."""
        return []

    def replay_detail(self, case, device: str, *, absorb: bool = True):
        """``None``, or ``(findings, show)`` from a re-run in this process that can show more than the
        findings record: ``show(finding, verbose)`` gives ``repro.finding_lines``'s ``elements`` and ``segments``."""
        return None

    def explain(self, case) -> List[str]:
        s = self.summary(case)
        verdict = "too small" if s["need"] > s["width"] else "fits"
        return [f"need {s['need']}, width {s['width']} under {self.case_sizing(case)}: {verdict}"]

    # -- shipped sizing ---------------------------------------------------------------------------------------
    def wall_case(self, ctx: int, page_size: int, draft_tokens: int, length: int):
        """One request of committed length ``length`` launched with ``draft_tokens`` added, as the shipped
        sites pass it (contracts with ``shipped_sites`` define it)."""
        raise BadInput(f"contract {self.name} has no shipped sizing (no wall_case)")


# -- the registry ------------------------------------------------------------------------------------------
_REGISTRY: Dict[str, str] = {}
_LOADED: Dict[str, Contract] = {}


def _entry_points() -> Dict[str, str]:
    if not _REGISTRY:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            _REGISTRY.setdefault(ep.name, ep.value)
    return _REGISTRY


def entry(name: str) -> str:
    """The ``module:attr`` a registered contract is loaded from (a checking worker loads it the same way)."""
    get(name)
    return _entry_points()[name]


def register(name: str, spec: str) -> None:
    """Register ``name`` as loaded from ``spec`` (``module:attr``) in this process, as an entry point would;
    a name registered already keeps its entry."""
    _entry_points().setdefault(name, spec)


def names() -> List[str]:
    """Every registered contract name, sorted."""
    return sorted(_entry_points())


def get(name: str) -> Contract:
    """The contract registered as ``name``; ``BadInput`` naming the known ones otherwise."""
    return _get(name, probe=True)


#: Seconds a contract plug-in's import may take in its throwaway process.
IMPORT_PROBE_TIMEOUT_S = 120.0

def _probe_import(name: str, entry: str) -> None:
    """Import a contract plug-in's module in a throwaway process before this one imports it (as
    ``kvfence.engine.probe`` does for kernel and sizing plug-ins; ``kvfence.engine.import_probe``): an import
    that exits (``os._exit(0)``: a silent pass in a user's CI), aborts, raises ``KeyboardInterrupt`` or
    ``SystemExit``, hangs, or leaves a thread or exit handler that would, is one line naming the contract,
    never the end of this process."""
    import subprocess
    import sys
    import tempfile

    module_name = entry.partition(":")[0]
    with tempfile.TemporaryDirectory(prefix="kvfence-contract-probe-") as tmp:
        report = Path(tmp) / "report"
        try:
            proc = subprocess.run([sys.executable, "-m", "kvfence.engine.import_probe", module_name, str(report),
                                   *[p for p in sys.path if p]],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=IMPORT_PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BadInput(f"contract {name!r}: importing {module_name} did not finish within "
                           f"{IMPORT_PROBE_TIMEOUT_S:g}s") from None
        try:
            answer = report.read_text()
        except OSError:
            answer = None
    if answer is None:
        how = f"died of signal {-proc.returncode}" if proc.returncode < 0 else f"ended its process (exit status {proc.returncode})"
        raise BadInput(f"contract {name!r}: importing {module_name} {how} before kvfence could check it "
                       "(a contract's import, or a thread or exit handler it leaves, must not exit or kill its "
                       "process)")
    require(answer == "ok", f"contract {name!r}: cannot load {entry}: {answer[len('error '):]}")


def _get(name: str, *, probe: bool) -> Contract:
    """``get``; ``probe=False`` in a process that is itself a throwaway one (a checking worker, a probe)."""
    if name in _LOADED:
        return _LOADED[name]
    known = _entry_points()
    require(isinstance(name, str) and name in known,
            f"unknown contract {name!r}: choose from {', '.join(sorted(known)) or '(none registered)'}")
    module_name, _, attr = known[name].partition(":")
    import importlib
    import sys

    if probe and module_name.split(".")[0] != "kvfence" and module_name not in sys.modules:
        _probe_import(name, known[name])  # code from outside kvfence: its import cannot end this process
    try:
        record = getattr(importlib.import_module(module_name), attr)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code's import: bad input, one line
        raise BadInput(f"contract {name!r}: cannot load {known[name]}: {type(exc).__name__}: {exc}") from None
    require(isinstance(record, Contract), f"contract {name!r}: {known[name]} is not a kvfence Contract")
    require(record.name == name, f"contract {name!r}: {known[name]} calls itself {record.name!r}")
    missing = sorted(set(COVERAGE_REQUIRED) - set(record.coverage_fields))
    require(not missing, f"contract {name!r}: its coverage_fields lack {', '.join(missing)}")
    _LOADED[name] = record
    return record


def of(case) -> Contract:
    """The record a case belongs to (its ``contract`` attribute names it)."""
    return get(case.contract)


def loading(record: Contract) -> dict:
    """What another process (a checking worker, the plug-in probe) needs to load ``record`` as this process did:
    its registry entry and the import path it was found on (a contract registered at run time, as a test does,
    is found the same way); ``load_in_worker`` is the other end."""
    import sys

    return {"contract": record.name, "entry": entry(record.name), "sys_path": [p for p in sys.path if p]}


def load_in_worker(options: dict) -> Contract:
    """The other end of ``loading``: the record, registered and loaded in this process."""
    import sys

    for path in reversed(options.get("sys_path", [])):
        if path not in sys.path:
            sys.path.insert(0, path)
    register(options["contract"], options["entry"])
    return _get(options["contract"], probe=False)  # this process is the throwaway one
