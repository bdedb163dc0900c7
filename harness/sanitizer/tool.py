"""compute-sanitizer, folded into kvfence's findings.

Canaries see what compute-sanitizer cannot: writes that stay inside one allocation (a row overflowing
into the next row) or inside memory PyTorch's caching allocator already owns. compute-sanitizer sees
what canaries cannot: out-of-range reads, races, uninitialised reads. This module runs one case per
tool in its own process (the first memory error destroys the CUDA context), parses the XML report
(the text log of the same run is the fallback) and turns it into ``Finding``s.

How each case is run under a tool (``tool_command`` + ``case_env``):

* the child is ``python -m kvfence.sanitizer_child STATUS repro CASE --device cuda --layout production
  --no-absorb``: rows contiguous and nothing after kv_indices' last row, so an overflow past the buffer
  leaves the allocation as in production; the child writes its own exit code to ``STATUS``
  (compute-sanitizer replaces it when it reports errors);
* ``caching=False`` sets ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``: every tensor is its own cudaMalloc, so
  memcheck can see a write past kv_indices (with the caching allocator on, the write lands in memory
  the allocator owns and memcheck reports nothing). The plain sweep uses it for eager cases; graph
  cases keep the allocator on (``default_caching``);
* **initcheck never gets a kernel-name filter.** With ``--kernel-name``, kernels outside the filter are
  not instrumented, so initcheck never sees their stores: every buffer PyTorch fills (``zeros``,
  ``arange``, the canary ``where``) stays "uninitialised" in its shadow memory. Each later host copy of
  such a buffer (``clone`` / ``copy_`` / ``.tolist()`` / ``.item()``, i.e. cudaMemcpy) is then reported as
  "Host API uninitialized memory access", and each kernel read of a PyTorch-filled input as an
  uninitialised ``__global__`` read (the fixture ``sanitizer_initcheck_reference``: 6144 errors on a clean
  launch, the records kept all at the prefix-token load of ``req_to_token``, which ``slot_table`` builds
  with torch ops). kvfence initialises every element it copies (guarded buffers are fully written by
  ``reset``, inputs are ``zeros``/``ones``), so the unfiltered run is the check that means something.
  This is read from the logs and the code; ``bash benchmarks/gpu.sh sanitizer-clean`` confirms it on a GPU
  (a clean case under initcheck with and without the filter);
* every signal counts (``signal_findings``): the tool's exit code (``--error-exitcode``), its summary
  line, an unreadable XML report, a timeout, and the child's own status become ``SANITIZER_TOOL_ERROR``
  findings carrying the log path, never silence.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from kvfence.engine.findings import Finding, Kind
from kvfence.errors import BadInput, require

TOOLS = ("memcheck", "initcheck", "racecheck", "synccheck")
KIND_OF_TOOL = {"memcheck": Kind.SANITIZER_MEMCHECK, "initcheck": Kind.SANITIZER_INITCHECK,
                "racecheck": Kind.SANITIZER_RACECHECK, "synccheck": Kind.SANITIZER_SYNCCHECK}
#: compute-sanitizer's exit code when it found errors (``--error-exitcode``).
ERROR_EXIT = 86
#: Bytes of padding memcheck puts after every allocation (``--padding``): small overflows hit it.
PADDING_BYTES = 256
#: Default name filter: the kernel under test (verification kernels and helpers are not checked).
DEFAULT_KERNEL_FILTER = "generate_draft_decode_kv_indices"
#: Exit codes a child's own verdict may have: 0 clean, 1 the case reproduces.
CHILD_VERDICTS = (0, 1)


def locate(env: Optional[Dict[str, str]] = None, default_root: str = "/usr/local/cuda") -> str:
    """Path of compute-sanitizer: ``PATH``, then ``$CUDA_HOME/bin``, then ``/usr/local/cuda/bin``."""
    environ: Mapping[str, str] = os.environ if env is None else env
    found = shutil.which("compute-sanitizer", path=environ.get("PATH"))
    if found:
        return found
    for root in (environ.get("CUDA_HOME"), environ.get("CUDA_PATH"), default_root):
        if root:
            candidate = Path(root, "bin", "compute-sanitizer")
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise BadInput("compute-sanitizer not found (looked in PATH, $CUDA_HOME/bin, /usr/local/cuda/bin); "
                   "install the CUDA toolkit or put it on PATH")


def kernel_filter_for(kernel: str, contract: str) -> Optional[str]:
    """The ``--kernel-name`` filter for a kernel spec of ``contract``: the reference kernel's name for the
    reference and its mutants (a patched copy keeps the name), the release's function for a release, else None
    (check every kernel): a plug-in's CUDA kernel names kvfence does not know (a launcher may run several)."""
    from kvfence.engine import registry
    from kvfence.engine.kernels import reference_spec, references, release_source
    from kvfence.release.knowledge import shipped

    record = registry.get(contract)
    if kernel in references(record) or kernel.startswith("mutant:"):
        return reference_spec(record).rpartition(":")[2]
    if release_source(kernel):
        upstream = shipped(contract).upstream
        return upstream.function if upstream is not None else None
    return None


