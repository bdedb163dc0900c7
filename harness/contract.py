"""The contract interface: what a kernel family tells kvfence, in one typed class (docs/contract-api.md).

A contract is a record, an instance of a ``Contract`` subclass, registered under the entry-point group
``kvfence.contracts`` (``name = "module:attr"``). kvfence's engine (the fuzz loop, the checking worker,
``--jobs``, the journal, case files, ``repro``, summaries and reports, the self-test, the release matrices)
knows no contract by name: it loads the record and asks it the questions below, nothing else.

A *case* is the contract's own frozen value: one launch's inputs (its config and batch), nothing about how it
runs. The engine binds a case into a ``Launch``, the value it checks, stores and shows: the case, the row
width its sizing gives it, the sizing's name, the kernel spec, the mode (``graph``: captured in a CUDA graph,
``eager``) and the layout (``redzone``: a guard after every row; ``production``: rows contiguous, as upstream
lays them out). From a launch, the need and the JSON the engine derives every description, summary, override,
repro line, database key and shard.

==================================  ====================================================================
data                                what the contract is
==================================  ====================================================================
``name``                            its registered name
``doc``                             where the contract is stated (``docs/contract.md §9``)
``reference``                       ``module:attr`` of kvfence's own kernel of this ABI
``sizings``                         named row-width policies ``(case, mode) -> int``, ``safe`` among them
``mutants``                         planted bugs, each with the finding kinds that must catch it
``kinds``                           the contract's own finding kinds, each observed or arithmetic
``options``                         the flags it declares (``Option``: ``--stride``, the draft's ``--topk``)
==================================  ====================================================================

==================================  ====================================================================
required                            what the engine asks
==================================  ====================================================================
``cases(domain)``                   a Hypothesis strategy of cases (or of lists of cases of one config)
``to_json(case)``/``from_json(d)``  the case as JSON data and back (``BadInput`` on anything malformed)
``tables(launch)``                  the launch's buffers: outputs and inputs (``Table``)
``expected(launch)``                every output element the launch defines: ``{table: {(row, col): int}}``
``need(launch)``                    the row width the launch needs
``launch(kernel, buffers, launch)`` one launch of ``kernel`` on the tables' views
==================================  ====================================================================

==================================  ====================================================================
optional (engine default)           what for
==================================  ====================================================================
``keys(launch)``                    config / structure / compile / read keys and edge classes (``Keys``)
``owner(launch, table, row, col)``  the program the contract says writes an element (None)
``findings_before_launch(launch)``  findings the case's arithmetic decides before any launch (none)
``report(record, findings)``        HTML drawing one case file's buffers (the engine's table map)
``checker(plan)``                   a checker of the contract's own (``Checker``; None: the engine's)
``checker_bytes(launch)``           device bytes that checker holds beside the tables (0)
==================================  ====================================================================

``checker`` is the escape hatch for a contract that checks its own way: the draft kernel keeps its CUDA-graph
runner and device verifier behind it, and its ``tables``/``expected``/``launch`` are the plain path that
checker is tested against.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generic,
    Hashable,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
)

from kvfence.errors import BadInput, require

if TYPE_CHECKING:  # the annotations only: the interface's module imports no Hypothesis at run time
    from hypothesis.strategies import SearchStrategy

#: A contract's case type (the contract's own frozen value).
C = TypeVar("C")

#: Values of ``Table.role``.
ROLES = ("output", "input")
#: Values of ``Launch.mode`` and ``Launch.layout``.
MODES = ("graph", "eager")
LAYOUTS = ("redzone", "production")
#: Values of ``Table.guards``.
GUARDS = ("rows", "ends")
#: Values of ``Mutant.domain`` and ``Domain.name``.
DOMAINS = ("cpu", "gpu")


@dataclass(frozen=True)
class Table:
    """One buffer of a launch: ``rows x width`` int elements, or ``width`` of them when ``rows`` is None.

    ``role`` is ``output`` (the kernel writes it: kvfence fills its rows with poison and its guards with
    canaries) or ``input`` (the kernel only reads it: its rows hold ``contents``, its guards poison that a
    read past a row returns); ``guards`` says where the guards go. ``contents``: the input's rows (a
    ``rows x width`` nested sequence or array, or a flat one of ``width`` for a 1-D table), or a zero-argument
    callable returning them: kvfence calls it only once the launch's memory is known to fit."""

    name: str
    width: int
    rows: Optional[int] = None
    role: str = "output"
    contents: Union[None, Sequence[Any], Callable[[], Sequence[Any]]] = None
    dtype: str = "int32"
    #: ``rows``: a guard after every row (the kernel takes the table's row stride, ``view.stride(0)``);
    #: ``ends``: the rows contiguous, guards before the first and after the last only (for an ABI whose kernel
    #: computes a row's start from the row length, as the classic draft ABI does with ``req_to_token``).
    guards: str = "rows"
    #: An input whose rows belong to programs: ``(axis, rows)``, the program whose index on launch-grid axis
    #: ``axis`` is ``i`` may read row ``rows[i]`` only (a request's pool row, as the draft's ``req_to_token``), so
    #: the CPU address audit reports its read of any other row as ``OOB_READ`` (a program past ``rows`` owns
    #: none). None: any program may read any row.
    row_owners: Optional[Tuple[int, Tuple[int, ...]]] = None


