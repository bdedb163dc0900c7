"""A benchmark's result dictionary, rewritten to its ``--json`` file after every stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, List, Optional

from kvfence.provenance import stamped


def saver(path: Optional[str], result: dict) -> Callable[[], None]:
    """``save()`` writes ``result`` to ``path`` (nothing when ``path`` is None), so a time limit or a failure
    keeps what was measured so far."""

    def save() -> None:
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(stamped(result), indent=1) + "\n")

    return save


def draft_launches(strategy):
    """A strategy of the draft runner's cases (``kvfence.contracts.draft.strategies``: a ``Case`` per example, or a
    ``CaseRun`` of them) as the engine's launches, what ``kvfence.engine.loop.fuzz`` and a checker take
    (``kvfence.contracts.draft.record.launch_of``; a run's bulk bookkeeping read through, as
    ``kvfence.engine.run.BoundRun`` does for the engine's own draws)."""
    from kvfence.contracts.draft.record import launch_of
    from kvfence.engine.run import BoundRun

    def bind(drawn):
        if isinstance(drawn, list):
            return BoundRun([launch_of(c) for c in drawn], drawn)
        return launch_of(drawn)

    return strategy.map(bind)


def fuzz_command_parser(doc: str, argv):
    """``(parser, own argv, fuzz flags)`` of a benchmark that runs ``kvfence fuzz``: flags after ``--`` go to
    every fuzz command; the parser (described by ``doc``'s first line) has ``--device`` and ``--json``."""
    import argparse

    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--json", default=None)
    return parser, argv[:cut], argv[cut + 1:]


def job_summaries(out_dir: Path) -> List[dict]:
    """A ``fuzz --jobs N`` run's summaries of its jobs (``OUT/jobs/job-i/summary.json``), job 0 first; none for
    a run of one job."""
    paths = sorted((Path(out_dir) / "jobs").glob("job-*/summary.json"), key=lambda p: int(p.parent.name[4:]))
    return [json.loads(p.read_text()) for p in paths]


def first_failing(jobs: List[dict], run: dict) -> dict:
    """Of ``jobs``, the summary of the one that failed first (the earliest ``first_failure_at``: every job dates
    it by the same clock); ``run``, the run's own summary, when none failed or there are no jobs."""
    failed = [j for j in jobs if j.get("first_failure_at") is not None]
    return min(failed, key=lambda j: j["first_failure_at"]) if failed else run
