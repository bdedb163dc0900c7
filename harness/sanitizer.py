"""compute-sanitizer, folded into kvfence's findings.

Canaries see what compute-sanitizer cannot: writes that stay inside one allocation (a row overflowing
into the next row) or inside memory PyTorch's caching allocator already owns. compute-sanitizer sees
what canaries cannot: out-of-range reads, races, uninitialised reads. This module runs one case per
tool in its own process (the first memory error destroys the CUDA context), parses the XML report
(the text log of the same run is the fallback) and turns it into ``Finding``s.

How each case is run under a tool (``tool_command`` + ``case_env``):

* the child is ``python -m harness repro CASE --device cuda --layout production --no-absorb``: rows
  contiguous and guards of ``MIN_GUARD`` only, so an overflow leaves the allocation as in production;
* **eager** cases run with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``: every tensor is its own cudaMalloc, so
  memcheck can see a write past kv_indices (with the caching allocator on, the write lands in memory
  the allocator owns and memcheck reports nothing);
* **graph** cases run with the caching allocator on: CUDA-graph capture needs it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from harness.errors import BadInput, require
from harness.findings import Finding, Kind

TOOLS = ("memcheck", "initcheck", "racecheck", "synccheck")
KIND_OF_TOOL = {"memcheck": Kind.SANITIZER_MEMCHECK, "initcheck": Kind.SANITIZER_INITCHECK,
                "racecheck": Kind.SANITIZER_RACECHECK, "synccheck": Kind.SANITIZER_SYNCCHECK}
#: compute-sanitizer's exit code when it found errors (``--error-exitcode``).
ERROR_EXIT = 86
#: Bytes of padding memcheck puts after every allocation (``--padding``): small overflows hit it.
PADDING_BYTES = 256
#: Default name filter: the kernel under test (verification kernels and helpers are not checked).
DEFAULT_KERNEL_FILTER = "generate_draft_decode_kv_indices"


def locate(env: Optional[Dict[str, str]] = None, default_root: str = "/usr/local/cuda") -> str:
    """Path of compute-sanitizer: ``PATH``, then ``$CUDA_HOME/bin``, then ``/usr/local/cuda/bin``."""
    env = os.environ if env is None else env
    found = shutil.which("compute-sanitizer", path=env.get("PATH"))
    if found:
        return found
    for root in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), default_root):
        if root:
            candidate = Path(root, "bin", "compute-sanitizer")
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise BadInput("compute-sanitizer not found (looked in PATH, $CUDA_HOME/bin, /usr/local/cuda/bin); "
                   "install the CUDA toolkit or put it on PATH")


def tool_command(exe: str, tool: str, target: Sequence[str], *, xml_path: Path,
                 kernel_filter: Optional[str] = DEFAULT_KERNEL_FILTER) -> List[str]:
    """The compute-sanitizer command line for one tool around ``target`` (the child's argv)."""
    require(tool in TOOLS, f"unknown sanitizer tool {tool!r}: choose {', '.join(TOOLS)}")
    cmd = [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "0",
           "--xml", "--save", str(xml_path)]
    if kernel_filter:
        # kns=: kernel names containing this string (Triton names the CUDA kernel after the function).
        cmd += ["--kernel-name", f"kns={kernel_filter}"]
    if tool == "memcheck":
        cmd += ["--padding", str(PADDING_BYTES)]
    return cmd + list(target)


#: The tool watches the repro process itself (no worker: the launch must happen in the traced process,
#: once); the cases are the sweep's own, or those the user pointed it at with ``--cases``, so their
#: plug-ins are trusted (harness.repro.require_trusted).
REPRO_FLAGS = ("--in-process", "--trust-case")


def repro_target(case_path: Path, *, python: str = sys.executable) -> List[str]:
    """The child each tool runs: the case, in the production layout, overflow leaving the allocation."""
    return [python, "-m", "harness", "repro", str(case_path), "--device", "cuda", "--layout", "production",
            "--no-absorb", *REPRO_FLAGS]


def case_env(mode: str, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment of a sanitizer child: caching allocator off in eager mode, on in graph mode."""
    env = dict(os.environ if base is None else base)
    env.pop("TRITON_INTERPRET", None)
    if mode == "eager":
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    else:
        env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
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
                   r"|Program hit (\w+) .*|(?:Race|Error|Warning).*hazard.*|Barrier error.*)$")
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
                kind = "Initcheck" if message.startswith("Uninitialized") else "Precise"
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
    """The ``ERROR SUMMARY: N errors`` count of a text log (None when the log has none)."""
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
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
@dataclass
class ToolVerdict:
    """What one tool said about one case."""

    tool: str
    exit_code: Optional[int]
    seconds: float
    findings: List[Finding] = field(default_factory=list)
    source: str = "xml"  # xml | text | none
    timed_out: bool = False
    errors: Optional[int] = None  # ERROR SUMMARY count (text log)

    def to_dict(self) -> dict:
        return {"tool": self.tool, "exit_code": self.exit_code, "seconds": round(self.seconds, 3),
                "source": self.source, "timed_out": self.timed_out, "errors": self.errors,
                "findings": [f.to_dict() for f in self.findings]}


def run_tool(exe: str, tool: str, case_path: Path, mode: str, work: Path, *, timeout: float = 300.0,
             kernel_filter: Optional[str] = DEFAULT_KERNEL_FILTER) -> ToolVerdict:
    """Run one case under one tool in its own process; parse XML, else the text log."""
    xml_path = work / f"{case_path.stem}.{tool}.xml"
    log_path = work / f"{case_path.stem}.{tool}.log"
    cmd = tool_command(exe, tool, repro_target(case_path), xml_path=xml_path, kernel_filter=kernel_filter)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=case_env(mode), capture_output=True, text=True, timeout=timeout)
        code, log, timed_out = proc.returncode, proc.stdout + proc.stderr, False
    except subprocess.TimeoutExpired as exc:
        code, timed_out = None, True
        log = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    seconds = time.perf_counter() - t0
    log_path.write_text(log)
    text_records = parse_text(log)
    source, records = "none", []
    if xml_path.is_file():
        try:
            records = parse_xml(xml_path.read_text(errors="replace"))
            source = "xml"
            merge_nearest(records, text_records)
        except BadInput:
            records = []
    if source == "none" and text_records:
        records, source = text_records, "text"
    return ToolVerdict(tool, code, seconds, to_findings(tool, records), source, timed_out, error_summary(log))


def baseline_seconds(case_path: Path, mode: str, *, timeout: float = 300.0) -> float:
    """Wall time of the same child without a sanitizer (guards absorbing): the slowdown's denominator."""
    cmd = [sys.executable, "-m", "harness", "repro", str(case_path), "--device", "cuda", *REPRO_FLAGS]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=case_env(mode), capture_output=True, text=True, timeout=timeout)
    return time.perf_counter() - t0
