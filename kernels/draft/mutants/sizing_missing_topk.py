"""Mutant (sizing): the ``topk`` factor is missing, ``W = n * ctx`` (the pre-fix CUDA-graph ``prefix`` policy).

Bug class (docs/contract.md §3/§5): ``W = n * ctx``. Overflows once ``topk*sum(L) + bs*num_steps > n*ctx`` (mean
length above about ``ctx/topk``). Needs ``topk >= 2``.
"""

KIND = "sizing"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("SIZING_VIOLATION",)


def row_width(n: int, topk: int, ctx: int, num_steps: int) -> int:
    return n * ctx  # BUG: n * topk * ctx at least
