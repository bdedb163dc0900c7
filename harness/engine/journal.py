"""Crash-safe journal: the case in flight is on disk before every launch.

Each fuzzing process owns one small slot file ``<out>/journal/<pid>-<nonce>.inflight`` and holds an
exclusive ``flock`` on it while it lives. Before a launch it overwrites the slot with
``S<case JSON>\\n`` (one ``pwrite``); after the verdict it overwrites the first byte with ``D`` (one more).
The file never grows, and each write goes to the page cache, which survives the death of the process
(kill -9, a CUDA illegal address, an interpreter abort). No fsync: a power cut is out of scope.

``recover(out_dir)`` takes every slot whose lock it can get (its owner is dead: the kernel drops
``flock`` locks when a process dies, whatever killed it), turns an in-flight case into a case file
with a ``CRASH`` finding, and removes the slot. Live processes' slots are left alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from kvfence.contract import Launch
from kvfence.engine import casefile, registry
from kvfence.engine import launch as launches
from kvfence.engine.findings import Finding, Kind
from kvfence.errors import BadInput, printable, require

JOURNAL_DIR = "journal"
SUFFIX = ".inflight"
IN_FLIGHT = b"S"
DONE = b"D"


class Journal:
    """The in-flight slot of this process (see the module docstring). Use as a context manager."""

    def __init__(self, out_dir: Union[str, Path], *, device: str, meta: dict[str, Any] | None = None) -> None:
        self.folder = Path(out_dir) / JOURNAL_DIR
        require(not self.folder.exists() or self.folder.is_dir(),
                f"{self.folder} exists and is not a directory: the run's crash journal goes there; move it away")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{os.getpid()}-{os.urandom(4).hex()}{SUFFIX}"
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._head = json.dumps({"device": device, "pid": os.getpid(), "started": round(time.time(), 3),
                                 **(meta or {})}, separators=(",", ":"))
        os.pwrite(self._slot(), DONE + b"\n", 0)

    def _record(self, case: Launch[Any], tail: str = "") -> str:
        record = registry.get(case.contract)
        body = json.dumps(launches.to_record(record, case), separators=(",", ":"))
        return f'{{"run":{self._head},"contract":{json.dumps(record.name)},"case":{body}{tail}}}\n'

    def _slot(self) -> int:
        """The open slot's descriptor."""
        if self.fd is None:
            raise ValueError(f"the journal {self.path} is closed")
        return self.fd

    def begin(self, case: Launch[Any]) -> None:
        """Record ``case`` as in flight (call right before launching it)."""
        os.pwrite(self._slot(), IN_FLIGHT + self._record(case).encode(), 0)

    def begin_many(self, cases: Sequence[Launch[Any]]) -> None:
        """Record a batch of cases of one config checked in one device round trip: the first as the case
        in flight, the others beside it. A fault surfaces only when the batch's results are read back, so the
        journal cannot know which case caused it; ``recover`` says so."""
        record = registry.get(cases[0].contract)
        others = json.dumps([launches.to_record(record, c) for c in cases[1:]], separators=(",", ":"))
        os.pwrite(self._slot(), IN_FLIGHT + self._record(cases[0], f',"batch_of":{others}').encode(), 0)

    def end(self) -> None:
        """The verdict is in: nothing is in flight."""
        os.pwrite(self._slot(), DONE, 0)

    def close(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # An exception (not a dead process) ends the run: whatever was in flight did get a verdict or
        # raised in Python, which the caller reports. Only a dead process leaves a slot behind.
        self.close()


def epoch_text(value: object) -> str:
    """A recorded start time (epoch seconds) as local time, or ``?`` for anything else (a string, NaN,
    1e300, a negative time: records are data a dead or hostile process wrote)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value)) if value > 0 else "?"
    except (OverflowError, ValueError, OSError):
        return "?"


@dataclass
class Crash:
    """An in-flight case recovered from a dead process's slot, written as a case file."""

    path: Path
    case: Launch[Any]
    finding: Finding


#: Where a slot that cannot be read goes (``journal/unusable/``): out of every later run's way, kept
#: for a human to read.
UNUSABLE_DIR = "unusable"


def _read_slot(path: Path) -> Tuple[Optional[dict[str, Any]], Optional[str]]:
    """Return (in_flight_record or None, problem or None) for a slot whose lock we hold."""
    data = path.read_bytes()
    if not data.startswith(IN_FLIGHT):
        return None, None
    line = data[1:].split(b"\n", 1)[0]
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, "holds a torn record (the process died while writing it, before launch)"
    if not isinstance(record, dict):
        return None, "holds a record that is not a JSON object"
    if not isinstance(record.get("run", {}), dict):
        return None, "holds a record whose run is not an object"
    others = record.get("batch_of")
    if others is not None and not (isinstance(others, list) and all(isinstance(b, dict) for b in others)):
        return None, "holds a record whose batch_of is not a list of cases"
    return record, None


def _set_aside(folder: Path, path: Path, problem: str, report: Callable[[str], None]) -> None:
    """Move an unusable slot to ``journal/unusable/`` and say so; the run goes on."""
    line = f"journal slot {printable(path.name)} {problem}"
    try:
        aside = folder / UNUSABLE_DIR
        aside.mkdir(exist_ok=True)
        os.replace(path, aside / path.name)
        line += f"; set aside in {aside}"
        with open(aside / "unusable-slots.log", "a") as fh:
            fh.write(line + "\n")
    except OSError as exc:
        line += f"; could not set it aside ({exc.strerror or exc}): remove it by hand"
    report(line)


def _crash(record: dict[str, Any], path: Path, out_dir: Union[str, Path]) -> Crash:
    """The ``CRASH`` case file of a slot's in-flight case."""
    name = record.get("contract") or casefile.legacy_contract(record.get("case") or {})
    require(isinstance(name, str), "its contract is not a name")
    case = launches.from_record(registry.get(name), record.get("case"))
    run = record.get("run", {})
    others = record.get("batch_of") or []
    where = (f"a batch of {1 + len(others)} cases of this config (this is the first; the others "
             "are in the case file's extras: repro each to find the guilty one)") if others else "this launch"
    finding = Finding(Kind.CRASH, "kernel", "launch",
                      detail=f"process {printable(run.get('pid', '?'))} (run started {epoch_text(run.get('started'))}) "
                             f"died during {where}")
    device = run.get("device", "")
    case_path = casefile.write_case(case, [finding], out_dir=out_dir, device=device if isinstance(device, str) else "",
                                    source="journal", extras={"journal": {"slot": path.name, **run},
                                                              **({"batch_of": others} if others else {})})
    return Crash(case_path, case, finding)


def contracts_in(out_dir: Union[str, Path]) -> List[str]:
    """The contracts named by the in-flight records of ``out_dir``'s journal slots, read as data (an unreadable slot
    names none: ``recover`` sets it aside)."""
    names: List[str] = []
    folder = Path(out_dir) / JOURNAL_DIR
    try:
        paths = sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []
        for path in paths:
            if path.is_file() and not path.is_symlink():
                record, _ = _read_slot(path)
                name = record.get("contract") if record is not None else None
                if isinstance(name, str) and name not in names:
                    names.append(name)
    except OSError:
        pass
    return names


def recover(out_dir: Union[str, Path], report
: Callable[[str], None] = lambda line: None) -> List[Crash]:
    """Turn every in-flight case of a dead process under ``out_dir`` into a ``CRASH`` case file.

    A slot that cannot be read (corrupt, not a file, an unusable case) is moved to ``journal/unusable/``
    and ``report`` gets one line about it: it never stops this run or a later one."""
    folder = Path(out_dir) / JOURNAL_DIR
    if not folder.is_dir():
        return []
    crashes: List[Crash] = []
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        if not path.is_file() or path.is_symlink():
            _set_aside(folder, path, "is not a regular file", report)
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:  # another recoverer took it
            continue
        except OSError as exc:
            _set_aside(folder, path, f"cannot be opened ({exc.strerror or exc})", report)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its owner is alive
            if not path.exists():
                continue
            record, problem = _read_slot(path)
            if record is not None:
                try:
                    crashes.append(_crash(record, path, out_dir))
                except BadInput as exc:
                    problem = f"holds an unusable case: {exc}"
            if problem is not None:
                _set_aside(folder, path, problem, report)
            else:
                os.unlink(path)
        finally:
            os.close(fd)
    return crashes
