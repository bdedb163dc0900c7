"""Issue classes of docs/security.md that end in one line, never a traceback, a silent pass or GiBs allocated: a
1 KB case naming a huge table, versions that are not versions, a signal after the outputs are written, a job plan
that is a folder, a non-kernel given to a table contract, a contract name registered twice."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.engine import casefile, registry
from kvfence.engine.launch import bind
from kvfence.errors import BadInput

pytestmark = pytest.mark.cpu_only
ROOT = Path(__file__).resolve().parents[1]


def kvfence(*argv, timeout=300, cwd=ROOT, env=None):
    full = dict(os.environ, TRITON_INTERPRET="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full)


def _huge_case(folder: Path) -> Path:
    """A case file of under 1 KB whose tables would take 12 GiB: ctx 2**30 - 8 at page 1 (the validation bound),
    8 GiB of rows and the output's tail, which holds a whole row (``kvfence.engine.tables.tail_guard``)."""
    from kvfence.contracts.page_table.record import FLASHMLA, PageTableCase

    launch = bind(FLASHMLA, PageTableCase(1, 2 ** 30 - 8, 1, (5,), (0,), 1), "safe")
    path = folder / "huge.json"
    path.write_text(json.dumps(casefile.document(launch, [], device="cpu", source="test")))
    assert path.stat().st_size < 1024
    return path


@pytest.mark.interpreter
def test_a_1kb_case_naming_gib_tables_is_one_line_in_every_command_that_reads_it(tmp_path):
    case = _huge_case(tmp_path)
    replay = kvfence("repro", str(case), "--device", "cpu")
    lines = replay.stderr.strip().splitlines()
    assert replay.returncode == 2 and len(lines) == 1
    assert "12288 MiB" in lines[0] and "nothing was allocated" in lines[0]
    # A run folder holding it (as a run that found it would): the report renders, naming the case it cannot draw.
    run = tmp_path / "run"
    clean = kvfence("fuzz", "--contract", "flashmla-page-table", "--device", "cpu", "--max-examples", "2", "--quiet",
                    "--out", str(run))
    assert clean.returncode == 0, clean.stderr
    (run / "cases").mkdir(exist_ok=True)
    (run / "cases" / case.name).write_text(case.read_text())
    report = kvfence("report", str(run))
    assert report.returncode in (0, 1) and "Traceback" not in report.stderr, report.stderr
    merged = kvfence("report", "--merge", str(run), str(run), "--out", str(tmp_path / "merged"))
    assert merged.returncode in (0, 1, 2) and "Traceback" not in merged.stderr and "MemoryError" not in merged.stderr


@pytest.mark.interpreter
def test_a_journal_slot_holding_the_huge_case_becomes_a_crash_case_file_without_allocating(tmp_path):
    from kvfence.engine.journal import JOURNAL_DIR, SUFFIX

    case = json.loads(_huge_case(tmp_path).read_text())
    out = tmp_path / "out"
    (out / JOURNAL_DIR).mkdir(parents=True)
    slot = out / JOURNAL_DIR / f"1-dead{SUFFIX}"
    slot.write_bytes(b"S" + json.dumps({"run": {"device": "cpu", "pid": 1, "started": 0}, "contract":
                                        case["contract"], "case": case["case"]}).encode() + b"\n")
    resumed = kvfence("fuzz", "--contract", "flashmla-page-table", "--device", "cpu", "--resume", "--out", str(out))
    assert resumed.returncode in (1, 2) and "Traceback" not in resumed.stderr and "MemoryError" not in resumed.stderr
    again = kvfence("fuzz", "--contract", "flashmla-page-table", "--device", "cpu", "--max-examples", "2", "--quiet",
                    "--out", str(out))
    assert again.returncode in (0, 1) and "Traceback" not in again.stderr, again.stderr  # no slot left to trip on
    assert not list((out / JOURNAL_DIR).glob(f"*{SUFFIX}"))


@pytest.mark.parametrize("version", ["0.5.23\n", "9" * 100_000, "0.5.23/../../etc", " 0.5.23"])
def test_a_version_that_is_not_a_version_is_one_line(version, tmp_path):
    from kvfence.release.wheels import check_version

    with pytest.raises(BadInput) as err:
        check_version(version)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200
    proc = kvfence("upstream", "sizing", version, env={"KVFENCE_CACHE": str(tmp_path), "KVFENCE_OFFLINE": "1"})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[:300]


def test_a_signal_after_the_outputs_are_written_leaves_the_exit_status_to_them(monkeypatch, capsys):
    """The summary, written before the signal, says the run was not interrupted: the exit status agrees (and says
    why); a signal before the outputs are written is the run's interruption (128 + signal)."""
    from kvfence.cli import build_parser
    from kvfence.cli import fuzz as fuzz_cli
    from kvfence.engine import interrupt

    def run(after_outputs: bool):
        interrupt._RECEIVED.clear()
        interrupt._AT_OUTPUTS.clear()

        def fake(args):
            if after_outputs:
                interrupt.outputs_written()
            os.kill(os.getpid(), signal.SIGINT)  # deferred by the command: remembered, not raised
            return 1

        monkeypatch.setattr(fuzz_cli, "cmd_fuzz", fake)
        previous = signal.getsignal(signal.SIGINT)
        try:
            return fuzz_cli._fuzz_command(build_parser().parse_args(["fuzz", "--device", "cpu"]))
        finally:
            signal.signal(signal.SIGINT, previous)
            interrupt._RECEIVED.clear()

    assert run(after_outputs=True) == 1 and "came after the run's outputs were written" in capsys.readouterr().err
    assert run(after_outputs=False) == 130