@dataclass(frozen=True)
class FindingKind:
    """A finding kind a contract adds to kvfence's own (``kvfence.engine.findings.Kind``).

    ``observed``: the kind is seen in what the kernel did (its buffers after the launch). Otherwise it is
    *arithmetic*: decided from the case before any launch (``findings_before_launch``), and kvfence states it as
    arithmetic ("the width formula says ..."), never as the kernel's damage."""

    name: str
    observed: bool
    doc: str = ""


@dataclass(frozen=True)
class Mutant:
    """A planted bug and the finding kinds that count as catching it (``detects``: any one of them).

    The bug is a ``patch``, ``(reference text, mutated text)`` pairs applied to the reference kernel's file
    (each must match exactly once), a ``kernel`` spec of its own, or, with neither, the reference kernel run under
    a buggy ``sizing`` (a named policy or a plug-in spec). A kernel bug that only shows under one policy names it
    too. ``domain``: the draw space whose default draws must reach the bug (``gpu``: production sizes only)."""

    name: str
    doc: str
    detects: Tuple[str, ...]
    patch: Tuple[Tuple[str, str], ...] = ()
    kernel: Optional[str] = None
    sizing: Optional[str] = None
    domain: str = "cpu"


#: The value types an ``Option`` may declare.
OPTION_TYPES: Tuple[type, ...] = (int, float, str)
_TYPE_WORDS = {int: "an integer", float: "a number", str: "a text"}
_INTEGER = re.compile(r"[+-]?[0-9]{1,20}")


