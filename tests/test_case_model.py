"""The case model, guards and strategies: validation up front, canaries that catch shifted copies,
and the torch slot table equal to the plain definition."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvfence.contract import Table
from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.runner import slot_table
from kvfence.contracts.draft.strategies import batches, cases, configs, seq_len_bound
from kvfence.contracts.draft.tokens import slot_id
from kvfence.engine.tables import POISON, allocate_laid_out, seeded_canaries
from kvfence.errors import BadInput


@pytest.mark.parametrize("kwargs, message", [
    (dict(topk=0, num_steps=1), "config.topk must be a positive integer"),
    (dict(topk=2, num_steps=-1), "config.num_steps must be a positive integer"),
    (dict(topk=2, num_steps=1, page_size=3), "config.page_size must be a power of two"),
    (dict(topk=2, num_steps=1, layout="sideways"), "config.layout must be one of"),
    (dict(topk=2, num_steps=1, mode="lazy"), "config.mode must be one of"),
    (dict(topk=2, num_steps=1, max_bs=4, buckets=(1, 3)), "must end at max_bs=4"),
    (dict(topk=2, num_steps=1, max_bs=4, buckets=(2, 1, 4)), "strictly increasing"),
    (dict(topk=8, num_steps=1, max_bs=4096, ctx=2**17), "overflows int32 offsets"),
    (dict(topk=True, num_steps=1), "config.topk must be a positive integer"),
])
def test_impossible_configs_are_refused_with_one_line(kwargs, message):
    with pytest.raises(BadInput, match=message) as info:
        Config(**kwargs)
    assert "\n" not in str(info.value)


def test_batches_that_do_not_fit_are_refused():
    config = Config(topk=2, num_steps=2, ctx=8, max_bs=2)
    with pytest.raises(BadInput, match="exceed ctx=8"):
        Case(config, Batch((9,), (0,)))
    with pytest.raises(BadInput, match="more than max_bs=2"):
        Case(config, Batch((1, 1, 1), (0, 1, 2)))
    with pytest.raises(BadInput, match="must be distinct"):
        Batch((1, 1), (0, 0))
    with pytest.raises(BadInput, match="outside the pool"):
        Case(config, Batch((1,), (3,)))


def test_torch_slot_table_equals_the_plain_definition():
    table = slot_table(12345, 5, 37, "cpu")
    assert table.flatten().tolist() == [slot_id(12345, i) for i in range(5 * 37)]
    assert len(set(table.flatten().tolist())) == 5 * 37  # distinct: any shifted copy shows
    assert int(table.min()) >= 1


def test_canaries_depend_on_position_and_seed():
    a = seeded_canaries(1, torch.arange(1000))
    assert int(a.max()) < POISON  # never a slot id, never poison
    assert not torch.equal(a[1:], a[:-1])  # a copy shifted by one is wrong everywhere
    assert (a[1:] != a[:-1]).all()
    assert (seeded_canaries(2, torch.arange(1000)) != a).all()


def test_the_runners_laid_out_table_layout_regions_and_reset():
    """The draft runner's outputs: engine tables in the runner's geometry, seeded canaries in every guard (and in
    column 0 with ``column0_canary``), poisoned rows, and ``reset`` puts both back."""
    buf = allocate_laid_out(Table("kv_indices", 10, 3), "cpu", guard=4, front=5, tail=6, canary_seed=0)
    assert buf.view.shape == (3, 10) and buf.view.stride() == (14, 1)
    assert len(buf.flat) == 5 + 3 * 14 + 6 and buf.spacer is None
    guards = torch.ones(len(buf.flat), dtype=torch.bool)
    for row in range(3):
        guards[buf.position(row, 0):buf.position(row, 10)] = False
    fresh = buf.flat.clone()
    assert (buf.view == POISON).all()
    assert torch.equal(fresh[guards], seeded_canaries(0, torch.arange(len(fresh)))[guards])
    assert buf.locate(0) == ("front guard", None, 0)
    assert buf.locate(buf.position(1, 3)) == ("row", 1, 3)
    assert buf.locate(buf.position(1, 11)) == ("guard after row", 1, 1)
    assert buf.locate(len(buf.flat) - 1)[0] == "tail"
    buf.flat[0] = 7
    buf.view[1, 2] = 9
    buf.reset()
    assert torch.equal(buf.flat, fresh)
    indptr = allocate_laid_out(Table("kv_indptr", 4, 2), "cpu", guard=2, front=3, tail=3, canary_seed=5,
                               column0_canary=True, spacer=True)
    assert indptr.spacer is not None and len(indptr.spacer) == len(indptr.flat)
    assert (indptr.view[:, 1:] == POISON).all()
    assert torch.equal(indptr.view[:, 0], seeded_canaries(5, torch.tensor([3, 9])))


@given(data=st.data())
def test_strategies_draw_valid_cases_inside_their_bounds(data):
    config = data.draw(configs())
    assert 1 <= config.topk <= 8 and 1 <= config.num_steps <= 8 and config.page_size in (1, 2, 4, 16, 64)
    assert config.ctx > config.num_steps
    limit = data.draw(st.sampled_from(["ctx", "ctx-steps"]))
    batch = data.draw(batches(config, limit))
    assert 1 <= batch.raw_bs <= config.max_bs
    assert max(batch.seq_lens) <= seq_len_bound(config, limit)
    Case(config, batch)  # validates


@pytest.mark.parametrize("ctx, num_steps, limit", [(40, 3, "ctx"), (40, 3, "ctx-steps"), (1000, 5, "ctx")])
def test_a_full_batch_at_the_context_wall_is_a_common_draw(ctx, num_steps, limit):
    """``AT_THE_WALL``: every request of a full batch within ``num_steps`` of the bound is drawn in about one
    batch in ten of a small config (the sizing_no_draft_headroom trigger: no headroom for the drafts), on
    both length domains (small bounds draw one code per length, large ones ``sized``)."""
    from hypothesis import HealthCheck, Phase, seed, settings

    config = Config(topk=1, num_steps=num_steps, ctx=ctx, max_bs=4)
    bound = seq_len_bound(config, limit)
    drawn = []

    @seed(0)
    @settings(max_examples=200, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(batches(config, limit))
    def collect(batch):
        drawn.append(batch)

    collect()
    at_wall = [b for b in drawn if b.raw_bs == 4 and all(bound - num_steps < L <= bound for L in b.seq_lens)]
    assert len(at_wall) >= 0.05 * len(drawn), (len(at_wall), len(drawn))
    assert {L for b in at_wall for L in b.seq_lens} == set(range(bound - num_steps + 1, bound + 1))


@pytest.mark.parametrize("make, message", [
    (lambda: configs(layout="diagonal"), "layout"),
    (lambda: configs(topk=0), "topk"),
    (lambda: configs(page_size=3), "page_size"),
    (lambda: cases(seq_len_limit="forever"), "seq_len_limit"),
    (lambda: batches(Config(topk=1, num_steps=4, ctx=4), "ctx-steps"), "ctx > num_steps"),
])
def test_strategy_arguments_are_validated_up_front(make, message):
    with pytest.raises(BadInput, match=message):
        make().validate()


def test_a_failure_that_needs_two_requests_shrinks_to_two_not_to_a_full_batch():
    """A full batch (and the largest max_bs) is one tier of the count's draw: the tier comes first and the
    count is drawn whatever it is, so the shrinker can lower the tier while raising the count. A bug that
    needs two requests (a stray store from the second request, which kills the worker) then shrinks to
    two requests on every seed, not to the full batch the tier gave (the count drawn first shrank to 1
    under a full tier, stranding 2 of 10 seeds at four requests)."""
    from kvfence.contracts.draft.record import launch_of
    from kvfence.contracts.draft.strategies import case_runs
    from kvfence.engine.findings import Finding, Kind
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan

    class CrashesFromTwoRequests:
        stats: dict = {}

        def check(self, launch):
            return [Finding(Kind.CRASH, None, "kernel launch")] if len(launch.case.batch.seq_lens) >= 2 else []

    # The draft's strategy, each drawn case as the launch the engine checks.
    launches = case_runs(configs(), max_batches=1).map(lambda run: [launch_of(c) for c in run])
    plan = RunPlan(max_examples=200, shrink_seconds=30)
    shrunk = [len(fuzz(CrashesFromTwoRequests(), launches, plan.with_(seed=seed)).case.case.batch.seq_lens)
              for seed in range(10)]
    assert shrunk == [2] * 10
