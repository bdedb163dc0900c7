"""``benchmarks/kill_time.py``: one command and one results file for the kill time of every contract's planted
bugs, the first verdict and the two verifiers (issue 65). The GPU sitting runs each part at full size; here a
plain part runs on the CPU with one mutant and one seed, cut before its first run and resumed, then skipped once
complete; a verifiers part adds its seeds to the same file (a long test)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvfence.engine.fuzzrun import FIRST_FAILURE

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
ROW = "slot-mapping.tail_starts_one_late"
sys.path.insert(0, str(ROOT / "benchmarks"))

import kill_time  # noqa: E402
import plain_fuzz_mutants  # noqa: E402
import run_end  # noqa: E402


def _kill_time(tmp_path, *argv):
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kill_time.py"), "--device", "cpu", *argv],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_a_part_is_cut_resumed_and_skipped_and_every_part_lands_in_one_file(tmp_path):
    out = tmp_path / "kill.json"
    part = ["--part", "r2t-slot", "--seeds", "1", "--reference-seeds", "1", "--only", ROW, "--json", str(out)]
    tiny = ["--", "--max-examples", "20"]
    cut = _kill_time(tmp_path, *part, "--max-seconds", "0", *tiny)
    assert cut.returncode == 3 and "CUT" in cut.stdout, cut.stdout[-2000:] + cut.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["parts"]["r2t-slot"]["complete"] is False and doc["complete"] is False
    assert doc["parts"]["r2t-slot"]["mutants"][ROW]["seeds_run"] == []
    other = [a if a != "1" else "2" for a in part]  # another plan: two seeds, two reference seeds
    refused = _kill_time(tmp_path, *other, "--resume", *tiny)
    assert refused.returncode == 2 and "its seeds is 1, this command's 2" in refused.stderr, refused.stderr[-2000:]
    assert len(refused.stderr.strip().splitlines()) == 1 and json.loads(out.read_text()) == doc
    resumed = _kill_time(tmp_path, *part, "--resume", *tiny)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    doc = json.loads(out.read_text())
    row = doc["parts"]["r2t-slot"]["mutants"][ROW]
    assert row["detected"] == 1 and row["search_s"][0] is not None and row["kinds"] == ["MISSING_WRITE"]
    # Stopped at its first failure (no exit code of its own), its search time kept; the reference ran to its end.
    assert row["stopped_at_failure"] == [0] and row["exit_codes"] == [None]
    assert 0 < row["search_s"][0] < row["first_failure_s"][0] <= row["wall_s"][0]
    assert doc["parts"]["r2t-slot"]["reference"]["reference (slot-mapping)"]["exit_codes"] == [0]
    assert "--kernel mutant:tail_starts_one_late --contract slot-mapping" in row["command"]
    assert doc["parts"]["r2t-slot"]["reference"]["reference (slot-mapping)"]["clean"] is True
    assert len(doc["parts"]["r2t-slot"]["sessions"]) == 2
    assert doc["kill_search_s"][ROW]["median"] == row["median_search_s"]
    assert doc["kill_targets"]["mutants"] == 1 and doc["code"]["digest"]
    assert doc["kill_where"][ROW]["examples_to_failure"] == row["examples_to_failure"][0] >= 1
    again = _kill_time(tmp_path, *part, "--resume", *tiny)
    assert again.returncode == 0 and "is complete" in again.stdout
    assert json.loads(out.read_text())["parts"]["r2t-slot"]["sessions"] == doc["parts"]["r2t-slot"]["sessions"]
    assert doc["complete"] is False  # the other parts are not run


@pytest.mark.long
def test_a_verifiers_part_adds_its_seeds_beside_a_plain_part(tmp_path):
    """Five ``mutants --verifiers both`` side by side (the reference only, one config each), into a file that
    holds a plain part: both parts and their totals in the one file."""
    out = tmp_path / "kill.json"
    plain = _kill_time(tmp_path, "--part", "r2t-slot", "--seeds", "1", "--reference-seeds", "0", "--only", ROW,
                       "--json", str(out), "--", "--max-examples", "20")
    assert plain.returncode == 0, plain.stdout[-2000:] + plain.stderr[-2000:]
    verifiers = _kill_time(tmp_path, "--part", "verifiers-0-4", "--json", str(out), "--", "--only", "reference",
                           "--max-examples", "1")
    assert verifiers.returncode == 0, verifiers.stdout[-2000:] + verifiers.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["verifiers"] == {str(s): True for s in range(5)}
    assert set(doc["parts"]) == {"r2t-slot", "verifiers-0-4"} and ROW in doc["kill_search_s"]
    assert doc["complete"] is False  # the other parts are not run


def test_an_unknown_mutant_of_a_part_is_one_line_exit_2(tmp_path):
    bad = _kill_time(tmp_path, "--part", "pages", "--only", "slot-mapping.tail_starts_one_late")
    assert bad.returncode == 2 and "unknown mutant(s) slot-mapping.tail_starts_one_late" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def _job(out: Path, i: int, **summary) -> Path:
    """Job ``i`` of a ``--jobs`` run in ``out``, started (its plan written), with ``summary`` written when given."""
    folder = out / "jobs" / f"job-{i}"
    folder.mkdir(parents=True)
    (folder / "plan.json").write_text("{}")
    if summary:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_a_run_is_recorded_at_its_first_failure_once_every_started_job_has_written_its_summary(tmp_path):
    """``run_end``: nothing before the first-failure line; the jobs' summaries merged as the run merges them (the
    earliest failure, the first worker ready, every finding) once each job the run started has written one or is
    still starting after the first worker was ready; a run whose failing job is done while another still runs
    is asked to stop (SIGINT to its group), then recorded."""
    out, stderr = tmp_path / "out", tmp_path / "out.stderr"
    stderr.write_text("kvfence: starting\n")
    assert not run_end.announced(stderr)
    stderr.write_text(f"kvfence: starting\n{FIRST_FAILURE} 7.25s into the command: MISSING_WRITE at ...\n")
    assert run_end.announced(stderr)
    failing = {"startup_s": 5.1, "first_failure_s": 7.25, "first_failure_at": 1e9 + 7.25,
               "findings": [{"kind": "MISSING_WRITE"}]}
    _job(out, 0, **failing)
    late = _job(out, 1)
    # Job 1 has written no summary: it is waited for when it started before the first worker was ready (1e9 is
    # the command's start) or has checked an example (its progress file); not when it is still starting after.
    os.utime(late / "plan.json", (1e9 + 3.0, 1e9 + 3.0))
    assert run_end.failure_written(out) == (None, True)
    os.utime(late / "plan.json", (1e9 + 6.0, 1e9 + 6.0))
    starting, _ = run_end.failure_written(out)
    assert (starting["startup_s"], starting["first_failure_s"]) == (5.1, 7.25)
    (late / "progress.json").write_text(json.dumps({"examples": 1}))
    assert run_end.failure_written(out) == (None, True)
    (late / "summary.json").write_text(json.dumps({"startup_s": 6.4, "first_failure_s": None,
                                                   "first_failure_at": None, "findings": []}))
    doc, finder_done = run_end.failure_written(out)
    assert finder_done and (doc["startup_s"], doc["first_failure_s"]) == (5.1, 7.25)
    assert [f["kind"] for f in doc["findings"]] == ["MISSING_WRITE"]
    one = tmp_path / "one"  # a run of one process: its own summary
    one.mkdir()
    assert run_end.failure_written(one) == (None, False)
    (one / "summary.json").write_text(json.dumps(failing))
    assert run_end.failure_written(one) == (failing, True)
    # The benchmark's view: job 1 still searching, so the run (its own session) is interrupted, not yet recorded.
    (late / "summary.json").unlink()
    run = plain_fuzz_mutants.Run("m", 0, [], out, stop_at_failure=True)
    run.stderr.write_text(stderr.read_text())
    run.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    run.started = time.monotonic()
    assert plain_fuzz_mutants.ended(run, run_timeout=60) == (False, None)
    assert run.proc.wait(timeout=10) == -signal.SIGINT and run.interrupted and run.at_failure is None


def test_part_all_takes_the_parts_a_cut_loses_first_each_only_where_it_fits_then_fills_with_plain_parts():
    doc = {"parts": {}}
    assert kill_time.next_part(doc, 570, set()) == ("first-verdict", None)
    assert kill_time.next_part(doc, 570, {"first-verdict"}) == ("verifiers-0-4", None)
    # 300 s left: no verifier part fits; the first plain part starts no run in the budget's last 50 s.
    assert kill_time.next_part(doc, 300, {"first-verdict"}) == ("draft", 250)
    doc["parts"] = {"first-verdict": {"complete": True}, "verifiers-0-4": {"complete": True},
                    "draft": {"complete": True}, "pages": {"complete": False}}
    assert kill_time.next_part(doc, 570, set()) == ("verifiers-5-9", None)
    assert kill_time.next_part(doc, 200, set()) == ("pages", 150)  # a cut part is resumed first
    assert kill_time.next_part(doc, 60, set()) is None  # too little left for any part


@pytest.mark.long
def test_the_first_verdict_stops_each_measured_run_at_its_verdict_and_keeps_its_summary(tmp_path):
    """``first_verdict.py``: a measured run is stopped at its first-failure line as by a Ctrl-C (exit 130, not
    left to shrink), its time to the verdict and its summary's figures kept; ``--run-to-exit`` lets it end."""
    out = tmp_path / "verdict.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_verdict.py"), "--device", "cpu",
                           "--repeats", "1", "--warmup", "0", "--json", str(out), "--", "--max-examples", "30",
                           "--jobs", "2"], cwd=tmp_path, env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = json.loads(out.read_text())["runs"][0]
    assert run["stopped_at_verdict"] is True and run["exit"] == 130 and run["ended_by"] == "signal"
    assert 0 < run["startup_s"] < run["first_failure_s"] < run["first_verdict_s"] < run["wall_s"]
    assert run["first_failing_job_examples_to_failure"] >= 1 and len(run["jobs_ready_s"]) == 2


