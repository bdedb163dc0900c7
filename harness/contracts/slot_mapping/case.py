"""The slot-mapping contract's case and oracle (docs/contract.md §11), plain Python.

A case is one launch of the slot-mapping kernel: the KV-cache groups (each with its block size, its row width
rule, whether it takes a slot mapping and whether context parallelism splits its KV), the model's context length,
the batch (each request's block-table row, or -1 for a dummy request, and its tokens' positions: a run of
consecutive positions below the context length), the rows of the block tables, the padding past the batch's
tokens, the context-parallel rank and the kernel's tile.

A group's row is ``width`` blocks wide for a group sized by the launch's width (``blocks`` None: ``ceil(width /
(block_size * shards))`` blocks, where ``width`` is the tokens the tables are sized for and ``shards`` the
context-parallel ranks splitting the group's KV), or ``blocks`` wide whatever the width (a group whose table is
narrower than the positions reach: vllm#53982). The oracle: the slot of a token at rank-local position ``l`` is
``row[l // block_size] * block_size + l % block_size`` while ``l // block_size`` is inside the row, and PAD past
it, for a dummy request, a group without a slot mapping or another rank's token; every column past the batch's
tokens is PAD.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from kvfence.errors import require

#: The pad the kernel is launched with. vLLM's is -1 (``PAD_SLOT_ID``), which is kvfence's output poison: a
#: column the kernel never wrote would read as padded, so kvfence passes another value (``PAD_ID`` is a constexpr
#: of the ABI; the kernel does nothing else with it).
PAD = -2
#: Rows of a block table that no request of the launch owns hold ``SPARE_POISON - position``: no block id is
#: negative, so a slot derived from one is a read past the request's row (the engine's ``POISON_READ``).
SPARE_POISON = -(1 << 20)
#: Bounds ``from_json`` accepts (a case file is data from anywhere).
MAX_GROUPS = 8
MAX_REQUESTS = 4096
MAX_CTX = 1 << 22
MAX_BLOCK_SIZE = 1 << 16
MAX_PAD = 1 << 16
TILES = (16, 32, 64, 128, 256, 512, 1024)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Group:
    """One KV-cache group: ``blocks`` None sizes its row by the launch's width, else the row is ``blocks`` wide."""

    block_size: int
    blocks: Optional[int] = None
    enabled: bool = True
    sharded: bool = True


@dataclass(frozen=True)
class SlotCase:
    ctx: int
    groups: Tuple[Group, ...]
    req_rows: Tuple[int, ...]  # idx_mapping: each request's block-table row, -1 a dummy request
    starts: Tuple[int, ...]  # each request's first position
    query_lens: Tuple[int, ...]  # each request's tokens this step
    table_rows: int  # rows of every group's block table (vLLM's max_num_reqs)
    pad: int = 0  # slot-mapping columns past the batch's tokens
    cp_size: int = 1
    cp_rank: int = 0
    cp_interleave: int = 1
    tile: int = 1024
    seed: int = 0

    @property
    def num_reqs(self) -> int:
        return len(self.req_rows)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def max_num_tokens(self) -> int:
        return self.num_tokens + self.pad

    def query_start_loc(self) -> List[int]:
        out = [0]
        for q in self.query_lens:
            out.append(out[-1] + q)
        return out

    def positions(self) -> List[int]:
        return [s + t for s, q in zip(self.starts, self.query_lens) for t in range(q)]

    def shards(self, g: int) -> int:
        """Context-parallel ranks splitting group ``g``'s KV (vLLM divides a sharded group's row by them)."""
        return self.cp_size if self.groups[g].sharded else 1

    def validate(self) -> "SlotCase":
        require(1 <= self.ctx <= MAX_CTX, f"ctx must be in [1, {MAX_CTX}]")
        require(1 <= len(self.groups) <= MAX_GROUPS, f"a case has 1 to {MAX_GROUPS} groups")
        require(1 <= self.cp_size <= 16, "cp_size must be in [1, 16]")
        require(0 <= self.cp_rank < self.cp_size, "cp_rank must be in [0, cp_size)")
        require(self.cp_interleave >= 1, "cp_interleave must be >= 1")
        for g, grp in enumerate(self.groups):
            require(1 <= grp.block_size <= MAX_BLOCK_SIZE, f"group {g}: block_size must be in [1, {MAX_BLOCK_SIZE}]")
            require(grp.blocks is None or 1 <= grp.blocks <= MAX_CTX, f"group {g}: blocks must be null or in "
                                                                         f"[1, {MAX_CTX}]")
            require(self.shards(g) == 1 or grp.block_size % self.cp_interleave == 0,
                    f"group {g}: cp_interleave {self.cp_interleave} must divide its block size {grp.block_size}")
        n = self.num_reqs
        require(1 <= n <= MAX_REQUESTS, f"a case has 1 to {MAX_REQUESTS} requests")
        require(len(self.starts) == n and len(self.query_lens) == n, "starts and query_lens: one per request")
        require(all(q >= 0 for q in self.query_lens) and all(s >= 0 for s in self.starts),
                "starts and query_lens must be >= 0")
        require(all(s + q <= self.ctx for s, q in zip(self.starts, self.query_lens)),
                "every position must be below ctx (start + query_len <= ctx)")
        real = [r for r in self.req_rows if r >= 0]
        require(all(r >= -1 for r in self.req_rows), "req_rows: a block-table row, or -1 for a dummy request")
        require(len(set(real)) == len(real) and all(r < self.table_rows for r in real),
                "req_rows: distinct rows below table_rows")
        require(1 <= self.table_rows <= MAX_REQUESTS, f"table_rows must be in [1, {MAX_REQUESTS}]")
        require(0 <= self.pad <= MAX_PAD, f"pad must be in [0, {MAX_PAD}]")
        require(self.tile in TILES, f"tile must be one of {TILES}")
        require(0 <= self.seed < 1 << 32, "seed must be in [0, 2**32)")  # numpy's generator takes no negative seed
        require(self.num_tokens <= 1 << 24, "at most 2**24 tokens")
        longest = max(grp.blocks or cdiv(self.ctx, grp.block_size) for grp in self.groups)
        require(self.table_rows * longest * max(grp.block_size for grp in self.groups) < 2 ** 31,
                "slots must fit int32: fewer rows or a shorter context")
        return self


