"""Strategy pieces every contract's strategies share (each contract's own live in its folder)."""

from __future__ import annotations

from hypothesis import strategies as st


def edge_or(draw, lo: int, hi: int, edges) -> int:
    """Half the time an edge inside ``[lo, hi]``, else any value; shrinks toward ``lo`` (the boolean's False)."""
    inside = sorted({e for e in edges if lo <= e <= hi})
    if inside and draw(st.booleans()):
        return draw(st.sampled_from(inside))
    return draw(st.integers(lo, hi))
