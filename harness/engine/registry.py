"""The contract registry: records found by name through the entry-point group ``kvfence.contracts``.

kvfence's own contracts are registered in ``pyproject.toml`` exactly as another package registers its own, so
the engine never imports a record by name. A record from outside kvfence is imported in a throwaway process
first (``kvfence.engine.import_probe``): an import that exits, aborts, hangs or leaves a thread or exit handler
that would is one line naming the contract, never the end of this process. Every record is checked on load
(``kvfence.engine.record_check.static``): a record mistake is one line naming the record and the problem.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List

from kvfence.contract import Contract
from kvfence.errors import BadInput, require

ENTRY_POINT_GROUP = "kvfence.contracts"
#: Seconds a contract plug-in's import may take in its throwaway process.
IMPORT_PROBE_TIMEOUT_S = 120.0

_REGISTRY: Dict[str, List[str]] = {}
_LOADED: Dict[str, Contract[Any]] = {}


#: A child command's registrations from its parent (``child_env``): JSON ``{"entries": {...}, "sys_path": [...]}``.
CHILD_ENV = "KVFENCE_REGISTERED"


def _entries() -> Dict[str, List[str]]:
    """Every name's ``module:attr`` entries (two for one name: a package that takes another's name)."""
    if not _REGISTRY:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            specs = _REGISTRY.setdefault(ep.name, [])
            if ep.value not in specs:
                specs.append(ep.value)
        inherited = json.loads(os.environ.get(CHILD_ENV) or "{}")
        for path in reversed(inherited.get("sys_path", [])):
            if path not in sys.path:
                sys.path.insert(0, path)
        for name, specs in inherited.get("entries", {}).items():
            _REGISTRY[name] = list(specs)
    return _REGISTRY


def child_env() -> Dict[str, str]:
    """What a child ``python -m kvfence`` needs to see this process's registrations (a test's contract registered
    with ``registered``, say) and the import path they were found on."""
    return {CHILD_ENV: json.dumps({"entries": _entries(), "sys_path": [p for p in sys.path if p]})}


def entry(name: str) -> str:
    """The ``module:attr`` a registered contract is loaded from (a checking worker loads it the same way)."""
    specs = _entries().get(name) or []
    require(bool(specs), f"unknown contract {name!r}: choose from {', '.join(names()) or '(none registered)'}")
    require(len(specs) == 1, f"contract {name!r} is registered twice ({' and '.join(specs)}): kvfence will not "
                             "pick one; uninstall the package that should not provide it")
    return specs[0]


def register(name: str, spec: str) -> None:
    """Register ``name`` as loaded from ``spec`` (``module:attr``) in this process, as an entry point would; a
    name registered already keeps its entry."""
    _entries().setdefault(name, [spec])


@contextlib.contextmanager
def registered(name: str, spec: str) -> Iterator[None]:
    """``name`` registered as loaded from ``spec`` in this process for the block, as an installed package's entry
    point would be (a test's contract), then forgotten."""
    entries = _entries()
    before = entries.get(name)
    entries[name] = [spec]
    _LOADED.pop(name, None)
    try:
        yield
    finally:
        if before is None:
            entries.pop(name, None)
        else:
            entries[name] = before
        _LOADED.pop(name, None)


def names() -> List[str]:
    """Every registered contract name, sorted."""
    return sorted(_entries())


def default_name() -> str:
    """The contract a command checks when none is named (``default_contract.json`` beside this module)."""
    import json

    return str(json.loads((Path(__file__).resolve().parent / "default_contract.json").read_text())["contract"])


def builtin(name: str) -> bool:
    """Whether ``name`` is one of kvfence's own contracts (its record lives in the ``kvfence`` package)."""
    return entry(name).split(".")[0] == "kvfence"


def get(name: str) -> Contract[Any]:
    """The contract registered as ``name``; ``BadInput`` naming the known ones otherwise."""
    return _get(name, probe=True)


def _probe_import(name: str, spec: str) -> None:
    module_name = spec.partition(":")[0]
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
        how = (f"died of signal {-proc.returncode}" if proc.returncode < 0
               else f"ended its process (exit status {proc.returncode})")
        raise BadInput(f"contract {name!r}: importing {module_name} {how} before kvfence could check it (a "
                       "contract's import, or a thread or exit handler it leaves, must not exit or kill its process)")
    require(answer == "ok", f"contract {name!r}: cannot load {spec}: {answer[len('error '):]}")


def _get(name: str, *, probe: bool) -> Contract[Any]:
    """``get``; ``probe=False`` in a process that is itself a throwaway one (a checking worker, a probe)."""
    if name in _LOADED:
        return _LOADED[name]
    require(isinstance(name, str), f"unknown contract {name!r}")
    spec = entry(name)
    module_name, _, attr = spec.partition(":")
    if probe and module_name.split(".")[0] != "kvfence" and module_name not in sys.modules:
        _probe_import(name, spec)  # code from outside kvfence: its import cannot end this process
    try:
        record: Contract[Any] = getattr(importlib.import_module(module_name), attr)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code's import: bad input, one line
        raise BadInput(f"contract {name!r}: cannot load {spec}: {type(exc).__name__}: {exc}") from None
    from kvfence.engine.record_check import static

    if module_name.split(".")[0] != "kvfence":
        from kvfence.engine.boundary import guard

        record = guard(record, name)  # its methods run under the boundary's calls (kvfence.engine.boundary)
    static(name, spec, record)
    _LOADED[name] = record
    return record


def loading(record: Contract[Any]) -> dict[str, Any]:
    """What another process (a checking worker, a ``--jobs`` child) needs to load ``record`` as this one did: its
    registry entry and the import path it was found on; ``load_in_worker`` is the other end."""
    return loading_named(record.name)


def loading_named(name: str) -> dict[str, Any]:
    """``loading`` of the contract registered as ``name``, without importing it here."""
    return {"contract": name, "entry": entry(name), "sys_path": [p for p in sys.path if p]}


def load_in_worker(options: dict[str, Any]) -> Contract[Any]:
    """The other end of ``loading``: the record, registered and loaded in this (throwaway) process."""
    for path in reversed(options.get("sys_path", [])):
        if path not in sys.path:
            sys.path.insert(0, path)
    register(options["contract"], options["entry"])
    return _get(options["contract"], probe=False)
