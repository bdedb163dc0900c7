"""Mutant (sizing): the window rail's buffer without the ``topk`` factor, ``W = n * w``.

Bug class (docs/contract.md §6, §3): the rail needs ``B(s, bs) <= bs * w`` entries per row, so
``W = n * topk * w`` (``window-fixed``); ``n * w`` is the seed's missing-``topk`` bug again, on the rail.
Overflows once the windows of ``topk >= 2`` branches add up past ``n * w``.
"""

KIND = "sizing"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("SIZING_VIOLATION",)
CONTRACT = "window-rail"


def row_width(n: int, topk: int, ctx: int, num_steps: int, *, window_size: int = 0, sink_size: int = 0) -> int:
    return n * window_size  # BUG: n * topk * window_size