def tool_command(exe: str, tool: str, target: Sequence[str], *, xml_path: Path,
                 kernel_filter: Optional[str] = DEFAULT_KERNEL_FILTER,
                 padding: Optional[int] = None) -> List[str]:
    """The compute-sanitizer command line for one tool around ``target`` (the child's argv).

    ``padding`` (memcheck only): bytes memcheck adds after every allocation, so a short overflow past
    an allocation's end lands in memory memcheck knows is not the allocation's.
    """
    require(tool in TOOLS, f"unknown sanitizer tool {tool!r}: choose {', '.join(TOOLS)}")
    require(padding is None or tool == "memcheck", f"--padding is a memcheck option, not {tool}'s")
    cmd = [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "0",
           "--xml", "--save", str(xml_path)]
    if kernel_filter and tool != "initcheck":  # initcheck: see the module docstring
        # kns=: kernel names containing this string (Triton names the CUDA kernel after the function).
        cmd += ["--kernel-name", f"kns={kernel_filter}"]
    if padding:
        cmd += ["--padding", str(padding)]
    return cmd + list(target)


#: The tool watches the repro process itself (no worker: the launch must happen in the traced process,
#: once). The sweep checked the case files before (a plug-in kernel runs only when named with --kernel),
#: so the child trusts them (kvfence.engine.repro.require_trusted).
REPRO_FLAGS = ("--in-process", "--trust-case")
#: Every contract's tables laid out as production does: rows contiguous, no tail guard, so an overflow past the
#: last row leaves the allocation, where memcheck sees it.
LAYOUT_FLAGS = ("--layout", "production", "--no-absorb")


def repro_target(case_path: Path, *, status_path: Path, python: str = sys.executable,
                 kernel: Optional[str] = None, mode: Optional[str] = None) -> List[str]:
    """The child each tool runs: the case, in the production layout (``LAYOUT_FLAGS``), its own exit code
    written to ``status_path`` (``kvfence.sanitizer_child``)."""
    cmd = [python, "-m", "kvfence.sanitizer_child", str(status_path), "repro", str(case_path), "--device", "cuda",
           *LAYOUT_FLAGS, *REPRO_FLAGS]
    if kernel is not None:
        cmd += ["--kernel", kernel]
    if mode is not None:
        cmd += ["--mode", mode]
    return cmd


def default_caching(mode: str) -> bool:
    """The plain sweep's allocator choice: off in eager mode (memcheck sees overflows), on in graph mode."""
    return mode != "eager"


