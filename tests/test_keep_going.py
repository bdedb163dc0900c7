"""``fuzz --keep-going`` (kvfence.engine.keepgoing): one run finds, shrinks and saves every distinct failure
it meets within its budget instead of stopping at the first."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.engine import casefile
from kvfence.engine.findings import Kind

pytestmark = pytest.mark.cpu_only  # the plug-in segfaults the interpreter's process on purpose

ROOT = Path(__file__).resolve().parent.parent
SPEC = f"{ROOT / 'tests' / 'targets' / 'crashers.py'}:crash_or_wrong"
SMALL = ["--device", "cpu", "--mode", "eager", "--topk", "2", "--num-steps", "1", "--ctx", "6", "--max-bs", "2",
         "--seed", "1", "--quiet", "--database", "none"]


def fuzz(*args):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-m", "kvfence", "fuzz", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.mark.long
def test_a_crash_and_a_value_bug_are_both_found_shrunk_and_saved_in_one_run(tmp_path):
    out = tmp_path / "out"
    res = fuzz("--kernel", SPEC, "--keep-going", "--max-examples", "80", "--out", out, *SMALL)
    assert res.returncode == 1, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    by_kind = {record["kinds"][0]: casefile.load_case(path) for path, record in summary["cases"].items()}
    assert sorted(by_kind) == [Kind.CRASH.value, Kind.VALUE_MISMATCH.value]
    # Each shrunk to the smallest case of its own bug (crashers.crash_or_wrong), not slipped into the other.
    crash, wrong = by_kind[Kind.CRASH.value].case.case, by_kind[Kind.VALUE_MISMATCH.value].case.case
    assert crash.config.page_size == 64 and list(crash.batch.seq_lens) == [2]
    assert wrong.config.page_size == 1 and list(wrong.batch.seq_lens) == [3]
    assert summary["keep_going"]["distinct_failures"] == 2 and summary["keep_going"]["phases"] >= 2
    assert sorted(f["kind"] for f in summary["findings"]) == [Kind.CRASH.value, Kind.VALUE_MISMATCH.value]
    assert sorted(p.name for p in (out / "cases").glob("*.json")) == sorted(Path(p).name for p in summary["cases"])
    assert "2 distinct failure(s)" in res.stdout


def test_the_correct_kernel_runs_its_whole_budget_clean(tmp_path):
    out = tmp_path / "out"
    res = fuzz("--keep-going", "--max-examples", "30", "--out", out, *SMALL)
    assert res.returncode == 0, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["findings"] == [] and summary["examples"] == 30
    assert summary["keep_going"] == {"phases": 1, "distinct_failures": 0, "duplicates": 0, "known_repeats": 0}
    assert not list((out / "cases").glob("*.json"))


def test_a_failure_cut_by_shrink_seconds_says_so_in_its_case_file(tmp_path):
    cut = fuzz("--sizing", "prefix", "--shrink-seconds", "0", "--max-examples", "20", "--out", tmp_path / "cut", *SMALL)
    whole = fuzz("--sizing", "prefix", "--max-examples", "20", "--out", tmp_path / "whole", *SMALL)
    assert cut.returncode == whole.returncode == 1, (cut.stderr, whole.stderr)
    (cut_case,), (whole_case,) = ((tmp_path / d / "cases").glob("*.json") for d in ("cut", "whole"))
    shrink = casefile.load_case(cut_case).extras["shrink"]
    assert shrink["cut"] is True and "shrunk as far as it got" in shrink["note"]
    assert "shrink" not in casefile.load_case(whole_case).extras  # fully shrunk: nothing to say
