"""The fast source of the draft's batch draws: a seeded PRNG answering the strategies the batch code draws, and
recording the Hypothesis choice that gives the same value (``kvfence.contracts.draft.strategies`` says why).

Every strategy the batch code draws is built by a ``fast_*`` helper, which registers how ``FastDraw`` draws it.
"""

from __future__ import annotations

import functools
import random
from typing import Optional

from hypothesis import strategies as st

# -- the fast source: the batch code's draws from a seeded PRNG -----------------------------------------
#: The attribute under which a strategy the batch code draws carries how ``FastDraw`` draws it: the
#: registry lives on the strategy objects themselves, so it lasts exactly as long as they do.
FAST_SPEC = "_kvfence_fast_spec"
_INT, _SAMPLED, _BOOL, _JUST = range(4)


class UnregisteredStrategy(LookupError):
    """``FastDraw`` met a strategy no ``fast_*`` helper registered: the batch code drew something new."""


def fast_integers(strategy, lo: int, hi: int):
    """Register ``strategy`` (``st.integers(lo, hi)``) for ``FastDraw``: uniform, recorded as the int."""
    setattr(strategy, FAST_SPEC, (_INT, lo, hi - lo + 1, None))
    return strategy


def fast_sampled(strategy, values: tuple):
    """Register ``strategy`` (``st.sampled_from(values)``): recorded as the index, as Hypothesis does;
    one value is Hypothesis's ``just`` (no choice at all)."""
    setattr(strategy, FAST_SPEC, (_SAMPLED, 0, len(values), values) if len(values) > 1 else (_JUST, 0, 1, values))
    return strategy


def fast_booleans(strategy):
    setattr(strategy, FAST_SPEC, (_BOOL, 0, 2, None))
    return strategy


class FastDraw:
    """A ``draw`` for the batch code (``draw_batch``) that takes its choices from ``rng`` instead of
    Hypothesis: uniform over each registered strategy's choices (the code's tiers and codes carry the
    edge bias, so the distributions are the strategies' own), at a fraction of a Hypothesis draw's cost.

    Every draw is recorded in ``choices`` as the Hypothesis choice that gives the same value (the int of
    ``st.integers``, the index of ``st.sampled_from``, the bool of ``st.booleans``; nothing for a
    one-value ``sampled_from``): feeding them to Hypothesis replays the same batch, which is how a
    failure found here is shrunk (``kvfence.engine.loop``). A strategy no ``fast_*`` registered
    raises ``UnregisteredStrategy``.
    """

    __slots__ = ("_random", "choices")

    def __init__(self, rng: random.Random):
        self._random = rng.random
        self.choices: list = []

    def __call__(self, strategy):
        spec = getattr(strategy, FAST_SPEC, None)
        if spec is None:
            raise UnregisteredStrategy(f"FastDraw cannot draw {strategy!r}: the batch code's strategies are "
                                       f"built by the fast_* helpers of kvfence.contracts.draft.fastdraw")
        kind, lo, n, values = spec
        i = int(self._random() * n)
        if kind == _INT:
            self.choices.append(lo + i)
            return lo + i
        if kind == _SAMPLED:
            self.choices.append(i)
            return values[i]
        if kind == _BOOL:
            self.choices.append(i == 1)
            return i == 1
        return values[0]


BOOLEANS = fast_booleans(st.booleans())
TOKEN_SEEDS = fast_integers(st.integers(0, 2**30 - 1), 0, 2**30 - 1)
V2P_SEEDS = fast_integers(st.integers(1, 2**30 - 1), 1, 2**30 - 1)
#: Tier of a size draw: 0-1 small (half the mass, and the shrink target), 2 an edge, 3 log-uniform.
TIERS = fast_integers(st.integers(0, 3), 0, 3)
#: Length pattern of a batch: 0 one shared length (shrink target), 1 one length per request, 2 a palette,
#: 3-4 every request at the context wall (``AT_THE_WALL``; two codes of five, see ``_draw_lengths``).
LENGTH_MODES = fast_integers(st.integers(0, 4), 0, 4)
AT_THE_WALL = 3


@functools.lru_cache(maxsize=1024)
def integers(lo: int, hi: int):
    return fast_integers(st.integers(lo, hi), lo, hi)


@functools.lru_cache(maxsize=1024)
def sampled(values: tuple):
    return fast_sampled(st.sampled_from(values), values)


def sized(draw, lo: int, hi: int, edges=(), small: int = 8, small_from: Optional[int] = None) -> int:
    """An integer in ``[lo, hi]``: half the time a small one (``small_from .. small_from+small-1``,
    ``small_from`` defaulting to ``lo``), a quarter an edge from ``edges``, a quarter log-uniform (a
    power-of-two range, then a value in it). Shrinks toward ``small_from`` (``lo`` when it is None)."""
    if hi <= lo:
        return lo
    tier = draw(TIERS)
    if tier <= 1:
        first = min(hi, max(lo, small_from if small_from is not None else lo))
        return draw(integers(first, min(hi, first + small - 1)))
    if tier == 2:
        found = edges_inside(edges, lo, hi) if isinstance(edges, tuple) else inside(edges, lo, hi)
        if found:
            return draw(sampled(found))
    top = hi.bit_length() - 1
    e = draw(integers(max(0, lo.bit_length() - 1), top))
    return draw(integers(max(lo, 1 << e), min(hi, (2 << e) - 1)))


def inside(edges, lo: int, hi: int) -> tuple:
    return tuple(sorted({e for e in edges if lo <= e <= hi}))


#: ``inside`` for the edges a batch draws with (a tuple, per config and bound): once, not per length.
edges_inside = functools.lru_cache(maxsize=1024)(inside)