def case_env(caching, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment of a sanitizer child: PyTorch's caching allocator on or off (``caching`` may also be
    a mode name, meaning ``default_caching(mode)``)."""
    if isinstance(caching, str):
        caching = default_caching(caching)
    env = dict(os.environ if base is None else base)
    env.pop("TRITON_INTERPRET", None)
    if caching:
        env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    else:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


# -- parsing --------------------------------------------------------------------------------------------
@dataclass
class Record:
    """One compute-sanitizer report: a device error (``Precise``, ``Initcheck``, ...) or an API error."""

    kind: str
    text: str
    kernel: str = ""
    location: str = ""
    access: str = ""  # read / write
    size: Optional[int] = None
    address: Optional[int] = None
    thread: Optional[tuple] = None
    block: Optional[tuple] = None
    error: str = ""
    nearest: str = ""  # "65 bytes after the nearest allocation at 0x... of size 32 bytes" (text log only)


def _xyz(node) -> Optional[tuple]:
    if node is None:
        return None
    return tuple(int(node.findtext(a, "0")) for a in ("x", "y", "z"))


def parse_xml(text: str) -> List[Record]:
    """Records of a ``--xml --save`` report. ``BadInput`` if it is not compute-sanitizer XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise BadInput(f"sanitizer XML does not parse: {exc}") from None
    require(root.tag == "ComputeSanitizerOutput", f"not a compute-sanitizer report (root <{root.tag}>)")
    out = []
    for rec in root.findall("record"):
        what, where, who = rec.find("what"), rec.find("where"), rec.find("who")
        address = what.findtext("address") if what is not None else None
        size = what.findtext("size") if what is not None else None
        out.append(Record(
            kind=rec.findtext("kind", ""),
            text=(what.findtext("text", "") if what is not None else "").strip(),
            kernel=where.findtext("func", "") if where is not None else "",
            location=(f"{Path(where.findtext('path', '')).name}:{where.findtext('line', '')}"
                      if where is not None and where.findtext("path") else ""),
            access=what.findtext("direction", "") if what is not None else "",
            size=int(size) if size else None,
            address=int(address, 16) if address else None,
            thread=_xyz(who.find("threadIdx")) if who is not None else None,
            block=_xyz(who.find("blockIdx")) if who is not None else None,
            error=(what.findtext("error", "") if what is not None else ""),
        ))
    return out


_HEAD = re.compile(r"^========= (Invalid __\w+__ (read|write) of size (\d+) bytes"
                   r"|Uninitialized __\w+__ memory (read|write) of size (\d+) bytes"
                   r"|Program hit (\w+) .*|(?:Race|Error|Warning).*hazard.*|Barrier error.*"
                   r"|Host API .*)$")
_AT = re.compile(r"^=========\s+at (\S+?)\+0x[0-9a-f]+ in (\S+)$")
_WHO = re.compile(r"^=========\s+by thread \((\d+),(\d+),(\d+)\) in block \((\d+),(\d+),(\d+)\)")
_ADDR = re.compile(r"^=========\s+(?:Access to|Address) (0x[0-9a-f]+)")
_NEAR = re.compile(r"^=========\s+and is (.+)$")


def parse_text(text: str) -> List[Record]:
    """Records of compute-sanitizer's text log (the fallback when the XML is missing or broken)."""
    out: List[Record] = []
    for line in text.splitlines():
        head = _HEAD.match(line)
        if head:
            message = head.group(1)
            if head.group(6):
                out.append(Record("Api", message, error=head.group(6)))
            else:
                access = head.group(2) or head.group(4) or ""
                size = head.group(3) or head.group(5)
                # A host API call (cudaMemcpy, ...) touching memory initcheck considers uninitialised.
                kind = ("Initcheck" if message.startswith("Uninitialized")
                        else "HostApi" if message.startswith("Host API") else "Precise")
                out.append(Record(kind, message, access=access, size=int(size) if size else None))
            continue
        if not out:
            continue
        rec = out[-1]
        if (m := _AT.match(line)) and not rec.kernel:
            rec.kernel, rec.location = m.group(1), m.group(2)
        elif (m := _WHO.match(line)) and rec.thread is None:
            rec.thread = tuple(map(int, m.group(1, 2, 3)))
            rec.block = tuple(map(int, m.group(4, 5, 6)))
        elif (m := _ADDR.match(line)) and rec.address is None:
            rec.address = int(m.group(1), 16)
        elif (m := _NEAR.match(line)) and not rec.nearest:
            rec.nearest = m.group(1)
    return out


