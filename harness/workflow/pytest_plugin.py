"""pytest plugin (loaded by conftest.py): a failing property test's report ends with the repro command.

``kvfence.cases.casefile.raise_on_findings`` puts ``repro: python -m kvfence repro FILE`` in its message, but
Hypothesis appends its own notes after the exception, so the command would sit in the middle of the
report. This hook repeats it as the report's last section.
"""

from __future__ import annotations

import re

import pytest

_REPRO = re.compile(r"repro: (python -m kvfence repro \S+)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or call.excinfo is None:
        return
    match = _REPRO.search(str(call.excinfo.value))
    if match and hasattr(report.longrepr, "addsection"):
        report.longrepr.addsection("kvfence: replay this case", match.group(1))