def test_part_all_runs_the_parts_that_fit_stops_at_a_cut_and_says_what_is_left(tmp_path, monkeypatch, capsys):
    """``run_all`` over made-up parts: each part ``next_part`` picks is run and saved; a cut plain part ends the
    call (INCOMPLETE, the parts left named); the next call runs the rest and the file is complete (exit 0)."""
    ran = []

    def fake_part(args, name, extra, doc, argv):
        ran.append((name, args.max_seconds))
        part = {"complete": not (name == "draft" and len(ran) < 5), "passed": True, "seeds": {}}
        doc["parts"][name] = part
        kill_time.totals(doc)
        return part

    monkeypatch.setattr(kill_time, "run_part", fake_part)
    args = kill_time._arguments(["--device", "cpu", "--part", "all", "--budget", "1000"])
    doc, saved = {"parts": {}}, []
    keep = signal.getsignal(signal.SIGTERM)  # run_all sets it before each part
    code = kill_time.run_all(args, doc, tmp_path / "k.json", lambda: saved.append(1), [], [], keep)
    assert code == kill_time.INCOMPLETE
    assert [n for n, _ in ran] == ["first-verdict", "verifiers-0-4", "verifiers-5-9", "draft"] and len(saved) == 4
    assert ran[0][1] is None and 900 < ran[3][1] < 950  # the plain part's last start: the budget less its tail
    assert "left for the next call: draft, pages, r2t-slot, fa3-rail, dsv4" in capsys.readouterr().out
    assert kill_time.run_all(args, doc, tmp_path / "k.json", lambda: saved.append(1), [], [], keep) == 0
    assert [n for n, _ in ran[4:]] == ["draft", "pages", "r2t-slot", "fa3-rail", "dsv4"]
    assert "every part is complete" in capsys.readouterr().out


def test_the_parts_that_are_not_plain_compile_into_a_triton_cache_of_their_own(monkeypatch):
    """The first verdict's and the verifiers' kernels (the draft's mutants among them) never warm the cache the
    plain runs use, whichever order ``--part all`` runs the parts in."""
    monkeypatch.setenv("TRITON_CACHE_DIR", "/shared-cache")
    for kind in ("first-verdict", "verifiers"):
        with kill_time.triton_cache(kind):
            assert os.environ["TRITON_CACHE_DIR"] == str(kill_time.WHOLE_PART_TRITON_CACHE) != "/shared-cache"
    with kill_time.triton_cache("plain"):
        assert os.environ["TRITON_CACHE_DIR"] == "/shared-cache"
    assert os.environ["TRITON_CACHE_DIR"] == "/shared-cache"
