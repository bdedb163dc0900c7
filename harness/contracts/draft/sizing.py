"""Row-width policies for the kv_indices buffer (docs/contract.md §3).

Each policy maps ``(n, topk, ctx, num_steps)`` to the width ``W`` of one step row of the
``(num_steps, W)`` kv_indices buffer. ``n`` is ``max_bs`` in graph mode (buffers are sized once, at
capture) and the batch's ``num_seqs`` in eager mode (sized per batch).

What the kernel needs from row ``s`` is ``U(s) = topk*sum(L) + bs*(s+1)``; the last row needs
``need = topk*sum(L) + bs*num_steps`` with ``bs = num_seqs*topk``. A policy is safe for a domain of
batches when ``need <= W`` for every batch in it.
"""

from __future__ import annotations


def eager(n: int, topk: int, ctx: int, num_steps: int) -> int:
    """``W = n * topk * ctx``: the eager path, sized for the batch at hand (``n = num_seqs``)."""
    return n * topk * ctx


def fixed(n: int, topk: int, ctx: int, num_steps: int) -> int:
    """``W = n * topk * ctx``: the CUDA-graph path after the upstream fix (``n = max_bs``).

    Same formula as ``eager`` at a different site. Still overflows when every request of a full
    bucket sits within ``num_steps`` of ``ctx``: each branch needs ``L + num_steps`` entries but is
    budgeted ``ctx``. That context-limit overflow is a real upstream bug class.
    """
    return n * topk * ctx


def prefix(n: int, topk: int, ctx: int, num_steps: int) -> int:
    """``W = n * ctx``: the CUDA-graph path before the upstream fix — the ``topk`` factor is missing.

    Overflows once ``topk*sum(L) + bs*num_steps > max_bs*ctx`` (roughly: mean ``L`` above ``ctx/topk``).
    """
    return n * ctx


def safe(n: int, topk: int, ctx: int, num_steps: int) -> int:
    """``W = n * topk * (ctx + num_steps)``: room for the draft tokens of a request at the context limit.

    Sufficient for every batch of at most ``n`` requests with ``L <= ctx``:
    ``topk*sum(L) + n*topk*num_steps <= n*topk*ctx + n*topk*num_steps``.
    """
    return n * topk * (ctx + num_steps)


def _window(window_size: int, name: str) -> int:
    from kvfence.errors import require

    require(window_size > 0, f"sizing {name} needs a window: set window_size (--window) above 0")
    return window_size


def window_fixed(n: int, topk: int, ctx: int, num_steps: int, *, window_size: int = 0, sink_size: int = 0) -> int:
    """``W = n * topk * w``: the window rail's buffer (docs/contract.md §6). Each branch keeps at most
    ``w`` tokens, so ``B(s, bs) <= bs * w <= W`` for every batch of at most ``n`` requests."""
    return n * topk * _window(window_size, "window-fixed")


def window_no_topk(n: int, topk: int, ctx: int, num_steps: int, *, window_size: int = 0, sink_size: int = 0) -> int:
    """``W = n * w``: the window rail's buffer without the ``topk`` factor — §3's bug again, on the rail.

    Overflows once the branches' windows add up past ``n * w`` (``topk >= 2`` and requests near ``w``)."""
    return n * _window(window_size, "window-no-topk")


#: The builtin policies by name; the CLI, the strategies and the case files all refer to these names.
#: Any policy may take ``window_size`` / ``sink_size`` keywords (kvfence.contracts.draft.targets.resolve_sizing
#: passes them only to policies that declare them); the ``window-*`` ones need a window.
POLICIES = {"eager": eager, "fixed": fixed, "prefix": prefix, "safe": safe, "window-fixed": window_fixed,
            "window-no-topk": window_no_topk}
#: Policies that size the window rail from ``w``: a config using one must have a window.
WINDOW_POLICIES = ("window-fixed", "window-no-topk")
