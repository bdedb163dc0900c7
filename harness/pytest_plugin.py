"""kvfence's pytest plugin, registered by the installed package (entry point ``pytest11``: ``kvfence``).

It works in any project that installs kvfence (disable it with ``-p no:kvfence``):

* options ``--kvfence-contract``, ``--kvfence-kernel``, ``--kvfence-sizing``, ``--kvfence-device`` (env
  ``KVFENCE_CONTRACT``, ``KVFENCE_KERNEL``, ``KVFENCE_SIZING``, ``KVFENCE_DEVICE``), ``--kvfence-network``
  (env ``KVFENCE_NETWORK=1``) and ``--kvfence-long`` (env ``KVFENCE_LONG=1``);
* the Hypothesis profiles ``ci``, ``dev``, ``triage``, ``gpu`` and ``nightly``; the one named by ``HYPOTHESIS_PROFILE``
  (or the ini option ``kvfence_hypothesis_profile``) is loaded; ``KVFENCE_DATABASE`` layers an example
  database on it;
* markers ``gpu``, ``cpu_only``, ``interpreter``, ``long``, ``network``, ``redis``;
* fixtures ``kvfence_device``, ``kvfence_contract``, ``kvfence_kernel``, ``kvfence_sizing``, ``kvfence_plan`` (the
  run plan those options make, ``kvfence.engine.plan.RunPlan``, the same object ``kvfence fuzz`` builds) and
  ``kvfence_session`` (a factory of cached checking sessions of the contract under test);
* a failing test whose message holds ``repro: python -m kvfence repro ...`` gets that command as its
  report's last section (Hypothesis appends its notes after the exception, burying it).

The device is chosen before any conftest is imported (``pytest_load_initial_conftests``), because
Triton picks interpreter-or-compiler when it is first imported (``kvfence.device``).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Optional

import pytest

#: (option, env var, default, help) of the options that say what is under test and where.
OPTIONS = (
    ("--kvfence-device", "KVFENCE_DEVICE", "auto",
     "where kernels run: cuda (compiled) or cpu (TRITON_INTERPRET=1); auto picks CUDA if present"),
    ("--kvfence-contract", "KVFENCE_CONTRACT", None,
     "contract under test (kvfence.contract: draft, window-rail, the page-table builders, another package's)"),
    ("--kvfence-kernel", "KVFENCE_KERNEL", "reference",
     "kernel under test: reference, module:attr or file.py:attr"),
    ("--kvfence-sizing", "KVFENCE_SIZING", "safe",
     "sizing policy under test: a builtin name, module:attr or file.py:attr"),
)

MARKERS = (
    "gpu: needs a CUDA device; skipped without one",
    "cpu_only: runs kernels under the Triton interpreter in this process; skipped when the session runs on CUDA",
    "interpreter: runs kernels under the Triton CPU interpreter (in a subprocess); skipped with the reason "
    "where the installed triton/numpy pair cannot interpret (kvfence.device.check_interpreter_numpy)",
    "long: an end-to-end soak, a benchmark's smoke test or a non-default path, over 15 s on two CPU cores; "
    "skipped without --kvfence-long / KVFENCE_LONG=1 (tox -e long)",
    "network: downloads from PyPI; skipped without --kvfence-network / KVFENCE_NETWORK=1",
    "redis: needs a local redis-server on PATH; skipped without one",
)

_REPRO = re.compile(r"repro: (python -m kvfence repro .+)$", re.M)


def register_profiles() -> None:
    """kvfence's Hypothesis profiles. Interpreter launches cost milliseconds each: no deadline, and the
    "too slow" health check is noise."""
    from hypothesis import HealthCheck, Phase, settings

    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, print_blob=True,
                              suppress_health_check=quiet)
    settings.register_profile("dev", max_examples=15, deadline=None, print_blob=True, suppress_health_check=quiet)
    # "Does this kernel fail?" at once: the first failing example as drawn, not shrunk (shrinking a
    # draft-kernel case through the interpreter takes about a minute).
    settings.register_profile("triage", max_examples=15, deadline=None, print_blob=True, suppress_health_check=quiet,
                              phases=(Phase.explicit, Phase.reuse, Phase.generate))
    settings.register_profile("gpu", max_examples=500, deadline=None, print_blob=True, suppress_health_check=quiet)
    settings.register_profile("nightly", max_examples=5000, deadline=None, print_blob=True,
                              suppress_health_check=list(HealthCheck))


register_profiles()


def option(config, name: str):
    """An option's value (``contract``, ``kernel``, ``sizing``, ``device``, ``network`` or ``long``), from the parsed
    command line (the contract: the registry's default when none is named)."""
    value = config.getoption(f"--kvfence-{name}")
    if name == "contract" and value is None:
        from kvfence.engine.registry import default_name

        return default_name()
    return value


def pytest_addoption(parser):
    group = parser.getgroup("kvfence")
    for flag, env, default, text in OPTIONS:
        group.addoption(flag, default=os.environ.get(env, default), help=f"{text} (env {env})")
    group.addoption("--kvfence-network", action="store_true", default=os.environ.get("KVFENCE_NETWORK") == "1",
                    help="run tests marked network (they download from PyPI; env KVFENCE_NETWORK=1)")
    group.addoption("--kvfence-long", action="store_true", default=os.environ.get("KVFENCE_LONG") == "1",
                    help="run tests marked long (soaks, benchmarks' smoke tests, matrices end to end; "
                         "env KVFENCE_LONG=1)")
    parser.addini("kvfence_hypothesis_profile", "Hypothesis profile loaded when HYPOTHESIS_PROFILE is unset",
                  default="")


def _choose_device(device: str) -> str:
    from kvfence.device import select
    from kvfence.errors import BadInput

    try:
        return select(device)
    except BadInput as exc:
        raise pytest.UsageError(f"kvfence: {exc}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Before any conftest (which may import triton): the interpreter-or-compiler choice comes first.
    early_config._kvfence_device = _choose_device(early_config.known_args_namespace.kvfence_device)


#: Cases a plug-in contract's methods are asked about before the session draws from it (``_probe_plugins``).
PROBE_EXAMPLES = 5


def _probe_plugins(config) -> None:
    """``--kvfence-kernel`` / ``--kvfence-sizing`` plug-ins are imported in a throwaway process first
    (``kvfence.engine.probe``): an import that exits, aborts or raises ``KeyboardInterrupt`` is a usage
    error naming it, never a pytest that ends with exit 0 and no output."""
    from kvfence.engine.boundary_parent import call, foreign
    from kvfence.engine.kernels import is_plugin
    from kvfence.engine.probe import check_plugins
    from kvfence.engine.record_probe import check_named
    from kvfence.engine.registry import get
    from kvfence.errors import BadInput

    name, sizing = option(config, "contract"), option(config, "sizing")
    try:
        if foreign([name]):
            # A plug-in contract's methods are asked about a few drawn cases behind the boundary first
            # (kvfence.engine.boundary): one that exits, hangs or raises is a usage error naming it, before this
            # process draws from it.
            for problem in check_named(name, examples=PROBE_EXAMPLES, seed=0, launches=False)["problems"]:
                raise BadInput(f"contract {name!r}: {problem}")
        check_plugins(get(name), {what: option(config, what) for what in ("kernel", "sizing")})
        if is_plugin(sizing):
            # A sizing plug-in is called in this process wherever a test draws cases: it is asked about a few
            # drawn cases behind the boundary first (one that exits, hangs or raises is a usage error naming it).
            call("kvfence.engine.record_probe:sizing_widths",
                 dict(contract=name, sizing=sizing, examples=PROBE_EXAMPLES, seed=0), [name])
    except BadInput as exc:
        raise pytest.UsageError(f"kvfence: {exc}") from None


def _load_profile(config) -> None:
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    name = os.environ.get("HYPOTHESIS_PROFILE") or config.getini("kvfence_hypothesis_profile")
    if not name:
        return
    try:
        settings.load_profile(name)
    except InvalidArgument:
        raise pytest.UsageError(f"kvfence: Hypothesis profile {name!r} is not registered "
                                "(kvfence registers ci, dev, triage, gpu and nightly)") from None


def _load_example_database(config) -> None:
    """``KVFENCE_DATABASE`` (``none``, a directory or ``redis://HOST:PORT/DB``, as ``fuzz --database``):
    the property tests' Hypothesis example database, layered on the loaded profile as profile
    ``kvfence+database``. Keys are namespaced by the kernel and sizing under test (kvfence.engine.campaign).
    A database replays stored failures, so it turns ``derandomize`` off (Hypothesis forbids both)."""
    text = os.environ.get("KVFENCE_DATABASE")
    if not text:
        return
    from hypothesis import settings

    from kvfence.engine.campaign import pytest_database
    from kvfence.errors import BadInput

    try:
        database = pytest_database(text, kernel=option(config, "kernel"), sizing=option(config, "sizing"))
    except BadInput as exc:
        raise pytest.UsageError(f"kvfence: {exc}") from None
    # settings() inherits the profile loaded now (HYPOTHESIS_PROFILE or --hypothesis-profile).
    settings.register_profile("kvfence+database", settings(), database=database, derandomize=False)
    settings.load_profile("kvfence+database")


def pytest_configure(config):
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if not hasattr(config, "_kvfence_device"):  # loaded late (-p from a conftest): choose now, or say why not
        config._kvfence_device = _choose_device(option(config, "device"))
    _probe_plugins(config)
    _load_profile(config)
    _load_example_database(config)
    # pytest-xdist: with several GPUs, each worker pins one (worker index mod device count).
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if config._kvfence_device == "cuda" and worker:
        from kvfence.device import pin_worker_gpu

        pin_worker_gpu(worker)


def interpreter_unusable() -> str:
    """Why the Triton CPU interpreter cannot run kernels here (naming the versions), or ``""``."""
    from kvfence.device import check_interpreter_numpy
    from kvfence.errors import BadInput

    try:
        check_interpreter_numpy()
    except BadInput as exc:
        return f"needs the Triton CPU interpreter: {exc}"
    return ""


def skip_reasons(config, keywords) -> list:
    """Why a test with these marker ``keywords`` cannot run in this session (empty: it runs)."""
    device = config._kvfence_device
    reasons = []
    if "network" in keywords and not option(config, "network"):
        reasons.append("downloads from PyPI (run with --kvfence-network or KVFENCE_NETWORK=1)")
    if "long" in keywords and not option(config, "long"):
        reasons.append("a long test (run with --kvfence-long or KVFENCE_LONG=1)")
    if "gpu" in keywords and device != "cuda":
        reasons.append("needs CUDA (run with --kvfence-device cuda on a GPU machine)")
    if "cpu_only" in keywords and device != "cpu":
        reasons.append("interpreter-only test; this session runs compiled kernels on CUDA")
    if "interpreter" in keywords or "cpu_only" in keywords:
        why = interpreter_unusable()
        if why:
            reasons.append(why)
    if "redis" in keywords and shutil.which("redis-server") is None:
        reasons.append("needs a local redis-server on PATH")
    return reasons


def pytest_collection_modifyitems(config, items):
    for item in items:
        for reason in skip_reasons(config, item.keywords):
            item.add_marker(pytest.mark.skip(reason=reason))
        _no_deadline_for_kernel_checks(item)


def _no_deadline_for_kernel_checks(item) -> None:
    """A user's ``@given`` test that checks cases through ``kvfence_session`` gets no Hypothesis deadline
    unless its settings give another one than the loaded profile's: a check's time depends on compiling (or
    interpreting) the kernel for the drawn shape, so the default 200 ms would fail a correct kernel
    (``DeadlineExceeded``), not a slow one."""
    from hypothesis import settings

    test = getattr(item, "obj", None)
    if test is None or "kvfence_session" not in getattr(item, "fixturenames", ()) \
            or not getattr(test, "is_hypothesis_test", False):
        return
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    default = settings.default  # the loaded profile's
    if current is not None and default is not None and current.deadline == default.deadline \
            and current.deadline is not None:
        test._hypothesis_internal_use_settings = settings(current, deadline=None)


#: The last case a test checked through ``kvfence_session`` and its findings: when a Hypothesis test fails,
#: its last example is the shrunk one it reports, and that case is written as a case file (``_case_section``).
_LAST_CHECK: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _LAST_CHECK.clear()


def _case_section(item) -> Optional[str]:
    """The failing test's last checked case, written under ``<rootdir>/reports/out/cases``, and its repro
    line; None when the test checked nothing through ``kvfence_session`` or its last check was clean."""
    last = _LAST_CHECK.get("case")
    if last is None or not _LAST_CHECK.get("findings"):
        return None
    from kvfence.engine.casefile import case_repro_command, write_case

    path = write_case(last, _LAST_CHECK["findings"], out_dir=Path(str(item.config.rootpath)) / "reports" / "out",
                      device=_LAST_CHECK.get("device", "cpu"), source="pytest")
    kinds = sorted({f.kind.value for f in _LAST_CHECK["findings"]})
    return f"case file: {path} ({', '.join(kinds)})\n{case_repro_command(path, last)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or call.excinfo is None:
        return
    match = _REPRO.search(str(call.excinfo.value))
    if match and hasattr(report.longrepr, "addsection"):
        report.longrepr.addsection("kvfence: replay this case", match.group(1))
    elif call.when == "call" and hasattr(report.longrepr, "addsection"):
        section = _case_section(item)
        if section:
            report.longrepr.addsection("kvfence: replay this case", section)


# -- fixtures ------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def kvfence_device(pytestconfig) -> str:
    """``cpu`` (interpreter) or ``cuda``, as chosen by ``--kvfence-device``."""
    return pytestconfig._kvfence_device


@pytest.fixture(scope="session")
def kvfence_contract(pytestconfig) -> str:
    """The contract under test (``--kvfence-contract``, env ``KVFENCE_CONTRACT``; default ``draft``)."""
    return option(pytestconfig, "contract")


@pytest.fixture(scope="session")
def kvfence_plan(pytestconfig, kvfence_device, kvfence_contract):
    """The run plan of the options (``kvfence.engine.plan.RunPlan``): contract, kernel, sizing, device; what
    ``kvfence.engine.run`` builds a run's draws and checker from, as ``kvfence fuzz`` does."""
    from kvfence.engine.budget import default_budget
    from kvfence.engine.plan import RunPlan

    return RunPlan(contract=kvfence_contract, kernel=option(pytestconfig, "kernel"),
                   sizing=option(pytestconfig, "sizing"), device=kvfence_device,
                   domain="gpu" if kvfence_device == "cuda" else "cpu", max_bytes=default_budget(kvfence_device))


@pytest.fixture(scope="session")
def kvfence_kernel(pytestconfig) -> str:
    """The kernel spec under test (``--kvfence-kernel``, env ``KVFENCE_KERNEL``; default ``reference``)."""
    return option(pytestconfig, "kernel")


@pytest.fixture(scope="session")
def kvfence_sizing(pytestconfig) -> str:
    """The sizing spec under test (``--kvfence-sizing``, env ``KVFENCE_SIZING``; default ``safe``)."""
    return option(pytestconfig, "sizing")


class _Recording:
    """A session whose ``check`` remembers the case and findings (``_LAST_CHECK``) for the failure report."""

    def __init__(self, session, device: str, contract: str, of_contract=None):
        self._session, self._device, self._contract = session, device, contract
        #: ``of_contract(name)``: the same session's settings for another contract (a launch names its own).
        self._of_contract = of_contract

    def check(self, case):
        from kvfence.contract import Launch  # lazily, as every import here: the device comes first

        if not isinstance(case, Launch):
            raise TypeError("kvfence_session(...).check takes a launch (kvfence.contract.Launch: what "
                            f"kvfence.strategies.cases draws), got {type(case).__name__}")
        if case.contract != self._contract and self._of_contract is not None:
            # The launch's contract decides how it is checked, not --kvfence-contract's.
            findings = self._of_contract(case.contract).check(case)
            _LAST_CHECK.update(case=case, findings=findings, device=self._device)
            return findings
        findings = self._session.check(case)
        _LAST_CHECK.update(case=case, findings=findings, device=self._device)
        return findings

    def __getattr__(self, name):
        return getattr(self._session, name)


@pytest.fixture(scope="session")
def kvfence_session(kvfence_plan):
    """``kvfence_session(kernel="reference", *, isolated=None, **kw)``: a cached checker of the contract under
    test (``--kvfence-contract``) on this session's device. A plug-in kernel (``file.py:attr``, ``module:attr``:
    the user's code) is checked in a worker process (``kvfence.engine.supervisor.RemoteSession``, ``case_timeout``
    seconds a case): an exit, abort or crash of its launch is a ``CRASH`` finding and a launch that never returns
    a ``HANG``, so the test fails instead of ending pytest; kvfence's builtin kernels run in this process (the
    contract's checker: ``kvfence.engine.checking.checker_for``). ``isolated`` overrides the choice; ``kw`` are
    fields of the run's plan (e.g. ``audit``, ``case_timeout``, ``mode``)."""
    from kvfence.engine.boundary_parent import foreign
    from kvfence.engine.checking import checker_for
    from kvfence.engine.kernels import is_plugin
    from kvfence.engine.registry import get
    from kvfence.engine.supervisor import RemoteSession

    cache = {}

    def make(kernel: str = "reference", *, isolated=None, record: bool = True, **kw):
        plan = kvfence_plan.with_(kernel=kernel, **kw)
        # A plug-in kernel, or any kernel of a plug-in contract (its tables, oracle and launch are its author's code).
        isolated = (is_plugin(kernel) or bool(foreign([plan.contract]))) if isolated is None else isolated
        key = (kernel, isolated, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = RemoteSession(plan) if isolated else checker_for(get(plan.contract), plan)
        if not record:
            return cache[key]
        return _Recording(cache[key], kvfence_plan.device, plan.contract,
                          lambda name: make(kernel, isolated=isolated, record=False, **{**kw, "contract": name}))

    yield make
    for session in cache.values():
        if isinstance(session, RemoteSession):
            session.close()
