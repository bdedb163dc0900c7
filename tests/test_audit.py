"""The interpreter address audit (kvfence.engine.audit): OOB reads and writes are found, wild stores dropped.

Every detection test pairs a buggy kernel that must be caught with a correct one that must stay clean.
Several tests put the kernel's tensor inside a larger numpy array (``sandwich``): the memory around the
tensor is not part of any registered allocation, but it is ours, so we can see what a wild store does
to it with and without the audit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parents[1]

PAST_END = "mutant:last_row_past_end"  # the reference kernel with that mutant's PATCH applied
OTHER_ROW = "mutant:row_from_request_index"
PAD = 64  # elements of the sandwich on each side of the tensor


def sandwich(n: int, fill: int = 7, pad: int = -5):
    """A torch tensor of ``n`` int32 whose storage is exactly ``n`` elements, inside a numpy array."""
    outer = np.full(n + 2 * PAD, pad, dtype=np.int32)
    outer[PAD:PAD + n] = fill
    return outer, torch.from_numpy(outer[PAD:PAD + n])


@pytest.fixture(scope="module")
def kernels(device):
    """Small kernels that step outside a tensor of ``n`` elements by ``shift`` (0: in bounds)."""
    import triton
    import triton.language as tl

    @triton.jit
    def shifted_copy(src, dst, n, shift, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs + shift, tl.load(src + offs + shift, mask=mask, other=-9), mask=mask)

    @triton.jit
    def shifted_atomics(dst, n, shift, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.atomic_add(dst + offs + shift, 1, mask=offs < n)
        tl.atomic_cas(dst + shift + n - 1, 8, 100)

    return shifted_copy, shifted_atomics


def run_copy(kernel, shift: int, audit: bool):
    from kvfence.engine.audit import Audit

    n = 16
    src_outer, src = sandwich(n, fill=3, pad=-6)
    dst_outer, dst = sandwich(n)
    a = Audit()
    a.register_tensor("src", src)
    a.register_tensor("dst", dst)
    if audit:
        with a:
            kernel[(1,)](src, dst, n, shift, BLOCK=n)
    else:
        kernel[(1,)](src, dst, n, shift, BLOCK=n)
    return a.findings(), dst_outer, dst


def test_in_bounds_copy_is_clean(kernels):
    findings, outer, dst = run_copy(kernels[0], 0, audit=True)
    assert findings == []
    assert (dst.numpy() == 3).all()
    assert (outer[:PAD] == -5).all() and (outer[-PAD:] == -5).all()


@pytest.mark.parametrize("shift", [5, -3])
def test_wild_stores_are_reported_and_dropped(kernels, shift):
    from kvfence.engine.findings import Kind

    findings, outer, dst = run_copy(kernels[0], shift, audit=True)
    by_kind = {f.kind: f for f in findings}
    assert set(by_kind) == {Kind.OOB_READ, Kind.OOB_WRITE}
    write = by_kind[Kind.OOB_WRITE]
    assert write.buffer == "dst" and write.count == abs(shift)
    assert write.region == ("past the allocation" if shift > 0 else "before the allocation")
    assert write.programs == [(0, 0, 0)]
    # Host memory around the tensor is untouched: the wild lanes were dropped.
    assert (outer[:PAD] == -5).all() and (outer[-PAD:] == -5).all()
    # The in-bounds lanes were performed; wild reads were masked off and read ``other``.
    inside = dst.numpy()
    moved = inside[shift:] if shift > 0 else inside[:shift]
    assert (moved == 3).sum() + (moved == -9).sum() == moved.size


def test_without_the_audit_the_same_kernel_writes_past_the_tensor(kernels):
    """The pair of the test above: the sandwich shows what the dropped stores would have done."""
    _, outer, _ = run_copy(kernels[0], 5, audit=False)
    assert (outer[PAD + 16: PAD + 21] == -6).all()  # src's surroundings, copied past dst's end


def test_atomics_outside_the_tensor_are_dropped(kernels):
    from kvfence.engine.audit import Audit
    from kvfence.engine.findings import Kind

    for shift, expect_oob in ((0, False), (4, True)):
        outer, dst = sandwich(8)
        a = Audit()
        a.register_tensor("dst", dst)
        with a:
            kernels[1][(1,)](dst, 8, shift, BLOCK=8)
        kinds = [f.kind for f in a.findings()]
        assert (Kind.OOB_WRITE in kinds) == expect_oob
        assert (outer[:PAD] == -5).all() and (outer[-PAD:] == -5).all()
        if not expect_oob:
            assert kinds == [] and (dst.numpy()[:7] == 8).all() and dst.numpy()[7] == 100


def test_unregistered_launch_arguments_are_registered_not_flagged(kernels):
    from kvfence.engine.audit import Audit

    a = Audit()  # nothing registered: the launch's own tensors become allocations
    src, dst = torch.arange(16, dtype=torch.int32), torch.zeros(16, dtype=torch.int32)
    with a:
        kernels[0][(1,)](src, dst, 16, 0, BLOCK=16)
    assert a.findings() == [] and torch.equal(src, dst)
    assert {x.name for x in a.allocations} == {"src (unregistered launch argument)",
                                               "dst (unregistered launch argument)"}


def test_audit_restores_the_interpreter(kernels):
    from triton.runtime import interpreter

    from kvfence.engine.audit import Audit

    before = interpreter.GridExecutor._init_args_hst
    with Audit():
        assert "create_masked_store" in vars(interpreter.interpreter_builder)
    assert "create_masked_store" not in vars(interpreter.interpreter_builder)
    assert interpreter.GridExecutor._init_args_hst is before


# -- through the harness -------------------------------------------------------------------------------
def long_case(kernel: str):
    from kvfence.contracts.draft.case import Batch, Case, Config

    return Case(Config(topk=1, num_steps=2, ctx=48, max_bs=2), Batch((48, 40), (2, 0), 5), kernel)


def test_a_whole_row_past_the_buffer_is_an_oob_write_and_the_reference_is_clean(make_session):
    from kvfence.engine.findings import Kind

    # Without a tail guard (--no-absorb) the row past the end leaves the allocation at its first element.
    findings = make_session(PAST_END, absorb=False).check(long_case(PAST_END))
    oob = [f for f in findings if f.kind is Kind.OOB_WRITE]
    assert oob and all(f.buffer == "kv_indices" and f.region == "past the allocation" for f in oob)
    assert all(p[0] == 1 for f in oob for p in f.programs)  # the last step did it
    assert "kv_indices[2," in oob[0].detail  # row 2 of a 2-row view
    assert Kind.MISSING_WRITE in {f.kind for f in findings}
    assert make_session("reference", absorb=False).check(long_case("reference")) == []
    # With kvfence's tail guard (one whole row) the same stores land in it: no store leaves.
    absorbed = make_session(PAST_END).check(long_case(PAST_END))
    assert Kind.OOB_WRITE not in {f.kind for f in absorbed}
    assert any(f.kind is Kind.GUARD_OVERWRITE and f.region == "tail" for f in absorbed)


def test_reads_outside_the_programs_own_pool_row_are_oob_reads(make_session):
    from kvfence.engine.findings import Kind

    findings = make_session(OTHER_ROW).check(long_case(OTHER_ROW))
    reads = [f for f in findings if f.kind is Kind.OOB_READ]
    assert reads and all(f.buffer == "req_to_token" and f.region.startswith("outside own row") for f in reads)
    assert {f.programs[0][1] for f in reads} == {0, 1}


def test_guard_writes_are_left_to_the_canaries(make_session):
    """The seed's sizing bug writes into our guards: GUARD_OVERWRITE, not OOB (guards are ours)."""
    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.engine.findings import Kind

    bad = Case(Config(topk=2, num_steps=2, ctx=8, max_bs=2, sizing="prefix"), Batch((8, 8), (0, 1)))
    kinds = {f.kind for f in make_session().check(bad)}
    assert Kind.GUARD_OVERWRITE in kinds and not kinds & {Kind.OOB_READ, Kind.OOB_WRITE}
    good = Case(Config(topk=2, num_steps=2, ctx=8, max_bs=2, sizing="safe"), Batch((8, 8), (0, 1)))
    assert make_session().check(good) == []


