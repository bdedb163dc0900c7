"""Using a release's shipped-sizing record (docs/contract.md, "Shipped sizing"): ``--sizing
sglang==VERSION:BACKEND`` as a row-width policy, and the release's host check on one launch.

The record is what ``kvfence.contracts.draft.shipped_wheel`` read from the wheel, stored as data in the release's cache
entry by ``kvfence.contracts.draft.release_kernels`` (fetched here when allowed). This module reads only that file.
"""

from __future__ import annotations

import functools
import json
from typing import Optional, Tuple

from kvfence.contracts.draft import release_kernels
from kvfence.contracts.draft.shipped_wheel import (
    DRAFT_KERNEL,
    MODES,
    RECORD_FILE,
    evaluate,
    unread_note,
    validate_record,
)
from kvfence.engine.kernels import release_source
from kvfence.errors import BadInput, require
from kvfence.release import upstream, wheels


def parse_spec(spec: str) -> Tuple[str, str]:
    require(release_source(spec) == "sglang", f"sizing {spec!r}: the draft's shipped sizings are SGLang's "
                                               "(sglang==VERSION:BACKEND)")
    version, _, backend = spec[len(upstream.SPEC_PREFIX):].partition(":")
    wheels.check_version(version)
    require(backend, f"sizing {spec!r}: name the backend, sglang==VERSION:BACKEND "
                     f"(`python -m kvfence upstream sizing {version}` lists them)")
    return version, backend


def load_record(version: str) -> dict:
    """The release's record from its cache entry (fetched when allowed); ``BadInput`` if it is unusable."""
    try:
        entry = release_kernels.fetch(version, announce=lambda m: None)
    except upstream.Refused as exc:
        raise BadInput(f"sglang=={version} has no draft kernel kvfence can test, so no shipped sizing: {exc}") from None
    path = entry.folder / RECORD_FILE
    try:
        record = validate_record(json.loads(path.read_text(encoding="utf-8")))
        require(wheels.sha256_hex(path.read_bytes()) == entry.manifest.get("shipped_sha256"),
                "does not match the manifest's sha256")
    except (OSError, ValueError, RecursionError, BadInput) as exc:
        raise BadInput(f"cache entry {entry.folder} is corrupt ({RECORD_FILE}: {exc}); run "
                       f"`python -m kvfence upstream fetch {version} --refresh`") from None
    return record


def backend_record(version: str, backend: str) -> dict:
    record = load_record(version)
    names = sorted(record["backends"])
    require(names, f"sglang=={version} has no draft backend (no class launches {DRAFT_KERNEL})"
                   + unread_note(record))
    require(backend in record["backends"], f"sglang=={version} has no backend {backend!r}; it has {', '.join(names)}")
    return record["backends"][backend]


def site_state(site: dict) -> Tuple[str, str]:
    """``(state, text)`` of a graph/eager/check site: ``ok`` with its formula, ``unreadable`` or ``absent``."""
    if site is None:
        return "absent", ""
    if "absent" in site:
        return "absent", site["absent"]
    if "unreadable" in site:
        u = site["unreadable"]
        return "unreadable", f"{u['why']}: {u['text']} ({u['source']})"
    return "ok", site["formula"]


class ShippedSizing:
    """A ``--sizing sglang==VERSION:BACKEND`` policy: the width the backend allocates in each mode.

    Called as any policy, ``(n, topk, ctx, num_steps)``, plus ``mode`` (``Config`` passes it to policies
    with ``takes_mode``): ``n`` requests (graph: ``max_bs``; eager: ``num_seqs``)."""

    takes_mode = True

    def __init__(self, spec: str):
        self.spec = spec
        self.version, self.backend = parse_spec(spec)
        self.record = backend_record(self.version, self.backend)
        self.__name__ = spec

    def site(self, mode: str) -> dict:
        require(mode in MODES, f"mode {mode!r}")
        state, text = site_state(self.record[mode])
        require(state == "ok", f"sizing {self.spec!r}: the {mode} width is {state}: {text}")
        return self.record[mode]

    def check_topk(self, topk: int) -> None:
        refuses = self.record.get("refuses")
        require(not (refuses and refuses.get("refuses") == "topk > 1" and topk > 1),
                f"sizing {self.spec!r}: {self.backend} refuses topk > 1 in its constructor "
                f"({refuses and refuses['source']}); topk={topk} is unreachable")

    def __call__(self, n: int, topk: int, ctx: int, num_steps: int, *, mode: str = "graph", **window) -> int:
        self.check_topk(topk)
        return evaluate(self.site(mode)["tree"], {"requests": n, "topk": topk, "ctx": ctx, "steps": num_steps})

    def host_check(self) -> Optional[dict]:
        check = self.record.get("host_check")
        if check is None:
            return None
        state, text = site_state(check)
        require(state == "ok", f"sizing {self.spec!r}: the host check is {state}: {text}")
        return check


@functools.lru_cache(maxsize=None)
def policy(spec: str) -> ShippedSizing:
    return ShippedSizing(spec)


def check_verdict(sizing: str, topk: int, num_steps: int, num_seqs: int, sum_seq_lens: int, width: int,
                  need: int) -> Optional[Tuple[str, str]]:
    """The host check of a shipped sizing on one launch: None when there is none or it admits a launch
    that fits; else ``(kind, detail)``: ``HOST_CHECK_FIRED`` (rejects an overflow: loud, as in
    production), ``HOST_CHECK_REJECTS_FIT`` or ``HOST_CHECK_ADMITS_OVERFLOW`` (the check's formula is wrong)."""
    if release_source(sizing) is None:  # a builtin or plug-in sizing: no release's host check
        return None
    check = policy(sizing).host_check()
    if check is None:
        return None
    used = evaluate(check["tree"], {"requests": num_seqs, "topk": topk, "steps": num_steps,
                                    "sum_seq_lens": sum_seq_lens})
    fires = used >= width if check["strict"] else used > width
    values = (f"{check['formula']} = {used} {'>=' if check['strict'] else '>'} width {width}" if fires
              else f"{check['formula']} = {used} fits width {width}")
    where = f"host check {check['text']} ({check['source']}): {values}; the kernel needs {need}"
    if fires:
        return ("HOST_CHECK_FIRED" if need > width else "HOST_CHECK_REJECTS_FIT"), where
    if need > width:
        return "HOST_CHECK_ADMITS_OVERFLOW", where
    return None
