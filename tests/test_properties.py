"""Property tests: the kernel under test (``--kernel``, default ours) against the oracle over the
strategies' domain, and the fuzz loop catching the sizing bugs it exists for."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvfence.contracts.draft import oracle
from kvfence.contracts.draft.case import Case
from kvfence.contracts.draft.record import DRAFT, launch_of
from kvfence.contracts.draft.runner import make_runner
from kvfence.contracts.draft.strategies import batches, cases, configs
from kvfence.contracts.draft.targets import resolve_kernel
from kvfence.engine.casefile import raise_on_findings
from kvfence.engine.findings import Kind
from kvfence.engine.launch import utilisation
from kvfence.engine.loop import fuzz
from kvfence.engine.plan import RunPlan
from kvfence.kernels.draft.draft_kv_indices import token_blocks_for

layouts = st.sampled_from(["redzone", "production"])
modes = st.sampled_from(["graph", "eager"])


@st.composite
def any_config(draw, sizing):
    return draw(configs(sizing=sizing, layout=draw(layouts), mode=draw(modes)))


@given(data=st.data())
def test_kernel_with_safe_sizing_is_clean_over_the_full_domain(make_session, kernel_spec, data):
    case = data.draw(cases(any_config("safe"), kernel=kernel_spec))
    raise_on_findings(launch_of(case), make_session(kernel_spec).check(case))


@given(data=st.data())
def test_fixed_sizing_is_clean_when_requests_keep_draft_headroom(make_session, kernel_spec, data):
    case = data.draw(cases(any_config("fixed"), kernel=kernel_spec, seq_len_limit="ctx-steps"))
    assert case.sizing_summary()["need"] <= case.sizing_summary()["width"]
    raise_on_findings(launch_of(case), make_session(kernel_spec).check(case))


@given(data=st.data())
def test_sizing_under_test_is_clean_when_requests_keep_draft_headroom(make_session, kernel_spec, sizing_spec, data):
    """``--sizing`` (default ``safe``) is the policy a user brings; ``ctx-steps`` is its fair domain."""
    case = data.draw(cases(any_config(sizing_spec), kernel=kernel_spec, seq_len_limit="ctx-steps"))
    raise_on_findings(launch_of(case), make_session(kernel_spec).check(case))


def _fuzz(make_session, kernel, sizing, seq_len_limit, max_examples=120, seed=7):
    strategy = cases(configs(sizing=sizing), kernel=kernel, seq_len_limit=seq_len_limit).map(launch_of)
    return fuzz(make_session(kernel), strategy, RunPlan(max_examples=max_examples, seed=seed, shrink_seconds=60))


def test_prefix_sizing_is_caught_and_shrunk_to_a_topk_bug(make_session, kernel_spec):
    """The pre-fix ``prefix`` sizing: the CUDA-graph buffer without the topk factor. With draft headroom kept
    (ctx-steps) the only way to overflow is topk >= 2."""
    result = _fuzz(make_session, kernel_spec, "prefix", "ctx-steps")
    kinds = {f.kind for f in result.findings}
    assert kinds & {Kind.GUARD_OVERWRITE, Kind.STRAY_WRITE}, [f.headline() for f in result.findings]
    assert Kind.SIZING_VIOLATION in kinds
    case = DRAFT.runtime(result.case)
    summary = case.sizing_summary()
    assert case.config.topk >= 2 and summary["need"] > summary["width"]
    # Shrunk: one request, one step, the smallest config that still overflows.
    assert case.batch.raw_bs == 1 and case.config.num_steps == 1 and case.config.max_bs == 1


def test_fixed_sizing_context_limit_overflow_is_caught(make_session, kernel_spec):
    """The fixed policy budgets ctx per branch but a branch needs L + num_steps: a full bucket of
    requests at the context limit overflows (a real upstream bug class)."""
    result = _fuzz(make_session, kernel_spec, "fixed", "ctx")
    kinds = {f.kind for f in result.findings}
    assert Kind.SIZING_VIOLATION in kinds and Kind.GUARD_OVERWRITE in kinds
    c, b = result.case.case.config, result.case.case.batch
    # Every such overflow needs a request within num_steps of ctx.
    assert max(b.seq_lens) > c.ctx - c.num_steps
    assert utilisation(DRAFT, result.case) > 1


def test_reference_fuzz_with_safe_sizing_finds_nothing(make_session):
    result = _fuzz(make_session, "reference", "safe", "ctx", max_examples=30)
    assert result.findings == [] and result.examples == 30


@st.composite
def long_prefix_cases(draw):
    """Cases whose prefixes span several 512-token blocks (the token-block variant's split)."""
    config = draw(configs(topk=draw(st.integers(1, 2)), num_steps=draw(st.integers(1, 2)), max_bs=2,
                          ctx=draw(st.integers(513, 1100)), sizing="safe", mode=draw(modes)))
    batch = draw(batches(config))
    return Case(config, batch)


@settings(max_examples=8)
@given(case=long_prefix_cases())
def test_token_block_variant_is_bit_identical_to_classic(device, case):
    assert token_blocks_for(case.config.pool_len) >= 2  # several blocks per step row really run
    outputs = []
    for spec in ("reference", "reference-blocked"):
        runner = make_runner(case.config, resolve_kernel(spec, device), device, canary_seed=case.canary_seed)
        obs = runner.run(case.batch)
        assert obs.error is None, obs.error
        outputs.append((obs.after["kv_indices"], obs.after["kv_indptr"]))
    assert all(a.equal(b) for a, b in zip(*outputs))
    lb = case.launch()
    assert oracle.need(lb.seq_lens, case.config.topk, case.config.num_steps) <= case.config.row_width(lb.num_seqs)
