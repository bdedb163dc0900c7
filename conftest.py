"""pytest configuration for kvfence: options, markers, Hypothesis profiles and fixtures."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# A failing property test's report ends with its repro command (harness/workflow/pytest_plugin.py).
pytest_plugins = ["kvfence.workflow.pytest_plugin"]

# -- Hypothesis profiles -------------------------------------------------------------------------------
# Interpreter launches cost milliseconds each: no deadline, and the "too slow" health check is noise.
_quiet_health = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=_quiet_health)
settings.register_profile("dev", max_examples=15, deadline=None, print_blob=True, suppress_health_check=_quiet_health)
settings.register_profile("gpu", max_examples=500, deadline=None, print_blob=True, suppress_health_check=_quiet_health)
settings.register_profile("nightly", max_examples=5000, deadline=None, print_blob=True,
                          suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _load_example_database(config):
    """``KVFENCE_DATABASE`` (``none``, a directory or ``redis://HOST:PORT/DB``, as ``fuzz --database``):
    the property tests' Hypothesis example database, layered on the loaded profile as profile
    ``kvfence+database``. Keys are namespaced by ``--kernel`` and ``--sizing`` (kvfence.workflow.campaign). A
    database replays stored failures, so it turns ``derandomize`` off (Hypothesis forbids both)."""
    text = os.environ.get("KVFENCE_DATABASE")
    if not text:
        return
    from kvfence.workflow.campaign import pytest_database
    from kvfence.errors import BadInput

    try:
        database = pytest_database(text, kernel=config.getoption("--kernel"), sizing=config.getoption("--sizing"))
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None
    # settings() inherits the profile loaded now (HYPOTHESIS_PROFILE or --hypothesis-profile).
    settings.register_profile("kvfence+database", settings(), database=database, derandomize=False)
    settings.load_profile("kvfence+database")


# -- options and markers -------------------------------------------------------------------------------
def pytest_addoption(parser):
    group = parser.getgroup("kvfence")
    group.addoption("--device", default=os.environ.get("KVFENCE_DEVICE", "auto"), choices=["auto", "cpu", "cuda"],
                    help="where kernels run: cuda (compiled) or cpu (TRITON_INTERPRET=1); auto picks CUDA if present")
    group.addoption("--kernel", default=os.environ.get("KVFENCE_KERNEL", "reference"),
                    help="kernel under test: reference, module:attr or file.py:attr (env KVFENCE_KERNEL)")
    group.addoption("--sizing", default=os.environ.get("KVFENCE_SIZING", "safe"),
                    help="sizing policy under test: a builtin name, module:attr or file.py:attr (env KVFENCE_SIZING)")
    group.addoption("--network", action="store_true", default=os.environ.get("KVFENCE_NETWORK") == "1",
                    help="run tests marked network (they download from PyPI; env KVFENCE_NETWORK=1)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")
    config.addinivalue_line("markers", "cpu_only: runs kernels under the Triton interpreter only")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on the CPU")
    config.addinivalue_line("markers", "network: downloads from PyPI; skipped without --network / KVFENCE_NETWORK=1")
    # The interpreter-or-compiler choice must precede any triton import (kvfence.device explains why).
    from kvfence.device import select
    from kvfence.errors import BadInput

    try:
        config._kvfence_device = select(config.getoption("--device"))
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None
    _load_example_database(config)
    # pytest-xdist: with several GPUs, each worker pins one (worker index mod device count).
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if config._kvfence_device == "cuda" and worker:
        from kvfence.device import pin_worker_gpu

        pin_worker_gpu(worker)


def pytest_collection_modifyitems(config, items):
    device = config._kvfence_device
    skip_gpu = pytest.mark.skip(reason="needs CUDA (run with --device cuda on a GPU machine)")
    skip_cpu = pytest.mark.skip(reason="interpreter-only test; this session runs compiled kernels on CUDA")
    skip_network = pytest.mark.skip(reason="downloads from PyPI (run with --network or KVFENCE_NETWORK=1)")
    for item in items:
        if "network" in item.keywords and not config.getoption("--network"):
            item.add_marker(skip_network)
        if "gpu" in item.keywords and device != "cuda":
            item.add_marker(skip_gpu)
        if "cpu_only" in item.keywords and device != "cpu":
            item.add_marker(skip_cpu)


# -- fixtures ------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def device(pytestconfig) -> str:
    """``cpu`` (interpreter) or ``cuda``, as chosen by ``--device``."""
    return pytestconfig._kvfence_device


@pytest.fixture(scope="session")
def kernel_spec(pytestconfig) -> str:
    return pytestconfig.getoption("--kernel")


@pytest.fixture(scope="session")
def sizing_spec(pytestconfig) -> str:
    return pytestconfig.getoption("--sizing")


@pytest.fixture(scope="session")
def make_session(device):
    """``make_session(kernel="reference", **kw)``: a cached ``kvfence.verifying.session.Session`` on this device."""
    from kvfence.verifying.session import Session

    cache = {}

    def make(kernel: str = "reference", **kw):
        key = (kernel, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = Session(device, kernel, **kw)
        return cache[key]

    return make
