"""The token table a draft case's kernel reads, and TRANSLATE's page table: drawn from seeds, never stored.

Entry ``i`` of the flattened ``req_to_token`` is ``table_entry(config, token_seed, i)`` (``slot_id``: distinct,
page-granular for ``ENTRY_PAGE_SIZE > 1``, a permutation under TRANSLATE); ``v2p_table`` is the virtual-to-physical
page table a TRANSLATE case reads. A case file keeps only the seeds (docs/contract.md §6).
"""

from __future__ import annotations

from typing import List, Optional, Protocol

#: Offsets are int32 inside the kernel (docs/contract.md §3).
INT32_LIMIT = 2**31

#: Hash classes (of 8) of a drawn page: mapped to a negative id, to the page-0 sink, far away.
V2P_NEGATIVE, V2P_SINK, V2P_FAR = 0, 1, 2


#: A prime above any pool's entry count: ``i -> (i*A + c) mod N`` is then a permutation of ``[0, N)``.
PERMUTE = 2654435761
#: KV slot ids live in [1, 2**30]; poison and canaries are negative, so no valid slot id equals them.
SLOT_BITS = 30
def slot_id(token_seed: int, flat_index: int, bits: int = SLOT_BITS) -> int:
    """The KV slot id stored at ``req_to_token.view(-1)[flat_index]``.

    A bijection on ``bits`` bits (odd multiply, xor-shift, odd multiply, all mod 2**bits) plus one, so
    every entry of the table is distinct: a shifted, swapped or stale copy never equals the right value.
    ``bits`` is 30 except for page-granular rows (``entry_bits``).
    """
    mask = (1 << bits) - 1
    h = (flat_index * 0x9E3779B1 + token_seed) & mask
    h ^= h >> 13
    h = (h * 0x5BD1E995) & mask
    return h + 1


class TableShape(Protocol):
    """What the tables here are drawn for: a config's pool and TRANSLATE fields (``kvfence.contracts.draft.case.Config``
    is one; this module is below it, so it names only what it reads)."""

    @property
    def translate(self) -> bool: ...

    @property
    def page_size(self) -> int: ...

    @property
    def pool_rows(self) -> int: ...

    @property
    def pool_cols(self) -> int: ...

    @property
    def entry_bits(self) -> int: ...

    @property
    def v2p_pages(self) -> int: ...


def table_entry(config: TableShape, token_seed: int, flat: int) -> int:
    """Entry ``flat`` of the flattened req_to_token table (``kvfence.contracts.draft.runner.slot_table`` is its torch
    twin).

    Without TRANSLATE a distinct slot id of ``config.entry_bits`` bits (with ``E > 1`` the token id
    ``entry*E + p mod E`` is then still distinct and below 2**30). With TRANSLATE a virtual id: the
    entries are a seeded permutation of ``[0, N)``, ``N = pool_rows*pool_cols``, so every virtual page has
    a ``v2p`` entry (docs/contract.md §6)."""
    if config.translate:
        n = config.pool_rows * config.pool_cols
        return (flat * (PERMUTE % n) + token_seed) % n
    return slot_id(token_seed, flat, config.entry_bits)


def req_to_token_rows(config: TableShape, token_seed: int) -> List[List[int]]:
    """The req_to_token table as plain lists (``[pool_rows][pool_cols]``), for the oracle."""
    width = config.pool_cols
    return [[table_entry(config, token_seed, r * width + t) for t in range(width)] for r in range(config.pool_rows)]


def v2p_entry(seed: int, page: int, pages: int, page_size: int) -> int:
    """``v2p[page]`` of the page table drawn with ``seed`` (docs/contract.md §6, TRANSLATE).

    Seed 0 is the identity (the shrink target). Otherwise page 0 stays the sink page 0 (a pool reserves
    it), and every other page gets a hash class: 1 in 8 a negative id (the kernel must read 0), 1 in 8
    the sink page 0, 1 in 8 a far page near the int32 limit, the rest a seeded permutation of the pages.
    ``kvfence.contracts.draft.runner.v2p_tensor`` is the torch twin."""
    if seed == 0:
        return page
    if page == 0:
        return 0
    perm = (page * (PERMUTE % pages) + seed) % pages
    h = slot_id(seed, page)
    cls = h % 8
    if cls == V2P_NEGATIVE:
        return -1 - (h >> 3) % 3
    if cls == V2P_SINK:
        return 0
    if cls == V2P_FAR:
        return (INT32_LIMIT // page_size) - 1 - perm
    return perm


def v2p_table(config: TableShape, seed: int) -> Optional[List[int]]:
    """The page table as a plain list (None without TRANSLATE), for the oracle."""
    if not config.translate:
        return None
    return [v2p_entry(seed, p, config.v2p_pages, config.page_size) for p in range(config.v2p_pages)]
