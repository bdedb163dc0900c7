"""kvfence's pytest plugin (kvfence.pytest_plugin): the device is chosen before a project's conftest
imports triton, its fixtures and kvfence.contracts.draft.strategies serve a project's own ``@given`` test, a triton
import ahead of the plugin is one line saying what to change, and tests that need the CPU interpreter skip with
the versions named where the installed triton/numpy pair cannot interpret (simulated here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvfence import pytest_plugin

CONFTEST_IMPORTING_TRITON = '''
import os
import triton.language  # a project's conftest imports triton before any test runs

assert os.environ.get("TRITON_INTERPRET") == "1", "the plugin did not choose the interpreter first"
'''

OWN_GIVEN_TEST = '''
from hypothesis import given, settings
from kvfence.strategies import cases, configs


@settings(max_examples=3, deadline=None)
@given(case=cases(configs(max_ctx=8, max_max_bs=2)))
def test_reference_is_clean(case, kvfence_session, kvfence_kernel, kvfence_sizing, kvfence_device):
    assert (kvfence_kernel, kvfence_sizing, kvfence_device) == ("reference", "safe", "cpu")
    assert kvfence_session(kvfence_kernel).check(case) == []
'''


def cpu_child_env() -> dict:
    """A child that chooses its device itself: no TRITON_INTERPRET inherited from this session."""
    env = dict(os.environ)
    for name in ("TRITON_INTERPRET", "PYTHONPATH", "PYTEST_ADDOPTS", "KVFENCE_DEVICE", "HYPOTHESIS_PROFILE"):
        env.pop(name, None)
    return env


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST_IMPORTING_TRITON)
    (tmp_path / "test_own.py").write_text(OWN_GIVEN_TEST)
    return tmp_path


@pytest.mark.interpreter  # the child runs --kvfence-device cpu
def test_plugin_chooses_the_interpreter_before_a_conftest_imports_triton(project):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--kvfence-device", "cpu", "test_own.py"], cwd=project, env=cpu_child_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


@pytest.mark.interpreter
def test_triton_imported_ahead_of_the_plugin_is_one_line_saying_what_to_change(project):
    """The pair of the test above: triton loaded before pytest starts, the interpreter not chosen."""
    launch = "import triton.language, sys, pytest; sys.exit(pytest.main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", launch, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--kvfence-device", "cpu", "test_own.py"], cwd=project, env=cpu_child_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "before triton is imported" in errors[0] and "TRITON_INTERPRET=1" in errors[0]


# -- skips, with the reason ------------------------------------------------------------------------------
def fake_config(device: str, network: bool = False, long: bool = False):
    return SimpleNamespace(_kvfence_device=device,
                           getoption=lambda name: {"--kvfence-network": network, "--kvfence-long": long}[name])


def test_long_tests_skip_unless_asked_for():
    reasons = pytest_plugin.skip_reasons(fake_config("cpu"), {"long": True})
    assert len(reasons) == 1 and "--kvfence-long" in reasons[0] and "KVFENCE_LONG=1" in reasons[0], reasons
    assert pytest_plugin.skip_reasons(fake_config("cpu", long=True), {"long": True}) == []


@pytest.fixture
def broken_interpreter(monkeypatch):
    """The GPU machine's pair: triton 3.6.0 with numpy 2.5.2 (kvfence.device.check_interpreter_numpy refuses it)."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: {"triton": "3.6.0", "numpy": "2.5.2"}.get(name) or real(name))


def test_interpreter_tests_skip_naming_the_versions_where_it_cannot_run(broken_interpreter):
    reasons = pytest_plugin.skip_reasons(fake_config("cuda"), {"interpreter": True})
    assert len(reasons) == 1 and "3.6.0" in reasons[0] and "2.5.2" in reasons[0], reasons
    assert pytest_plugin.skip_reasons(fake_config("cuda"), {"gpu": True}) == []  # GPU tests still run there


def test_interpreter_tests_run_where_it_can(monkeypatch):
    """The pair of the test above: triton 3.9 (this CI's) interprets with any numpy."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: {"triton": "3.9.0", "numpy": "2.5.2"}.get(name) or real(name))
    assert pytest_plugin.skip_reasons(fake_config("cuda"), {"interpreter": True}) == []
    assert pytest_plugin.skip_reasons(fake_config("cpu"), {"cpu_only": True}) == []
    assert pytest_plugin.skip_reasons(fake_config("cuda"), {"cpu_only": True}) != []  # in-process: cpu only


def test_service_and_network_tests_say_what_they_need(monkeypatch):
    monkeypatch.setattr(pytest_plugin.shutil, "which", lambda name: None)
    assert pytest_plugin.skip_reasons(fake_config("cpu"), {"redis": True}) == ["needs a local redis-server on PATH"]
    assert "KVFENCE_NETWORK=1" in pytest_plugin.skip_reasons(fake_config("cpu"), {"network": True})[0]
    assert pytest_plugin.skip_reasons(fake_config("cpu", network=True), {"network": True}) == []


SIMULATED_GPU_MACHINE = '''
import kvfence.device
from kvfence.errors import require


def _refuse():  # what check_interpreter_numpy says on the H200 (triton 3.6.0, numpy 2.5.2)
    require(False, "the Triton 3.6.0 interpreter fails with numpy 2.5.2 (scalar loads)")


kvfence.device.check_interpreter_numpy = _refuse  # after the plugin chose the device, before collection
'''

MARKED = '''
import pytest


@pytest.mark.interpreter
def test_needs_the_interpreter():
    raise AssertionError("ran where the interpreter cannot")


def test_plain():
    pass
'''


@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
def test_the_interpreter_marker_skips_with_the_versions_in_a_real_session(tmp_path):
    (tmp_path / "conftest.py").write_text(SIMULATED_GPU_MACHINE)
    (tmp_path / "test_marked.py").write_text(MARKED)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--kvfence-device", "cpu", "test_marked.py"], cwd=tmp_path,
                          env=dict(cpu_child_env(), TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout
    assert "needs the Triton CPU interpreter: the Triton 3.6.0 interpreter fails with numpy 2.5.2" in proc.stdout