@dataclass(frozen=True)
class Option:
    """A command-line flag a contract declares: ``--NAME`` (underscores as dashes) on ``kvfence fuzz`` and
    ``campaign`` with ``--contract`` naming the contract, and ``NAME=VALUE`` for ``check-contract --pin``.

    A value given away from ``default`` (None: drawn) pins ``Domain.pins[pin]`` for the contract's ``cases``
    (``pin``: ``name`` unless it names another). ``type`` is ``int``, ``float`` or ``str``; ``choices`` (values of
    that type) or ``bounds`` (inclusive ``(low, high)``, either None for open; numbers only) are checked before
    any work, one line naming the flag. ``shard``: the values a ``--shard`` deals out on a domain (a callable of
    the domain's name), or None where it deals none. ``canary``: the value ``kvfence sweep``'s canary phase pins
    (None: drawn as fuzz draws it). A declaration that breaks these rules raises ``BadInput`` when it is made."""

    name: str
    type: type = int
    default: object = None
    help: str = ""
    pin: str = ""
    choices: Optional[Tuple[object, ...]] = None
    bounds: Optional[Tuple[Optional[float], Optional[float]]] = None
    shard: Optional[Callable[[str], Sequence[object]]] = None
    canary: object = None

    def __post_init__(self) -> None:
        where = f"option {self.name!r}"
        require(isinstance(self.name, str) and self.name.isidentifier() and not self.name.startswith("_"),
                f"{where}: the name must be a Python identifier (--{self.name} on the command line)")
        require(self.type in OPTION_TYPES, f"{where}: type must be int, float or str, got {self.type!r}")
        require(isinstance(self.help, str), f"{where}: help must be a text")
        require(isinstance(self.pin, str) and (not self.pin or self.pin.isidentifier()),
                f"{where}: pin must name a draw field (an identifier), got {self.pin!r}")
        require(self.choices is None or (isinstance(self.choices, tuple) and len(self.choices) > 0
                                         and all(self._typed(c) for c in self.choices)),
                f"{where}: choices must be a non-empty tuple of {self.type.__name__} values")
        require(self.bounds is None or self._bounds_ok(),
                f"{where}: bounds must be (low, high) numbers (either None) with low <= high, for an int or float "
                f"option without choices")
        require(self.shard is None or callable(self.shard), f"{where}: shard must be a callable of the domain's name")
        for what in ("default", "canary"):
            value = getattr(self, what)
            problem = None if value is None else self.problem(value)
            require(problem is None, f"{where}: its {what} {value!r} is refused by its own rules ({problem})")

    @property
    def flag(self) -> str:
        """The command-line flag: ``--NAME``, underscores as dashes."""
        return "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """The draw field the option pins (``Domain.pins``)."""
        return self.pin or self.name

    def _typed(self, value: object) -> bool:
        if self.type is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return isinstance(value, self.type) and not isinstance(value, bool)

    def _bounds_ok(self) -> bool:
        b = self.bounds
        if not (isinstance(b, tuple) and len(b) == 2 and self.type in (int, float) and self.choices is None):
            return False
        if not all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in b):
            return False
        return b[0] is None or b[1] is None or b[0] <= b[1]

    def expected(self) -> str:
        """What a value must be, in words (``a positive integer``, ``one of on, off``)."""
        if self.choices is not None:
            return "one of " + ", ".join(str(c) for c in self.choices)
        low, high = self.bounds or (None, None)
        word = _TYPE_WORDS[self.type]
        if self.type is int and high is None and low in (0, 1):
            return "a positive integer" if low == 1 else "a non-negative integer"
        if low is not None and high is not None:
            return f"{word} in [{low:g}, {high:g}]"
        if low is not None or high is not None:
            return f"{word} {'>=' if low is not None else '<='} {low if low is not None else high:g}"
        return word

    def problem(self, value: object) -> Optional[str]:
        """Why ``value`` is no value of this option, or None."""
        low, high = self.bounds or (None, None)
        ok = (self._typed(value) and (self.choices is None or value in self.choices)
              and (low is None or value >= low) and (high is None or value <= high))  # type: ignore[operator]
        return None if ok else f"expected {self.expected()}, got {value!r}"

    def parse(self, text: str) -> object:
        """The option's value from its command-line text; ``BadInput`` (without the flag) when it is none."""
        # An integer is ASCII digits with one optional sign, at most 20 of them ("²", "1_000" and a number of
        # thousands of digits are none, though int() takes the first two and spends seconds on the last).
        if self.type is int and not _INTEGER.fullmatch(text):
            digits = text.lstrip("+-")
            if digits.isascii() and digits.isdigit() and len(digits) > 20:
                raise BadInput(f"expected {self.expected()}, got an integer of more than 20 digits ({text[:24]!r}...)")
            raise BadInput(f"expected {self.expected()}, got {text[:40]!r}")
        try:
            value = self.type(text)
        except ValueError:
            raise BadInput(f"expected {self.expected()}, got {text!r}") from None
        problem = self.problem(value)
        if problem is not None:
            raise BadInput(problem)
        return value

    def check(self, value: object) -> object:
        """``value`` when it is one of the option's; ``BadInput`` naming the flag otherwise (a plan's pin)."""
        problem = self.problem(value)
        require(problem is None, f"{self.flag}: {problem}")
        return value


@dataclass(frozen=True)
class Keys:
    """What the engine counts a case by (each a hashable value, the same in every process).

    ``config``: what the case shares with the others of its config, as ``(name, value)`` pairs (distinct
    configs, ``--keep-going``'s signatures); its first pair names the coverage plot's panels. ``structure``: what
    changes where the kernel writes (the structural rate). ``compile``: what the kernel's compiled
    specialization depends on (None: the structure). ``reads``: what else changes which input elements are read
    (counted apart; None: nothing). ``edges``: the edge classes the case sits on (the summary counts them).
    ``requests``: how many requests the launch has, the coverage plot's x axis (None: rows of its first
    output table)."""

    config: Tuple[Tuple[str, Hashable], ...]
    structure: Hashable
    compile: Optional[Hashable] = None
    reads: Optional[Hashable] = None
    edges: Tuple[str, ...] = ()
    requests: Optional[int] = None


