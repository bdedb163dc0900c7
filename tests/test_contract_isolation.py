"""A plug-in contract's kernel runs in a checking worker (kvfence.engine.run.checker): a
kernel that exits, aborts, raises KeyboardInterrupt or hangs is that case's CRASH or HANG finding, with a case
file that ``repro`` replays the same way, never the end of the run or a silent exit 0. Each hostile kernel is
paired with the correct one, which passes on the same engine. CPU: the interpreter runs a jit body as Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.engine import registry

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TOY = FIXTURES / "toy_contract"


def _kvfence(*argv, cwd):
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.syspath_prepend(str(TOY))
    with registry.registered("toy-copy", "toy_contract:TOY"):
        yield registry.get("toy-copy")


#: Seconds a toy case may take in the worker: an interpreted launch is milliseconds, but on a loaded 2-core CI
#: machine one took over 5 s (the limit of a 2.5 s timeout), a false HANG of the correct kernel.
TOY_CASE_TIMEOUT = 5.0


def _fuzz(kernel: str, *, max_examples: int, shrink_seconds: float = 0.0):
    """The toy contract fuzzed by the engine every run uses, its kernel in a checking worker."""
    from kvfence.engine import run as pipeline
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan

    plan = RunPlan(contract="toy-copy", kernel=kernel, max_examples=max_examples, seed=0,
                   case_timeout=TOY_CASE_TIMEOUT, shrink_seconds=shrink_seconds)
    pipeline.record(plan)
    with pipeline.checker(plan) as session:
        return fuzz(session, pipeline.draws(plan)[0], plan)


@pytest.mark.parametrize("how, kind, detail", [
    ("exits", "CRASH", "exit status 0"), ("aborts", "CRASH", "SIGABRT"),
    ("interrupts", "CRASH", "KeyboardInterrupt"), ("hangs", "HANG", "no verdict after")])
def test_a_kernel_that_ends_or_stalls_its_process_is_a_finding_of_its_case(toy, how, kind, detail):
    """The toy contract's hostile kernels misbehave only on a request of length 3: the run goes on, and the
    failing case is one holding that request, named by the kind and the way the worker ended."""
    from kvfence.engine.loop import damage_kinds

    result = _fuzz(f"{TOY / 'hostile_toy_kernels.py'}:{how}", max_examples=50, shrink_seconds=1)
    headlines = [f.headline() for f in result.findings]
    assert result.findings and damage_kinds(result.findings) == [kind], headlines
    assert 3 in result.case.case.lens and detail in headlines[0]


def test_the_correct_toy_kernel_passes_in_the_checking_worker(toy):
    clean = _fuzz("reference", max_examples=30)
    assert not clean.findings and clean.examples == 30


def test_fuzz_and_repro_of_a_kernel_that_exits_0_fail_with_its_crash_and_the_reference_passes(tmp_path):
    """The user's commands: ``fuzz --contract`` exits 1 with a CRASH case file, ``repro`` of it exits 1 with
    the CRASH (in one process each would have ended with status 0), the reference kernel passes the same
    case; a kernel whose import ends the process is one line and exit 2."""
    kernel = f"{FIXTURES / 'hostile_flashmla.py'}:exits"
    run = _kvfence("fuzz", "--contract", "flashmla-page-table", "--kernel", kernel, "--device", "cpu",
                   "--seed", "0", "--shrink-seconds", "1", "--out", str(tmp_path / "out"), "--quiet", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "CRASH" in run.stdout and "died with exit status 0" in run.stdout
    case_file = next((tmp_path / "out" / "cases").glob("*.json"))
    assert [f["kind"] for f in json.loads(case_file.read_text())["findings"]] == ["CRASH"]
    again = _kvfence("repro", str(case_file), "--kernel", kernel, "--device", "cpu", cwd=tmp_path)
    assert again.returncode == 1 and "CRASH" in again.stdout and "FAIL:" in again.stdout, again.stdout
    fixed = _kvfence("repro", str(case_file), "--kernel", "reference", "--device", "cpu", cwd=tmp_path)
    assert fixed.returncode == 0 and "PASS: no findings" in fixed.stdout, fixed.stdout + fixed.stderr
    dies = _kvfence("fuzz", "--contract", "flashmla-page-table", "--kernel", f"{FIXTURES / 'exits_at_import.py'}:k",
                    "--device", "cpu", "--out", str(tmp_path / "out2"), cwd=tmp_path)
    # Its import is probed in a throwaway process first, as a draft kernel's is: one line, before anything runs.
    assert dies.returncode == 2 and "ends the process (exit status 0) before kvfence could check it" in dies.stderr
    assert "Traceback" not in dies.stderr and len(dies.stderr.strip().splitlines()) == 1


def _installed_toy(tmp_path: Path) -> dict:
    """The toy contract installed as another package installs a contract: its two files on the path and an
    entry point in the ``kvfence.contracts`` group (a ``.dist-info`` folder, what pip writes). No kvfence file
    names it. The environment of a ``kvfence`` process that sees it."""
    site = tmp_path / "site"
    info = site / "toy_contract-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-contract\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kvfence.contracts]\ntoy-copy = toy_contract:TOY\n")
    path = os.pathsep.join([str(site), str(TOY)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return {"PYTHONPATH": path}


def _kvfence_env(*argv, cwd, env):
    full = dict(os.environ, TRITON_INTERPRET="1", **env)
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=300)


def test_an_installed_contract_gets_jobs_keep_going_case_files_repro_and_the_report(tmp_path):
    """The commands a user runs, on a contract kvfence's code never names: ``fuzz --jobs 2`` merges two jobs'
    counts, ``--keep-going`` saves each distinct failure (the short sizing's overflow, the hostile kernel's
    CRASH) as a case file, ``repro`` replays each as printed, and report.html draws its tables. Its own flag
    (``--stride``, declared in ``Contract.options``) is listed by ``--help``, pinned into every case and kept in
    the case files ``repro`` replays."""
    env = _installed_toy(tmp_path)
    listed = _kvfence_env("fuzz", "--contract", "toy-copy", "--help", cwd=tmp_path, env=env)
    assert "toy-copy" in listed.stdout and "--stride STRIDE" in listed.stdout  # its own flag (Contract.options)
    assert "--topk" not in listed.stdout  # and not the draft kernel's
    clean = _kvfence_env("fuzz", "--contract", "toy-copy", "--device", "cpu", "--jobs", "2", "--max-examples", "30",
                         "--seed", "0", "--quiet", "--out", str(tmp_path / "clean"), cwd=tmp_path, env=env)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    doc = json.loads((tmp_path / "clean" / "summary.json").read_text())
    assert doc["contract"] == "toy-copy" and doc["jobs"] == 2 and doc["examples"] == 30 and not doc["findings"]
    assert len(list((tmp_path / "clean" / "jobs").iterdir())) == 2
    kernel = f"{TOY / 'hostile_toy_kernels.py'}:exits"
    out = tmp_path / "bad"
    bad = _kvfence_env("fuzz", "--contract", "toy-copy", "--device", "cpu", "--kernel", kernel, "--sizing", "short",
                       "--stride", "3", "--keep-going", "--max-examples", "60", "--seed", "0", "--shrink-seconds", "5",
                       "--case-timeout", str(TOY_CASE_TIMEOUT), "--quiet", "--out", str(out), cwd=tmp_path, env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    summary = json.loads((out / "summary.json").read_text())
    kinds = {frozenset(c["kinds"]) for c in summary["cases"].values()}
    assert any("CRASH" in k for k in kinds) and any("GUARD_OVERWRITE" in k for k in kinds), kinds
    page = (out / "report.html").read_text()
    assert "buffer-map" in page and "toy-copy" in page
    assert summary["pins"] == {"stride": 3}
    for _path, record in summary["cases"].items():
        assert record["contract"] == "toy-copy" and record["kernel"] == kernel
        assert json.loads(Path(record["path"]).read_text())["case"]["case"]["stride"] == 3  # pinned, kept, replayed
        words = record["repro"].split()[3:]  # python -m kvfence repro FILE [--kernel K] [--sizing S]
        replay = _kvfence_env(*words, "--device", "cpu", cwd=tmp_path, env=env)
        assert replay.returncode == 1 and "FAIL:" in replay.stdout, replay.stdout + replay.stderr
        assert all(kind in replay.stdout for kind in record["kinds"]), (record["kinds"], replay.stdout)
    tampered = Path(next(iter(summary["cases"].values()))["path"])  # repro reads the stride the case file holds
    doc = json.loads(tampered.read_text())
    doc["case"]["case"]["stride"] = 9
    tampered.write_text(json.dumps(doc))
    refused = _kvfence_env("repro", str(tampered), "--device", "cpu", "--kernel", "reference", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and "stride must be an integer in [1, 8]" in refused.stderr, refused.stderr


#: A contract package's module whose import misbehaves (the probes of the isolation issue).
HOSTILE_IMPORTS = {
    "exit": "import os\nos._exit(0)\n",
    "raise": "raise RuntimeError('broken contract')\n",
    "interrupt": "raise KeyboardInterrupt\n",
    "system-exit": "raise SystemExit(0)\n",
    "thread": "import os, threading, time\n"
              "threading.Thread(target=lambda: (time.sleep(1.5), os._exit(0)), daemon=True).start()\n",
}


def _installed_hostile_contract(tmp_path: Path, how: str) -> dict:
    site = tmp_path / "site"
    info = site / "evil_contract-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil-contract\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kvfence.contracts]\nevil = evil_contract:EVIL\n")
    (site / "evil_contract.py").write_text(HOSTILE_IMPORTS[how])
    path = os.pathsep.join([str(site)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return {"PYTHONPATH": path}


@pytest.mark.parametrize("how", sorted(HOSTILE_IMPORTS))
def test_a_contract_whose_import_ends_or_interrupts_its_process_is_one_line_in_fuzz_pytest_and_the_api(tmp_path, how):
    """A contract plug-in's module is imported in a throwaway process first: an import that exits 0,
    raises, raises KeyboardInterrupt or SystemExit is one line naming the contract (fuzz: exit 2; the
    pytest plugin: a usage error, exit 4; ``check_kernel``: ``BadInput``, so the test fails), never an
    exit 0 with no output, a traceback or a run that looks interrupted by Ctrl-C. The installed toy
    contract passes the same way (the test above)."""
    env = _installed_hostile_contract(tmp_path, how)
    run = _kvfence_env("fuzz", "--contract", "evil", "--device", "cpu", "--max-examples", "2",
                       "--out", str(tmp_path / "out"), cwd=tmp_path, env=env)
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert "contract 'evil'" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    test = tmp_path / "test_api.py"
    test.write_text("import kvfence\n\ndef test_it():\n"
                    "    kvfence.check_kernel('reference', device='cpu', contract='evil', max_examples=2)\n")
    full = dict(os.environ, TRITON_INTERPRET="1", **env)
    api = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(test)],
                         cwd=tmp_path, env=full, capture_output=True, text=True, timeout=300)
    assert api.returncode == 1 and "contract 'evil'" in api.stdout and "1 failed" in api.stdout, api.stdout + api.stderr
    plugin = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             "--kvfence-contract", "evil", str(test)],
                            cwd=tmp_path, env=full, capture_output=True, text=True, timeout=300)
    assert plugin.returncode == 4 and "contract 'evil'" in plugin.stderr, (plugin.returncode, plugin.stdout,
                                                                           plugin.stderr)
