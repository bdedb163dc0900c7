"""Is a contract record well formed? ``static`` (on every load) and ``on_cases`` (``kvfence check-contract``).

A record mistake is the author's, not the kernel's: each is one line naming the record and the problem
(``BadInput``, exit 2), never a finding against a correct kernel and never a traceback. ``static`` reads the
record's data and which methods it defines; ``on_cases`` draws a few cases and asks every method about each
(JSON round trip, tables and their shapes, the oracle's keys against the tables, need and every sizing, keys,
the findings decided before a launch), then checks the reference kernel on them through the engine: a record
whose own reference is not clean on its own cases is wrong somewhere.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, List, Optional, Set

from kvfence.contract import (
    DOMAINS,
    GUARDS,
    MODES,
    REQUIRED,
    ROLES,
    Contract,
    FindingKind,
    Keys,
    Launch,
    Mutant,
    Option,
    Table,
)
from kvfence.engine.findings import Finding, Kind, closest_kind
from kvfence.errors import BadInput, printable

#: Widest row a sizing may give (``kvfence.engine.launch.MAX_WIDTH``).
MAX_WIDTH = 1 << 30

DTYPES = ("int8", "int16", "int32", "int64")
_KIND_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


class RecordError(BadInput):
    """A contract record that is not well formed (one line: the record and the problem)."""


def fail(name: str, problem: str) -> RecordError:
    return RecordError(f"contract {name!r}: {problem}")


def static(name: str, spec: str, record: object) -> None:
    """The record's data and method set (``RecordError`` naming the first problem)."""
    problems = static_problems(name, spec, record)
    if problems:
        raise fail(name, problems[0])


def static_problems(name: str, spec: str, record: Any) -> List[str]:
    if not isinstance(record, Contract):
        return [f"{spec} is {type(record).__name__}, not a kvfence.contract.Contract"]
    out: List[str] = []
    if record.name != name:
        out.append(f"{spec} calls itself {record.name!r}")
    missing = [m for m in REQUIRED if getattr(type(record), m) is getattr(Contract, m)]
    if missing:
        out.append(f"it does not define {', '.join(m + '()' for m in missing)} (required)")
    ref = record.reference
    specs = list(ref.items()) if isinstance(ref, Mapping) else [("reference", ref)]
    if not specs or specs[0][0] != "reference" or not all(
            isinstance(n, str) and ":" not in n and isinstance(s, str) and ":" in s for n, s in specs):
        out.append("reference must be 'module:attr' of its kernel (or a mapping of kernel names to such specs, "
                   f"'reference' first), got {printable(ref, 80)!r}")
    if not isinstance(record.doc, str):
        out.append("doc must be a string (where the contract is stated)")
    out += _sizing_problems(record) + _kind_problems(record) + _mutant_problems(record) + _option_problems(record)
    out += _budget_problems(record)
    return out


def _sizing_problems(record: Contract[Any]) -> List[str]:
    sizings = record.sizings
    if not isinstance(sizings, Mapping):
        return [f"sizings must map names to (case, mode) -> width, got {type(sizings).__name__}"]
    out = [] if "safe" in sizings else ["sizings has no 'safe' policy (the one a reference run must be clean under)"]
    out += [f"sizing {n!r} is not callable" for n, f in sizings.items() if not callable(f)]
    return out


def _kind_problems(record: Contract[Any]) -> List[str]:
    out, seen = [], set()
    if not isinstance(record.kinds, tuple):
        return ["kinds must be a tuple of kvfence.contract.FindingKind"]
    for k in record.kinds:
        if not isinstance(k, FindingKind):
            out.append(f"kinds holds {printable(k, 60)!r}, not a FindingKind(name, observed)")
            continue
        if not (isinstance(k.name, str) and _KIND_NAME.match(k.name)):
            out.append(f"finding kind {printable(k.name, 60)!r} must be an UPPER_CASE name")
        elif k.name in Kind.__members__ or k.name in seen:
            out.append(f"finding kind {k.name} is declared twice (or is one of kvfence's own)")
        if not isinstance(k.observed, bool):
            out.append(f"finding kind {k.name}: observed must be True (seen in the buffers) or False (arithmetic)")
        seen.add(k.name)
    return out


