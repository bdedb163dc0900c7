"""A ``HANG`` is a finding only once confirmed (issue 56, item 4; ``kvfence.engine.supervisor``): a case past its
time limit is run again alone, in a fresh worker, with ``CONFIRM_FACTOR`` times its limit, and the kernel is
resolved where the worker starts (``kvfence.engine.checking.checker_for``), so neither a slow first launch (a
release's kernel read from its wheel, Triton's first compile) nor a loaded machine is a verdict.

The contracts here are the CSR fixture (``tests/fixtures/csr_contract``) with a launch that sleeps: on its first
call in each process (a first launch that takes longer than the limit, shorter than the confirmation's), or on
every call (a real hang). Under load: processes burning every CPU while the slow first launch runs, and the
plain command on a release's kernel (a fake wheel holding kvfence's own text) with a tight ``--case-timeout``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvfence.engine import registry
from kvfence.engine.findings import Kind
from kvfence.engine.launch import bind
from kvfence.engine.plan import RunPlan
from kvfence.engine.supervisor import CONFIRM_FACTOR, RemoteSession

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "csr_contract"
#: Seconds a case may take (--case-timeout): a first case's limit is twice it (the CPU's warm-up allowance).
TIMEOUT = 0.5

SLOW = '''
import os
import time

from csr_contract import CsrKvIndices

_launched = []


class Sleepy(CsrKvIndices):
    """The CSR contract whose launch sleeps FIRST seconds on its first call in a process, EVERY on each."""

    name = NAME

    def launch(self, kernel, buffers, launch):
        if not _launched:
            _launched.append(1)
            time.sleep(FIRST)
        time.sleep(EVERY)
        super().launch(kernel, buffers, launch)


RECORD = Sleepy()
'''


@contextmanager
def _sleepy(tmp_path: Path, name: str, first: float, every: float):
    """The record ``Sleepy`` registered as ``name`` (its module on the import path the worker gets)."""
    module = f"sleepy_{name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(f"NAME = {name!r}\nFIRST = {first}\nEVERY = {every}\n" + SLOW)
    sys.path[:0] = [str(tmp_path), str(FIXTURE)]
    try:
        with registry.registered(name, f"{module}:RECORD"):
            yield registry.get(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.path.remove(str(FIXTURE))


@contextmanager
def _load(processes: int):
    """``processes`` busy loops: every CPU core taken while the block runs."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()


def _case(record):
    from kvfence.engine.record_probe import drawn

    return bind(record, drawn(record, 1, 0, {})[0], "safe")


@pytest.mark.parametrize("loaded", [False, True], ids=["idle", "every-core-busy"])
def test_a_first_launch_slower_than_its_limit_is_no_hang(tmp_path, loaded):
    """The first launch of each worker sleeps past the first case's limit (2 x 0.5 s) but well inside the
    confirmation's (CONFIRM_FACTOR times it): the case runs again alone in a fresh worker, passes there, and is no
    finding; the run's counters say one hang was not confirmed. Idle, and with every core busy."""
    with _sleepy(tmp_path, "csr-slow-first", 1.4, 0.0) as record, _load(2 * os.cpu_count() if loaded else 0):
        with RemoteSession(RunPlan(contract=record.name, device="cpu", case_timeout=TIMEOUT)) as session:
            findings = session.check(_case(record))
            stats = dict(session.stats)
    assert findings == [], findings
    assert stats["hangs"] == 1 and stats["hangs_unconfirmed"] == 1 and stats["worker_starts"] >= 2, stats


