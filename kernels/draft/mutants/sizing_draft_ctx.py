"""Mutant (sizing): the width comes from the draft model's smaller context length.

Bug class (docs/contract.md §5): width from a smaller draft ``ctx``. ``W = n * topk * (ctx // 2)``, as if the
buffer were sized with the draft model's half-length context: requests longer than that overflow.
Shows with any config.
"""

KIND = "sizing"
#: Finding kinds that count as detecting this bug (any one of them; kvfence.selftest.mutants).
DETECTS = ("SIZING_VIOLATION",)


def row_width(n: int, topk: int, ctx: int, num_steps: int) -> int:
    return n * topk * (ctx // 2)  # BUG: the target model's ctx is the budget
