"""Mutant (sizing): the width is sized for one request, not for ``n``.

Bug class (docs/contract.md §3): ``W = topk * (ctx + num_steps)`` ignores the batch size: any launch with two or
more requests of enough total length overflows. Needs ``max_bs >= 2``.
"""

KIND = "sizing"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("SIZING_VIOLATION",)


def row_width(n: int, topk: int, ctx: int, num_steps: int) -> int:
    return topk * (ctx + num_steps)  # BUG: times n