def test_a_real_hang_is_confirmed_alone_with_a_longer_limit(tmp_path):
    """Every launch sleeps far past any limit: the first run's HANG is confirmed by a second, alone in a fresh
    worker with CONFIRM_FACTOR times the limit, and the finding says both."""
    with _sleepy(tmp_path, "csr-hangs", 0.0, 60.0) as record:
        with RemoteSession(RunPlan(contract=record.name, device="cpu", case_timeout=TIMEOUT)) as session:
            findings = session.check(_case(record))
            stats = dict(session.stats)
    assert [f.kind for f in findings] == [Kind.HANG], findings
    detail = findings[0].detail
    assert "again alone in a fresh worker" in detail and f"limit {2 * TIMEOUT * CONFIRM_FACTOR:.1f}s" in detail, detail
    assert stats["hangs"] == 2 and stats["hangs_unconfirmed"] == 1, stats


def test_a_kernel_is_resolved_before_the_worker_is_ready_not_in_the_first_launch(tmp_path):
    """The checker a worker makes resolves the plan's kernel then, under the worker's start allowance: a plug-in
    kernel whose import takes 1.5 s (a release's wheel read on first use takes longer) costs the first case nothing
    (no hang, not even an unconfirmed one, where its limit is 1 s); a spec that cannot be resolved is one line at
    the start, before any case."""
    from kvfence.errors import BadInput

    kernel = tmp_path / "slow_import_kernel.py"
    kernel.write_text("import time\ntime.sleep(1.5)\n" + (FIXTURE / "csr_kernel.py").read_text())
    with _sleepy(tmp_path, "csr-plain", 0.0, 0.0) as record:
        plan = RunPlan(contract=record.name, device="cpu", case_timeout=TIMEOUT, kernel=f"{kernel}:csr_kv_indices")
        with RemoteSession(plan) as session:
            launch = _case(record)
            findings = session.check(bind(record, launch.case, "safe", plan.kernel))
            stats = dict(session.stats)
    assert findings == [] and stats["hangs"] == 0 and stats["worker_starts"] == 1, (findings, stats)
    with pytest.raises(BadInput, match="unknown mutant"):
        RemoteSession(RunPlan(contract="flashmla-page-table", device="cpu", kernel="mutant:no_such_bug"))


def _fake_release(folder: Path, version: str) -> None:
    """A wheel holding kvfence's own FA3 and FlashMLA kernels where SGLang 0.5.23 keeps them."""
    files = {"sglang/kernels/ops/attention/metadata.py": "kernels/fa3_metadata/fa3_decode_metadata.py",
             "sglang/kernels/ops/attention/kv_indices.py": "kernels/page_table/flashmla_page_table.py"}
    with zipfile.ZipFile(folder / f"sglang-{version}-py3-none-any.whl", "w") as zf:
        for member, ours in files.items():
            zf.writestr(member, (ROOT / ours).read_text())


@pytest.mark.parametrize("contract", ["fa3-decode-metadata", "flashmla-page-table"])
def test_the_plain_command_on_a_release_kernel_under_load_reports_no_hang(tmp_path, contract):
    """``kvfence fuzz --contract C --kernel sglang==V --device cpu`` with every core busy and a case timeout of 0.5 s:
    the kernel read from the wheel at the worker's start, its first launches slow under the load, and no ``HANG``
    (exit 0, clean), where a loaded 2-core machine reported the first launch of a one-token case as one."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_release(wheels, "9.9.8")
    env = dict(os.environ, TRITON_INTERPRET="1", KVFENCE_WHEEL_DIR=str(wheels), KVFENCE_CACHE=str(tmp_path / "cache"),
               KVFENCE_OFFLINE="1")
    with _load(2 * os.cpu_count()):
        run = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--contract", contract, "--kernel",
                              "sglang==9.9.8", "--device", "cpu", "--max-examples", "8", "--seed", "0",
                              "--case-timeout", str(TIMEOUT), "--out", str(tmp_path / "out")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and "no findings" in run.stdout and "HANG" not in run.stdout, \
        run.stdout[-3000:] + run.stderr[-3000:]
    worker = json.loads((tmp_path / "out" / "summary.json").read_text())["worker"]
    assert worker["hangs"] == worker["hangs_unconfirmed"], worker
