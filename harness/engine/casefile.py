"""Case files: one failing case as versioned JSON, complete enough to re-run without Hypothesis.

The format is defined here and nowhere else, for every contract. A case file is data (JSON only: no pickle,
no eval) and is validated on load; anything wrong is ``BadInput`` with a one-line message. Schema version 1::

    {
      "kvfence_case": 1,
      "contract": the registered name of the record that reads "case" (absent: the draft kernel's),
      "case":     the launch's record (``kvfence.engine.launch.to_record``):
                  {"case": the contract's to_json(case), "width", "sizing", "kernel", "mode", "layout"},
      "device":   "cpu" | "cuda",            # where it was found
      "source":   "fuzz" | "pytest" | "journal" | ...,
      "sizing":   need vs width when found (informational: the contract's summary, less its config)
      "findings": [Finding.to_dict(), ...],
      "versions": {"python", "torch", "triton", "hypothesis", "kvfence"},
      "extras":   {"hypothesis": {"blob": "@reproduce_failure(...)"} or {"unavailable": "<why>"}, ...}
    }

A file without ``contract`` is a draft kernel's (every case file before contracts were plug-ins); a plug-in
contract's file of the earlier ``kvfence-contract-case/1`` format is read too, and so is a launch record written
before launches existed (its contract's ``from_json`` reads it whole). The file name is a short hash of the
contract and the launch's record, so re-finding the same case gives the same file and two contracts' cases
never share one; writes are atomic (temp file + ``os.replace``), so pytest-xdist workers never clobber each
other.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, NoReturn, Optional, Tuple, Union

from kvfence.contract import Launch
from kvfence.engine import kernels, registry
from kvfence.engine import launch as launches
from kvfence.engine.findings import Finding, Kind
from kvfence.errors import BadInput, require

SCHEMA_VERSION = 1
#: The key that marks a JSON object as a kvfence case file; its value is the schema version.
MARKER = "kvfence_case"
DEFAULT_OUT = Path("reports") / "out"
CASES_DIR = "cases"
#: Characters of the sha256 of the case content used as the file name.
HASH_CHARS = 12
#: Case files are small (a few KiB); anything far larger is not one.
MAX_BYTES = 4 * 1024 * 1024
#: A name of a program's coordinate in a finding's ``owner_names`` (``request``, ``column block``): shown as text.
OWNER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9 _-]{0,31}")
_TOP_KEYS = {MARKER, "contract", "case", "device", "source", "sizing", "findings", "versions", "extras"}
#: The format of a plug-in contract's case file before the one format above (still read).
CONTRACT_CASE_FORMAT = "kvfence-contract-case/1"


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# -- versions ------------------------------------------------------------------------------------------
def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _kvfence_version() -> str:
    version = _dist_version("kvfence")
    if version != "not installed":
        return version
    import tomllib  # a source checkout: read pyproject.toml

    try:
        with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as fh:
            return str(tomllib.load(fh)["project"]["version"]) + " (source)"
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


_VERSIONS: Optional[dict[str, Any]] = None


def versions() -> dict[str, Any]:
    """Tool versions, from package metadata (never imports triton: the device choice precedes that)."""
    global _VERSIONS
    if _VERSIONS is None:
        _VERSIONS = {"python": platform.python_version(), "torch": _dist_version("torch"),
                     "triton": _dist_version("triton"), "hypothesis": _dist_version("hypothesis"),
                     "kvfence": _kvfence_version()}
    return dict(_VERSIONS)


# -- Hypothesis blob -----------------------------------------------------------------------------------
def hypothesis_blob() -> dict[str, Any]:
    """The ``@reproduce_failure`` decorator of the example Hypothesis is running now, or why there is none.

    Called from inside a test body: the build context's choices are the ones drawn for this example
    (``@given`` draws every argument before the body runs), encoded as Hypothesis prints them with
    ``print_blob``. Uses ``hypothesis.core.reproduction_decorator``; if a Hypothesis release moves it,
    the case file says so instead of failing.
    """
    try:
        from hypothesis.control import _current_build_context
        from hypothesis.core import reproduction_decorator
    except ImportError as exc:
        return {"unavailable": f"hypothesis internals changed: {exc}"}
    context = _current_build_context.value
    if context is None:
        return {"unavailable": "not found by Hypothesis (no Hypothesis test was running)"}
    try:
        return {"blob": reproduction_decorator(context.data.choices),
                "note": "add it as a decorator to the same test (same strategy); Hypothesis version must match"}
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal: the case file re-runs without it
        return {"unavailable": f"cannot encode the Hypothesis choices: {type(exc).__name__}: {exc}"}


def hypothesis_final() -> Optional[bool]:
    """``True`` on Hypothesis' final replay of the minimal example, ``False`` while it explores or
    shrinks, ``None`` outside Hypothesis. Only final (or non-Hypothesis) failures are written to disk."""
    try:
        from hypothesis.control import _current_build_context
    except ImportError:
        return None
    context = _current_build_context.value
    return None if context is None else bool(context.is_final)


def current_choices() -> Optional[bytes]:
    """The choices of the example Hypothesis runs now, in its database encoding (or None if this
    Hypothesis has no such encoding: the failure is then kept in its case file only)."""
    try:
        from hypothesis.control import _current_build_context
        from hypothesis.database import choices_to_bytes
    except ImportError:
        return None
    context = _current_build_context.value
    if context is None:
        return None
    try:
        return choices_to_bytes(context.data.choices)
    except Exception:  # noqa: BLE001 - optional: without it the failure still has its case file
        return None


# -- case files ----------------------------------------------------------------------------------------
def case_hash(case: Launch[Any]) -> str:
    """Short sha256 of the launch's contract and record: the case file's name."""
    return launches.digest(registry.get(case.contract), case)[:HASH_CHARS]


def document(case: Launch[Any], findings: List[Finding], *, device: str, source: str,
             extras: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    record = registry.get(case.contract)
    try:
        sizing = {k: v for k, v in launches.summary(record, case).items() if k not in ("config", "case")}
    except BadInput as exc:  # e.g. a plug-in sizing that is gone: the case still records what it can
        sizing = {"unavailable": str(exc)}
    return {MARKER: SCHEMA_VERSION, "contract": record.name, "case": launches.to_record(record, case),
            "device": device, "source": source, "sizing": sizing, "findings": [f.to_dict() for f in findings],
            "versions": versions(), "extras": dict(extras or {})}


def _file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _file_mode()


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same folder and ``os.replace``: readers and
    concurrent writers see the old file or the new one, never a torn one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0600; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_case(case: Launch[Any], findings: List[Finding], *, out_dir: Union[str, Path] = DEFAULT_OUT,
               device: str = "cpu",
               source: str = "fuzz", extras: Optional[dict[str, Any]] = None) -> Path:
    """Write the case file under ``out_dir/cases/<hash>.json`` and return its path."""
    folder = Path(out_dir) / CASES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case_hash(case)}.json"
    doc = document(case, findings, device=device, source=source, extras=extras)
    atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=False) + "\n")
    return path


def legacy_contract(data: dict[str, Any]) -> str:
    """The contract of a record written before case files and summaries named one (every such record is the draft
    kernel's): the one of kvfence's own contracts whose ``from_json`` reads its case (``BadInput`` unless exactly
    one does)."""
    case = {k: data[k] for k in ("config", "batch", "kernel", "canary_seed") if k in data}
    readers = []
    for name in registry.names():
        if not registry.builtin(name):
            continue
        try:
            registry.get(name).from_json(case)
        except (BadInput, KeyError, TypeError, ValueError):
            continue
        readers.append(name)
    require(len(readers) == 1, "a record that names no contract must be one kvfence's own contracts read alone "
                               f"(read by {', '.join(readers) or 'none'})")
    return readers[0]


def repro_command(path: Union[str, Path], kernel: str, sizing: str, contract: str) -> str:
    """The command that replays the case file ``path`` found with ``kernel`` and ``sizing``.

    A case file's plug-ins are data that ``repro`` never imports on its own (kvfence.engine.repro), so
    a plug-in kernel or sizing is named again on the command line: the user who runs it vouches for it."""
    import shlex

    record = registry.get(contract)
    words = ["python", "-m", "kvfence", "repro", str(path)]
    if kernels.is_plugin(kernel):
        words += ["--kernel", kernel]
    if kernels.sizing_is_plugin(record, sizing):
        words += ["--sizing", sizing]
    return shlex.join(words)


def case_repro_command(path: Union[str, Path], case: Launch[Any]) -> str:
    """``repro_command`` for a case file holding ``case`` (a launch)."""
    return repro_command(path, case.kernel, case.sizing, case.contract)


def record_repro_command(path: Union[str, Path], record: dict[str, Any]) -> str:
    """``repro_command`` for a summary's case record (``kvfence.engine.summary.case_record``)."""
    sizing = record.get("sizing") or (record.get("config") or {}).get("sizing", "safe")
    return repro_command(path, record.get("kernel", "reference"), sizing,
                         record.get("contract") or legacy_contract(record))


# -- loading -------------------------------------------------------------------------------------------
@dataclass
class CaseFile:
    """A loaded, validated case file."""

    path: Path
    case: Launch[Any]
    findings: List[Finding]
    device: str
    source: str
    sizing: dict[str, Any]
    versions: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)


