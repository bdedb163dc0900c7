"""The end-of-run summary as text: the run table ``fuzz`` prints, and the rows report.md shares with it.

Everything is read from a summary document (``kvfence.engine.summary``), so ``report DIR`` prints what the run
printed."""

from __future__ import annotations

from typing import List

from kvfence.engine.summary import COUNTS
from kvfence.errors import printable


def table(rows: List[List[str]], header: List[str]) -> str:
    """A plain fixed-width text table."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def _seed_text(doc: dict) -> str:
    seed = doc.get("seed")
    return f"random ({seed})" if doc.get("seed_source") == "random" else str(seed)


def _largest_text(doc: dict) -> str:
    c = doc.get("largest_config")
    if not c:
        return "-"
    size = f"({c.get('estimated_bytes', 0) / 2**20:.1f} MiB)"
    if all(k in c for k in ("topk", "num_steps", "page_size", "ctx", "max_bs")):  # a summary of the draft kernel
        return (f"max_bs {c['max_bs']} x ctx {c['ctx']} x topk {c['topk']} x {c['num_steps']} steps, "
                f"page {c['page_size']} {size}")
    return " ".join(f"{k}={v}" for k, v in c.items() if k != "estimated_bytes") + f" {size}"


def _family_text(doc: dict) -> str:
    """Contract, whether the §6 fields were drawn (``--family``) and in which share of the examples, what
    was pinned, and how many cases the host verdict judged because the device verifier checks only the
    classic contract."""
    pins = doc.get("family_pins") or {}
    share = doc.get("family_share")
    drawn = "drawn" + (f" in {share:.3g} of examples" if doc.get("family_drawn") and share not in (None, 1) else "")
    text = f"contract {doc.get('contract', '-')}, {drawn if doc.get('family_drawn') else 'not drawn'}"
    if pins:
        text += ", pinned " + " ".join(f"{k}={v}" for k, v in sorted(pins.items()))
    host = doc.get("host_verified_cases")
    return text + (f"; {host} case(s) verified on the host" if host else "")


def run_rows(doc: dict) -> List[List[str]]:
    """The run table: the same words and numbers as the progress line and the JSON keys."""
    rows = [[key.replace("_", " "), str(doc.get(key, 0))] for key in COUNTS]
    rows += [["elapsed", f"{doc['elapsed_s']:.1f} s"
              + (f" (ended by {doc['ended_by']})" if doc.get("ended_by") else "")],
             ["start-up", phases_text(doc)],
             ["verified cases/s", f"{doc['cases_per_s']:.1f}"],
             ["structurally distinct cases/s", f"{doc.get('structural_cases_per_s', 0):.1f}"],
             ["examples/s", f"{doc.get('examples_per_s', 0):.1f}"],
             ["distinct configs", str(doc.get("distinct_configs", "?"))
              + (f" ({doc['distinct_configs_per_s']:.1f}/s)" if "distinct_configs_per_s" in doc else "")],
             ["compiles / captures", f"{doc.get('compiles', 0)} / {doc.get('captures', 0)} "
                                     f"({doc.get('compile_s', 0):.1f} s compiling, "
                                     f"{doc.get('capture_s', 0):.1f} s capturing)"],
             ["jobs", str(doc.get("jobs", 1)) + (f" ({doc['jobs_not_started']} not started: the run ended while "
                                                 f"the lead job ran alone)" if doc.get("jobs_not_started") else "")],
             ["contract", str(doc.get("contract", "-"))],
             ["domain", str(doc.get("domain_text") or doc.get("domain", "?"))]]
    if "family_drawn" in doc:  # the draft kernel's §6 fields (docs/contract.md §6)
        rows.append(["§6 fields", _family_text(doc)])
    rows += [["largest config", _largest_text(doc)],
             ["device", str(doc.get("device", "?"))], ["kernel", str(doc.get("kernel", "?"))],
             ["sizing", str(doc.get("sizing", "?"))],
             ["mode / layout", f"{doc.get('mode', '?')} / {doc['layout']}"] if doc.get("layout") else
             ["mode", str(doc.get("mode", "?"))],
             ["seed", _seed_text(doc)], ["max need/width", max_need_text(doc)],
             ["findings", str(len(doc["findings"]))]]
    if doc.get("bulk_splice"):  # the first failure was a bulk case: shrunk through Hypothesis, or why not
        rows.append(["bulk failure", str(doc["bulk_splice"])])
    return rows + campaign_rows(doc)


def phases_text(doc: dict) -> str:
    """Seconds from the command's start to the checking worker's ready, the first launch, the first failure."""
    parts = [f"{label} {doc[key]:.2f} s" for key, label in (("startup_s", "worker ready"),
                                                           ("first_launch_s", "first launch"),
                                                           ("first_failure_s", "first failure"))
             if isinstance(doc.get(key), (int, float))]
    return ", ".join(parts) or "-"


def campaign_rows(doc: dict) -> List[List[str]]:
    """The example database and shard of a run (``kvfence.engine.campaign``), when it recorded them."""
    c = doc.get("campaign")
    if not isinstance(c, dict):
        return []
    rows = [["database", str(c.get("database"))]]
    if c.get("stored_failures_at_start"):
        rows.append(["replayed from database", f"{c['stored_failures_at_start']} stored failure(s)"])
    shard = c.get("shard")
    if isinstance(shard, dict):
        rows.append(["shard", f"{shard.get('shard')} ({shard.get('cells')} of {shard.get('of_cells')} config cells; "
                              f"{shard.get('partition')})"])
    return rows


def max_need_text(doc: dict) -> str:
    """"max need/width" with the example it came from (config, launched requests, need and width)."""
    text = f"{doc.get('max_need_over_width', 0):.2f}"
    ex = doc.get("max_need_over_width_example")
    if not ex:
        return text
    raw = ex.get("raw_bs", ex["num_seqs"])
    requests = f"{raw} request{'s' if raw != 1 else ''}"
    if ex["num_seqs"] != raw:
        requests += f" padded to {ex['num_seqs']}"
    config = " ".join(f"{k}={v}" for k, v in ex.items() if k not in ("num_seqs", "raw_bs", "need", "width", "failed"))
    where = f"{config}, {requests}: need {ex['need']}, width {ex['width']}"
    if ex["failed"]:
        cases = [c["path"] for c in doc.get("cases", {}).values() if c.get("source") == "fuzz"]
        where += "; the failing example" + (f", shrunk into {cases[0]}" if cases else "")
    return f"{text} ({where})"


def earlier_text(doc: dict) -> str:
    """A line naming where an earlier run's case files went, or ``""``."""
    e = doc.get("earlier_cases")
    if not e:
        return ""
    return (f"{e['count']} case file(s) of an earlier run in this folder were moved to {e['folder']}; "
            "they are not part of this report.")


