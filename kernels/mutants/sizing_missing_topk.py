"""Mutant (sizing): the ``topk`` factor is missing (the seed's bug, the pre-fix ``prefix`` policy).

Bug class (SPEC §3/§5): ``W = n * ctx``. Overflows once ``topk*sum(L) + bs*num_steps > n*ctx`` (mean
length above about ``ctx/topk``). Needs ``topk >= 2``.
"""

KIND = "sizing"


def row_width(n: int, topk: int, ctx: int, num_steps: int) -> int:
    return n * ctx  # BUG: n * topk * ctx at least
