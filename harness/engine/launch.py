"""The engine's value, ``kvfence.contract.Launch``: binding a contract's case, and everything derived from it.

A contract says what its case is (``to_json``), what it needs (``need``) and what it runs on (``tables``); the
engine binds a case to a sizing, kernel, mode and layout, and derives from that launch, the same way for every
contract: its JSON record (case files, the journal, the checking worker's wire), a replacement under other
settings (``repro --sizing/--kernel/--mode/--layout``), one line describing it, its summary, its keys and the
need/width arithmetic ``repro`` prints.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Dict, List, Optional

from kvfence.contract import LAYOUTS, MODES, Contract, Keys, Launch, Sizing
from kvfence.engine.kernels import is_plugin, release_source
from kvfence.errors import BadInput, printable, require

#: Widest row kvfence allocates (elements): a sizing answering more is refused in one line.
MAX_WIDTH = 1 << 30
#: The record's fields beside ``case`` (the launch's settings).
SETTINGS = ("width", "sizing", "kernel", "mode", "layout")


def sizing_policy(found: Contract[Any], spec: str) -> Sizing[Any]:
    """The contract's sizing named ``spec`` (``BadInput`` naming the known ones otherwise)."""
    try:
        return found.sizings[spec]
    except (KeyError, TypeError):
        raise BadInput(f"unknown sizing {spec!r} of contract {found.name}: choose from "
                       f"{', '.join(found.sizings)}") from None


def width_of(record: Contract[Any], case: Any, sizing: str, mode: str) -> int:
    """The row width the named sizing gives ``case`` launched in ``mode``; ``BadInput`` (one line) for an unknown
    sizing or one that answers anything but an integer in ``[0, MAX_WIDTH]``."""
    width = sizing_policy(record, sizing)(case, mode)
    require(type(width) is int and 0 <= width <= MAX_WIDTH,
            f"contract {record.name}: sizing {sizing!r} gives width {printable(repr(width), 60)}, not an integer in "
            f"[0, 2**30]")
    return width


def named(record: Contract[Any], sizing: str) -> bool:
    """One of the contract's named policies (kvfence's own code: always recomputed, never taken from a file)."""
    return sizing in list(record.sizings)


def bind(record: Contract[Any], case: Any, sizing: str, kernel: str = "reference", mode: str = "eager",
         layout: str = "redzone", width: Optional[int] = None) -> Launch[Any]:
    """``case`` launched under ``sizing``: its width computed by a named policy; for any other sizing (a
    release's shipped one, a plug-in's) the ``width`` given is taken as recorded, since computing it would run
    code a case file names, else computed."""
    require(mode in MODES, f"mode must be graph or eager, got {mode!r}")
    require(layout in LAYOUTS, f"layout must be redzone or production, got {layout!r}")
    if width is None or named(record, sizing):
        width = width_of(record, case, sizing, mode)
    require(type(width) is int and 0 <= width <= MAX_WIDTH, f"width must be an integer in [0, 2**30], got {width!r}")
    return Launch(record.name, case, width, sizing, kernel, mode, layout)


def replace(record: Contract[Any], launch: Launch[Any], *, kernel: Optional[str] = None, sizing: Optional[str] = None,
            mode: Optional[str] = None, layout: Optional[str] = None) -> Launch[Any]:
    """``launch`` under another kernel, sizing, mode or layout (the width recomputed by the new sizing)."""
    keep = sizing is None and mode is None and not named(record, launch.sizing)
    return bind(record, launch.case, sizing or launch.sizing, kernel or launch.kernel, mode or launch.mode,
                layout or launch.layout, launch.width if keep else None)


def to_record(record: Contract[Any], launch: Launch[Any]) -> dict[str, Any]:
    """The launch as JSON data: ``{"case": to_json(case), "width", "sizing", "kernel", "mode", "layout"}``."""
    return {"case": record.to_json(launch.case), "width": launch.width, "sizing": launch.sizing,
            "kernel": launch.kernel, "mode": launch.mode, "layout": launch.layout}


def from_record(record: Contract[Any], data: object) -> Launch[Any]:
    """The launch ``to_record`` wrote (validated: ``BadInput`` naming the field). A record of an older format,
    without ``case``, goes to the contract's ``from_json`` whole: a contract whose case once carried its launch
    settings returns the bound launch from it."""
    if not isinstance(data, dict):
        raise BadInput("case: expected a JSON object")
    if "case" not in data:
        legacy = record.from_json(data)
        if not isinstance(legacy, Launch):
            raise BadInput(f"case: a {record.name} launch record needs its 'case' field")
        return legacy
    unknown = sorted(set(data) - {"case", *SETTINGS})
    require(not unknown, f"case: unknown field(s) {', '.join(unknown)}")
    for key in ("sizing", "kernel"):
        require(isinstance(data.get(key), str) and data[key], f"case: {key} must be a non-empty string")
    mode, layout = data.get("mode", "eager"), data.get("layout", "redzone")
    require(mode in MODES, "case: mode must be graph or eager")
    require(layout in LAYOUTS, "case: layout must be redzone or production")
    width = data.get("width")
    # A release's shipped sizing (``sglang==V:...``) or a plug-in's: its width is recorded with the launch.
    require(named(record, data["sizing"]) or release_source(data["sizing"]) or is_plugin(data["sizing"]),
            f"case: unknown sizing '{printable(data['sizing'], 80)}' of contract {record.name}: choose from "
            f"{', '.join(record.sizings)}, a release's (sglang==V:...) or a plug-in (module:attr)")
    if not named(record, data["sizing"]):
        require(type(width) is int and 0 <= width <= MAX_WIDTH,
                f"case: a case of sizing {data['sizing']!r} needs its width, an integer in [0, 2**30]")
    case = record.from_json(data["case"])
    return bind(record, case, data["sizing"], data["kernel"], mode, layout, width)


