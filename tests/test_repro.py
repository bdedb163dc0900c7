"""The issue's "done when": fuzz finds the ``prefix`` overflow (pre-fix sizing, no topk factor), writes a
case file named in --json, and repro replays it."""

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import launch_of
from kvfence.engine import casefile
from kvfence.engine.repro import run_repro

ROOT = Path(__file__).resolve().parent.parent


def harness(*args):
    return subprocess.run([sys.executable, "-m", "kvfence", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    """One real fuzz run of the pre-fix sizing, as in the issue (seeded, CPU)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    res = harness("fuzz", "--sizing", "prefix", "--device", "cpu", "--max-examples", "200", "--seed", "1",
                  "--json", tmp / "s.json", "--out", tmp / "out")
    return tmp, res


@pytest.mark.cpu_only  # the CLI runs --device cpu (the interpreter)
def test_fuzz_writes_a_case_file_named_in_the_json_summary(fuzzed):
    tmp, res = fuzzed
    assert res.returncode == 1, res.stderr
    summary = json.loads((tmp / "s.json").read_text())
    assert summary == json.loads((tmp / "out" / "summary.json").read_text())  # --json: same content
    for key in ("examples", "elapsed_s", "cases_per_s"):
        assert key in summary
    assert summary["findings"] and all(set(f) >= {"kind", "region", "case"} for f in summary["findings"])
    paths = {f["case"] for f in summary["findings"]}
    assert len(paths) == 1
    path = Path(paths.pop())
    assert path.parent == tmp / "out" / "cases" and path.is_file()
    assert f"python -m kvfence repro {path}" in res.stdout
    loaded = casefile.load_case(path)
    assert loaded.case.sizing == "prefix" and loaded.sizing["need"] > loaded.sizing["width"]
    assert loaded.extras["hypothesis"]["blob"].startswith("@reproduce_failure(")


@pytest.mark.cpu_only
def test_repro_exits_1_with_a_readable_diff_and_0_under_the_fixed_sizing(fuzzed):
    tmp, _ = fuzzed
    path = json.loads((tmp / "s.json").read_text())["findings"][0]["case"]
    res = harness("repro", path, "--device", "cpu")
    assert res.returncode == 1, res.stderr
    out = res.stdout
    assert "FAIL:" in out and "GUARD_OVERWRITE" in out and "SIZING_VIOLATION" in out
    # The need/width arithmetic is the engine's (kvfence.engine.launch.explain): the need, the sizing's policy
    # with its formula, and the verdict.
    assert "need   = " in out and "width  = prefix(case, graph) = " in out and "W = n * ctx" in out
    assert "=> need > width by" in out
    assert "expected owners (programs): (0,0," in out and "written by: (0," in out
    assert "expected" in out and "found" in out and "elements [" in out
    fixed = harness("repro", path, "--device", "cpu", "--sizing", "safe")
    assert fixed.returncode == 0, fixed.stderr
    assert "PASS: no findings" in fixed.stdout and "override sizing safe (file: prefix)" in fixed.stdout
    assert "width  = safe(case, graph) = " in fixed.stdout and "=> fits" in fixed.stdout


@pytest.mark.cpu_only
def test_a_printed_repro_line_keeps_working_after_a_later_run_moved_its_case_file(fuzzed, tmp_path):
    """A second ``fuzz`` into the folder moves the first run's case files to ``cases/earlier/<time>/``
    (``set_aside_earlier_cases``, what the run does first): the repro line the first run printed still replays
    the case, with a note saying where it now is (it used to be "no such file")."""
    import shutil

    from kvfence.engine.outdir import set_aside_earlier_cases

    tmp, res = fuzzed
    shutil.copytree(tmp / "out", tmp_path / "out")
    printed = tmp_path / "out" / "cases" / Path(json.loads((tmp / "s.json").read_text())["findings"][0]["case"]).name
    moved = set_aside_earlier_cases(tmp_path / "out")
    assert moved and not printed.exists()
    replay = harness("repro", printed, "--device", "cpu")
    assert replay.returncode == 1 and "SIZING_VIOLATION" in replay.stdout, replay.stderr
    assert f"{printed} was moved to {Path(moved['folder']) / printed.name}" in replay.stderr


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_repro_verbose_shows_every_element_and_the_program_segments(tmp_path, device):
    # A wider overflow than the fuzzer's minimal case: 3 requests of 4, topk 2, pre-fix width 3*4.
    case = launch_of(Case(Config(topk=2, num_steps=2, ctx=4, max_bs=3, sizing="prefix"),
                          Batch((4, 4, 4), (3, 1, 0), 9)))
    path = casefile.write_case(case, [], out_dir=tmp_path, device=device)
    short, verbose = io.StringIO(), io.StringIO()
    assert run_repro(path, device=device, out=short) == 1
    assert run_repro(path, device=device, out=verbose, verbose=True) == 1
    assert len(verbose.getvalue().splitlines()) > len(short.getvalue().splitlines()) + 10
    # --verbose lists every element of each finding (the plain path's re-run), each that differs marked "<-";
    # the short form shows only the samples the finding recorded, and says how to see the rest.
    assert verbose.getvalue().count("   <-") >= 24 and "   <-" not in short.getvalue()
    assert "(--verbose lists every element" in short.getvalue()
    assert "(--verbose lists every element" not in verbose.getvalue()


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_repro_kernel_override_runs_the_named_kernel(tmp_path, device):
    case = launch_of(Case(Config(topk=2, num_steps=1, ctx=4, max_bs=1, sizing="prefix"), Batch((3,), (1,), 0)))
    path = casefile.write_case(case, [], out_dir=tmp_path, device=device)
    out = io.StringIO()
    assert run_repro(path, device=device, kernel="reference-blocked", sizing="safe", out=out) == 0
    assert "override kernel reference-blocked (file: reference)" in out.getvalue()


def _readme_repro_shape() -> re.Pattern:
    """The repro line README.md shows under "Read a finding", as a pattern: its words as they are, its case
    file's 12-hex-digit name any such name."""
    block = (ROOT / "README.md").read_text().split("## Read a finding", 1)[1].split("```text\n", 1)[1].split("```")[0]
    lines = [line for line in block.splitlines() if " repro " in line]
    assert len(lines) == 1, lines
    shown = lines[0]
    assert re.fullmatch(r"\S+ repro \S+/[0-9a-f]{12}\.json", shown), shown
    return re.compile(re.sub(r"[0-9a-f]{12}\\\.json$", r"[0-9a-f]{12}\\.json", re.escape(shown)))


@pytest.mark.cpu_only  # the CLI runs --device cpu (the interpreter)
@pytest.mark.interpreter
def test_a_plugin_contracts_printed_repro_line_is_the_readmes_shape(tmp_path):
    """``kvfence fuzz --contract C`` for a plug-in contract (run behind the boundary, in a ``python -m kvfence``
    child) prints its repro line as README.md shows one: ``kvfence repro reports/out/cases/<id>.json``, the name
    the user typed, from the folder the user ran it in; and that line replays the case."""
    import os
    import shlex

    fixture = ROOT / "tests" / "fixtures" / "csr_contract"
    env = dict(os.environ, TRITON_INTERPRET="1", KVFENCE_REGISTERED=json.dumps(
        {"entries": {"csr-kv-indices": ["csr_contract:CSR"]}, "sys_path": [str(fixture)]}))
    script = Path(sys.executable).parent / "kvfence"  # the console script: what README's reader runs
    res = subprocess.run([str(script), "fuzz", "--contract", "csr-kv-indices", "--sizing", "short", "--seed", "1",
                          "--max-examples", "30"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr
    printed = [line for line in res.stdout.splitlines() if " repro " in line]
    assert printed and all(_readme_repro_shape().fullmatch(line) for line in printed), printed
    replay = subprocess.run([str(script), *shlex.split(printed[0])[1:], "--device", "cpu"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 1, replay.stdout + replay.stderr
