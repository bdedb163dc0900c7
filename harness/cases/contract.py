"""What a kvfence contract provides: the one interface between the generic engine and a kernel family.

Read this first when adding a contract. A contract is a record (a ``Contract`` subclass instance) that says
everything kernel-specific; the generic engine (``kvfence.workflow.contract_run``: fuzz, shrink, case files,
repro, the self-test of its mutants) and the generic buffers and verdict (``kvfence.running.tables``,
``kvfence.verifying.tables``) know no contract by name. A contract is found through the entry-point group
``kvfence.contracts`` (``name = "module:attr"``), so another package adds one without editing kvfence, and
kvfence's own contracts are registered the same way in ``pyproject.toml``.

What a record says (docs/contract.md §9 for the page-table builders, the first contracts on this interface):

* ``name``, ``section`` (where docs/contract.md states it), ``kinds`` (finding kinds beyond the common ones
  of ``kvfence.cases.findings.Kind``);
* its kernel: ``reference_kernel`` (kvfence's own Triton kernel, a file), ``upstream`` (the function name and
  the module paths inside an SGLang wheel where releases define it, for ``--kernel sglang==VERSION``), and
  ``launch(kernel, buffers, case, width)``, the ABI: how a jit function is launched on the guarded buffers;
* its draws: ``cases(domain)``, a Hypothesis strategy of cases (config and batch in one value that shrinks
  toward the simplest launch), ``case_to_dict``/``case_from_dict`` for case files (data, validated);
* its buffers: ``tables(case, width)``, each ``Table`` an output (guarded rows, poison inside, canaries
  between) or an input (its contents, with poisoned guards after each row so an over-read yields a
  poison-derived value);
* its oracle: ``expected(case, width)``, plain Python: every element each output must hold after the
  launch, by (table, row, column); a column at or past ``width`` is a write the contract asks for that the
  row cannot hold (it lands in the guard after the row), ``need(case)`` the row width the launch needs, and
  ``findings_before_launch(case, width)`` the contract's own arithmetic findings (e.g. a truncated table);
* its sizing: ``sizings``, named policies ``case -> width``;
* its planted mutants (``mutants``: name, docstring, ``PATCH`` on ``reference_kernel``, ``DETECTS``);
* its structural key: ``structural_key(case, width)``, what changes where the kernel writes; for the checking
  worker, ``compile_key`` (what a launch's compiled specialization depends on: a new one may compile first)
  and ``elements`` (how much work a launch is: its time limit scales with it);
* its shipped sizing (optional): ``shipped_sites``, where SGLang's backends size the table and which lengths
  they pass (``ShippedSite``, read from each wheel by ``kvfence.cases.contract_shipped``), and
  ``wall_case(ctx, page_size, draft_tokens, length)``, the one-request launch at a committed length, on
  which ``upstream matrix --shipped`` runs the release's kernel.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from kvfence.cases.findings import ContractKind  # noqa: F401 - a contract's kinds are declared with it
from kvfence.errors import BadInput, require

ENTRY_POINT_GROUP = "kvfence.contracts"


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
    forward mode, as expression texts a reader finds in the release's wheel (``kvfence.cases.contract_shipped``).

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
    """The record of one kernel contract (see the module docstring)."""

    name: str = ""
    section: str = ""
    kinds: Tuple[str, ...] = ()
    reference_kernel: Path
    reference_attr: str = ""
    upstream: Optional[Upstream] = None
    sizings: Mapping[str, Callable] = {}
    #: The sizing a reference run must be clean under, and the one that models the shipped graph tables.
    safe_sizing: str = "safe"
    mutants: Tuple[ContractMutant, ...] = ()
    shipped_sites: Tuple[ShippedSite, ...] = ()

    @abc.abstractmethod
    def cases(self, domain: str):
        """A Hypothesis strategy of this contract's cases on ``domain`` (``cpu`` or ``gpu``)."""

    @abc.abstractmethod
    def case_to_dict(self, case) -> dict:
        ...

    @abc.abstractmethod
    def case_from_dict(self, data: dict):
        """The case a case file holds; ``BadInput`` (one line) when it is malformed."""

    @abc.abstractmethod
    def tables(self, case, width: int) -> List[Table]:
        ...

    @abc.abstractmethod
    def expected(self, case, width: int) -> Dict[str, Dict[Tuple[int, int], int]]:
        """Plain-Python oracle: ``{output table: {(row, column): value}}``, every element the launch writes."""

    @abc.abstractmethod
    def need(self, case) -> int:
        """The row width this launch needs."""

    @abc.abstractmethod
    def launch(self, kernel, buffers: Dict[str, object], case, width: int) -> None:
        """Launch ``kernel`` (a jit function of this contract's ABI) on ``buffers`` (tensor views by table)."""

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
        """Roughly how much work one check of ``case`` is, in elements (its time limit scales with it):
        by default every element of its tables."""
        return sum((t.rows or 1) * t.width for t in self.tables(case, width))

    def wall_case(self, ctx: int, page_size: int, draft_tokens: int, length: int):
        """One request of committed length ``length`` launched with ``draft_tokens`` added, as the shipped
        sites pass it (contracts with ``shipped_sites`` define it)."""
        raise BadInput(f"contract {self.name} has no shipped sizing (no wall_case)")

    def sizing(self, name: str) -> Callable:
        require(name in self.sizings, f"contract {self.name}: unknown sizing {name!r}: choose from "
                                      f"{', '.join(self.sizings)}")
        return self.sizings[name]

    def mutant(self, name: str) -> ContractMutant:
        known = {m.name: m for m in self.mutants}
        require(name in known, f"contract {self.name}: unknown mutant {name!r}: choose from {', '.join(known)}")
        return known[name]


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
    if name in _LOADED:
        return _LOADED[name]
    known = _entry_points()
    require(name in known, f"unknown contract {name!r}: choose from {', '.join(sorted(known)) or '(none registered)'}")
    module_name, _, attr = known[name].partition(":")
    import importlib

    try:
        record = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BadInput(f"contract {name!r}: cannot load {known[name]}: {type(exc).__name__}: {exc}") from None
    require(isinstance(record, Contract), f"contract {name!r}: {known[name]} is not a kvfence Contract")
    require(record.name == name, f"contract {name!r}: {known[name]} calls itself {record.name!r}")
    _LOADED[name] = record
    return record
