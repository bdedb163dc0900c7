"""``python -m kvfence repro FILE``: re-run one case file and print a readable diff.

The case runs through the same pipeline as the fuzzer (``Session.observe`` then ``verdict.check``, which
is ``Session.check`` with the observation kept so that ``--verbose`` can show whole stretches of the
buffers). Overrides of kernel, sizing and device answer "does my fix work on this case?".
"""

from __future__ import annotations

import dataclasses
import re
from typing import List, Optional, TextIO

from kvfence.cases.casefile import CaseFile, load_case
from kvfence.cases.case import Case
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS, require
from kvfence.cases.findings import Finding, Kind

#: Elements shown per finding with ``--verbose`` (the finding itself keeps 3 samples).
VERBOSE_ELEMENTS = 64
VERBOSE_PROGRAMS = 32
_ROW = re.compile(r"^(?:slack of )?row (\d+)$")
_GUARD = re.compile(r"^guard after row (\d+)$")


def require_trusted(loaded: CaseFile, *, kernel: Optional[str], sizing: Optional[str], trust: bool) -> None:
    """A case file's plug-ins are data: ``BadInput`` unless the user named them again or trusts the file.

    Re-running a case file must not run code it names (a file from a bug report could name any module),
    so a plug-in kernel or sizing runs only when ``--kernel`` / ``--sizing`` replace it or
    ``--trust-case`` is given. Builtin names are always fine.
    """
    from kvfence.cases.targets import is_plugin

    if trust:
        return
    for what, named, override, flag in (("kernel", loaded.case.kernel, kernel, "--kernel"),
                                        ("sizing", loaded.case.config.sizing, sizing, "--sizing")):
        require(override is not None or not is_plugin(named),
                f"case file {loaded.path} names {what} plug-in {named!r}, which kvfence does not import from a "
                f"case file: re-run with {flag} {named} (or --trust-case) if you trust that code")


def apply_overrides(loaded: CaseFile, *, kernel: Optional[str] = None, sizing: Optional[str] = None,
                    mode: Optional[str] = None, layout: Optional[str] = None) -> Case:
    """The loaded case with another kernel, sizing policy, mode or layout (``BadInput`` if impossible)."""
    from kvfence.cases.targets import resolve_sizing

    case = loaded.case
    config = case.config
    if sizing is not None:
        resolve_sizing(sizing)
        config = dataclasses.replace(config, sizing=sizing)
    if mode is not None:
        config = dataclasses.replace(config, mode=mode)
    if layout is not None:
        config = dataclasses.replace(config, layout=layout)
    return Case(config, case.batch, kernel if kernel is not None else case.kernel, case.canary_seed)


def sizing_lines(case: Case) -> List[str]:
    """need vs width, with the arithmetic written out (``Case.sizing_summary`` plus the policy)."""
    from kvfence.cases.targets import resolve_sizing

    c = case.config
    s = case.sizing_summary()
    lens = case.launch().seq_lens
    policy = resolve_sizing(c.sizing)
    doc = (policy.__doc__ or "").strip().split("\n")[0]
    formula = doc.split(":")[0].strip("` ") if doc.startswith("``W") else ""
    n = c.sizing_n(s["num_seqs"])
    verdict = (f"need > width by {s['need'] - s['width']}: the buffer is too small" if s["need"] > s["width"]
               else f"fits ({s['width'] - s['need']} spare)")
    lens_text = "+".join(map(str, lens)) if len(lens) <= 8 else f"sum of {len(lens)} lengths"
    return [
        f"need   = topk*sum(L) + num_seqs*topk*num_steps = {c.topk}*({lens_text}) + {s['num_seqs']}*{c.topk}*"
        f"{c.num_steps} = {s['need']}",
        f"width  = {c.sizing}(n={n}, topk={c.topk}, ctx={c.ctx}, num_steps={c.num_steps}) = {s['width']}"
        + (f"   [{formula}; n = {'max_bs' if c.mode == 'graph' else 'num_seqs'}]" if formula else ""),
        f"=> {verdict}",
    ]


