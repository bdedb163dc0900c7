"""tests/test_isolation.py's promise on a CUDA device (docs/security.md): the API and the plugin run a plug-in
kernel in a checking worker that owns the GPU, so a launch that exits, aborts, raises ``KeyboardInterrupt``
or never returns is a failing case with its case file, never pytest ending green, red or not at all.
``case_timeout=1`` keeps the first HANG within the warm-up allowance of a new config (13 s on CUDA)."""

import os
import subprocess
import sys

import pytest
from test_isolation import CRASHERS, MISBEHAVING, ROOT, check_a_misbehaving_launch

pytestmark = [pytest.mark.gpu]


@pytest.mark.parametrize("launcher, kind", MISBEHAVING)
def test_on_cuda_check_kernel_turns_a_misbehaving_launch_into_a_failing_case(launcher, kind, tmp_path):
    assert check_a_misbehaving_launch(launcher, kind, tmp_path, device="cuda", case_timeout=1)["device"] == "cuda"


@pytest.mark.parametrize("launcher, kind", [("hard_exit", "CRASH"), ("spin", "HANG")])
def test_on_cuda_the_plugin_session_fails_a_test_whose_launch_ends_or_stalls_the_worker(launcher, kind, tmp_path):
    (tmp_path / "test_mine.py").write_text(
        "from kvfence.contracts.draft.case import Batch, Case, Config\n"
        "from kvfence.contracts.draft.record import launch_of\n\n"
        "def test_mine(kvfence_session, kvfence_kernel):\n"
        "    case = launch_of(Case(Config(topk=1, num_steps=1, ctx=4, max_bs=1, sizing='safe'), Batch((2,), (0,), 0),"
        " kvfence_kernel))\n"
        "    assert [f.kind.value for f in kvfence_session(kvfence_kernel, case_timeout=1).check(case)] == []\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "HYPOTHESIS_PROFILE",
                                                            "KVFENCE_KERNEL", "KVFENCE_SIZING", "TRITON_INTERPRET")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kvfence-kernel",
                           f"{CRASHERS}:{launcher}", "--kvfence-device", "cuda"], cwd=tmp_path,
                          env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and kind in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
