"""Mutant (sizing): no headroom for draft tokens at the context limit.

Bug class (docs/contract.md §3/§5): context-limit overflow. ``W = n * topk * ctx`` (the post-fix ``fixed`` policy)
budgets ``ctx`` per branch, but a branch needs ``L + num_steps``: a full bucket whose requests sit
within ``num_steps`` of ``ctx`` overflows. The pins (one request, three steps, short ``ctx``) make
that batch likely.
"""

KIND = "sizing"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("SIZING_VIOLATION",)


def row_width(n: int, topk: int, ctx: int, num_steps: int) -> int:
    return n * topk * ctx  # BUG: n * topk * (ctx + num_steps) is enough