@dataclass(frozen=True)
class Domain:
    """What a run lets a contract draw: the space (``cpu``: interpreter-sized, ``gpu``: production-sized), the
    fields pinned on the command line (``pins``: the keys of the contract's declared ``options``) and the run's
    choices a draw may depend on: the kernel spec, sizing, mode and layout, the device memory one config may take
    (``max_bytes``), and cases of one config per example (``batches``: a contract may draw lists of them; ``bulk``
    more of them from a fast generator after ``bulk_after`` seconds). A ``--shard`` pins its config cell's options."""

    name: str = "cpu"
    pins: Mapping[str, object] = field(default_factory=dict)
    kernel: str = "reference"
    sizing: str = "safe"
    mode: str = "graph"
    layout: str = "redzone"
    max_bytes: Optional[int] = None
    batches: int = 1
    bulk: int = 0
    bulk_after: float = 0.0

    def pin(self, name: str, default: Any = None) -> Any:
        value = self.pins.get(name)
        return default if value is None else value


@dataclass(frozen=True)
class Launch(Generic[C]):
    """The engine's value: a contract's case bound to the row width its sizing gives it, with the kernel, the
    mode and the layout it runs in. Contracts receive launches in ``Checker.check``."""

    contract: str
    case: C
    width: int
    sizing: str
    kernel: str = "reference"
    mode: str = "eager"
    layout: str = "redzone"


class Checker(Protocol):
    """What ``Contract.checker(plan)`` returns: a checker of one kernel on one device, in this process (the
    engine runs it inside its checking worker). ``check_many`` is optional: a list of launches of one config
    in one device round trip, one findings list per launch."""

    @property
    def stats(self) -> Mapping[str, float]:
        """Counters of the checker's work (launches, compiles, ...), read by the run's summary."""
        ...

    def check(self, launch: Launch[Any]) -> List[Any]: ...


#: ``(case, mode) -> width``: the row width a policy gives one launch.
Sizing = Callable[[C, str], int]


