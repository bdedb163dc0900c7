"""The upstream release matrix: ``python -m kvfence upstream matrix``.

Which SGLang release is safe under which buffer sizing? Every release of a version range x every sizing x
every contract is one *cell*, fuzzed with a fixed example budget and seed by its own ``python -m kvfence
fuzz`` process (so a cell that crashes, hangs or is refused is that cell's result, never the matrix's end).
Releases come from the registered release cache (``kvfence.release.knowledge.release_cache``: fetched unless
offline); the table is rendered by ``harness/release/matrix_report.py``.

A cell's ``status`` is one of ``STATUSES``. The exit code is about the releases, not the harness: 0 when
every applicable cell of a correct sizing (``SAFE_SIZINGS``) is clean, 1 when one has findings or could not
be checked (error); findings under the buggy sizings (``prefix``, ``fixed``) are expected and only reported.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Set, TextIO, Tuple

from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, BadInput, require
from kvfence.provenance import stamped
from kvfence.release import upstream
from kvfence.release.knowledge import release_cache, shipped
from kvfence.release.wheels import cache_root, check_version, is_version

if TYPE_CHECKING:
    from kvfence.engine.progress import CountBar

#: Cell statuses and what each means (the report's legend).
STATUSES = {
    "clean": "fuzzed with the whole example budget, no finding",
    "findings": "the fuzz found a failing case (kinds listed, case files under <version>/<sizing>-<contract>/cases/)",
    "not-applicable": "the release has no kernel of this contract, or this kvfence build does not check the "
                      "contract yet",
    "abi-unsupported": "the release's kernel fits no launch ABI kvfence knows (reason in the note)",
    "error": "the cell could not be checked: its fuzz process was refused, crashed outside a case or ran past "
             "--cell-timeout (message in the note)",
    "not-cached": "offline and the release is not in the cache (fetch it where PyPI is reachable)",
}
#: Sizings that are correct by the contract: a finding under one of them is a bug in the release.
SAFE_SIZINGS = ("safe", "window-fixed")
#: ``releases.json`` in the cache: the releases the package index listed when last asked (for offline runs).
RELEASES_FILE = "releases.json"
MARKER = "kvfence_release_matrix"
FORMAT = 1


# -- versions -----------------------------------------------------------------------------------------
_KEY = re.compile(r"^([0-9]+(?:\.[0-9]+)*)(?:(a|b|rc)([0-9]+))?(?:\.post([0-9]+))?(?:\.dev([0-9]+))?$")


def version_key(version: str) -> tuple:
    """PEP 440 order for the versions ``check_version`` accepts: dev < a < b < rc < final < post."""
    m = _KEY.match(check_version(version))
    assert m is not None  # check_version admits only versions of this form
    release = [int(x) for x in m.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()  # 0.5 == 0.5.0
    pre = ({"a": 0, "b": 1, "rc": 2}[m.group(2)], int(m.group(3))) if m.group(2) else (3, 0)
    if m.group(5) is not None and not m.group(2) and m.group(4) is None:
        pre = (-1, 0)  # 1.0.dev1 comes before 1.0a1
    post = int(m.group(4)) if m.group(4) is not None else -1
    dev = int(m.group(5)) if m.group(5) is not None else float("inf")
    return (tuple(release), pre, post, dev)


def is_prerelease(version: str) -> bool:
    """An alpha, beta, release candidate or dev release (PEP 440)."""
    m = _KEY.match(check_version(version))
    assert m is not None  # check_version admits only versions of this form
    return bool(m.group(2) or m.group(5) is not None)


def parse_versions(text: str, known: Sequence[str], announce: Optional[Callable[[str], None]] = None) -> List[str]:
    """``--versions``: a comma list of versions and inclusive ranges ``A..B``, expanded against ``known``
    (post releases included; pre-releases only where named, as pip leaves them out of a range: ``announce``
    gets one line naming those a range passed over), sorted and without repeats. An unknown version or an
    empty range is ``BadInput``."""
    require(isinstance(text, str) and text.strip(), "--versions is empty: give A..B, a version, or a comma list")
    known = sorted(set(known), key=version_key)
    chosen: Set[str] = set()
    skipped: List[str] = []

    def known_one(v: str) -> str:
        check_version(v)
        span = f" (known: {known[0]} .. {known[-1]}, {len(known)} releases)" if known else " (no release is known)"
        require(v in known, f"--versions: sglang {v} is not a known release{span}")
        return v

    for item in (part.strip() for part in text.split(",")):
        require(item, f"--versions {text!r}: empty item in the comma list")
        if ".." in item:
            lo, _, hi = item.partition("..")
            lo, hi = known_one(lo.strip()), known_one(hi.strip())
            span = [v for v in known if version_key(lo) <= version_key(v) <= version_key(hi)]
            require(span, f"--versions: range {item} is empty ({lo} comes after {hi})")
            passed = [v for v in span if is_prerelease(v) and v not in (lo, hi)]
            chosen.update(v for v in span if v not in passed)
            skipped.extend(passed)
        else:
            chosen.add(known_one(item))
    left_out = sorted(set(skipped) - chosen, key=version_key)
    if left_out and announce is not None:
        announce(f"kvfence: --versions leaves out the pre-release(s) {', '.join(left_out)} inside its range(s); "
                 "name one in the list to include it")
    return sorted(chosen, key=version_key)


def known_releases(offline: bool, *, announce: Callable[[str], None] = lambda m: None) -> List[str]:
    """Releases a range may name: the cache (entries, remembered refusals, the last index listing),
    ``KVFENCE_WHEEL_DIR``'s wheels, and, online without a wheel folder, the package index (whose listing
    is saved in the cache for later offline runs)."""
    found = set(release_cache().cached_versions())
    listing = cache_root() / RELEASES_FILE
    if listing.is_file():
        try:
            saved = json.loads(listing.read_text(encoding="utf-8"))["versions"]
            found.update(v for v in saved if isinstance(v, str) and is_version(v))
        except (OSError, ValueError, KeyError, TypeError):
            announce(f"kvfence: ignoring {listing}: not a release listing")
    wheel_dir = os.environ.get("KVFENCE_WHEEL_DIR")
    if wheel_dir:
        for wheel in Path(wheel_dir).glob("sglang-*.whl"):
            version = wheel.name.split("-")[1]
            if is_version(version):
                found.add(version)
    elif not offline:
        listed = index_versions()
        found.update(listed)
        listing.parent.mkdir(parents=True, exist_ok=True)
        listing.write_text(json.dumps({"versions": sorted(listed, key=version_key)}, indent=1) + "\n",
                           encoding="utf-8")
    return sorted(found, key=version_key)


def index_versions() -> List[str]:
    """The sglang releases the package index lists (``pip index versions``: pip's own index settings)."""
    # --pre: pre-releases too, so that a range can say which it leaves out and a list can name them.
    cmd = [sys.executable, "-m", "pip", "index", "versions", "sglang", "--pre", "--disable-pip-version-check",
           "--no-input", "--retries", "1", "--timeout", "30"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        proc = None
    line = re.search(r"^Available versions: *(.*)$", proc.stdout, re.M) if proc is not None else None
    if line is None:
        raise BadInput("cannot list sglang releases: the package index is not reachable (no network?); "
                       "use --offline (or KVFENCE_OFFLINE=1) to test the cached releases only")
    return [v.strip() for v in line.group(1).split(",") if is_version(v.strip())]


# -- what the fuzz command checks ----------------------------------------------------------------------
def fuzz_contracts() -> Tuple[str, ...]:
    """Contracts ``fuzz --contract`` checks: every registered one (``kvfence.contract``)."""
    from kvfence.engine import registry

    return tuple(registry.names())


def contract_flags(contract: str) -> List[str]:
    """The fuzz flags that select ``contract``, with those its release knowledge pins (``Shipped.flags``: the
    rail's window is part of its ABI)."""
    return ["--contract", contract, *shipped(contract).flags]


def contract_kernel(contract: str) -> Optional[str]:
    """The function each release's wheel defines for ``contract`` (``Shipped.upstream``), or None."""
    found = shipped(contract).upstream
    return found.function if found is not None else None


def sizing_applies(sizing: str, contract: str) -> bool:
    """Whether the named sizing sizes ``contract``'s rows: one of the sizings its release knowledge pairs with it
    (``Shipped.sizings``; the rail is sized by its ``window-*`` policies, the draft kernel by the others), or any
    of its record's named sizings where it lists none. A cell pairing a sizing with a contract it does not size
    is not applicable."""
    from kvfence.engine import registry

    paired = shipped(contract).sizings
    return sizing in paired if paired else sizing in list(registry.get(contract).sizings)


def check_contracts(names: Sequence[str]) -> List[str]:
    """``--contracts``: registered contract names (``fuzz --contract`` checks each)."""
    allowed = fuzz_contracts()
    for name in names:
        require(name in allowed, f"--contracts: unknown contract {name!r}: choose {', '.join(allowed)}")
    return list(dict.fromkeys(names))


def check_sizings(names: Sequence[str], contracts: Sequence[str]) -> List[str]:
    """``--sizing``: named policies of the contracts in the matrix (a cell's folder is named after its sizing);
    a plug-in sizing (``file.py:attr``) is refused."""
    from kvfence.engine import registry

    known = list(dict.fromkeys(n for c in contracts for n in registry.get(c).sizings))
    for name in names:
        require(name in known, f"--sizing: {name!r} is not a named sizing of {', '.join(contracts)}; the matrix "
                               f"takes {', '.join(known)}")
    return list(dict.fromkeys(names))


def split_list(text: str, flag: str) -> List[str]:
    items = [x.strip() for x in (text or "").split(",")]
    require(text and all(items), f"{flag} {text!r}: expected a comma list with no empty item")
    return items


# -- cells --------------------------------------------------------------------------------------------
@dataclass
class Release:
    """One release of the range: its cache entry's facts, or why it has none (``status``)."""

    version: str
    status: Optional[str] = None  # None: testable; else a cell status for all its cells
    reason: str = ""
    source_path: Optional[str] = None
    abis: Dict[str, str] = field(default_factory=dict)  # kernel -> ABI name


@dataclass
class Cell:
    version: str
    sizing: str
    contract: str
    status: str = "error"
    kinds: List[str] = field(default_factory=list)
    cases: int = 0  # cases verified by the cell's fuzz
    seconds: float = 0.0
    case_files: List[str] = field(default_factory=list)
    message: str = ""
    tool_versions: Dict[str, str] = field(default_factory=dict, repr=False)  # from its summary.json
    #: Config fields pinned because the release's ABI has no parameter for them (fuzz flags).
    pins: List[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.sizing}-{self.contract}"


def prepare(version: str, offline: bool, announce: Callable[[str], None]) -> Release:
    """The release's cache entry (fetched unless offline): testable, or the status of all its cells."""
    cached = release_cache().cached_versions().get(version)
    if offline and cached is None and not os.environ.get("KVFENCE_WHEEL_DIR"):
        return Release(version, "not-cached", f"not in the cache {cache_root()}")
    if cached is None:
        announce(f"kvfence: fetching sglang=={version}")
    try:
        entry = release_cache().fetch(version, offline=offline, announce=announce)
    except upstream.Refused as exc:
        status = "not-applicable" if exc.status == upstream.NO_KERNEL else "abi-unsupported"
        return Release(version, status, str(exc))
    except BadInput as exc:
        return Release(version, "error", str(exc))
    return Release(version, None, "", entry.manifest["source_path"], {k: a.name for k, a in entry.abis.items()})


def settle(release: Release, sizing: str, contract: str, checked: Sequence[str]) -> Cell:
    """The cell's result when it needs no fuzzing, else a ``pending`` cell to fuzz. The draft family's cells
    follow the release's cache entry (its kernels' ABIs: ``Shipped.cache``); another contract's, its kernel
    extracted from the wheel by the kernel source (``kvfence.engine.kernels.release_kernel_file``), or why not."""
    cell = Cell(release.version, sizing, contract)
    kernel = contract_kernel(contract) if shipped(contract).cache else None
    if kernel is None and contract in checked:
        return _settle_release_kernel(cell, release)
    if release.status is not None:
        cell.status, cell.message = release.status, release.reason
    elif contract not in checked or kernel is None:
        cell.status, cell.message = "not-applicable", f"this kvfence build does not check the {contract} contract yet"
    elif kernel not in release.abis:
        cell.status = "not-applicable"
        cell.message = f"sglang=={release.version} has no {kernel} ({release.source_path})"
    elif not sizing_applies(sizing, contract):
        cell.status, cell.message = "not-applicable", f"{sizing} does not size the {contract} kernel's rows"
    else:
        cell.status = "pending"
        if "page_size" not in release_cache().abi_parameters(release.abis[kernel]):
            # 0.4.3-0.4.7: no page_size parameter, so no paged layout to ask of it (the flat one is checked).
            cell.pins = ["--page-size", "1"]
            cell.message = f"page_size pinned to 1: the {release.abis[kernel]} ABI has no page_size"
    return cell


def _settle_release_kernel(cell: Cell, release: Release) -> Cell:
    """A cell of a contract whose kernel the kernel source extracts from the wheel."""
    from kvfence.engine import registry
    from kvfence.engine.kernels import release_kernel_file

    record = registry.get(cell.contract)
    if release.status == "not-cached":
        cell.status, cell.message = release.status, release.reason
    elif not sizing_applies(cell.sizing, cell.contract):
        cell.status, cell.message = "not-applicable", f"{cell.sizing} does not size the {cell.contract} kernel's rows"
    else:
        try:
            release_kernel_file(record, f"{upstream.SPEC_PREFIX}{release.version}")
            cell.status = "pending"
        except upstream.Refused as exc:
            cell.status = "not-applicable" if exc.status == upstream.NO_KERNEL else "abi-unsupported"
            cell.message = str(exc)
        except BadInput as exc:
            cell.status, cell.message = "error", str(exc)
    return cell


@dataclass
class Settings:
    """What every cell's fuzz gets (one budget and seed for all)."""

    device: str
    max_examples: int
    seed: int
    shrink_seconds: float
    cell_timeout: float
    max_gpu_mem: Optional[int]
    extra: List[str] = field(default_factory=list)


def fuzz_command(cell: Cell, out: Path, s: Settings) -> List[str]:
    spec = f"{upstream.SPEC_PREFIX}{cell.version}"
    if shipped(cell.contract).cache and contract_kernel(cell.contract) != release_cache().kernel:
        spec += f":{contract_kernel(cell.contract)}"
    cmd = [sys.executable, "-m", "kvfence", "fuzz", "--kernel", spec, "--sizing", cell.sizing, "--device", s.device,
           "--max-examples", str(s.max_examples), "--seed", str(s.seed), "--shrink-seconds", str(s.shrink_seconds),
           "--database", "none", "--jobs", "1", "--quiet", "--out", str(out), *contract_flags(cell.contract)]
    if s.max_gpu_mem is not None:
        cmd += ["--max-gpu-mem", str(s.max_gpu_mem)]
    return cmd + cell.pins + s.extra


def _child_env() -> Dict[str, str]:
    # The cache as the parent left it, never the network; the same installed kvfence the parent runs.
    return dict(os.environ, KVFENCE_OFFLINE="1", KVFENCE_CACHE=str(cache_root()))


class Running:
    """One cell's fuzz process, in a process group of its own (killed whole on a timeout)."""

    def __init__(self, cell: Cell, out: Path, s: Settings):
        self.cell, self.out, self.settings = cell, out, s
        out.mkdir(parents=True, exist_ok=True)
        self.log = out / "fuzz.log"
        self.start = time.monotonic()
        with open(self.log, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(fuzz_command(cell, out, s), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=_child_env(), start_new_session=True)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this process started: fuzz and its worker
        except ProcessLookupError:
            pass
        self.proc.wait()

    def poll(self) -> Optional[Cell]:
        """The finished cell, or None while it runs."""
        elapsed = time.monotonic() - self.start
        if self.proc.poll() is None:
            if elapsed <= self.settings.cell_timeout:
                return None
            self.kill()
            self.cell.status = "error"
            self.cell.message = f"ran past --cell-timeout {self.settings.cell_timeout:g} s; killed"
        else:
            read_result(self.cell, self.proc.returncode, self.out, self.log)
        self.cell.seconds = round(elapsed, 2)
        return self.cell


def read_result(cell: Cell, rc: int, out: Path, log: Path) -> None:
    """Fill ``cell`` from its fuzz's exit code and ``summary.json``."""
    summary = None
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    if rc in (EXIT_CLEAN, EXIT_FINDINGS) and isinstance(summary, dict) and isinstance(summary.get("findings"), list):
        cell.cases = int(summary.get("verified_cases") or 0)
        cell.kinds = sorted({f.get("kind", "?") for f in summary["findings"]})
        cell.case_files = sorted(summary.get("cases") or {})
        cell.status = "findings" if rc == EXIT_FINDINGS or cell.kinds else "clean"
        cell.tool_versions = summary.get("versions") or {}
        if rc == EXIT_FINDINGS and not cell.kinds:
            cell.status, cell.message = "error", "fuzz exited 1 without a finding in its summary.json"
        return
    cell.status = "error"
    cell.message = f"fuzz {_rc_text(rc)}: {_last_line(log)}" + (f" ({cell.message})" if cell.message else "")


def _rc_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited {rc}"


def _last_line(log: Path) -> str:
    """The line that says what went wrong: kvfence's own error line, else the log's last line."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if line.startswith("kvfence: error:")]
    text = (errors or lines or ["no output"])[-1]
    return text.removeprefix("kvfence: error: ")[:400]


# -- the matrix ---------------------------------------------------------------------------------------
def exit_code(cells: Sequence[Cell]) -> int:
    """1 when a cell of a correct sizing has findings or could not be checked, else 0."""
    bad = [c for c in cells if c.sizing in SAFE_SIZINGS and c.status in ("findings", "error")]
    return EXIT_FINDINGS if bad else EXIT_CLEAN


def run(*, versions: List[str], sizings: List[str], contracts: List[str], settings: Settings, offline: bool,
        out: Path, json_path: Optional[Path], jobs: int, progress: Optional[TextIO],
        write: Callable[[dict, Path], None]) -> Tuple[dict, Optional[str]]:
    """Fuzz every cell; ``write(doc, out)`` renders the reports after every cell (a killed run keeps what it
    had). Returns the document and the signal name if SIGINT/SIGTERM stopped it. ``progress``: the stream
    of a bar over the cells, with a line of its own for each cell that decides the exit code (a correct
    sizing's findings, an error); ``None``: quiet."""
    from kvfence.engine.progress import CountBar

    def announce(text: str) -> None:
        if progress is not None:
            progress.write(text + "\n")
            progress.flush()

    started, t0 = time.time(), time.monotonic()
    checked = fuzz_contracts()
    releases = [prepare(v, offline, announce) for v in versions]
    require(any(r.status != "not-cached" for r in releases),
            f"none of the {len(releases)} release(s) in --versions is in the cache {cache_root()} and "
            "fetching is off (--offline / KVFENCE_OFFLINE=1): nothing to test")
    cells = [settle(r, sizing, contract, checked) for r in releases for sizing in sizings for contract in contracts]
    doc = {MARKER: FORMAT, "versions": versions, "sizings": sizings, "contracts": contracts,
           "safe_sizings": list(SAFE_SIZINGS), "device": settings.device, "max_examples": settings.max_examples,
           "seed": settings.seed, "shrink_seconds": settings.shrink_seconds, "cell_timeout": settings.cell_timeout,
           "jobs": jobs, "offline": offline, "cache": str(cache_root()), "started_at": started,
           "releases": [asdict(r) for r in releases], "statuses": STATUSES, "tool_versions": {}}
    matrix = _Matrix(doc, cells, out, json_path, write, t0,
                     CountBar(len(cells), "cells", progress) if progress is not None else None)
    for cell in cells:
        if cell.status != "pending":
            matrix.emit(cell)
    # The correct sizings first (their verdict is the exit code, and their full budget compiles the
    # kernel variants the other sizings' cells of the same release then find in Triton's cache).
    queue = sorted([c for c in cells if c.status == "pending"],
                   key=lambda c: (c.sizing not in SAFE_SIZINGS, sizings.index(c.sizing)))
    interrupted = matrix.drive(queue, settings, jobs)
    if matrix.bar is not None:
        matrix.bar.close()
    matrix.save(interrupted)
    return doc, interrupted


class _Matrix:
    """A release matrix under way: its document, its cells, where it writes, and its progress bar."""

    def __init__(self, doc: dict, cells: List[Cell], out: Path, json_path: Optional[Path],
                 write: Callable[[dict, Path], None], t0: float, bar: Optional[CountBar]) -> None:
        self.doc, self.cells, self.out, self.json_path, self.write = doc, cells, out, json_path, write
        self.t0, self.bar = t0, bar  # t0: the run's start (time.monotonic), which elapsed_s counts from

    def emit(self, cell: Cell) -> None:
        """A settled cell on the bar (a line of its own when it decides the exit code)."""
        what = cell.status + (f" {', '.join(cell.kinds)}" if cell.kinds else "")
        more = f" ({cell.cases} cases, {cell.seconds:.1f} s)" if cell.status in ("clean", "findings") else \
            (f": {cell.message}" if cell.message and cell.status == "error" else "")
        text = f"sglang=={cell.version} {cell.sizing} {cell.contract}: {what}{more}"
        if self.bar is not None:
            if cell.status == "error" or (cell.status == "findings" and cell.sizing in SAFE_SIZINGS):
                self.bar.note(f"kvfence: {text}")
            self.bar.advance(text[:100])
        if cell.tool_versions and not self.doc["tool_versions"]:
            self.doc["tool_versions"] = cell.tool_versions

    def save(self, interrupted: Optional[str] = None) -> None:
        """The document with the cells settled so far, rendered and written."""
        cells = self.cells
        self.doc.update(cells=[_cell_dict(c) for c in cells if c.status != "pending"],
                        pending=sum(c.status == "pending" for c in cells), interrupted=interrupted,
                        elapsed_s=round(time.monotonic() - self.t0, 2), exit_code=exit_code(cells))
        self.write(self.doc, self.out)
        _write_json(self.out / "matrix.json", self.doc)
        if self.json_path is not None:
            _write_json(self.json_path, self.doc)

    def drive(self, queue: List[Cell], settings: Settings, jobs: int) -> Optional[str]:
        """Run the ``queue``'s cells, ``jobs`` at a time, each saved as it settles; returns the signal's name if
        SIGINT/SIGTERM stopped the run (the cells running are then killed)."""
        from kvfence.engine.interrupt import signals_interrupt

        running: List[Running] = []
        with signals_interrupt():
            try:
                while queue or running:
                    while queue and len(running) < jobs:
                        cell = queue.pop(0)
                        running.append(Running(cell, self.out / cell.version / cell.name, settings))
                    for r in list(running):
                        done = r.poll()
                        if done is not None:
                            running.remove(r)
                            self.emit(done)
                            self.save()
                    time.sleep(0.1)
            except KeyboardInterrupt as exc:
                for r in running:
                    r.kill()
                return getattr(exc, "signal_name", "SIGINT")
        return None


def _cell_dict(c: Cell) -> dict:
    return {"version": c.version, "sizing": c.sizing, "contract": c.contract, "status": c.status, "kinds": c.kinds,
            "cases": c.cases, "seconds": c.seconds, "case_files": c.case_files, "message": c.message,
            "pins": c.pins}


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(stamped(doc), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
