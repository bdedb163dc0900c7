"""The dsv4-topk-indices contract's case and oracle (docs/contract.md §12), plain Python.

A case is one launch of DeepSeek-V4's top-k global-index kernel: the compressed block size ``B`` (compressed
tokens per block-table entry: the KV cache's block size over the layer's compress ratio), the compressed context
``ctx`` (a valid token's indices lie below it), the top-k width ``topk``, the block table's rows, and per token
its block-table row, whether it is valid (a scheduled token, not CUDA-graph padding) and its ``topk`` local
indices. A padding token's indices are whatever the shared buffer last held: -1, an index of another layer or
request, or uninitialised memory (any int32).

The block table is ``table_rows x W`` with ``W = ceil(width / B)`` blocks, ``width`` the compressed tokens the
launch's sizing gives a row (vLLM's row holds ``max_model_len`` tokens' blocks: ``safe`` is ``ctx``). The oracle:
for a valid token, index ``idx`` maps to ``table[req, idx // B] * B + idx % B`` when ``0 <= idx`` and ``idx // B <
W``, else to -1, and ``topk_lens`` counts the mapped ones; for a padding token ``topk_lens`` is 0, an index past
its row (or negative) maps to -1, and an index inside its row maps to -1 or to its slot (the consumer reads none of
a padding token's entries: ``topk_lens`` is 0; what it must not do is read past the row).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Tuple

from kvfence.errors import require

#: Rows of the block table that no token names hold ``SPARE_POISON - position``: no block id is negative, so a slot
#: derived from one is a read past a row (the engine's ``POISON_READ``; ``* B`` keeps it poison-derived and an int32
#: for B <= 64). Not a power of two: times a block size it never equals an input guard's poison, which the
#: engine would name as the guard read.
SPARE_POISON = -(1 << 22) - 7
#: Bounds ``from_json`` accepts (a case file is data from anywhere).
MAX_BLOCK_SIZE = 64  # INPUT_POISON * B must stay an int32 (c4 at a 256-token cache block: 64)
MAX_TOKENS = 4096
MAX_TOPK = 2048
MAX_ROWS = 1024
MAX_CTX = 1 << 20
MAX_CELLS = 1 << 22
TILES = (16, 32, 64, 128, 256, 512, 1024)
INT32 = (-(1 << 31), (1 << 31) - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TopkCase:
    block_size: int  # compressed tokens per block
    ctx: int  # compressed context: every valid token's indices are below it
    topk: int  # indices per token
    table_rows: int  # rows of the block table (vLLM: the decode requests)
    reqs: Tuple[int, ...]  # each token's block-table row
    valid: Tuple[bool, ...]  # each token: scheduled (True) or padding (False)
    indices: Tuple[Tuple[int, ...], ...]  # each token's topk local indices
    tile: int = 1024  # the kernel's TRITON_BLOCK_SIZE (vLLM's: 1024)
    seed: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.reqs)

    def validate(self) -> "TopkCase":
        require(1 <= self.block_size <= MAX_BLOCK_SIZE, f"block_size must be in [1, {MAX_BLOCK_SIZE}]")
        require(1 <= self.ctx <= MAX_CTX, f"ctx must be in [1, {MAX_CTX}]")
        require(1 <= self.topk <= MAX_TOPK, f"topk must be in [1, {MAX_TOPK}]")
        require(1 <= self.table_rows <= MAX_ROWS, f"table_rows must be in [1, {MAX_ROWS}]")
        require(1 <= self.num_tokens <= MAX_TOKENS, f"a case has 1 to {MAX_TOKENS} tokens")
        require(len(self.valid) == self.num_tokens and len(self.indices) == self.num_tokens,
                "reqs, valid and indices: one per token")
        require(all(0 <= r < self.table_rows for r in self.reqs), "reqs: a block-table row each, below table_rows")
        require(all(len(row) == self.topk for row in self.indices), "indices: topk of them per token")
        require(all(INT32[0] <= i <= INT32[1] for row in self.indices for i in row), "indices must be int32")
        require(all(i < self.ctx for row, v in zip(self.indices, self.valid) if v for i in row),
                "a valid token's indices must be below ctx (the indexer picks among its compressed tokens)")
        require(self.tile in TILES, f"tile must be one of {TILES}")
        require(self.table_rows * (cdiv(self.ctx, self.block_size) + 1) <= MAX_CELLS,
                "the block table is too large: fewer rows or a shorter context")
        return self


def row_blocks(case: TopkCase, width: int) -> int:
    """W: the blocks a row holds under a launch width of ``width`` compressed tokens."""
    return cdiv(width, case.block_size)


@functools.lru_cache(maxsize=8)  # tables() and the oracle both read it, once per launch
def block_table(case: TopkCase, blocks: int):
    """The block table (``table_rows x blocks``, int32): a row some token names holds distinct block ids (a seeded
    shuffle), every other row ``SPARE_POISON - position``."""
    import numpy as np

    named = sorted(set(case.reqs))
    out = SPARE_POISON - np.arange(case.table_rows * blocks, dtype=np.int64).reshape(case.table_rows, blocks)
    ids = np.random.default_rng(case.seed).permutation(len(named) * blocks).reshape(len(named), blocks)
    for i, r in enumerate(named):
        out[r] = ids[i]
    return out.astype(np.int32)


def inside(case: TopkCase, blocks: int, idx: int) -> bool:
    """The contract's bound: a non-negative index whose block is inside the row."""
    return idx >= 0 and idx // case.block_size < blocks


def oracle(case: TopkCase, width: int) -> Dict[str, Dict[Tuple[int, int], object]]:
    """``{"global_topk_indices": {(token, k): slot}, "topk_lens": {(0, token): count}}``."""
    blocks = row_blocks(case, width)
    table = block_table(case, blocks)
    bs = case.block_size
    slots: Dict[Tuple[int, int], object] = {}
    lens: Dict[Tuple[int, int], object] = {}
    for t, (req, valid, row) in enumerate(zip(case.reqs, case.valid, case.indices)):
        mapped = 0
        for k, idx in enumerate(row):
            if not inside(case, blocks, idx):
                slots[(t, k)] = -1
                continue
            slot = int(table[req, idx // bs]) * bs + idx % bs
            if valid:
                slots[(t, k)] = slot
                mapped += 1
            else:
                slots[(t, k)] = frozenset({-1, slot})
        lens[(0, t)] = mapped
    return {"global_topk_indices": slots, "topk_lens": lens}


def need(case: TopkCase) -> int:
    """The width (compressed tokens) a row needs: the block of every valid token's index inside it,
    ``ceil(width / B) > idx // B``, that is ``width >= (idx // B) * B + 1``."""
    bs = case.block_size
    return max([(i // bs) * bs + 1 for row, v in zip(case.indices, case.valid) if v for i in row if i >= 0] or [0])


def reach(case: TopkCase, width: int) -> Tuple[int, ...]:
    """Per token: how its indices sit against its row, ``-1`` none past it, ``0`` one in the first block past
    the row, ``1`` further (the row after it, or past the table), ``2`` an index past the table altogether."""
    blocks = row_blocks(case, width)
    out = []
    for req, row in zip(case.reqs, case.indices):
        past = [i // case.block_size - blocks for i in row if i >= 0 and i // case.block_size >= blocks]
        cells = [req * blocks + i // case.block_size for i in row if i >= 0]
        far = any(c >= case.table_rows * blocks for c in cells)
        out.append(2 if far else 1 if any(p > 0 for p in past) else 0 if past else -1)
    return tuple(out)