def _triple_list(value: object, what: str) -> List[Tuple[Any, ...]]:
    if not isinstance(value, list):
        raise BadInput(f"{what} must be a list")
    for item in value:
        require(isinstance(item, list) and len(item) == 3, f"{what} entries must be lists of 3, got {item!r}")
    return value


#: Kinds a case file of an older kvfence may carry that it no longer names, and the kind each is read as:
#: ``INDPTR_MISMATCH`` (the draft's kv_indptr column not holding the oracle's value) is the engine's
#: ``VALUE_MISMATCH`` there (or its ``MISSING_WRITE``, when the column kept its poison: the old kind did not say).
RETIRED_KINDS = {"INDPTR_MISMATCH": Kind.VALUE_MISMATCH.value}


def finding_from_dict(d: Any, where: str, kinds: Iterable[str] = ()) -> Finding:
    """``Finding.from_dict`` with every field type-checked first (``BadInput`` names the field); ``kinds``: the
    contract's own kinds a finding may carry (a retired kind is read as its successor, ``RETIRED_KINDS``)."""
    require(isinstance(d, dict), f"{where} must be a JSON object")
    if d.get("kind") in RETIRED_KINDS and d.get("kind") not in kinds:
        d = {**d, "kind": RETIRED_KINDS[d["kind"]]}
    known = [k.value for k in Kind] + list(kinds)
    require(d.get("kind") in known, f"{where}.kind must be one of {', '.join(known)}, got {d.get('kind')!r}")
    for key in ("buffer", "region"):
        require(isinstance(d.get(key), str), f"{where}.{key} must be a string")
    for key in ("start", "stop", "count"):
        require(key not in d or _is_int(d[key]), f"{where}.{key} must be an integer, got {d.get(key)!r}")
    require(d.get("start", 0) <= d.get("stop", 0), f"{where}: start {d.get('start')} > stop {d.get('stop')}")
    require(isinstance(d.get("detail", ""), str), f"{where}.detail must be a string")
    require(isinstance(d.get("extra", {}), dict), f"{where}.extra must be a JSON object")
    for sample in _triple_list(d.get("samples", []), f"{where}.samples"):
        require(all(x is None or _is_int(x) for x in sample), f"{where}.samples entries must be integers or null")
    for key in ("programs", "writers"):
        value = d.get(key, [])
        require(isinstance(value, list), f"{where}.{key} must be a list")
        for program in value:  # a program's grid coordinates: (s, b, k) for the draft kernel, 1-4 of them
            require(isinstance(program, list) and 1 <= len(program) <= 4
                    and all(_is_int(x) and x >= 0 for x in program),
                    f"{where}.{key} entries must be lists of 1-4 non-negative integers (a program's grid index)")
    names = d.get("owner_names", [])
    require(isinstance(names, list) and len(names) <= 4 and all(isinstance(n, str) and OWNER_NAME.fullmatch(n)
                                                                 for n in names),
            f"{where}.owner_names must be a list of up to 4 names of a program's coordinates (letters, digits, "
            "spaces, '_' or '-', at most 32 characters each)")
    return Finding.from_dict(d, kinds)