def known_kinds(record: Contract[Any]) -> set[Any]:
    return set(Kind.__members__) | {k.name for k in record.kinds if isinstance(k, FindingKind)}


def _mutant_problems(record: Contract[Any]) -> List[str]:
    if not isinstance(record.mutants, tuple):
        return ["mutants must be a tuple of kvfence.contract.Mutant"]
    out, seen, kinds = [], set(), known_kinds(record)
    for m in record.mutants:
        if not isinstance(m, Mutant):
            out.append(f"mutants holds {printable(m, 60)!r}, not a Mutant")
            continue
        if m.name in seen:
            out.append(f"mutant {m.name} is listed twice")
        seen.add(m.name)
        if not (isinstance(m.detects, tuple) and m.detects):
            out.append(f"mutant {m.name}: detects must name the finding kinds that catch it")
        else:
            unknown = [d for d in m.detects if d not in kinds]
            for name in unknown:
                close = closest_kind(str(name), kinds)
                out.append(f"mutant {m.name} detects {printable(name, 60)}, which no kind declares"
                           + (f": did you mean {close}?" if close else f" (kinds: {', '.join(sorted(kinds))})"))
        if m.domain not in DOMAINS:
            out.append(f"mutant {m.name}: domain must be cpu or gpu")
        if not (m.patch or m.kernel or m.sizing):
            out.append(f"mutant {m.name} plants nothing: give it a patch, a kernel or a sizing")
        if m.sizing is not None and not m.patch and not m.kernel and ":" not in m.sizing \
                and m.sizing not in record.sizings:
            out.append(f"mutant {m.name} runs under sizing {m.sizing!r}, which sizings lacks")
    return out


def _option_problems(record: Contract[Any]) -> List[str]:
    """The declared options (``kvfence.contract.Option``, each checked when made): a tuple of them, no two with
    one flag or one draw field."""
    options = record.options
    if not isinstance(options, tuple) or not all(isinstance(o, Option) for o in options):
        return [f"options must be a tuple of kvfence.contract.Option, got {printable(options, 80)!r}"]
    out: List[str] = []
    for what, names in (("flag", [o.flag for o in options]), ("draw field", [o.key for o in options])):
        out += [f"options declare the {what} {n} twice" for n in sorted({n for n in names if names.count(n) > 1})]
    return out


def _budget_problems(record: Contract[Any]) -> List[str]:
    budgets = record.selftest_examples
    if not isinstance(budgets, Mapping) or not all(
            d in DOMAINS and type(n) is int and n >= 1 for d, n in budgets.items()):
        return [f"selftest_examples must map domains ({', '.join(DOMAINS)}) to positive example counts, got "
                f"{printable(budgets, 80)!r}"]
    return []


# -- on drawn cases ------------------------------------------------------------------------------------------
def case_problems(record: Contract[Any], case: Any, *, refused: Optional[dict[str, Any]] = None) -> List[str]:
    """What is wrong with the record's answers about one drawn ``case``.
    A sizing that refuses the case (``BadInput``: a policy of some cases only) goes to ``refused``, by name: the
    caller decides whether refusing every drawn case is a problem."""
    out: List[str] = []
    refused = {} if refused is None else refused
    try:
        data = record.to_json(case)
        text = json.dumps(data)
    except (TypeError, ValueError) as exc:
        return [f"to_json(case) is not JSON data: {exc}"]
    if not isinstance(data, dict):
        return [f"to_json(case) must be a JSON object, got {type(data).__name__}"]
    try:
        back = record.from_json(json.loads(text))
    except BadInput as exc:
        return [f"from_json rejects what to_json wrote: {exc}"]
    if back != case or record.to_json(back) != data:
        out.append("from_json(to_json(case)) is not the case (the round trip changes it)")
    launches = []
    for mode in MODES:
        for sizing, policy in record.sizings.items():
            try:
                width = policy(case, mode)
            except BadInput as exc:  # a policy of some cases only (the draft's window-*): refused, not wrong
                refused.setdefault(sizing, str(exc))
                continue
            if type(width) is not int or not 0 <= width <= MAX_WIDTH:
                out.append(f"sizing {sizing!r} gives width {printable(repr(width), 60)}, not an integer in "
                           "[0, 2**30]")
                continue
            launches.append(Launch(record.name, case, width, sizing, mode=mode))
    needs: dict[str, tuple[Launch[Any], int]] = {}
    for launch in launches:
        need = record.need(launch)
        if type(need) is not int or need < 0:
            out.append(f"need(launch) must be an integer >= 0, got {printable(repr(need), 60)}")
            break
        needs.setdefault(launch.mode, (launch, need))
    for launch, need in needs.values():
        out += need_problems(record, launch, need)
    seen: Set[Any] = set()
    for launch in launches:
        if (launch.width, launch.mode) not in seen and len(seen) < 3:
            seen.add((launch.width, launch.mode))
            out += table_problems(record, launch)
    return list(dict.fromkeys(out))


