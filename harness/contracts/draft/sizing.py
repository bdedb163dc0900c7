"""Row-width policies for the kv_indices buffer (docs/contract.md §3).

Each policy maps ``(n, topk, ctx, num_steps)`` to the width ``W`` of one step row of the
``(num_steps, W)`` kv_indices buffer. ``n`` is ``max_bs`` in graph mode (buffers are sized once, at
capture) and the batch's ``num_seqs`` in eager mode (sized per batch).

What the kernel needs from row ``s`` is ``U(s) = topk*sum(L) + bs*(s+1)``; the last row needs
``need = topk*sum(L) + bs*num_steps`` with ``bs = num_seqs*topk``. A policy is safe for a domain of
batches when ``need <= W`` for every batch in it.

``resolve_sizing`` resolves a sizing spec: a builtin name, a release's shipped sizing (``sglang==VERSION:BACKEND``)
or a plug-in ``module:attr`` / ``file.py:attr`` (``kvfence.engine.kernels`` says which, and loads it), whose every
call runs under the engine's boundary.
"""

from __future__ import annotations

import functools
import inspect
import operator
from typing import Any, Callable, Tuple

from kvfence.engine.boundary import ContractFault, calling
from kvfence.engine.kernels import is_plugin, load_attr, release_source
from kvfence.errors import BadInput, require


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
#: Any policy may take ``window_size`` / ``sink_size`` keywords (``resolve_sizing``
#: passes them only to policies that declare them); the ``window-*`` ones need a window.
POLICIES = {"eager": eager, "fixed": fixed, "prefix": prefix, "safe": safe, "window-fixed": window_fixed,
            "window-no-topk": window_no_topk}
#: Policies that size the window rail from ``w``: a config using one must have a window.
WINDOW_POLICIES = ("window-fixed", "window-no-topk")


#: The window parameters a sizing policy may take as keywords (docs/contract.md §3, §6).
WINDOW_KWARGS = ("window_size", "sink_size")


def _window_kwargs_of(fn) -> Tuple[str, ...]:
    """Which ``WINDOW_KWARGS`` a policy accepts: a 4-argument plug-in gets none of them."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return ()
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return WINDOW_KWARGS
    return tuple(name for name in WINDOW_KWARGS if name in params)


# -- a sizing plug-in's callable runs behind the engine's boundary ----------------------------------------
# ``--sizing file.py:attr`` (and ``check_kernel(sizing=...)``) is user code the strategies call for every config
# they draw: a command that names one runs in a supervised child (``kvfence.engine.boundary_parent``, as for a
# plug-in contract's code), and each call runs under ``kvfence.engine.boundary.calling``, so an exit, a signal, an
# interrupt or a call past the call limit is one line naming the sizing and the call, exit 2. What it raises or
# returns is checked here (``policy``).


@functools.lru_cache(maxsize=None)
def resolve_sizing(spec: str) -> Callable[..., int]:
    """Resolve a sizing spec to ``(n, topk, ctx, num_steps, *, window_size=0, sink_size=0) -> width``.

    The window parameters reach only policies that declare them (or ``**kwargs``): a 4-argument
    plug-in keeps working unchanged."""
    require(isinstance(spec, str) and spec, "sizing spec must be a non-empty string")
    if spec in POLICIES:
        builtin = POLICIES[spec]
        accepted = _window_kwargs_of(builtin)

        @functools.wraps(builtin)
        def builtin_policy(n, topk, ctx, num_steps, **window):
            return builtin(n, topk, ctx, num_steps, **{k: v for k, v in window.items() if k in accepted})

        return builtin_policy
    from kvfence.contracts.draft import shipped_sizing

    if release_source(spec):  # sglang==VERSION:BACKEND: read from the release's cache entry, never run
        return shipped_sizing.policy(spec)
    require(is_plugin(spec), f"unknown sizing {spec!r}: choose {', '.join(POLICIES)} or module:attr / file.py:attr")
    obj = load_attr(spec, "sizing")
    require(callable(obj), f"sizing {spec!r} is not callable")
    try:
        inspect.signature(obj).bind(1, 1, 1, 1)
    except (TypeError, ValueError):
        raise BadInput(f"sizing {spec!r} must take (n, topk, ctx, num_steps)") from None

    return _plugin_policy(spec, obj)


def _plugin_policy(spec: str, obj: Callable[..., Any]) -> Callable[..., int]:
    """A sizing plug-in's callable, each call under the boundary's ``calling`` (see above); an exception or an
    answer other than an integer width is bad input (one line), never a traceback."""
    accepted = _window_kwargs_of(obj)

    @functools.wraps(obj)
    def policy(n: int, topk: int, ctx: int, num_steps: int, **window) -> int:
        call = f"n={n}, topk={topk}, ctx={ctx}, num_steps={num_steps}"
        try:
            with calling(spec, f"call for {call}", who=f"sizing {spec!r}"):
                width = obj(n, topk, ctx, num_steps, **{k: v for k, v in window.items() if k in accepted})
        except ContractFault:
            raise  # an exit or an interrupt, named by the boundary
        except (Exception, SystemExit) as exc:  # SystemExit: in a checking worker, which converts no exit
            raise BadInput(f"sizing {spec!r} failed for {call}: {type(exc).__name__}: {exc}") from None
        try:
            require(not isinstance(width, bool), f"returned a bool ({width!r}), not a row width")
            return operator.index(width)
        except (BadInput, TypeError) as exc:
            raise BadInput(f"sizing {spec!r} failed for {call}: {type(exc).__name__}: {exc}") from None

    return policy
