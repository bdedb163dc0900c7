"""``kvfence affected`` and ``upstream matrix --shipped`` for the contracts whose release knowledge lists sites
(kvfence.release.affected_sites, contract_shipped_matrix, contract_space), on fake wheels holding kvfence's own
kernel texts and toy backends spelled as SGLang spells them (no network).

Each test pairs a release whose answer names damage with one that must not: a verdict that names damage rests on
what the release's kernel was seen to do (a kernel that stores nothing is never "affected" and its matrix cell is
an ``error``); a class comes from the whole space and its witness; sites run as SGLang runs them (the attention
registry's classes, ``topk <= 1`` paths, eager sites of a graph deployment); an unknown release or a kernel
kvfence cannot run is UNKNOWN with its own exit code; a release of another kernel ABI is named apart in every
range the report quotes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_contracts import TRTLLM_BACKEND
from test_upstream import kvfence, make_wheel, one_line_exit_2

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
TRTLLM_KERNEL = (ROOT / "kernels" / "page_table" / "trtllm_mha_page_table.py").read_text()
FA3_KERNEL = (ROOT / "kernels" / "fa3_metadata" / "fa3_decode_metadata.py").read_text()
#: The TRTLLM-MHA kernel with its stores gone: it launches, and writes nothing.
NOOP_KERNEL = (TRTLLM_KERNEL
               .replace("    tl.store(page_table + out, (slot // PAGE_SIZE).to(tl.int32), mask=mask)\n", "")
               .replace("        tl.store(swa_page_table + out, (swa_slot // PAGE_SIZE).to(tl.int32), mask=mask)\n",
                        "        pass\n"))
CEIL = "(self.max_context_len + self.page_size - 1) // self.page_size"

_FA3 = '''
class FlashAttentionBackend(Base):
    def __init__(self, model_runner):
        self.max_context_len = model_runner.model_config.context_len
        self.page_size = model_runner.page_size
        self.max_num_pages = (self.max_context_len + self.page_size - 1) // self.page_size

    def _set_decode_page_metadata(self, metadata, seq_lens, seq_len_delta):
        normal_decode_set_metadata(metadata, self.max_num_pages, seq_lens, seq_len_delta)

    def _apply_cuda_graph_metadata(self, bs, seq_lens, forward_mode):
        if forward_mode.is_decode_or_idle():
            if self.topk <= 1:
                self._set_decode_page_metadata(self.decode_metadata, seq_lens, 0)
        elif forward_mode.is_target_verify():
            if self.topk <= 1:
                verify_delta = self.speculative_num_draft_tokens
                self._set_decode_page_metadata(self.verify_metadata, seq_lens, verify_delta)
'''
_REGISTRY = '''
ATTENTION_BACKENDS = {}


def register_attention_backend(name):
    def decorator(fn):
        ATTENTION_BACKENDS[name] = fn
        return fn
    return decorator


@register_attention_backend("trtllm_mha")
def create_trtllm_mha_backend(runner):
    from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend

    return TRTLLMHAAttnBackend(runner)


@register_attention_backend("fa3")
def create_flashattention_v3_backend(runner):
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

    return FlashAttentionBackend(runner)


@register_attention_backend("fa4")
def create_flashattention_v4_backend(runner):
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

    return FlashAttentionBackend(runner, fa_impl_ver=4)
'''
_RUNNER = '''
class CudaGraphRunner:
    def can_run(self, forward_batch):
        cuda_graph_bs = forward_batch.batch_size
        is_bs_supported = (
            self.backend.can_run(forward_batch)
            if self.disable_padding
            else cuda_graph_bs <= self.max_bs
        )
        return is_bs_supported
'''
_ADMISSION = {"sglang/srt/managers/tp_worker.py": "def get_worker_info(self):\n    max_req_len = min(\n"
              "        self.model_config.context_len - 1, kv_capacity - 1)\n",
              "sglang/srt/managers/scheduler.py": "def f(self):\n    return min(n, self.max_req_len - input_len - 1)\n"}


def release(folder: Path, version: str, *, width: str = CEIL, kernel: str = TRTLLM_KERNEL, fa3: str = FA3_KERNEL,
            extra=None) -> Path:
    files = dict(_ADMISSION)
    files.update({"sglang/kernels/ops/attention/trtllm_mha_page_table.py": kernel,
                  "sglang/kernels/ops/attention/metadata.py": fa3,
                  "sglang/srt/layers/attention/trtllm_mha_backend.py": TRTLLM_BACKEND.format(WIDTH=width),
                  "sglang/srt/layers/attention/flashattention_backend.py": _FA3,
                  "sglang/srt/layers/attention/attention_registry.py": _REGISTRY,
                  "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py": _RUNNER})
    files.update(extra or {})
    return make_wheel(folder, version, files)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("affected-site-wheels")
    release(folder, "9.8.1")                       # ceil(ctx / P): short by the draft tokens
    release(folder, "9.8.2", kernel=NOOP_KERNEL)   # the same width, a kernel that stores nothing
    release(folder, "9.8.3", width="(self.max_context_len + 16 + self.page_size - 1) // self.page_size",
            fa3=FA3_KERNEL.replace("_fused_decode_metadata_kernel", "_fused_metadata_kernel_general"))
    return folder


def affected(wheels, tmp_path, version, *flags, json_out=False):
    """The full lines (``--verbose``), or the JSON document."""
    extra = ["--json"] if json_out else ["--verbose"]
    return kvfence("affected", "--device", "cpu", "--out", str(tmp_path / "out"), *extra, version, *flags,
                   cache=tmp_path / "cache", wheel_dir=wheels)


def lines_of(proc, contract):
    return [line for line in proc.stdout.splitlines() if f": {contract} (" in line]


MHA = ("--attention-backend", "trtllm_mha", "--speculative-eagle-topk", "1", "--page-size", "16")


# -- 1. a verdict that names damage rests on an observed kind ------------------------------------------------------
def test_writing_past_the_row_is_seen_and_a_short_width_is_stated_as_arithmetic(wheels, tmp_path):
    """ctx 1024, page 16, 5 draft tokens: W = 64 is not a multiple of the kernel's 256-page block, so the page past
    the row lands in the next row (GUARD_OVERWRITE, silent overwrite); ctx 4096: W = 256 ends the launch at the
    row, so the kernel keeps to it and the line says the width formula is short, naming no kind as damage."""
    past = affected(wheels, tmp_path, "9.8.1", *MHA, "--speculative-num-steps", "4", "--context-length", "1024",
                    "--disable-cuda-graph")
    assert past.returncode == 1, past.stdout + past.stderr
    [line] = lines_of(past, "trtllm-mha-page-table")
    assert "AFFECTED" in line and "severity: silent overwrite" in line and "writes past its row" in line
    assert "the release's kernel showed GUARD_OVERWRITE;" in line
    assert "basis: the release's kernel showed it" in line
    assert "a request whose committed length reaches 1020" in line  # the condition, not a witness: 64*16 - 5 + 1
    short = affected(wheels, tmp_path, "9.8.1", *MHA, "--speculative-num-steps", "4", "--context-length", "4096",
                     "--disable-cuda-graph", json_out=True)
    assert short.returncode == 1, short.stdout + short.stderr
    doc = json.loads(short.stdout)
    [v] = [v for v in doc["verdicts"] if v["contract"] == "trtllm-mha-page-table"]
    assert v["status"] == "affected" and v["severity"] == "read past the table" and v["observed"] == []
    assert {"SIZING_VIOLATION", "TABLE_TRUNCATED"} <= set(v["arithmetic"])
    assert "width formula short" in v["condition"] and "(arithmetic)" in v["condition"]
    # AFFECTED with nothing observed: the basis says so, and names the reader kvfence does not run.
    assert v["basis"] == "the width arithmetic" and v["reader"].startswith("the attention kernel given the length")
    assert v["fixed_in"] == "9.8.3" and any(a.startswith("--speculative-num-steps 3") for a in v["avoid"])
    assert any("trtllm_mha_backend.py:" in e for e in v["evidence"])
    text = affected(wheels, tmp_path, "9.8.1", *MHA, "--speculative-num-steps", "4", "--context-length", "4096",
                    "--disable-cuda-graph")
    assert "showed TABLE_TRUNCATED" not in text.stdout and "showed SIZING_VIOLATION" not in text.stdout


def test_a_kernel_that_stores_nothing_is_never_affected_and_its_matrix_cell_is_an_error(wheels, tmp_path):
    """The same width with a no-op kernel: the arithmetic kinds alone name no damage, so the line is UNKNOWN
    (exit 3), and the matrix's cell is an ``error`` (exit 1), while the working kernel's cell is not."""
    noop = affected(wheels, tmp_path, "9.8.2", *MHA, "--speculative-num-steps", "4", "--context-length", "1024",
                    "--disable-cuda-graph")
    assert noop.returncode == 3, noop.stdout + noop.stderr
    [line] = lines_of(noop, "trtllm-mha-page-table")
    assert "UNKNOWN" in line and "does not confirm an overflow there" in line and "MISSING_WRITE" in line
    assert "severity" not in line and "AFFECTED" not in line
    for version, status in (("9.8.2", "error"), ("9.8.1", "writes past its row")):
        out = tmp_path / f"m{version}"
        proc = kvfence("upstream", "matrix", "--shipped", "--contracts", "trtllm-mha-page-table", "--versions",
                       version, "--device", "cpu", "--out", str(out), "--json", str(out) + ".json",
                       cache=tmp_path / "cache", wheel_dir=wheels)
        assert proc.returncode == 1, proc.stderr
        cell = json.loads(Path(str(out) + ".json").read_text())["rows"][0]["cells"][0]
        assert cell["status"] == status, cell
        if status == "error":
            assert "MISSING_WRITE" in cell["why"]
        else:  # both classes of the space, each confirmed by its witness on the kernel
            assert cell["classes"]["writes past its row"]["observed"] == ["GUARD_OVERWRITE"]
            assert cell["classes"]["width formula short"]["observed"] == []
            assert all(e["confirmed"] for e in cell["classes"].values())


def test_release_affected_reads_observed_ness_from_the_records_kinds():
    import kvfence.release.affected as affected_module
    from kvfence.engine import registry
    from kvfence.engine.findings import observed

    assert not hasattr(affected_module, "ARITHMETIC_KINDS")
    assert not observed(registry.get("trtllm-mha-page-table"), "TABLE_TRUNCATED")
    assert not observed(registry.get("fa3-decode-metadata"), "PUBLISHED_PAST_TABLE")
    assert observed(registry.get("fa3-decode-metadata"), "GUARD_OVERWRITE")


# -- 3. labels from the whole space -------------------------------------------------------------------------------
def _site(width_tree, delta_tree, page_sizes):
    return {"site": {"page_sizes": list(page_sizes)}, "width": {"tree": width_tree, "formula": "W"},
            "delta": {"tree": delta_tree, "formula": "d"}}


FLASHMLA_GRAPH = ["//", ["+", ["sym", "ctx"], ["sym", "page"]], ["sym", "page"]]
CEIL_TREE = ["//", ["+", ["sym", "ctx"], ["-", ["sym", "page"], ["int", 1]]], ["sym", "page"]]


def test_each_class_condition_holds_at_every_point_of_the_space():
    """FlashMLA's graph width (ctx + 64) // 64 with the admitted length ctx - 4: overflow iff ctx mod 64 + d >= 69
    at every point; it writes past the row unless ctx mod 4096 >= 4032 (W a multiple of the 64-page block), so
    ctx 1087 (d 6) writes past, 4095 only truncates, and 50 past a multiple of 64 overflows with 20 draft tokens."""
    from kvfence.release import contract_space as sp
    from kvfence.release import wheel_ast

    block = lambda page: 4096 // page  # noqa: E731
    space = sp.page_space(_site(FLASHMLA_GRAPH, ["sym", "d"], [64]), {"minus": 4}, block, 64, d_range=(1, 20))
    assert space["overflow"] == "ctx mod 64 + d >= 69"
    assert "ctx mod 4096 >= 4032" in space["classes"][sp.PAST]["condition"]
    assert space["classes"][sp.PAST]["witness"]["ctx"] == 1087 and space["classes"][sp.SHORT]["witness"]["ctx"] == 4095
    rng = np.random.default_rng(0)
    for ctx, d in zip(rng.integers(1024, 262145, 2000), rng.integers(1, 21, 2000)):
        ctx, d = int(ctx), int(d)
        width = wheel_ast.evaluate(FLASHMLA_GRAPH, {"ctx": ctx, "page": 64})
        need = -(-(ctx - 4 + d) // 64)
        assert (need > width) == (ctx % 64 + d >= 69)
        pt = sp.point(_site(FLASHMLA_GRAPH, ["sym", "d"], [64]), {"minus": 4}, block, 64, ctx, d)
        expect = sp.FITS if need <= width else sp.SHORT if width % 64 == 0 else sp.PAST
        assert pt["class"] == expect, (ctx, d)
    assert sp.point(_site(FLASHMLA_GRAPH, ["sym", "d"], [64]), {"minus": 4}, block, 64, 64 * 40 + 50, 20)["class"] \
        == sp.PAST
    ceil = sp.page_space(_site(CEIL_TREE, ["sym", "d"], [16]), {"minus": 4}, block, 16)
    assert ceil["overflow"] == "(ctx - 1) mod 16 + 1 + d >= 21"
    assert ceil["classes"][sp.SHORT]["witness"]["ctx"] == 4096 and ceil["classes"][sp.PAST]["witness"]["ctx"] == 1024
    clamped = sp.page_space(_site(CEIL_TREE, ["sym", "d"], [1]), {"minus": 4}, None, 1)
    assert clamped["overflow"] == "d >= 5" and set(clamped["classes"]) == {sp.SHORT, sp.FITS}


# -- 4. sites as SGLang runs them ------------------------------------------------------------------------------------
def test_topk_above_one_skips_the_verify_delta_path_and_fa4_builds_the_fa3_class(wheels, tmp_path):
    fa3 = ["--speculative-num-steps", "4", "--context-length", "4096"]
    topk4 = affected(wheels, tmp_path, "9.8.1", "--attention-backend", "fa3", "--speculative-eagle-topk", "4",
                     "--speculative-num-draft-tokens", "8", *fa3)
    assert topk4.returncode == 0, topk4.stdout + topk4.stderr
    [line] = lines_of(topk4, "fa3-decode-metadata")
    assert "NOT LAUNCHED" in line and "topk <= 1 only (sglang/srt/layers/attention/flashattention_backend.py:" in line
    for backend in ("fa3", "fa4"):
        one = affected(wheels, tmp_path, "9.8.1", "--attention-backend", backend, "--speculative-eagle-topk", "1",
                       *fa3)
        assert one.returncode == 1, one.stdout + one.stderr
        [line] = lines_of(one, "fa3-decode-metadata")
        assert "AFFECTED" in line and "severity: read past the table" in line and "showed" not in line
        assert (backend == "fa3") == ("which --attention-backend fa4 builds" not in line)


#: An FA3 backend as SGLang spelled it up to 0.5.15: torch fills the CUDA-graph target-verify table (no kernel of the
#: contract), ceil(ctx / P) pages wide, the published length seq_lens + D, the copy sliced to the row.
_FA3_TORCH = '''
class FlashAttentionBackend(Base):
    def __init__(self, model_runner):
        self.max_context_len = model_runner.model_config.context_len
        self.page_size = model_runner.page_size

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        max_num_pages = (self.max_context_len + self.page_size - 1) // self.page_size
        self.target_verify_metadata = {"page_table": torch.zeros(max_bs, max_num_pages)}

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, forward_mode):
        if forward_mode.is_target_verify():
            if self.topk <= 1:
                metadata = self.target_verify_metadata[bs]
                metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_num_draft_tokens)
                max_seq_pages = (metadata.max_seq_len_k + self.page_size - 1) // self.page_size
                page_indices = self.req_to_token[req_pool_indices[:, None], self.strided_indices[:max_seq_pages]]
                page_indices //= self.page_size
                metadata.page_table[:, :max_seq_pages].copy_(page_indices)
'''


def test_a_table_torch_fills_is_answered_by_its_width_arithmetic(tmp_path):
    """A release whose FA3 backend fills its target-verify table with torch has no kernel of the contract, yet the
    table is there: 5 draft tokens at ctx 4096 pass its 4096 pages (AFFECTED on the arithmetic, no kernel run, no
    NOT LAUNCHED line for the kernel's site); 4 fit (NOT AFFECTED)."""
    from kvfence.release.affected_verdict import BASIS_ARITHMETIC

    folder = tmp_path / "wheels"
    folder.mkdir()
    release(folder, "9.7.1", fa3="# no metadata kernel in this release\n",
            extra={"sglang/srt/layers/attention/flashattention_backend.py": _FA3_TORCH})
    flags = ["--attention-backend", "fa3", "--speculative-eagle-topk", "1", "--context-length", "4096"]
    over = affected(folder, tmp_path, "9.7.1", *flags, "--speculative-num-steps", "4", json_out=True)
    assert over.returncode == 1, over.stdout + over.stderr
    [v] = [x for x in json.loads(over.stdout)["verdicts"] if x["contract"] == "fa3-decode-metadata"]
    assert (v["status"], v["severity"], v["basis"]) == ("affected", "read past the table", BASIS_ARITHMETIC), v
    assert v["observed"] == [] and v["case_file"] == "" and "attention kernel" in v["reader"]
    assert "needs 4097 pages of 1 tokens" in v["condition"] and "its row holds 4096" in v["condition"]
    assert "torch fills the table, its copy sliced to the row (sglang/srt/layers/attention/flashattention_backend" \
        ".py:19)" in v["condition"]
    assert any("copy_(page_indices)" in e for e in v["evidence"])
    assert "--speculative-num-steps 3" in " ".join(v["avoid"])
    fits = affected(folder, tmp_path, "9.7.1", *flags, "--speculative-num-steps", "3")
    assert fits.returncode == 0, fits.stdout + fits.stderr
    [line] = lines_of(fits, "fa3-decode-metadata")
    assert ": NOT AFFECTED;" in line and "every admitted length fits" in line
    sizing = kvfence("upstream", "sizing", "9.7.1", "--contract", "fa3-decode-metadata", cache=tmp_path / "cache",
                     wheel_dir=folder)
    assert sizing.returncode == 0 and "fa3 graph target verify, torch-filled (FlashAttentionBackend):" in sizing.stdout
    assert "filled by torch, the copy sliced to the row: metadata.page_table[:, :max_seq_pages].copy_(page_indices) " \
           "(sglang/srt/layers/attention/flashattention_backend.py:19)" in sizing.stdout, sizing.stdout


#: kvfence's FA3 kernel spelled as 0.5.20 .. 0.5.22 spell theirs: ``_fused_metadata_kernel_general``, the page size's
#: log2 and ``use_swa`` as parameters, no page translations, no ZERO_TAIL.
_SWA, _CONST = "    full_to_swa_index_mapping, full_to_swa_mapping_stride_0,\n", "tl.constexpr,\n"
GENERAL_KERNEL = (FA3_KERNEL.replace("def _fused_decode_metadata_kernel(", "def _fused_metadata_kernel_general(")
                  .replace(_SWA + "    full_v2p, full_v2p_stride_0,\n    swa_v2p, swa_v2p_stride_0,\n",
                           _SWA.replace("index_mapping", "mapping"))
                  .replace(f"    PAGE_SIZE: {_CONST}    SEQ_LEN_DELTA: {_CONST}",
                           "".join(f"    {n}: {_CONST}" for n in ("page_size", "seq_len_delta", "use_swa", "SHIFT")))
                  .replace(f"    ZERO_TAIL: {_CONST}", "")
                  .replace("SEQ_LEN_DELTA", "seq_len_delta").replace("PAGE_SIZE", "page_size")
                  .replace("if not ZERO_TAIL and first >= live", "if first >= live")
                  .replace("store_mask = cols < max_seq_pages if ZERO_TAIL else live_mask", "store_mask = live_mask"))


def test_the_kernel_under_its_older_name_runs_through_kvfences_adapter(tmp_path):
    """A release defining the FA3 kernel as ``_fused_metadata_kernel_general`` with the signature 0.5.20 .. 0.5.22
    give it is run (the contract's ABI through kvfence's adapter): AFFECTED on the longest admitted launch, which
    its kernel kept to its row; the same name with a parameter more is not adapted: UNKNOWN, exit 3."""
    from kvfence.contracts.fa3_metadata.shipped import GENERAL_PARAMETERS
    from kvfence.release.wheels import parameters

    assert parameters(GENERAL_KERNEL, "_fused_metadata_kernel_general", "test") == list(GENERAL_PARAMETERS)
    folder = tmp_path / "wheels"
    folder.mkdir()
    release(folder, "9.7.2", fa3=GENERAL_KERNEL)
    release(folder, "9.7.3", fa3=GENERAL_KERNEL.replace(f"    SKIP_PAGE_TABLE: {_CONST}",
                                                        f"    SKIP_PAGE_TABLE: {_CONST}    EXTRA: {_CONST}"))
    flags = ["--attention-backend", "fa3", "--speculative-eagle-topk", "1", "--speculative-num-steps", "4",
             "--context-length", "4096"]
    ran = affected(folder, tmp_path, "9.7.2", *flags)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    [line] = lines_of(ran, "fa3-decode-metadata")
    assert ": AFFECTED;" in line and "the release's kernel kept to its row on the longest admitted launch" in line
    assert Path(line.rsplit("case: ", 1)[1].split(";")[0]).is_file()
    module = (tmp_path / "cache" / "contracts" / "sglang-9.7.2" / "fa3-decode-metadata.py").read_text()
    assert "def _fused_metadata_kernel_general(" in module and "# kvfence's adapter (not the release's code)" in module
    other = affected(folder, tmp_path, "9.7.3", *flags)
    assert other.returncode == 3, other.stdout + other.stderr
    [line] = lines_of(other, "fa3-decode-metadata")
    assert ": UNKNOWN;" in line and "launches _fused_metadata_kernel_general only with the 27 it adapts" in line


def test_a_graph_deployment_reaches_its_eager_sites(wheels, tmp_path):
    graphs = affected(wheels, tmp_path, "9.8.1", *MHA, "--speculative-num-steps", "4", "--context-length", "1024",
                      "--cuda-graph-max-bs", "4")
    assert graphs.returncode == 1, graphs.stdout + graphs.stderr
    [line] = lines_of(graphs, "trtllm-mha-page-table")
    assert "AFFECTED" in line and "reached by batches above the largest capture bucket (--cuda-graph-max-bs 4)" in line
    assert "decode_cuda_graph_runner.py:" in line


def test_an_eager_site_no_batch_reaches_is_not_launched(tmp_path):
    """With the release's argument code in the wheel (test_affected_launch.ARGS: 96 graph batches on an H100, a
    request limit of 40 for speculative decoding, capture sizes clamped to the request pool) no batch of a default
    graph deployment runs eagerly for its size: the eager site that overflows at ctx 1024 (AFFECTED under a graph
    of 4 batches, above) is NOT LAUNCHED, with the reason and exit 0; with 16 graph batches it is reached again."""
    from test_affected_launch import ARGS

    folder = tmp_path / "wheels"
    release(folder, "9.9.1", extra=ARGS)
    flags = (*MHA, "--speculative-num-steps", "4", "--context-length", "1024")
    default = affected(folder, tmp_path, "9.9.1", *flags, json_out=True)
    assert default.returncode == 0, default.stdout + default.stderr
    doc = json.loads(default.stdout)
    [v] = [v for v in doc["verdicts"] if v["contract"] == "trtllm-mha-page-table"]
    assert v["status"] == "not launched" and "no batch exceeds the largest capture bucket" in v["condition"]
    assert "base_cuda_graph_runner.py:3" in v["condition"]
    assert v["basis"] == "the release's code does not run this path here"
    assert (doc["deployment"]["graph_max_bs"], doc["deployment"]["max_running"]) == (96, 40)
    assert any(a.startswith("--cuda-graph-max-bs-decode 96 (SGLang's default on H100, assumed: give --gpu")
               for a in doc["deployment"]["assumed"])
    reached = affected(folder, tmp_path, "9.9.1", *flags, "--cuda-graph-max-bs-decode", "16")
    assert reached.returncode == 1, reached.stdout + reached.stderr
    [line] = lines_of(reached, "trtllm-mha-page-table")
    assert "AFFECTED" in line and "(--cuda-graph-max-bs-decode 16), which SGLang runs eagerly" in line


def test_an_unknown_release_and_a_kernel_under_another_name_are_unknown_with_their_own_exit_code(wheels, tmp_path):
    unknown = affected(wheels, tmp_path, "9.8.99", *MHA)
    assert unknown.returncode == 3 and "UNKNOWN" in unknown.stdout and "not a release kvfence finds" in unknown.stdout
    renamed = affected(wheels, tmp_path, "9.8.3", "--attention-backend", "fa3", "--speculative-num-steps", "4",
                       "--context-length", "4096")
    assert renamed.returncode == 3, renamed.stdout + renamed.stderr
    [line] = lines_of(renamed, "fa3-decode-metadata")
    assert "UNKNOWN" in line and "the width formula is short (arithmetic)" in line and "cannot run it" in line
    helptext = kvfence("affected", "--help", cache=tmp_path / "cache")
    assert re.search(r"^  3  no line is AFFECTED and one is UNKNOWN", helptext.stdout, re.M), helptext.stdout


def test_a_long_run_reports_progress(wheels, tmp_path, monkeypatch):
    from kvfence.release import affected_verdict as a

    said = []
    monkeypatch.setattr(a.Progress, "QUIET_S", 0.0)
    with a.progress(said.append):
        a.step("running the kernel")
    assert said[0].startswith("kvfence affected: running the kernel (")
    assert said[-1].startswith("kvfence affected: done")


# -- 5. a release of another kernel ABI is named apart in every range quoted ----------------------------------------
def test_a_release_of_another_abi_breaks_the_quoted_ranges(wheels, tmp_path):
    folder = tmp_path / "abi"
    for version, kernel in (("9.7.1", TRTLLM_KERNEL), ("9.7.2", TRTLLM_KERNEL.replace("    HAS_SWA: tl.constexpr,\n",
                                                                                       "")), ("9.7.3", TRTLLM_KERNEL)):
        release(folder, version, kernel=kernel)
    proc = kvfence("upstream", "matrix", "--shipped", "--contracts", "trtllm-mha-page-table", "--versions",
                   "9.7.1..9.7.3", "--device", "cpu", "--out", str(tmp_path / "m"), cache=tmp_path / "cache",
                   wheel_dir=folder)
    assert proc.returncode == 1, proc.stderr
    assert "9.7.1 .. 9.7.3" not in proc.stdout and "| 9.7.1 |" in proc.stdout and "| 9.7.3 |" in proc.stdout
    assert "No kernel in 9.7.2:" in proc.stdout and "does not know this signature" in proc.stdout


# -- 2. one cache for every command ---------------------------------------------------------------------------------
def test_a_corrupt_contract_entry_is_one_line_exit_2(wheels, tmp_path):
    ok = affected(wheels, tmp_path, "9.8.1", *MHA, "--speculative-num-steps", "4", "--context-length", "1024",
                  "--disable-cuda-graph")
    assert ok.returncode == 1, ok.stderr
    module = tmp_path / "cache" / "contracts" / "sglang-9.8.1" / "trtllm-mha-page-table.py"
    module.write_text(module.read_text() + "\nimport os\n")
    for proc in (affected(wheels, tmp_path, "9.8.1", *MHA, "--disable-cuda-graph"),
                 kvfence("fuzz", "--contract", "trtllm-mha-page-table", "--kernel", "sglang==9.8.1", "--device", "cpu",
                         "--max-examples", "3", "--out", str(tmp_path / "f"), cache=tmp_path / "cache",
                         wheel_dir=wheels)):
        one_line_exit_2(proc, "is corrupt", "trtllm-mha-page-table.py")


def _one_cache_wheels(folder: Path) -> Path:
    """A release with the draft kernel and its toy backends (tests/test_shipped.py) beside the table contracts'."""
    from test_affected import SAFE
    from test_shipped import BACKENDS, RUNNER, TOY_RUNNER, backend
    from test_upstream import FAKE_MODULE, MODULE

    toy = "import torch\n\n" + "\n\n".join([backend("TritonMultiStepDraftBackend", "max_bs * self.max_context_len"),
                                            backend("FlashInferMultiStepDraftBackend", SAFE)])
    release(folder, "9.6.1", extra={MODULE: FAKE_MODULE, RUNNER: TOY_RUNNER, BACKENDS: toy})
    return folder


def _commands(out: Path):
    v = "9.6.1"
    draft = ["--attention-backend", "triton", "--speculative-eagle-topk", "2", "--speculative-num-steps", "2",
             "--speculative-num-draft-tokens", "4", "--context-length", "32", "--cuda-graph-max-bs", "2"]
    return {
        "fetch": ["upstream", "fetch", v],
        "sizing": ["upstream", "sizing", v],
        "sizing-contract": ["upstream", "sizing", v, "--contract", "trtllm-mha-page-table"],
        "matrix-shipped": ["upstream", "matrix", "--shipped", "--versions", v, "--device", "cpu", "--out",
                           str(out / "ms")],
        "matrix-shipped-contract": ["upstream", "matrix", "--shipped", "--contracts", "trtllm-mha-page-table",
                                    "--versions", v, "--device", "cpu", "--out", str(out / "mc")],
        "fuzz": ["fuzz", "--kernel", f"sglang=={v}", "--device", "cpu", "--max-examples", "4", "--seed", "1",
                 "--quiet", "--out", str(out / "f")],
        "fuzz-contract": ["fuzz", "--contract", "trtllm-mha-page-table", "--kernel", f"sglang=={v}", "--device", "cpu",
                          "--max-examples", "4", "--seed", "1", "--quiet", "--out", str(out / "fc")],
        "affected-draft": ["affected", "--device", "cpu", "--out", str(out / "a"), v, *draft],
        "affected-table": ["affected", "--device", "cpu", "--out", str(out / "b"), v, *MHA, "--speculative-num-steps",
                           "4", "--context-length", "1024", "--disable-cuda-graph"],
    }


def _said(proc, out: Path) -> tuple:
    """A command's exit code and what it printed, without its own folders, times, rates and case-file names."""
    text = (proc.stdout + "\n" + "\n".join(line for line in proc.stderr.splitlines() if "error" in line.lower()
                                           or "Traceback" in line)).replace(str(out), "OUT")
    text = re.sub(r"[ -]{2,}", " ", re.sub(r"[0-9a-f]{12}\.json", "CASE.json", text))  # a table's padding follows OUT
    # Numbers with a fraction are times and rates; fuzz's table of them and its cache's hit count differ by run.
    text = "\n".join(line for line in re.sub(r"\d+\.\d+", "N", text).splitlines()
                     if not re.match(r"(cached cases|verified cases|.*/s\b|.*seconds)", line))
    if proc.args[3] == "fuzz":  # a fuzz run's table of counts and times follows the machine's load: its verdict
        text = "\n".join(line for line in text.splitlines() if re.match(r"(no findings|FAIL|.*error)", line))
    return proc.returncode, text


@pytest.mark.long  # about 50 s on two cores: every command twice on one cache
def test_every_command_on_one_cache_in_both_orders_answers_as_on_a_fresh_cache(tmp_path):
    """The draft kernel's entry and each table contract's are apart: every command answers the same on a fresh
    cache, and after every other command in either order; nothing is called corrupt, nothing traces back."""
    wheels = _one_cache_wheels(tmp_path / "wheels")
    names = list(_commands(tmp_path))
    fresh = {}
    for name in names:
        out = tmp_path / f"fresh-{name}"
        fresh[name] = _said(kvfence(*_commands(out)[name], cache=out / "cache", wheel_dir=wheels), out)
        assert fresh[name][0] in (0, 1), (name, fresh[name])
    for label, order in (("forward", names), ("backward", names[::-1])):
        out = tmp_path / label
        for name in order:
            said = _said(kvfence(*_commands(out)[name], cache=out / "cache", wheel_dir=wheels), out)
            assert said == fresh[name], (label, name, said, fresh[name])
    assert fresh["affected-table"][0] == 1 and fresh["affected-draft"][0] == 1
    # A corrupt entry is one line, exit 2, whichever command meets it: the draft kernel's, a table contract's.
    out = tmp_path / "forward"
    (out / "cache" / "sglang-9.6.1" / "manifest.json").write_text("{")
    for name in ("affected-draft", "affected-table", "fuzz"):
        one_line_exit_2(kvfence(*_commands(out)[name], cache=out / "cache", wheel_dir=wheels), "is corrupt")


# -- 3. the sentences the docs quote are the matrix's ---------------------------------------------------------------
def test_the_docs_quote_the_shipped_matrix_as_generated():
    """docs/shipped-sizing.md's generated block is ``sentences`` of the results file word for word, BENCHMARKS
    quotes every sentence of a site that overflows, README some, each word for word; no stale label is left (a
    FlashMLA range spanning the releases of another kernel ABI, "53-63 past a multiple of 64")."""
    from kvfence.release import contract_shipped_matrix as csm

    doc = json.loads((ROOT / "benchmarks" / "results" / "cpu_contract_shipped_matrix.json").read_text())
    said = csm.sentences(doc)
    flat = lambda text: " ".join(text.split())  # noqa: E731
    guide = (ROOT / "docs" / "shipped-sizing.md").read_text()
    block = guide.split("<!-- shipped-sentences: begin -->")[1].split("<!-- shipped-sentences: end -->")[0]
    assert [flat(s) for s in block.split("\n- ")] == [""] + [flat(s) for s in said] or \
        flat(block) == flat("".join(f"- {s}\n" for s in said))
    overflowing = [s for s in said if not s.startswith("On ") and ("WRITES PAST" in s or "WIDTH FORMULA" in s)]
    assert overflowing
    bench = flat((ROOT / "BENCHMARKS.md").read_text())
    assert all(flat(s) in bench for s in overflowing)
    # README quotes some: each bullet that names a contract's site is one of the generated sentences.
    readme = (ROOT / "README.md").read_text()
    quoted = [flat(q) for q in re.findall(r"^- ([a-z0-9-]+(?:-page-table|-metadata), [^\n]+(?:\n  [^\n]+)*)",
                                          readme, re.M)]
    assert quoted and all(q in [flat(s) for s in said] for q in quoted), quoted
    for name in ("README.md", "BENCHMARKS.md", "docs/shipped-sizing.md"):
        text = flat((ROOT / name).read_text())
        assert "53-63" not in text and "0.4.6.post5..0.5.12.post1" not in text, name
    versions = doc["versions"]
    refused = [r["version"] for r in doc["rows"] if "cells" not in r and r["contract"] == "flashmla-page-table"]
    assert "0.5.3.post3" in refused
    for s in said:  # no quoted range of FlashMLA spans a release without its kernel
        if s.startswith("flashmla-page-table"):
            for a, b in re.findall(r"(\d[\w.]*)\.\.(\d[\w.]*?)(?=[,;.]?(?:\s|$))", s):
                inside = versions[versions.index(a):versions.index(b) + 1]
                assert not set(inside) & set(refused), (s, a, b)


# -- the real wheels (optional: KVFENCE_TEST_WHEELS holding sglang-0.5.23's wheel; skipped without it) ------------
def test_real_0_5_23_answers_as_its_wheel_says(tmp_path):
    import os

    folder = os.environ.get("KVFENCE_TEST_WHEELS")
    if not folder or not list(Path(folder).glob("sglang-0.5.23-*.whl")):
        pytest.skip("no sglang 0.5.23 wheel in $KVFENCE_TEST_WHEELS (pip download sglang==0.5.23 --no-deps)")
    wheels = Path(folder)
    steps = ("--speculative-num-steps", "5", "--speculative-eagle-topk", "1")  # SGLang refuses steps without topk
    cases = [(["--attention-backend", "flashmla", *steps, "--context-length", "1087"], 1,
              "flashmla-page-table", "severity: silent overwrite"),
             (["--attention-backend", "flashmla", *steps, "--context-length", "4095"], 1,
              "flashmla-page-table", "severity: read past the table"),
             (["--attention-backend", "fa3", "--speculative-eagle-topk", "4", "--speculative-num-steps", "3",
               "--speculative-num-draft-tokens", "8"], 1, "fa3-decode-metadata", "flashattention_backend.py:3171"),
             # A default graph deployment on an H100 captures every batch size up to its 48 requests: its eager
             # site is not reached by size (the release's memory default, request limit and pool clamp).
             (["--attention-backend", "trtllm_mha", *steps], 0, "trtllm-mha-page-table",
              "base_cuda_graph_runner.py:78")]
    for flags, code, contract, needle in cases:
        proc = affected(wheels, tmp_path, "0.5.23", *flags)
        assert proc.returncode == code, proc.stdout + proc.stderr
        assert any(needle in line for line in lines_of(proc, contract)), proc.stdout
    refused = affected(wheels, tmp_path, "0.5.23", "--attention-backend", "fa3", "--speculative-num-steps", "5")
    one_line_exit_2(refused, "sglang/srt/arg_groups/speculative_hook.py:1274", "TypeError")


def test_real_0_5_10_torch_table_and_0_5_22_renamed_kernel_are_answered(tmp_path):
    """0.5.10's FA3 target-verify table is filled by torch, ceil(ctx / P) pages, the published length seq_lens + D
    (flashattention_backend.py:1189, 1325-1327, 1848-1850, 1878): AFFECTED on the arithmetic at 6 draft tokens;
    0.5.22's kernel, _fused_metadata_kernel_general, runs through the adapter: AFFECTED, kept to its row."""
    import os

    folder = os.environ.get("KVFENCE_TEST_WHEELS")
    have = {v: bool(folder and list(Path(folder).glob(f"sglang-{v}-*.whl"))) for v in ("0.5.10", "0.5.22")}
    if not all(have.values()):
        pytest.skip("no sglang 0.5.10 and 0.5.22 wheels in $KVFENCE_TEST_WHEELS (pip download sglang==V --no-deps)")
    flags = ["--attention-backend", "fa3", "--speculative-eagle-topk", "1", "--speculative-num-steps", "5",
             "--speculative-num-draft-tokens", "6"]
    torch_filled = affected(Path(folder), tmp_path, "0.5.10", *flags, json_out=True)
    assert torch_filled.returncode == 1, torch_filled.stdout + torch_filled.stderr
    [v] = [x for x in json.loads(torch_filled.stdout)["verdicts"] if x["contract"] == "fa3-decode-metadata"]
    assert (v["status"], v["basis"], v["observed"], v["case_file"]) == ("affected", "the width arithmetic", [], "")
    assert "flashattention_backend.py:1878" in v["condition"] and "needs 4097 pages" in v["condition"]
    assert any(e.startswith("sglang/srt/layers/attention/flashattention_backend.py:1189: width") for e in v["evidence"])
    renamed = affected(Path(folder), tmp_path, "0.5.22", *flags)
    assert renamed.returncode == 1, renamed.stdout + renamed.stderr
    [line] = lines_of(renamed, "fa3-decode-metadata")
    assert ": AFFECTED;" in line and "the release's kernel kept to its row on the longest admitted launch" in line
