"""The API and the pytest plugin never run a plug-in kernel in the test's own process (docs/security.md):
an import that exits, aborts or raises ``KeyboardInterrupt`` is ``BadInput`` (the plugin: a usage error,
exit 4), and a launch that exits, aborts, raises ``KeyboardInterrupt`` or never returns is a ``CRASH`` or
``HANG`` finding with a case file, so the test fails instead of ending pytest green, red or not at all."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvfence
from kvfence.errors import BadInput

pytestmark = [pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
CRASHERS = ROOT / "tests" / "targets" / "crashers.py"
HOSTILE_IMPORTS = {"exit": "import os\nos._exit(0)\n", "abort": "import os\nos.abort()\n",
                   "interrupt": "raise KeyboardInterrupt\n"}
LAUNCH = "\ndef launch(**kw):\n    pass\n"


@pytest.mark.parametrize("launcher, kind", [("exit_zero", "LAUNCH_ERROR"), ("hard_exit", "CRASH"), ("abort", "CRASH"),
                                            ("interrupt", "CRASH"), ("spin", "HANG")])
def test_check_kernel_turns_a_misbehaving_launch_into_a_failing_case(launcher, kind, tmp_path):
    spec = f"{CRASHERS}:{launcher}"
    if launcher == "interrupt":
        (tmp_path / "kbd.py").write_text("def launch(**kw):\n    raise KeyboardInterrupt\n")
        spec = f"{tmp_path / 'kbd.py'}:launch"
    with pytest.raises(AssertionError) as info:
        kvfence.check_kernel(spec, max_examples=3, out_dir=tmp_path / "o", shrink_seconds=2, case_timeout=3)
    text = str(info.value)
    assert kind in text and "repro: python -m kvfence repro" in text
    case = Path(text.split("case file: ", 1)[1].split("\n", 1)[0])
    assert case.is_file() and kind in {f["kind"] for f in json.loads(case.read_text())["findings"]}


def test_check_kernel_passes_the_reference_in_its_worker(tmp_path):
    kvfence.check_kernel("reference", max_examples=3, out_dir=tmp_path / "o")
    assert not (tmp_path / "o" / "cases").exists()


@pytest.mark.parametrize("what", sorted(HOSTILE_IMPORTS))
def test_check_kernel_refuses_a_plug_in_whose_import_ends_its_process(what, tmp_path):
    (tmp_path / "k.py").write_text(HOSTILE_IMPORTS[what] + LAUNCH)
    with pytest.raises(BadInput, match="importing kernel"):
        kvfence.check_kernel(f"{tmp_path / 'k.py'}:launch", max_examples=2, out_dir=tmp_path / "o")


def _pytest(tmp_path, *args, timeout=300):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_the_plugin_refuses_a_kernel_option_whose_import_ends_pytest(tmp_path):
    (tmp_path / "k.py").write_text(HOSTILE_IMPORTS["exit"] + LAUNCH)
    (tmp_path / "test_x.py").write_text("def test_nothing():\n    pass\n")
    proc = _pytest(tmp_path, "--kvfence-kernel", "k.py:launch", "--kvfence-device", "cpu")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # a usage error, not a silent exit 0
    assert "kvfence: importing kernel 'k.py:launch' ends the process" in proc.stderr


def test_the_session_fixture_checks_a_plug_in_in_a_worker(tmp_path):
    """A user's test through ``kvfence_session`` on a launcher that never returns fails with HANG; the same
    test on the reference passes."""
    (tmp_path / "test_mine.py").write_text(
        "from kvfence.cases.case import Batch, Case, Config\n\n"
        "def test_mine(kvfence_session, kvfence_kernel):\n"
        "    case = Case(Config(topk=1, num_steps=1, ctx=4, max_bs=1, sizing='safe'), Batch((2,), (0,), 0),"
        " kvfence_kernel)\n"
        "    assert [f.kind.value for f in kvfence_session(kvfence_kernel, case_timeout=3).check(case)] == []\n")
    hang = _pytest(tmp_path, "--kvfence-kernel", f"{CRASHERS}:spin", "--kvfence-device", "cpu")
    assert hang.returncode == 1 and "HANG" in hang.stdout, hang.stdout + hang.stderr
    clean = _pytest(tmp_path, "--kvfence-kernel", f"{ROOT / 'kernels' / 'draft_kv_indices.py'}:"
                    "generate_draft_decode_kv_indices", "--kvfence-device", "cpu")
    assert clean.returncode == 0, clean.stdout + clean.stderr
