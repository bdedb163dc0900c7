"""A runner's case as the engine's launch (``launch_of``): what a checker, a checking worker, a case file and a
summary take. Apart from the record (``kvfence.contracts.draft.record`` re-exports it) so that the runner's session
can make one without importing the record, which imports the session's checker."""

from __future__ import annotations

from kvfence.contract import Launch
from kvfence.contracts.draft.case import Case, DraftCase


def launch_of(case: Case) -> Launch:
    """A runner's case (what ``strategies`` draws, with its config's sizing, mode and layout and its kernel) as
    the engine's launch of its contract (``config.contract``: ``draft`` or ``window-rail``)."""
    c = case.config
    return Launch(c.contract, DraftCase.of(case), case.sizing_summary()["width"], c.sizing, case.kernel, c.mode,
                  c.layout)