def _flat_of(buf, region: str, offset: int) -> Optional[int]:
    """Inverse of ``GuardedBuffer.region_of`` for a finding's first region."""
    first = region.split(" .. ")[0]
    if first == "front guard":
        return offset
    if first == "tail":
        return buf.front + buf.rows * buf.stride + offset
    m = _ROW.match(first)
    if m:
        return buf.flat_index(int(m.group(1)), offset)
    m = _GUARD.match(first)
    if m:
        return buf.flat_index(int(m.group(1)), buf.width + offset)
    return None


def _element_rows(obs, expected_writes, finding: Finding, limit: int) -> List[str]:
    # By role: the window rail's buffers are named window_kv_indices / window_kv_indptr.
    role = {obs.kv_indices.name: "kv_indices", obs.kv_indptr.name: "kv_indptr"}.get(finding.buffer)
    buf = {"kv_indices": obs.kv_indices, "kv_indptr": obs.kv_indptr}.get(role)
    if buf is None or finding.count == 0:
        return []
    lo = _flat_of(buf, finding.region, finding.start)
    if lo is None:
        return []
    pos, val = ((expected_writes.indices_pos, expected_writes.indices_val) if role == "kv_indices"
                else (expected_writes.indptr_pos, expected_writes.indptr_val))
    before, after = obs.before[role], obs.after[role]
    expected = before.clone()
    expected[pos] = val
    hi = min(lo + finding.count, lo + limit, buf.length)
    rows = [f"      {'offset':>8} {'expected':>12} {'found':>12}"]
    for flat in range(lo, hi):
        e, f = int(expected[flat]), int(after[flat])
        rows.append(f"      {finding.start + flat - lo:>8} {e:>12} {f:>12}{'' if e == f else '   <-'}")
    if finding.count > hi - lo:
        rows.append(f"      ... {finding.count - (hi - lo)} more elements")
    return rows


def finding_lines(i: int, f: Finding, *, obs=None, expected_writes=None, verbose: bool = False) -> List[str]:
    where = f"{f.buffer} {f.region}"
    if f.count:
        where += f", elements [{f.start}, {f.stop}) ({f.count})"
    out = [f"[{i}] {f.kind.value}  {where}"]
    if f.detail:
        out.append(f"    {f.detail}")
    rows = _element_rows(obs, expected_writes, f, VERBOSE_ELEMENTS) if verbose and obs is not None else []
    if rows:
        out += rows
    elif f.samples:
        out.append(f"      {'offset':>8} {'expected':>12} {'found':>12}")
        out += [f"      {off:>8} {str(e):>12} {str(g):>12}" for off, e, g in f.samples]
    if f.programs:
        limit = VERBOSE_PROGRAMS if verbose else 6
        shown = ", ".join(f"({s},{b},{k})" for s, b, k in f.programs[:limit])
        more = f" and {len(f.programs) - limit} more" if len(f.programs) > limit else ""
        out.append(f"    expected owners (s,b,k): {shown}{more}")
        if verbose and expected_writes is not None:
            wanted = set(map(tuple, f.programs[:limit]))
            for s, b, k, start, stop in expected_writes.segments:
                if (s, b, k) in wanted:
                    out.append(f"      ({s},{b},{k}) should write row {s} [{start}, {stop})")
    if f.writers:
        limit = VERBOSE_PROGRAMS if verbose else 6
        shown = ", ".join(f"({s},{b},{k})" for s, b, k in f.writers[:limit])
        more = f" and {len(f.writers) - limit} more" if len(f.writers) > limit else ""
        out.append(f"    written by (s,b,k): {shown}{more} (the programs whose values were found there)")
    return out


