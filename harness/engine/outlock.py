"""One run at a time per ``--out`` folder (fuzz, ``report --merge``, ``upstream matrix``): a lock, so two runs
never lose each other's findings.

Two runs writing the same folder would set each other's case files aside (``kvfence.engine.outdir``) and
replace each other's ``summary.json`` and reports, so one run's findings would vanish from the folder.
The second run is refused instead, before it writes anything: one line naming the running one's pid,
host and start time, exit 2.

The lock is ``OUT/.kvfence.lock``, held with ``flock`` for the whole run. The kernel drops an ``flock``
when its holder dies, however it dies (SIGKILL, OOM killer), so a lock is never stale in the sense of
being held by nobody; what stays behind is the file and the dead run's record in it (a run that ends
normally removes the file). A run that finds
such a record takes the lock over and says so on stderr (that run never wrote its summary: its case
files, if any, are still in ``cases/``, and ``fuzz --resume`` recovers a case it died on). The record
(pid, host, start time, command) is what the refusal and the note name; the lock itself is the
``flock``, so a recycled pid can never make a live lock look dead or a dead one look live.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

from kvfence.engine.journal import epoch_text
from kvfence.errors import BadInput, printable, redact_word

LOCK_NAME = ".kvfence.lock"

#: Locks this process holds, by folder (``release_all`` ends them when the command returns).
_HELD: Dict[str, Tuple[int, Path]] = {}


def _describe(record: dict[str, Any]) -> str:
    """The record as one safe line: it is data another process wrote (a dead run, or anyone who can
    write the folder), so no field can break the line or reach the terminal as an escape code."""
    return (f"pid {printable(record.get('pid', '?'))} on {printable(record.get('host', '?'))}, "
            f"started {epoch_text(record.get('started'))}")


def _read(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        record = json.loads(raw.decode() or "{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def acquire(out_dir: Path, announce: Callable[[str], None]) -> None:
    """Hold ``out_dir``'s lock until ``release_all`` (or this process ends); ``BadInput`` if another run
    holds it. Creates ``out_dir`` (the caller has validated everything else by now)."""
    import fcntl

    out_dir = Path(out_dir)
    key = str(out_dir.resolve())
    if key in _HELD:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise BadInput(f"--out {out_dir}: cannot open the run lock {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            record = _read(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise BadInput(f"--out {out_dir} is in use by another kvfence run ({_describe(record)}; lock "
                               f"{path}): wait for it or choose another --out") from None
            raise BadInput(f"--out {out_dir}: cannot lock {path}: {exc.strerror or exc}") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the run that held it removed the file as we opened it: lock the new one
    earlier = _read(fd)
    if earlier.get("pid") is not None:
        announce(f"kvfence: note: took over the lock of a run that ended without releasing it "
                 f"({_describe(earlier)}); its case files stay in {out_dir / 'cases'}")
    record = {"pid": os.getpid(), "host": platform.node(), "started": time.time(),
              # No URL credential in the record (a --database redis://:PASSWORD@...): it outlives a killed run.
              "command": [redact_word(word) for word in sys.argv[:12]]}
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(record).encode())
    except OSError as exc:  # a full disk (ENOSPC, EDQUOT) or a read-only one, before the run wrote anything
        os.close(fd)
        raise BadInput(f"--out {out_dir}: cannot write the run lock record {path}: {exc.strerror or exc} "
                       f"({errno.errorcode.get(exc.errno or 0, exc.errno)})") from None  # errno 0 has no name
    _HELD[key] = (fd, path)


def release_all() -> None:
    """End every lock this process holds: the file is removed while still locked (a clean end leaves
    nothing behind; ``acquire`` re-checks the inode it locked), then the ``flock`` goes with the descriptor."""
    while _HELD:
        _, (fd, path) = _HELD.popitem()
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)