# -- the row widths and the tables -----------------------------------------------------------------------------
def row_blocks(case: SlotCase, width: int) -> Tuple[int, ...]:
    """Each group's row width in blocks under a launch width of ``width`` tokens."""
    return tuple(grp.blocks if grp.blocks is not None else cdiv(width, grp.block_size * case.shards(g))
                 for g, grp in enumerate(case.groups))


@functools.lru_cache(maxsize=8)  # tables() and the oracle both read it, once per launch
def block_table(case: SlotCase, g: int, blocks: int):
    """Group ``g``'s block table (``table_rows x blocks``, int32): each row a request owns holds distinct block
    ids (a seeded shuffle), every other row ``SPARE_POISON - position``."""
    import numpy as np

    owned = sorted(r for r in case.req_rows if r >= 0)
    out = SPARE_POISON - np.arange(case.table_rows * blocks, dtype=np.int64).reshape(case.table_rows, blocks)
    ids = np.random.default_rng([case.seed, g]).permutation(len(owned) * blocks).reshape(len(owned), blocks)
    for i, r in enumerate(owned):
        out[r] = ids[i]
    return out.astype(np.int32)


def local_position(case: SlotCase, g: int, p: int) -> Optional[int]:
    """Position ``p`` on this rank for group ``g``, or None when another rank holds its KV."""
    if case.shards(g) == 1:
        return p
    bs, cp, il = case.groups[g].block_size, case.cp_size, case.cp_interleave
    vblock, voff = divmod(p, bs * cp)
    if (voff // il) % cp != case.cp_rank:
        return None
    return vblock * bs + (voff // (il * cp)) * il + voff % il


def token_owner(case: SlotCase) -> List[int]:
    """The request of every token column."""
    return [b for b, q in enumerate(case.query_lens) for _ in range(q)]


def oracle(case: SlotCase, width: int) -> Dict[Tuple[int, int], int]:
    """``{(group, column): slot}`` for every column of every slot-mapping row."""
    blocks = row_blocks(case, width)
    positions = case.positions()
    owners = token_owner(case)
    out = {}
    for g, grp in enumerate(case.groups):
        table = block_table(case, g, blocks[g]) if grp.enabled else None
        for t in range(case.max_num_tokens):
            slot = PAD
            if t < case.num_tokens and table is not None and case.req_rows[owners[t]] >= 0:  # None: disabled
                local = local_position(case, g, positions[t])
                if local is not None and local // grp.block_size < blocks[g]:
                    j, o = divmod(local, grp.block_size)
                    slot = int(table[case.req_rows[owners[t]], j]) * grp.block_size + o
            out[(g, t)] = slot
    return out


def need(case: SlotCase) -> int:
    """The width (tokens) every group sized by it needs: its rows must hold the block of each real request's
    rank-local position in an enabled group, ``ceil(width / (block_size * shards)) > j`` for each, that is
    ``width >= j * block_size * shards + 1``. Narrow groups (``blocks`` given) need nothing of the width."""
    most = 0
    positions, owners = case.positions(), token_owner(case)
    for g, grp in enumerate(case.groups):
        if grp.blocks is not None or not grp.enabled:
            continue
        for t, p in enumerate(positions):
            if case.req_rows[owners[t]] < 0:
                continue
            local = local_position(case, g, p)
            if local is not None:
                most = max(most, (local // grp.block_size) * grp.block_size * case.shards(g) + 1)
    return most


def reach(case: SlotCase, width: int) -> Tuple[Tuple[Tuple[int, ...], ...], ...]:
    """Per group, per request: ``(first, last)`` block index its local tokens ask for minus the row's width
    (``last >= 0``: the request reaches past its row), ``()`` for a dummy request, a disabled group or no local
    token."""
    blocks = row_blocks(case, width)
    out = []
    for g, grp in enumerate(case.groups):
        per = []
        for b, (s, q) in enumerate(zip(case.starts, case.query_lens)):
            js = [loc // grp.block_size for loc in (local_position(case, g, p) for p in range(s, s + q))
                  if loc is not None]
            per.append((min(js) - blocks[g], max(js) - blocks[g])
                       if js and grp.enabled and case.req_rows[b] >= 0 else ())
        out.append(tuple(per))
    return tuple(out)