def run_repro(path, *, device: str = "auto", kernel: Optional[str] = None, sizing: Optional[str] = None,
              mode: Optional[str] = None, layout: Optional[str] = None, absorb: bool = True,
              verbose: bool = False, out: TextIO, announce=None, trust_case: bool = False,
              in_process: bool = False, case_timeout: Optional[float] = None) -> int:
    """Load, re-run and describe one case file; returns the exit code (1 reproduces, 0 passes).

    ``absorb=False`` (``--no-absorb``) lets an overflow leave the buffer's allocation, as in
    production: for runs under compute-sanitizer (``kvfence.tools.sanitizer``). The case runs first in a
    worker process (``kvfence.workflow.worker``), so a case that crashes or hangs is reported as ``CRASH`` /
    ``HANG`` instead of killing repro; a case that survives is re-run here for the full diff.
    ``in_process`` skips the worker (debugging).
    """
    from kvfence.device import select

    loaded = load_case(path)
    require_trusted(loaded, kernel=kernel, sizing=sizing, trust=trust_case)
    case = apply_overrides(loaded, kernel=kernel, sizing=sizing, mode=mode, layout=layout)
    device = select(device, announce=announce)
    from kvfence.verifying.session import Session
    from kvfence.verifying.verdict import check, expected_from_oracle

    remote = None
    if not in_process:
        from kvfence.workflow.worker import DEFAULT_CASE_TIMEOUT, RemoteSession

        # Resolves the kernel in the worker: BadInput before anything runs.
        worker = RemoteSession(device, case.kernel, absorb=absorb,
                               case_timeout=DEFAULT_CASE_TIMEOUT if case_timeout is None else case_timeout)
        with worker:
            remote = worker.check(case)
    fatal = [f for f in remote or [] if f.kind in (Kind.CRASH, Kind.HANG)]
    session = None if fatal else Session(device, case.kernel, absorb=absorb)  # BadInput before anything runs
    c, b = case.config, case.batch
    lb = case.launch()
    p = lambda line="": print(line, file=out)  # noqa: E731
    p(f"kvfence repro {path}")
    p(f"config  topk={c.topk} num_steps={c.num_steps} page_size={c.page_size} ctx={c.ctx} max_bs={c.max_bs} "
      f"buckets={list(c.buckets)} mode={c.mode} layout={c.layout} canary_seed={case.canary_seed}")
    p(f"batch   seq_lens={list(b.seq_lens)} req_pool_indices={list(b.req_pool_indices)} token_seed={b.token_seed}"
      f" (launched as {lb.num_seqs} row{'s' * (lb.num_seqs != 1)}{', padded' if lb.num_seqs > b.raw_bs else ''})")
    changed = [f"{name} {new} (file: {old})" for name, new, old in
               (("kernel", case.kernel, loaded.case.kernel), ("sizing", c.sizing, loaded.case.config.sizing),
                ("mode", c.mode, loaded.case.config.mode), ("layout", c.layout, loaded.case.config.layout))
               if new != old]
    p(f"target  kernel {case.kernel}, sizing {c.sizing}, device {device}"
      + (f" (found on {loaded.device})" if loaded.device and loaded.device != device else ""))
    if changed:
        p(f"override {'; '.join(changed)}")
    for line in sizing_lines(case):
        p(f"sizing  {line}")
    recorded = ", ".join(sorted({f.kind.value for f in loaded.findings})) or "none"
    if fatal:  # the worker died or stalled on this case: there is no observation to diff
        p()
        p(f"FAIL: {len(fatal)} finding(s) (the file recorded {len(loaded.findings)}: {recorded})")
        for i, f in enumerate(fatal, 1):
            p()
            for line in finding_lines(i, f):
                p(line)
        return EXIT_FINDINGS
    obs = session.observe(case)
    expected_writes = expected_from_oracle(obs)
    findings = check(obs, expected_writes)
    p()
    if not findings:
        p(f"PASS: no findings (the file recorded {len(loaded.findings)}: {recorded})")
        return EXIT_CLEAN
    p(f"FAIL: {len(findings)} finding(s) (the file recorded {len(loaded.findings)}: {recorded})")
    for i, f in enumerate(findings, 1):
        p()
        for line in finding_lines(i, f, obs=obs, expected_writes=expected_writes, verbose=verbose):
            p(line)
    if not verbose:
        p()
        p("(--verbose shows every element of each finding, up to 64, and each program's segment)")
    return EXIT_FINDINGS