def finding_rows(doc: dict) -> List[List[str]]:
    out = []
    for f in doc["findings"]:
        span = f"[{f.get('start', 0)}, {f.get('stop', 0)})" if f.get("stop", 0) else ""
        out.append([f["kind"], f"{f.get('buffer', '')} {f['region']}".strip(), span, f["case"]])
    return out


def text_table(doc: dict, program: str = "python -m kvfence") -> str:
    """The end-of-run summary printed by ``fuzz``: the run, then the findings and their case files, each
    repro line spelled with ``program``, the name the user ran (the files keep ``python -m kvfence``, which
    works wherever kvfence imports)."""
    parts = [table(run_rows(doc), ["run", "value"])]
    if earlier_text(doc):
        parts.append(earlier_text(doc))
    if doc["findings"]:
        parts.append(table(finding_rows(doc), ["kind", "where", "elements", "case file"]))
        prefix = "python -m kvfence "
        parts.append("\n".join(program + " " + c["repro"][len(prefix):] if c["repro"].startswith(prefix)
                               else c["repro"] for c in doc.get("cases", {}).values()))
    # For a terminal: a summary may be an earlier run's (``--resume``, written elsewhere), so every line has
    # its control characters (escape codes) shown escaped, whatever field they came from.
    return "\n".join(printable(line, limit=None) for line in "\n\n".join(parts).split("\n"))