@pytest.mark.parametrize("mode,layout,page_size,topk", [("graph", "redzone", 1, 3), ("eager", "production", 4, 2),
                                                          ("graph", "production", 16, 1)])
def test_reference_is_clean_under_the_audit(make_session, mode, layout, page_size, topk):
    from kvfence.contracts.draft.case import Batch, Case, Config

    config = Config(topk=topk, num_steps=3, page_size=page_size, ctx=40, max_bs=3, mode=mode, layout=layout)
    session = make_session()
    assert session.audit is True  # on by default on the CPU
    for lens, rows in (((40, 1, 17), (3, 0, 1)), ((5,), (2,)), ((39, 38), (1, 2))):
        obs = session.observe(Case(config, Batch(lens, rows, 3)))
        assert obs.audit_findings == [] and obs.error is None


def test_audit_can_be_turned_off(make_session):
    from kvfence.engine.audit import resolve_audit
    from kvfence.engine.findings import Kind
    from kvfence.errors import BadInput

    kinds = {f.kind for f in make_session(OTHER_ROW, audit=False).check(long_case(OTHER_ROW))}
    assert Kind.VALUE_MISMATCH in kinds and Kind.OOB_READ not in kinds
    assert resolve_audit(None, "cuda") is False and resolve_audit(None, "cpu") is True
    with pytest.raises(BadInput):
        resolve_audit(True, "cuda")


def test_cli_fuzz_of_the_row_past_end_kernel_exits_1_without_a_crash(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--kernel", PAST_END, "--device", "cpu",
                           "--topk", "1", "--num-steps", "2", "--ctx", "48", "--max-bs", "2", "--max-examples", "20",
                           "--seed", "3", "--quiet", "--shrink-seconds", "5", "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISSING_WRITE" in proc.stdout


def test_cli_no_audit_flag_turns_it_off(tmp_path, monkeypatch):
    from kvfence import cli
    from kvfence.engine.supervisor import RemoteSession

    made = []  # the checking worker's plan carries the audit setting
    monkeypatch.setattr("kvfence.engine.supervisor.RemoteSession.__init__",
                        lambda self, *a, _init=RemoteSession.__init__, **kw: (_init(self, *a, **kw),
                                                                               made.append(self.plan.audit))[0])
    common = ["fuzz", "--device", "cpu", "--max-examples", "3", "--seed", "1", "--quiet", "--out", str(tmp_path / "o")]
    assert cli.main(common + ["--no-audit"]) == 0
    assert cli.main(common) == 0
    assert made == [False, None]