def error_summary(text: str) -> Optional[int]:
    """The tool's own count from its summary line: ``ERROR SUMMARY: N errors`` (memcheck, initcheck,
    synccheck) or ``RACECHECK SUMMARY: N hazards displayed`` (racecheck); None when the log has neither."""
    m = re.search(r"ERROR SUMMARY: (\d+) error", text) or re.search(r"RACECHECK SUMMARY: (\d+) hazard", text)
    return int(m.group(1)) if m else None


def merge_nearest(xml_records: List[Record], text_records: List[Record]) -> None:
    """Copy the text log's 'distance to the nearest allocation' onto XML records with the same address."""
    by_address = {r.address: r.nearest for r in text_records if r.address is not None and r.nearest}
    for r in xml_records:
        if not r.nearest and r.address in by_address:
            r.nearest = by_address[r.address]


def to_findings(tool: str, records: List[Record]) -> List[Finding]:
    """One ``Finding`` per distinct (report kind, message, kernel, location): count, first address,
    thread/block and nearest allocation of the first occurrence."""
    groups: Dict[tuple, List[Record]] = {}
    for r in records:
        groups.setdefault((r.kind, r.text, r.kernel, r.location, r.error), []).append(r)
    findings = []
    for (kind, text, kernel, location, error), recs in groups.items():
        first = recs[0]
        extra = {"tool": tool, "record_kind": kind, "message": text, "kernel": kernel, "location": location,
                 "access": first.access, "size": first.size, "error": error, "count": len(recs),
                 "address": hex(first.address) if first.address is not None else None,
                 "thread": list(first.thread) if first.thread else None,
                 "block": list(first.block) if first.block else None, "nearest_allocation": first.nearest or None}
        where = f" in {kernel} at {location}" if kernel else ""
        who = f", first by thread {first.thread} in block {first.block}" if first.thread else ""
        near = f"; {first.nearest}" if first.nearest else ""
        at = f" at {hex(first.address)}" if first.address is not None else ""
        findings.append(Finding(KIND_OF_TOOL[tool], kernel or "cuda-api", kind, 0, len(recs),
                                detail=f"{len(recs)} x {text}{where}{at}{who}{near}", extra=extra))
    return findings


# -- running ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """How one tool run is set up: the tool, memcheck's ``--padding`` and PyTorch's caching allocator
    (``caching=None``: ``default_caching(mode)``). ``name`` labels it in reports and file names."""

    tool: str
    padding: Optional[int] = None
    caching: Optional[bool] = None
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or self.tool

    def caching_for(self, mode: str) -> bool:
        return default_caching(mode) if self.caching is None else self.caching


def sweep_variant(tool: str, mode: str) -> Variant:
    """The plain sweep's run of ``tool``: memcheck gets ``--padding`` when the allocator is off."""
    caching = default_caching(mode)
    return Variant(tool, padding=PADDING_BYTES if tool == "memcheck" and not caching else None, caching=caching)


