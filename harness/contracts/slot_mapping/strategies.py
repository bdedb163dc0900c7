"""Hypothesis strategies for the slot-mapping contract (docs/contract.md §11).

``slot_cases(domain)`` draws one launch as the keyword arguments of ``kvfence.contracts.slot_mapping.case.SlotCase``
(which validates it). The edges are where the kernel reads past a row: a group whose table is narrower than the
positions reach (``blocks`` given), a request whose tokens straddle a row's end (the first block past it, and
further), the last row of a table (past it: the tail guard) and a row followed by another request's row or by a
row no request owns; a request at the context wall; dummy requests, groups without a slot mapping, context
parallelism (rank-local positions, other ranks' tokens), requests longer than the kernel's tile. Everything
shrinks toward one group of block size 16 sized by the width, no context parallelism, one request of one token at
position 0 in row 0, tile 1024.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvfence.draws import edge_or
from kvfence.errors import require

#: Per domain: (largest context, most requests, most tokens per request, most groups, most block-table cells).
DOMAINS = {"cpu": (640, 4, 48, 3, 1 << 14), "gpu": (131072, 256, 2048, 4, 1 << 22)}
#: Block sizes drawn, simplest first (vLLM's default is 16).
BLOCK_SIZES = {"cpu": (16, 4, 8, 32, 1, 64), "gpu": (16, 32, 64, 128, 256)}
TILES = {"cpu": (1024, 16, 32), "gpu": (1024, 128)}
#: Tokens one GPU-domain launch holds at most (the oracle is plain Python).
MAX_TOKENS = {"cpu": 192, "gpu": 16384}



@st.composite
def _group(draw, domain: str, ctx: int, cp: int):
    """One KV-cache group: its block size, whether context parallelism splits it, and a third of the time a row
    narrower than the context (``blocks``: fewer than the context's blocks, so some position passes it)."""
    bs = draw(st.sampled_from(BLOCK_SIZES[domain]))
    shard = cp == 1 or draw(st.sampled_from((True, True, False)))
    span = bs * (cp if shard else 1)
    narrow = draw(st.sampled_from((False, False, True)))
    blocks = draw(st.integers(1, max(1, -(-ctx // span) - 1))) if narrow else None
    enabled = draw(st.sampled_from((True, True, True, False)))
    return dict(block_size=bs, blocks=blocks, enabled=enabled, sharded=shard)


@st.composite
def slot_cases(draw, domain: str, cp_sizes=(1, 1, 2, 4)):
    require(domain in DOMAINS, f"domain={domain!r}: choose from {', '.join(DOMAINS)}")
    max_ctx, most_reqs, max_q, max_groups, max_cells = DOMAINS[domain]
    cp = draw(st.sampled_from(cp_sizes))
    # Contexts at a block boundary, one past it (the last position starts a block) and one short of it.
    walls = [(1 << e) + d for e in range(4, 18) for d in (-1, 0, 1)] + [4096 + 16, 131072 + 7]
    walls += [k * bs * cp + d for bs in BLOCK_SIZES[domain] for k in (1, 2, 3, 5) for d in (0, 1, 1)]
    ctx = edge_or(draw, 1, max_ctx, walls + [max_ctx])
    # A list of groups, so that shrinking can drop any of them (the narrow one need not come first).
    groups = draw(st.lists(_group(domain, ctx, cp), min_size=1, max_size=max_groups))
    num_groups = len(groups)
    sizes = [g["block_size"] for g in groups]
    sharded = [g["sharded"] for g in groups]
    longest = max(g["blocks"] or -(-ctx // g["block_size"]) for g in groups)
    most = max(1, min(most_reqs, max_cells // max(1, longest * num_groups)))
    num_reqs = draw(st.integers(1, most))
    per_req = max(1, min(max_q, MAX_TOKENS[domain] // num_reqs))
    tile = draw(st.sampled_from(TILES[domain]))
    # A request's tokens straddle a wall: a row's end (the first block past it is the edge the row guard must
    # hold) or the context's; else anywhere below the context.
    ends = [g["blocks"] * g["block_size"] * (cp if g["sharded"] else 1) for g in groups if g["blocks"]] + [ctx]
    starts, lens = [], []
    for _ in range(num_reqs):
        q = min(ctx, edge_or(draw, 1, per_req, (1, 2, tile - 1, tile, tile + 1, per_req)))
        if draw(st.sampled_from((True, True, False))):
            wall = ctx if draw(st.booleans()) else draw(st.sampled_from(sorted(set(ends))))
            s = min(max(0, wall - draw(st.integers(0, q))), ctx - q)
        else:
            s = draw(st.integers(0, ctx - q))
        starts.append(s)
        lens.append(draw(st.sampled_from((q, q, q, 0))) if num_reqs > 1 else q)
    spare = draw(st.integers(0, 2))
    rows = list(draw(st.permutations(range(num_reqs + spare)))[:num_reqs])
    dummies = draw(st.sets(st.integers(0, num_reqs - 1), max_size=num_reqs - 1)) if num_reqs > 1 else set()
    req_rows = [-1 if b in dummies else r for b, r in enumerate(rows)]
    interleaves = sorted({il for il in (1, 2, 4, 8, 16) if all(bs % il == 0 for bs, sh in zip(sizes, sharded) if sh)})
    return dict(ctx=ctx, groups=tuple(groups), req_rows=tuple(req_rows), starts=tuple(starts),
                query_lens=tuple(lens), table_rows=num_reqs + spare, pad=edge_or(draw, 0, 40, (1, tile)),
                cp_size=cp, cp_rank=draw(st.integers(0, cp - 1)), cp_interleave=draw(st.sampled_from(interleaves)),
                tile=tile, seed=draw(st.integers(0, 2 ** 16)))