def need_problems(record: Contract[Any], launch: Launch[Any], need: int) -> List[str]:
    """What ``need`` promises (docs/contract-api.md): a launch whose width is ``need`` has no ``SIZING_VIOLATION``,
    so every element the oracle defines there fits the tables the launch sizes from that width. An oracle element
    past its table's row (or rows) at ``width = need`` means ``need`` is below what the contract itself writes: a
    too-small width the fuzz run would call fine. Checked on the launch's tables at that width, not on ``need``
    as a column count: a contract's need and its tables' widths need not be the same number."""
    if need > MAX_WIDTH:
        return []
    tight = dataclasses.replace(launch, width=need)
    try:
        tables = {t.name: t for t in record.tables(tight)}
        expected = record.expected(tight)
    except BadInput:
        return []  # a width no sizing gives this case: nothing to compare (the sizings' launches are checked)
    if not isinstance(expected, Mapping):
        return []  # table_problems names it
    for name, cells in expected.items():
        t = tables.get(name)
        if t is None or not isinstance(cells, Mapping) or shape_problems(t):
            continue  # table_problems names it
        rows = 1 if t.rows is None else t.rows
        past = [key for key in cells if isinstance(key, tuple) and len(key) == 2
                and all(type(x) is int for x in key) and (key[1] >= t.width or key[0] >= rows)]
        if past:
            row, column = max(past, key=lambda key: (key[1], key[0]))
            return [f"need(launch) is {need}, but at that width expected(launch) defines {name}[{row}, {column}], "
                    f"past the table's {rows} x {t.width} (need must be at least the width that holds every "
                    f"element the oracle writes; case {printable(json.dumps(record.to_json(launch.case)), 120)})"]
    return []


def table_problems(record: Contract[Any], launch: Launch[Any]) -> List[str]:
    """``tables``, ``expected``, ``keys`` and ``findings_before_launch`` of one launch against each other."""
    out: List[str] = []
    tables = record.tables(launch)
    if not (isinstance(tables, list) and all(isinstance(t, Table) for t in tables)):
        return ["tables(launch) must return a list of kvfence.contract.Table"]
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        out.append(f"tables(launch) names a table twice ({', '.join(names)})")
    for t in tables:
        out += [f"table {t.name}: {p}" for p in shape_problems(t)]
    expected = record.expected(launch)
    by_name = {t.name: t for t in tables}
    if not isinstance(expected, Mapping):
        return out + ["expected(launch) must map output table names to {(row, column): value}"]
    for name, cells in expected.items():
        table = by_name.get(name)
        if table is None:
            out.append(f"expected(launch) names table {name!r}, which tables(launch) lacks "
                       f"(it has {', '.join(names)})")
            continue
        if table.role != "output":
            out.append(f"expected(launch) defines elements of {name!r}, an input table")
        out += [f"expected[{name!r}]: {p}" for p in cell_problems(table, cells)]
    keys = record.keys(launch)
    if not isinstance(keys, Keys):
        out.append("keys(launch) must return kvfence.contract.Keys")
    else:
        try:
            hash((keys.config, keys.structure, keys.compile, keys.reads, keys.edges))
        except TypeError as exc:
            out.append(f"keys(launch) holds an unhashable value: {exc}")
        if not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in keys.config):
            out.append("keys(launch).config must be (name, value) pairs")
    for f in record.findings_before_launch(launch):
        if not isinstance(f, Finding):
            out.append("findings_before_launch must return kvfence.engine.findings.Finding values")
            continue
        kind = f.kind.value
        declared = next((k for k in record.kinds if k.name == kind), None)
        if declared is None or declared.observed:
            out.append(f"findings_before_launch gives {kind}: only kinds declared arithmetic "
                       "(FindingKind(name, observed=False)) are decided before a launch")
    return out


