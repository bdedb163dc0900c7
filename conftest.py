"""kvfence's own tests run under kvfence's pytest plugin (``kvfence.workflow.pytest_plugin``, registered by
the installed package's ``pytest11`` entry point): options, profiles, markers and fixtures live there.

This file only names the plugin's fixtures by the short names the suite uses.
"""

import pytest


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
def make_session(kvfence_session):
    return kvfence_session