def test_a_job_plan_that_is_a_folder_is_one_line(tmp_path):
    proc = kvfence("fuzz", "--plan", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"kvfence: error: job plan {tmp_path}: not a regular file"]


@pytest.mark.interpreter
@pytest.mark.parametrize("spec, named", [
    (f"{ROOT / 'tests' / 'targets' / 'bad_writes.py'}:BAD_VALUE", "is int, not a @triton.jit function"),
    ("collections:OrderedDict", "is type, not a @triton.jit function"),
    ("kvfence.kernels.draft.draft_kv_indices:generate_draft_decode_kv_indices", "parameters"),
])
def test_a_table_contract_refuses_a_non_kernel_in_one_line(spec, named, tmp_path):
    """An int, a class or another ABI's kernel given to a table contract: refused before any launch, never a
    LAUNCH_ERROR finding."""
    proc = kvfence("fuzz", "--contract", "flashmla-page-table", "--kernel", spec, "--device", "cpu", "--max-examples",
                   "3", "--out", str(tmp_path / "o"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0] and "LAUNCH_ERROR" not in proc.stdout


def test_a_second_package_registering_a_builtin_name_is_refused_not_obeyed():
    entries = registry._entries()
    before = list(entries["draft"])
    try:
        entries["draft"].append("somebody_else.contract:DRAFT")
        with pytest.raises(BadInput, match="registered twice"):
            registry.entry("draft")
    finally:
        entries["draft"][:] = before


@pytest.mark.interpreter
@pytest.mark.parametrize("name, said", [
    ("exits_later", "ended its process"),
    pytest.param("hangs_later", "did not return within", marks=pytest.mark.long),
])
def test_a_sizing_plugin_that_fails_after_good_calls_ends_the_run_in_one_line(tmp_path, name, said):
    """Not Hypothesis's FlakyFailure traceback: a ``BadInput`` inside an example ends the search at once."""
    spec = f"{ROOT / 'tests' / 'targets' / 'flaky_sizing.py'}:{name}"
    proc = kvfence("fuzz", "--device", "cpu", "--sizing", spec, "--max-examples", "20", "--quiet", "--out",
                   str(tmp_path / "o"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and said in lines[0] and "Flaky" not in proc.stderr, proc.stderr


def test_kvfences_own_option_inside_a_launch_command_is_refused_not_ignored(tmp_path):
    """``--offline`` after the release would be read as a server flag and dropped (and the wheel downloaded): it is
    one line naming where it goes, exit 2; before the release it holds (an empty cache offline: UNKNOWN, exit 3,
    nothing fetched)."""
    env = {"KVFENCE_CACHE": str(tmp_path / "cache"), "KVFENCE_WHEEL_DIR": ""}
    for command in (["0.5.23", "python", "-m", "sglang.launch_server", "--attention-backend", "fa3", "--offline"],
                    ["0.34.0", "vllm", "serve", "M", "--kv-cache-group=4:1"]):
        proc = kvfence("affected", *command, env=env, timeout=60)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and "is kvfence's option, not the server's" in proc.stderr
    proc = kvfence("affected", "--offline", "0.5.23", "--attention-backend", "fa3", env=env, timeout=120)
    assert proc.returncode == 3 and "UNKNOWN sglang" in proc.stdout, proc.stdout + proc.stderr  # the short line
    assert not any((tmp_path / "cache").rglob("*.whl"))


def test_two_contracts_cases_with_the_same_fields_keep_their_own_case_files(tmp_path):
    """A FlashMLA case and a TRTLLM-MHA case with the same fields are two case files (the name hashes the
    contract with the record), so ``report --merge`` keeps both findings."""
    from kvfence.contracts.page_table.record import FLASHMLA, TRTLLM_MHA, PageTableCase

    case = PageTableCase(16, 40, 2, (17,), (0,), 1)
    flashmla, trtllm = bind(FLASHMLA, case, "safe"), bind(TRTLLM_MHA, case, "safe")
    assert FLASHMLA.to_json(case) == TRTLLM_MHA.to_json(case)  # the same fields
    assert casefile.case_hash(flashmla) != casefile.case_hash(trtllm)


@pytest.mark.interpreter
def test_ctrl_c_inside_check_kernel_interrupts_the_caller(tmp_path):
    """SIGINT while ``check_kernel`` checks (a launcher that spins) ends the caller with a KeyboardInterrupt, never a
    normal return (a test calling it would have passed)."""
    script = tmp_path / "mine.py"
    script.write_text(
        "import kvfence\n"
        f"kvfence.check_kernel({str(ROOT / 'tests' / 'targets' / 'crashers.py') + ':spin'!r}, device='cpu',\n"
        f"                     max_examples=5, case_timeout=120, out_dir={str(tmp_path / 'out')!r})\n"
        "print('returned')\n")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        import time

        time.sleep(12)  # imports, the worker's start, the first launch spinning
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "returned" not in out, out + err
    # kvfence.engine.interrupt.Interrupted is a KeyboardInterrupt: uncaught, the script fails with it.
    assert proc.returncode != 0 and "Interrupted: SIGINT" in err, (proc.returncode, out, err[-2000:])