def shape_problems(t: Table) -> List[str]:
    out = []
    if t.role not in ROLES:
        out.append(f"role must be output or input, got {printable(t.role, 40)!r}")
    if type(t.width) is not int or t.width < 0 or (t.rows is not None and (type(t.rows) is not int or t.rows < 0)):
        out.append(f"width and rows must be integers >= 0 (rows None: 1-D), got {t.width!r} x {t.rows!r}")
    if t.guards not in GUARDS:
        out.append(f"guards must be rows or ends, got {printable(t.guards, 40)!r}")
    if t.dtype not in DTYPES:
        out.append(f"dtype must be one of {', '.join(DTYPES)}, got {printable(t.dtype, 40)!r}")
    if t.role == "input" and t.contents is None:
        out.append("an input table needs its contents")
    if t.role == "output" and t.contents is not None:
        out.append("an output table has no contents (kvfence poisons its rows)")
    return out + row_owner_problems(t)


def row_owner_problems(t: Table) -> List[str]:
    """``row_owners``: None, or an input's ``(grid axis 0-2, rows)`` with each row one of the table's."""
    if t.row_owners is None:
        return []
    owners = t.row_owners
    if not (isinstance(owners, tuple) and len(owners) == 2 and owners[0] in (0, 1, 2)
            and isinstance(owners[1], tuple) and all(type(r) is int for r in owners[1])):
        return [f"row_owners must be (grid axis 0-2, tuple of row indices), got {printable(owners, 60)!r}"]
    rows = 1 if t.rows is None else t.rows
    if t.role != "input":
        return ["row_owners is for an input table (who may read which row)"]
    if type(rows) is int and not all(0 <= r < rows for r in owners[1]):
        return [f"row_owners names a row outside the table's {rows}"]
    return []


def contents_problems(t: Table, contents: Any) -> List[str]:
    """An input's contents against its shape (after a callable's are built)."""
    import numpy as np

    try:
        array = np.asarray(contents)
    except (TypeError, ValueError) as exc:
        return [f"table {t.name}: contents are no array of integers: {exc}"]
    shape = (t.width,) if t.rows is None else (t.rows, t.width)
    if array.size == 0 and 0 in shape:
        return []
    if array.shape != shape:
        return [f"table {t.name}: contents have shape {array.shape}, the table is {shape}"]
    if not np.issubdtype(array.dtype, np.integer) and not np.issubdtype(array.dtype, np.bool_):
        return [f"table {t.name}: contents must be integers, got {array.dtype}"]
    return []


def cell_problems(t: Table, cells: Any) -> List[str]:
    if not isinstance(cells, Mapping):
        return ["must map (row, column) pairs to values"]
    rows = 1 if t.rows is None else t.rows
    for key, value in cells.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(type(x) is int for x in key)):
            return [f"key {printable(key, 40)!r} is no (row, column) pair of integers (a 1-D table's row is 0)"]
        if not (0 <= key[0] < rows and key[1] >= 0):
            return [f"key {key} is outside the table's {rows} row(s)"]
        if not (type(value) is int or (isinstance(value, frozenset) and value
                                       and all(type(v) is int for v in value))):
            return [f"value at {key} is {type(value).__name__}, not an integer (or a frozenset of them)"]
    return []


def require_well_formed(record: Contract[Any], expected: Any, tables: List[Table]) -> None:

    """The engine's per-launch check, cheap: the oracle names only output tables the launch has (``RecordError``)."""
    outputs = {t.name for t in tables if t.role == "output"}
    extra = [name for name in expected if name not in outputs]
    if extra:
        raise fail(record.name, f"expected(launch) names {', '.join(map(repr, extra))}, which are not output "
                                f"tables of tables(launch) ({', '.join(sorted(outputs))})")
    for t in tables:
        if t.name in expected:
            problems = cell_problems(t, expected[t.name])
            if problems:
                raise fail(record.name, f"expected[{t.name!r}]: {problems[0]}")