@dataclass
class ToolVerdict:
    """What one tool said about one case: its records as findings, and its own signals."""

    tool: str
    variant: str
    exit_code: Optional[int]
    seconds: float
    findings: List[Finding] = field(default_factory=list)  # the tool's records
    tool_errors: List[Finding] = field(default_factory=list)  # SANITIZER_TOOL_ERROR
    source: str = "xml"  # xml | text | none
    timed_out: bool = False
    errors: Optional[int] = None  # the summary line's count
    child_exit: Optional[int] = None  # the child's own exit code (None: it left no status)
    log: str = ""

    @property
    def all_findings(self) -> List[Finding]:
        return self.findings + self.tool_errors

    def to_dict(self) -> dict:
        return {"tool": self.tool, "variant": self.variant, "exit_code": self.exit_code,
                "seconds": round(self.seconds, 3), "source": self.source, "timed_out": self.timed_out,
                "errors": self.errors, "child_exit": self.child_exit, "log": self.log,
                "findings": [f.to_dict() for f in self.findings],
                "tool_errors": [f.to_dict() for f in self.tool_errors]}


def run_process(cmd: Sequence[str], env: Dict[str, str], timeout: float):
    """Run ``cmd`` in its own process group; on timeout kill that group (compute-sanitizer and the child
    under it). Returns ``(exit code or None, timed out, seconds, stdout+stderr)``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, False, time.perf_counter() - t0, out or ""
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this call created, nothing else
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return None, True, time.perf_counter() - t0, out or ""


def read_status(path: Path) -> Optional[dict]:
    """The child's ``{"exit": N[, "error": ...]}`` (``kvfence.sanitizer_child``), or None if it left none."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("exit"), int) else None


def _bad_input_line(log: str) -> str:
    lines = [line for line in log.splitlines() if line.startswith("kvfence: error:")]
    return lines[-1] if lines else "no 'kvfence: error:' line in the log"


def tool_error(tool: str, problem: str, log: str) -> Finding:
    return Finding(Kind.SANITIZER_TOOL_ERROR, tool, "run", detail=f"{problem} (log {log})",
                   extra={"tool": tool, "problem": problem, "log": log})


def signal_findings(tool: str, *, exit_code: Optional[int], timed_out: bool, timeout: float,
                    summary: Optional[int], records: int, xml_problem: Optional[str], child: Optional[dict],
                    log: str, log_text: str = "") -> List[Finding]:
    """``SANITIZER_TOOL_ERROR`` findings for every signal of one run that is not a clean, consistent
    verdict: timeout, missing summary, summary vs parsed records, exit code vs report, unreadable XML,
    and the child's own status."""
    problems: List[str] = []
    if timed_out:
        problems.append(f"timed out after {timeout:g} s; its process group was killed")
    else:
        if xml_problem:
            problems.append(xml_problem)
        found = records > 0 or bool(summary)
        if summary is None:
            problems.append("no summary line (ERROR SUMMARY / RACECHECK SUMMARY): the tool did not finish")
        elif summary and not records:
            problems.append(f"the summary counts {summary} error(s) but no record was parsed")
        elif summary == 0 and records:
            problems.append(f"{records} record(s) parsed but the summary counts 0")
        if found and exit_code != ERROR_EXIT:
            problems.append(f"errors reported but exit code {exit_code}, not --error-exitcode {ERROR_EXIT}")
        if not found and exit_code == ERROR_EXIT:
            problems.append(f"exit code {ERROR_EXIT} (--error-exitcode) but no error reported")
        # After a memory error memcheck has killed the CUDA context, so the child's next CUDA call
        # raises: expected, but still said, since it also hides any later verdict of the child.
        after = " after the tool's report (a memory error kills the CUDA context)" if found else ""
        child_problem = _child_problem(child, log_text, f"tool exit {exit_code}", after)
        if child_problem:
            problems.append(child_problem)
        elif not found and child is not None and exit_code != child["exit"]:  # None: a problem above
            problems.append(f"compute-sanitizer exited {exit_code} but its child exited {child['exit']}")
    return [tool_error(tool, p, log) for p in problems]


def _child_problem(child, log_text: str, exit_text: str, after: str = "") -> str:
    """What is wrong with a sanitizer child's own status (``kvfence.sanitizer_child``), or ``""``."""
    if child is None:
        return f"the child left no status: it died before its verdict ({exit_text})"
    if child["exit"] == 2:
        return f"the child rejected its input (exit 2): {_bad_input_line(log_text)}"
    if child["exit"] not in CHILD_VERDICTS:
        return f"the child exited {child['exit']}{after}: {child.get('error', 'no message')}"
    return ""