class Contract(Generic[C]):
    """The record of one kernel contract (the module docstring lists what each member is for)."""

    name: str = ""
    doc: str = ""
    reference: Union[str, Mapping[str, str]] = ""
    sizings: Mapping[str, Sizing[C]] = {}
    mutants: Tuple[Mutant, ...] = ()
    kinds: Tuple[FindingKind, ...] = ()
    #: The command-line flags this contract declares (``Option``): ``kvfence fuzz --contract NAME --help`` lists
    #: them, and a value given reaches ``cases`` as ``domain.pin(option.key)``.
    options: Tuple[Option, ...] = ()
    #: The mutation self-test's examples per planted bug and seed on each domain (``kvfence mutants`` without
    #: ``--max-examples``): enough for the contract's default draws to reach its bugs at what one of its examples
    #: costs. The default suits an example of one launch: 60 on the CPU domain (the CPU self-tests' worst
    #: detection took 50), 16 on the GPU domain, whose production-sized examples cost 0.6-1.9 s each on an H100
    #: (compile and capture per config; ``h100_contract_mutants_req-to-token.json``), where 8 caught the GPU-domain
    #: bug within 3. A contract whose example is a run of many launches declares its own.
    selftest_examples: Mapping[str, int] = {"cpu": 60, "gpu": 16}

    # -- required -----------------------------------------------------------------------------------------
    def cases(self, domain: Domain) -> Union[SearchStrategy[C], SearchStrategy[List[C]]]:
        """A Hypothesis strategy of this contract's cases on ``domain``, or of lists of cases of one config (one
        example checks them as one run of one compiled config). Simplest first: Hypothesis shrinks toward it."""
        raise NotImplementedError(f"contract {self.name}: cases(domain)")

    def to_json(self, case: C) -> Dict[str, Any]:
        """The case as JSON data (a dict of JSON values), complete enough to replay it."""
        raise NotImplementedError(f"contract {self.name}: to_json(case)")

    def from_json(self, data: Any) -> C:
        """The case ``to_json`` wrote; ``kvfence.errors.BadInput`` (one line) when ``data`` is malformed."""
        raise NotImplementedError(f"contract {self.name}: from_json(data)")

    def tables(self, launch: Launch[C]) -> List[Table]:
        """The launch's buffers, outputs and inputs (row widths from ``launch.width``)."""
        raise NotImplementedError(f"contract {self.name}: tables(launch)")

    def expected(self, launch: Launch[C]) -> Mapping[str, Mapping[Tuple[int, int], object]]:
        """The plain-Python oracle: ``{output table: {(row, column): value}}`` for every element the launch
        writes (row 0 for a 1-D table); a column at or past ``launch.width`` is one the contract asks for that
        the row cannot hold. A value is an int, or a frozenset of the ints any of which is right (two programs
        write the element, and which one writes last is up to the device). Every other element must keep what
        it held."""
        raise NotImplementedError(f"contract {self.name}: expected(launch)")

    def need(self, launch: Launch[C]) -> int:
        """The row width the launch needs (``need > width`` is a ``SIZING_VIOLATION``)."""
        raise NotImplementedError(f"contract {self.name}: need(launch)")

    def launch(self, kernel: Any, buffers: Mapping[str, Any], launch: Launch[C]) -> None:
        """Launch ``kernel`` (a jit function of this contract's ABI) on ``buffers`` (each table's view: its rows,
        ``rows x width`` with a row stride of its own, or ``width`` elements)."""
        raise NotImplementedError(f"contract {self.name}: launch(kernel, buffers, launch)")

    # -- optional -----------------------------------------------------------------------------------------
    def keys(self, launch: Launch[C]) -> Keys:
        """What the engine counts ``launch`` by. By default: the config is the case's scalar JSON fields but
        ``seed``, the structure its whole JSON."""
        data = self.to_json(launch.case)
        config = tuple((k, v) for k, v in sorted(data.items())
                       if k != "seed" and isinstance(v, (bool, int, float, str, type(None))))
        return Keys(config=config, structure=repr(sorted(data.items())))

    def owner(self, launch: Launch[C], table: str, row: int, column: int) -> Optional[Tuple[int, ...]]:
        """The grid coordinates of the program the contract says writes ``(table, row, column)``, or None. A
        ``typing.NamedTuple`` names the coordinates in the contract's own terms: findings show ``request 2`` (or
        ``(request 2, block 5)``) instead of ``(2,5)``, and the address audit's program ids take that shape."""
        return None

    def findings_before_launch(self, launch: Launch[C]) -> List[Any]:
        """Findings (``kvfence.engine.findings.Finding``) of the contract's *arithmetic* kinds that the case and
        width decide before any launch."""
        return []

    def report(self, record: Dict[str, Any], findings: List[Dict[str, Any]]) -> str:
        """HTML drawing one case file's buffers in report.html (``record``: the summary's record of the case file,
        ``findings``: the run's findings as data); empty: the engine's table map."""
        return ""

    def checker(self, plan: Any) -> Optional[Checker]:
        """A checker of this contract's own for ``plan`` (``kvfence.engine.plan.RunPlan``), or None for the
        engine's (tables, the oracle, the launch, guarded buffers and the element-by-element verdict)."""
        return None

    def checker_bytes(self, launch: Launch[C]) -> int:
        """Device bytes this contract's own ``checker`` holds for ``launch`` beside its tables (its own buffers,
        copies and temporaries), known before anything is built. The engine adds them to the tables' bytes
        (``kvfence.engine.budget.launch_bytes``), the one number a launch and a draw are held to under
        ``--max-gpu-mem``. 0: the engine's checker allocates the tables only."""
        return 0


#: The interface's members, as the contract author's reference lists them (tests hold both to this).
MEMBERS = ("name", "doc", "reference", "sizings", "mutants", "kinds", "options", "selftest_examples",
           "cases", "to_json", "from_json", "tables", "expected", "need", "launch",
           "keys", "owner", "findings_before_launch", "report", "checker", "checker_bytes")
REQUIRED = ("cases", "to_json", "from_json", "tables", "expected", "need", "launch")


def declared(record: Contract[Any], kind: str) -> Optional[FindingKind]:
    """The record's declaration of finding kind ``kind``, or None."""
    return next((k for k in record.kinds if k.name == kind), None)


def option_named(record: "Contract[Any]", key: str) -> Optional[Option]:
    """The record's option that pins ``key``, or None."""
    return next((o for o in record.options if o.key == key), None)


def require_int(value: object, what: str) -> int:
    require(type(value) is int, f"{what} must be an integer, got {value!r}")
    return cast(int, value)
