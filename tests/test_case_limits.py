"""Config sizes known by arithmetic: pool_len without a loop over ctx or page_size, absurd sizes refused
before anything is computed or allocated."""

import pytest

from kvfence.contracts.draft import oracle
from kvfence.contracts.draft.case import MAX_POOL_BYTES, Config
from kvfence.errors import BadInput


@pytest.mark.parametrize("topk", [1, 2, 3, 5])
@pytest.mark.parametrize("num_steps", [1, 2, 3, 7])
@pytest.mark.parametrize("page_size", [1, 2, 4, 16, 64])
def test_pool_len_is_the_maximum_read_extent_over_every_length(topk, num_steps, page_size):
    for ctx in list(range(num_steps + 1, 70)) + [129, 200]:
        c = Config(topk=topk, num_steps=num_steps, page_size=page_size, ctx=ctx, max_bs=2)
        brute = max(oracle.read_extent(L, topk, num_steps, page_size) for L in range(1, ctx + 1))
        assert c.pool_len == brute, (ctx, c.pool_len, brute)


def test_absurd_page_sizes_are_refused_before_any_work():
    with pytest.raises(BadInput, match="config too large"):
        Config(topk=2, num_steps=1, page_size=2**40, ctx=4, max_bs=1)
    with pytest.raises(BadInput, match="config too large"):
        Config(topk=1, num_steps=1, page_size=2**4000, ctx=4, max_bs=1)
    # The bound is far above real pools: production-sized configs construct.
    c = Config(topk=16, num_steps=16, page_size=128, ctx=131072, max_bs=256, sizing="fixed")
    assert 4 * c.pool_rows * c.pool_len < MAX_POOL_BYTES