def _parse_report(xml_path: Path, log_text: str):
    """(records, source, problem): the XML's records, else the text log's; a problem when the XML is
    missing or unreadable (the text log's records are then used, and the problem is still reported)."""
    text_records = parse_text(log_text)
    problem = None
    if xml_path.is_file():
        try:
            records = parse_xml(xml_path.read_text(errors="replace"))
            merge_nearest(records, text_records)
            return records, "xml", None
        except BadInput as exc:
            problem = f"XML report {xml_path.name} unusable: {exc}"
    else:
        problem = f"no XML report written ({xml_path.name})"
    return (text_records, "text", problem) if text_records else ([], "none", problem)


def run_tool(exe: str, tool, case_path: Path, mode: str, work: Path, *, timeout: float = 300.0,
             kernel_filter: Optional[str] = DEFAULT_KERNEL_FILTER, kernel: Optional[str] = None,
             python: str = sys.executable) -> ToolVerdict:
    """Run one case under one tool (a name or a ``Variant``) in its own process; parse XML, else the text
    log; fold every signal of the run into findings."""
    variant = tool if isinstance(tool, Variant) else sweep_variant(tool, mode)
    stem = f"{case_path.stem}.{mode}.{variant.label.replace(' ', '_')}"
    xml_path, log_path, status_path = (work / f"{stem}.xml", work / f"{stem}.log", work / f"{stem}.status.json")
    for stale in (xml_path, status_path):
        stale.unlink(missing_ok=True)
    target = repro_target(case_path, status_path=status_path, python=python, kernel=kernel, mode=mode)
    cmd = tool_command(exe, variant.tool, target, xml_path=xml_path, kernel_filter=kernel_filter,
                       padding=variant.padding)
    code, timed_out, seconds, log = run_process(cmd, case_env(variant.caching_for(mode)), timeout)
    log_path.write_text(log)
    records, source, xml_problem = _parse_report(xml_path, log)
    summary = error_summary(log)
    child = read_status(status_path)
    errors = signal_findings(variant.tool, exit_code=code, timed_out=timed_out, timeout=timeout, summary=summary,
                             records=len(records), xml_problem=xml_problem, child=child, log=str(log_path),
                             log_text=log)
    return ToolVerdict(variant.tool, variant.label, code, seconds, to_findings(variant.tool, records), errors, source,
                       timed_out, summary, child["exit"] if child else None, str(log_path))


def baseline(case_path: Path, mode: str, work: Path, *, caching: Optional[bool] = None, timeout: float = 300.0,
             kernel: Optional[str] = None, python: str = sys.executable):
    """The same child (same layout, flags and allocator) without a sanitizer: the slowdown's denominator.
    Returns ``(seconds, child exit or None, findings)``; a child that died, raised or rejected its input is
    a ``SANITIZER_TOOL_ERROR`` of the ``baseline`` run."""
    stem = f"{case_path.stem}.{mode}.baseline"
    log_path, status_path = work / f"{stem}.log", work / f"{stem}.status.json"
    status_path.unlink(missing_ok=True)
    target = repro_target(case_path, status_path=status_path, python=python, kernel=kernel, mode=mode)
    code, timed_out, seconds, log = run_process(target, case_env(default_caching(mode) if caching is None
                                                                 else caching), timeout)
    log_path.write_text(log)
    child = read_status(status_path)
    problems = []
    if timed_out:
        problems.append(f"timed out after {timeout:g} s; its process group was killed")
    elif _child_problem(child, log, f"exit {code}"):
        problems.append(_child_problem(child, log, f"exit {code}"))
    return seconds, (child["exit"] if child else None), [tool_error("baseline", p, str(log_path)) for p in problems]