def parse_json_file(path: Union[str, Path], what: str, max_bytes: int = MAX_BYTES) -> Any:
    """Read and parse a JSON file; every failure (missing, unreadable, too large, not JSON) is ``BadInput``."""
    import stat

    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise BadInput(f"{what} {path}: no such file") from None
    except OSError as exc:  # a symlink loop (ELOOP), a folder on the way that cannot be searched (EACCES), ...
        raise BadInput(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    require(stat.S_ISREG(mode), f"{what} {path}: not a regular file")
    try:
        with open(p, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise BadInput(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    require(len(raw) <= max_bytes, f"{what} {path}: larger than {max_bytes} bytes")
    require(raw.strip(), f"{what} {path}: file is empty")

    def no_constants(name: str) -> NoReturn:
        raise BadInput(f"{what} {path}: {name} is not valid JSON")

    try:
        return json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except UnicodeDecodeError:
        raise BadInput(f"{what} {path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{what} {path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except BadInput:  # no_constants' own message
        raise
    except ValueError as exc:  # Python's limit on digits in an integer (a 5,000-digit number)
        raise BadInput(f"{what} {path}: unusable number: {' '.join(str(exc).split())[:120]}") from None
    except RecursionError:
        raise BadInput(f"{what} {path}: JSON nested too deeply") from None


def _from_contract_case(doc: dict[str, Any], path: Union[str, Path]) -> dict[str, Any]:
    """A ``kvfence-contract-case/1`` document as this schema's (its fields, renamed)."""
    require(isinstance(doc.get("contract"), str), f"case file {path}: contract must be a string")
    case = {key: doc.get(key) for key in ("case", "width", "sizing", "kernel", "mode") if key in doc}
    return {MARKER: SCHEMA_VERSION, "contract": doc["contract"], "case": case, "device": doc.get("device", ""),
            "source": "fuzz", "findings": doc.get("findings", [])}


def from_document(doc: Any, path: Union[str, Path] = "<memory>") -> CaseFile:
    """Validate a parsed case-file document (see the module docstring for the schema)."""
    require(isinstance(doc, dict), f"case file {path}: top level must be a JSON object")
    if doc.get("format") == CONTRACT_CASE_FORMAT:
        doc = _from_contract_case(doc, path)
    require(MARKER in doc, f"case file {path}: not a kvfence case file (no {MARKER!r} field)")
    version = doc[MARKER]
    require(version == SCHEMA_VERSION and _is_int(version),
            f"case file {path}: schema version {version!r} is not supported "
            f"(this kvfence reads version {SCHEMA_VERSION})")
    unknown = sorted(set(doc) - _TOP_KEYS)
    require(not unknown, f"case file {path}: unknown fields {unknown}")
    require("case" in doc, f"case file {path}: no 'case' field")
    try:
        name = doc["contract"] if "contract" in doc else legacy_contract(doc["case"] if isinstance(doc["case"], dict)
                                                                         else {})
        require(isinstance(name, str), "contract must be a string")
        record = registry.get(name)
        require(isinstance(doc["case"], dict), "case must be a JSON object")
        # Syntax only: a plug-in named in a case file is data, never imported on load (kvfence.engine.repro).
        kernels.check_spec(doc["case"].get("kernel", "reference"), record=record)
        case = launches.from_record(record, doc["case"])
        kernels.check_spec(case.kernel, record=record)
        findings_raw = doc.get("findings", [])
        require(isinstance(findings_raw, list), "findings must be a list")
        kinds = [k.name for k in record.kinds]
        findings = [finding_from_dict(f, f"findings[{i}]", kinds) for i, f in enumerate(findings_raw)]
        for key in ("device", "source"):
            require(isinstance(doc.get(key, ""), str), f"{key} must be a string")
        for key in ("sizing", "versions", "extras"):
            require(isinstance(doc.get(key, {}), dict), f"{key} must be a JSON object")
    except BadInput as exc:
        raise BadInput(f"case file {path}: {exc}") from None
    return CaseFile(Path(path), case, findings, doc.get("device", ""), doc.get("source", ""), doc.get("sizing", {}),
                    doc.get("versions", {}), doc.get("extras", {}))


def contract_named(path: Union[str, Path]) -> List[str]:
    """The contract a case file or summary names, read as data: ``[name]``, or ``[]`` for a file that cannot be
    read or names none (reading it for real says why, in one line)."""
    try:
        doc = parse_json_file(path, "file")
    except (BadInput, OSError):
        return []
    name = doc.get("contract") if isinstance(doc, dict) else None
    return [name] if isinstance(name, str) else []


def load_case(path: Union[str, Path]) -> CaseFile:
    """Load and validate a case file; ``BadInput`` (one line naming the problem) on anything wrong."""
    return from_document(parse_json_file(path, "case file"), path)


# -- pytest --------------------------------------------------------------------------------------------
def raise_on_findings(case: Launch[Any], findings: List[Finding], *, out_dir: Union[str, Path] = DEFAULT_OUT,
                      device: Optional[str] = None,
                      limit: int = 12) -> None:
    """For property tests: if ``findings``, write the case file and raise ``AssertionError``.

    The message lists the findings and ends with the repro command. Inside Hypothesis the file is
    written only on the final replay of the shrunk example (not for every intermediate failure);
    content-hash names and atomic writes make it safe under ``pytest -n auto``.
    """
    if not findings:
        return

    message = format_failure(case, findings, limit=limit)
    final = hypothesis_final()
    if final is False:
        raise AssertionError(message + "\n(case file written once Hypothesis has shrunk this failure)")
    if device is None:
        from kvfence.device import interpreting

        device = "cpu" if interpreting() else "cuda"
    extras: Dict[str, Any] = {"hypothesis": hypothesis_blob()}
    test = os.environ.get("PYTEST_CURRENT_TEST")
    if test:
        extras["pytest"] = test.rsplit(" (", 1)[0]
    path = write_case(case, findings, out_dir=out_dir, device=device, source="pytest", extras=extras)
    raise AssertionError(f"{message}\ncase file: {path}\nrepro: {case_repro_command(path, case)}")


def format_failure(case: Launch[Any], findings: List[Finding], limit: int = 8) -> str:
    lines = [f"{len(findings)} finding(s) for {launches.describe(registry.get(case.contract), case, full=True)}"]
    lines += ["  " + f.headline() for f in findings[:limit]]
    if len(findings) > limit:
        lines.append(f"  ... {len(findings) - limit} more")
    return "\n".join(lines)