def digest(record: Contract[Any], launch: Launch[Any]) -> str:
    """A short sha256 of the launch's record and its contract: the name of its case file."""
    text = json.dumps({"contract": record.name, **to_record(record, launch)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _flat(data: dict[str, Any], full: bool) -> Dict[str, object]:
    """A case's JSON fields, nested objects flattened (their fields, unprefixed where no name repeats)."""
    out: Dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            for k, v in _flat(value, full).items():
                out[k if k not in out else f"{key}.{k}"] = v
        elif full or not isinstance(value, (list, tuple)):
            out[key] = value
    return out


def describe(record: Contract[Any], launch: Launch[Any], full: bool = False) -> str:
    """One line naming the launch: its contract, the case's fields (``full``: lists too), width and settings."""
    fields = " ".join(f"{k}={printable(v, 120)}" for k, v in _flat(record.to_json(launch.case), full).items())
    settings = f"{launch.mode}" + (f", {launch.layout} layout" if launch.layout != "redzone" else "")
    kernel = f", kernel {launch.kernel}" if full else ""
    return f"{record.name} {fields}; width {launch.width} ({launch.sizing}), {settings}{kernel}"


@functools.lru_cache(maxsize=256)  # the recent launches only: thousands kept alive made every GC pass slower
def keys(record: Contract[Any], launch: Launch[Any]) -> Keys:
    """The contract's keys of the launch (``Contract.keys``), with the launch's settings in its config and its
    width in its structure (computed once per launch: the fuzz loop and the worker's wire both ask)."""
    found = record.keys(launch)
    settings = (("sizing", launch.sizing), ("mode", launch.mode), ("layout", launch.layout), ("kernel", launch.kernel))
    return Keys(config=tuple(found.config) + settings, structure=(found.structure, launch.width),
                compile=found.compile, reads=found.reads, edges=tuple(found.edges), requests=found.requests)


#: The columns of a coverage row (``coverage_row``); the first is the contract's panel (its config key's first).
COVERAGE = ("num_seqs", "need", "width", "failed")


def coverage_fields(record: Contract[Any], launch: Launch[Any]) -> tuple[Any, ...]:
    """The coverage plot's columns for the contract: its panel field, then ``COVERAGE``."""
    config = keys(record, launch).config
    return ((config[0][0] if config else "config"),) + COVERAGE


def coverage_row(record: Contract[Any], launch: Launch[Any], failed: bool) -> tuple[Any, ...]:
    """One point of the coverage plot: the panel's value, the requests, need, width and whether it failed."""
    found = keys(record, launch)
    panel = found.config[0][1] if found.config else 0
    return (panel, requests(record, launch, found), record.need(launch), launch.width, failed)


def requests(record: Contract[Any], launch: Launch[Any], found: Optional[Keys] = None) -> int:
    """How many requests the launch has (the contract's ``Keys.requests``, else rows of its first output)."""
    found = found or keys(record, launch)
    if found.requests is not None:
        return found.requests
    outputs = [t for t in record.tables(launch) if t.role == "output"]
    return (outputs[0].rows or 1) if outputs else 1


def spill(record: Contract[Any], launch: Launch[Any]) -> int:
    """Elements past a row that the launch may store within its contract's bounds: ``need - width`` when the
    sizing leaves the row short (a correct kernel writes the whole need), else 0. Output tails hold it."""
    return max(0, record.need(launch) - launch.width)


def summary(record: Contract[Any], launch: Launch[Any]) -> dict[str, Any]:
    """What summaries and case files keep of a launch: need, width, requests, its config and its record."""
    found = keys(record, launch)
    return {"need": record.need(launch), "width": launch.width, "num_seqs": requests(record, launch, found),
            "config": {k: _data(v) for k, v in found.config}, "case": to_record(record, launch)}


def _data(value: Any) -> Any:
    """A key's value as JSON data (tuples as lists)."""
    if isinstance(value, (list, tuple)):
        return [_data(v) for v in value]
    return value


def explain(record: Contract[Any], launch: Launch[Any]) -> List[str]:
    """The need/width arithmetic, as ``repro`` prints it: the need, the sizing (with its policy's formula, the
    first line of its docstring) and the verdict."""
    need = record.need(launch)
    policy = record.sizings.get(launch.sizing) if hasattr(record.sizings, "get") else None
    formula = ((getattr(policy, "__doc__", None) or "").strip().splitlines() or [""])[0]
    verdict = (f"need > width by {need - launch.width}: the row is too narrow" if need > launch.width
               else f"fits ({launch.width - need} spare)")
    return [f"need   = {need} (the widest row the launch needs)",
            f"width  = {launch.sizing}(case, {launch.mode}) = {launch.width}" + (f"   [{formula}]" if formula else ""),
            f"=> {verdict}"]


def utilisation(record: Contract[Any], launch: Launch[Any]) -> float:
    """need / width (Hypothesis's target phase climbs it toward the wall)."""
    need = record.need(launch)
    return need / launch.width if launch.width else float(need > 0)
