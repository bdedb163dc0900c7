"""kvfence's own tests run under kvfence's pytest plugin (``kvfence.pytest_plugin``, registered by
the installed package's ``pytest11`` entry point): options, profiles, markers and fixtures live there.

This file only names the plugin's fixtures by the short names the suite uses, and loads the plugin itself
where the entry point is not there to (an install older than it, or plugin autoloading turned off).
"""

import os
from importlib.metadata import entry_points

import pytest

if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") or not any(
        ep.value == "kvfence.pytest_plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["kvfence.pytest_plugin"]


@pytest.fixture(scope="session")
def device(kvfence_device) -> str:
    return kvfence_device


@pytest.fixture(scope="session")
def kernel_spec(kvfence_kernel) -> str:
    return kvfence_kernel


@pytest.fixture(scope="session")
def sizing_spec(kvfence_sizing) -> str:
    return kvfence_sizing


@pytest.fixture(scope="session")
def make_session(kvfence_device):
    """kvfence's own tests of the draft kernel look inside its sessions (runners, buffers): the draft checker's
    ``Session``, in this process, plug-ins included."""
    from kvfence.contracts.draft.session import Session

    cache = {}

    def make(kernel="reference", **kw):
        key = (kernel, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = Session(kvfence_device, kernel, **kw)
        return cache[key]

    return make
