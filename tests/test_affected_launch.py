"""``kvfence affected`` reads the launch as the release's own argument code resolves it (kvfence.release.launch_args,
kvfence.release.launch_resolve): SGLang's refusals at startup, its automatic choice, the draft tokens it sets, the
CUDA-graph batch default it computes from the GPU and TP, the request limit it sets for speculative decoding, and
FA4's page on SM100; nothing of the wheel is imported or run.

A synthetic release (``ARGS``: an EAGLE handler, its automatic choice, a GPU-memory table, a request pool clamp, an
FA4 rule, two MLA architectures; numbers unlike any real release's, so an answer that does not come from the wheel
fails) is read in process; the real releases' lines are checked against ``$KVFENCE_TEST_WHEELS`` where it is set.
"""

from __future__ import annotations

import ast
import functools
import json
import os
from pathlib import Path

import pytest
from test_upstream import kvfence, make_wheel, one_line_exit_2

from kvfence.errors import BadInput
from kvfence.release import launch_args, launch_resolve
from kvfence.release.affected import parse_deployment
from kvfence.release.wheel_ast import Wheel

HOOK = "sglang/srt/arg_groups/speculative_hook.py"
HOOK_TEXT = '''
def _handle_eagle_family(server_args):
    cfg = resolving_view(server_args)
    if cfg.max_running_requests is None:
        declare_resolution(server_args, "_handle_eagle_family", max_running_requests=40)
    if not cfg.speculative_adaptive and cfg.speculative_num_steps is None:
        assert (
            cfg.speculative_eagle_topk is None
            and cfg.speculative_num_draft_tokens is None
        )
        steps, topk, draft_tokens = _auto_choose_speculative_params(server_args, "x")
    if "trtllm_mha" in attention_backends_of(resolved_view(server_args)):
        if cfg.speculative_eagle_topk > 1:
            raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
    if _should_auto_enable_hip_rejection_sampling(is_hip=get_platform().is_hip):
        pass
    if (
        cfg.speculative_eagle_topk == 1
        and cfg.speculative_num_draft_tokens != cfg.speculative_num_steps + 1
    ):
        declare_resolution(server_args, "_handle_eagle_family",
                           speculative_num_draft_tokens=cfg.speculative_num_steps + 1)
    _PAGE_TREE = ("flashinfer", "fa3", "triton")
    view = resolved_view(server_args)
    if (
        cfg.speculative_eagle_topk > 1
        and view.page_size > 1
        and view.attention_backend not in _PAGE_TREE
    ):
        raise ValueError("topk > 1 with page_size > 1 is only supported on some backends")


def _auto_choose_speculative_params(server_args, model_arch):
    cfg = resolving_view(server_args)
    if cfg.speculative_algorithm == "STANDALONE":
        return (3, 1, 4)
    if model_arch in ["LlamaForCausalLM"]:
        return (6, 3, 9)
    else:
        return (2, 1, 3)
'''
MEMORY = "sglang/srt/arg_groups/memory_hook.py"
MEMORY_TEXT = '''
def handle_gpu_memory_settings(server_args):
    gpu_mem = get_device_memory_capacity(cfg.device)
    decode_cuda_graph_config = cfg.cuda_graph_config.decode
    if gpu_mem is not None:
        if gpu_mem < 60 * 1024:
            if decode_cuda_graph_config.max_bs is None:
                decode_cuda_graph_config.max_bs = 24
        elif gpu_mem < 100 * 1024:
            if decode_cuda_graph_config.max_bs is None:
                if cfg.tp_size < 4:
                    decode_cuda_graph_config.max_bs = 96
                else:
                    decode_cuda_graph_config.max_bs = 192
        else:
            if decode_cuda_graph_config.max_bs is None:
                decode_cuda_graph_config.max_bs = 384
    else:
        if decode_cuda_graph_config.max_bs is None:
            decode_cuda_graph_config.max_bs = 100
'''
FIELDS = ("sglang/srt/arg_groups/fields/exec_.py",
          "class ExecFields:\n    cuda_graph_max_bs_decode: Optional[int] = None\n")
RUNNER = ("sglang/srt/model_executor/runner/base_cuda_graph_runner.py",
          "def get_batch_sizes_to_capture(model_runner):\n    capture_bs = list(bs)\n"
          "    num_max_requests = model_runner.req_to_token_pool.size\n    return capture_bs\n")
OVERRIDES = ("sglang/srt/arg_groups/overrides.py", '''
def _fa4_page_constraint(view):
    if (
        view.attention_backend == "fa4"
        and not use_mla_backend(view)
        and get_platform().is_sm100
        and (view.speculative_eagle_topk or 0) <= 1
    ):
        return {"page_size": 128}
    return {}
''')
MODEL_CONFIG = ("sglang/srt/configs/model_config.py", '''
class ModelConfig:
    def _derive(self):
        if "DeepseekV3ForCausalLM" in self.hf_config.architectures:
            self.attention_arch = AttentionArch.MLA
        elif "MiniCPM3ForCausalLM" in self.hf_config.architectures:
            self.attention_arch = AttentionArch.MLA
        else:
            self.attention_arch = AttentionArch.MHA
''')
ARGS = {HOOK: HOOK_TEXT, MEMORY: MEMORY_TEXT, FIELDS[0]: FIELDS[1], RUNNER[0]: RUNNER[1], OVERRIDES[0]: OVERRIDES[1],
        MODEL_CONFIG[0]: MODEL_CONFIG[1]}


def line_of(text: str, needle: str) -> int:
    """The first line of ``text`` holding ``needle`` (the whole line, stripped, when ``needle`` starts with =)."""
    if needle.startswith("="):
        return next(i for i, s in enumerate(text.splitlines(), 1) if s.strip() == needle[1:])
    return next(i for i, s in enumerate(text.splitlines(), 1) if needle in s)


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> dict:
    wheel = make_wheel(tmp_path_factory.mktemp("launch-wheel"), "9.7.1", ARGS)
    return launch_args.read(Wheel(wheel), "9.7.1")


def resolved(facts, *flags, gpu=None, version="9.7.1"):
    return launch_resolve.resolve(parse_deployment(version, ["--attention-backend", *flags]), facts, gpu)


def test_the_release_refuses_what_its_argument_code_refuses(facts):
    """Steps without topk: the handler compares ``topk > 1`` on None (TypeError): the first such comparison the
    launch reaches, by backend; topk without steps: the assertion; trtllm_mha with topk 4: its ValueError."""
    assert facts["unread"] == []
    with pytest.raises(BadInput, match=rf"{HOOK}:{line_of(HOOK_TEXT, '=cfg.speculative_eagle_topk > 1')}:.*"
                                       "TypeError: give --speculative-eagle-topk"):
        resolved(facts, "fa3", "--speculative-num-steps", "5")
    with pytest.raises(BadInput, match=rf"{HOOK}:{line_of(HOOK_TEXT, 'if cfg.speculative_eagle_topk > 1:')}:"):
        resolved(facts, "trtllm_mha", "--speculative-num-steps", "5")
    with pytest.raises(BadInput, match=rf"{HOOK}:{line_of(HOOK_TEXT, 'assert (')}: assert"):
        resolved(facts, "fa3", "--speculative-eagle-topk", "1")
    with pytest.raises(BadInput, match="ValueError: trtllm_mha backend only supports topk = 1"):
        resolved(facts, "trtllm_mha", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                 "--speculative-num-draft-tokens", "8")
    with pytest.raises(BadInput, match="ValueError: topk > 1 with page_size > 1"):
        resolved(facts, "flashmla", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                 "--speculative-num-draft-tokens", "8", "--page-size", "64")
    # The same launch on a backend the check allows, or with every flag given, starts.
    ok = resolved(facts, "fa3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                  "--speculative-num-draft-tokens", "8", "--page-size", "64")
    assert (ok.num_steps, ok.topk, ok.draft_tokens, ok.page_size) == (3, 4, 8, 64)


def test_the_release_chooses_the_flags_and_the_draft_tokens(facts, tmp_path):
    auto = resolved(facts, "triton")
    assert (auto.num_steps, auto.topk, auto.draft_tokens) == (2, 1, 3)  # the wheel's default, not kvfence's (3, 1, 4)
    assert any(f"{HOOK}:{line_of(HOOK_TEXT, 'return (2, 1, 3)')}" in a and "automatic choice" in a
               for a in auto.assumed)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    llama = resolved(facts, "triton", "--model-path", str(tmp_path))
    assert (llama.num_steps, llama.topk, llama.draft_tokens, llama.model_kind) == (6, 3, 9, "MHA")
    one = resolved(facts, "fa3", "--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
                   "--speculative-num-draft-tokens", "8")
    assert one.draft_tokens == 6 and any("6, not 8" in a and "steps + 1" in a for a in one.assumed)


@pytest.mark.parametrize("gpu, tp, cap", [("H100", 1, 96), ("H100", 4, 192), ("H200", 1, 384), ("B200", 1, 384),
                                          ("A100-40GB", 1, 24), (None, 1, 96)])
def test_the_graph_batch_default_is_the_releases_for_the_gpu_and_tp(facts, gpu, tp, cap):
    dep = resolved(facts, "fa3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--tp-size",
                   str(tp), gpu=gpu)
    assert dep.graph_cap == cap and dep.max_running == 40 and dep.max_bs == min(cap, 40)
    [said] = [a for a in dep.assumed if a.startswith("--cuda-graph-max-bs-decode")]
    assert f"--cuda-graph-max-bs-decode {cap} (SGLang's default on {gpu or 'H100'}" in said
    assert ("assumed: give --gpu" in said) == (gpu is None)
    # Every batch size up to the request limit is captured: no batch runs eagerly for its size.
    assert bool(dep.eager_note) == (cap >= 40) and (RUNNER[0] in dep.eager_note or cap < 40)


def test_graph_flags_are_the_releases_and_no_graph_value_is_assumed_without_graphs(facts):
    with pytest.raises(BadInput, match="it has no --cuda-graph-max-bs .its flag is --cuda-graph-max-bs-decode"):
        resolved(facts, "fa3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                 "--cuda-graph-max-bs", "8")
    given = resolved(facts, "fa3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                     "--cuda-graph-max-bs-decode", "16")
    assert (given.graph_cap, given.max_bs, given.eager_note) == (16, 16, "")  # batches 17..40 run eagerly
    eager = resolved(facts, "fa3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                     "--disable-cuda-graph")
    assert not any("cuda-graph" in a or "--gpu" in a for a in eager.assumed), eager.assumed
    assert eager.graph_cap is None and eager.max_bs == 40


def test_fa4_runs_with_page_128_on_sm100_for_mha_models(facts, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    flags = ("fa4", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--model-path", str(tmp_path))
    assert resolved(facts, *flags, gpu="B200").page_size == 128
    assert resolved(facts, *flags, gpu="H100").page_size is None
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    mla = resolved(facts, *flags, gpu="B200")
    assert mla.page_size is None and mla.model_kind == "MLA"
    unsaid = resolved(facts, "fa4", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1")
    assert unsaid.page_size is None and any("forces page 128 for fa4" in a for a in unsaid.assumed)


def test_a_release_whose_argument_code_is_not_read_says_so(tmp_path):
    facts = launch_args.read(Wheel(make_wheel(tmp_path, "9.7.2", {"sglang/srt/server_args.py": "x = 1\n"})), "9.7.2")
    dep = resolved(facts, "fa3", "--speculative-num-steps", "5", version="9.7.2")
    assert dep.topk == 1 and any("--speculative-eagle-topk 1 (not given" in a for a in dep.assumed)
    assert any("handler is not read" in a for a in dep.assumed)
    assert any(a.startswith("--cuda-graph-max-bs 8 (kvfence's") for a in dep.assumed)


def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "9.7.1", ARGS)
    proc = kvfence("affected", "9.7.1", "--attention-backend", "fa3", "--speculative-num-steps", "5",
                   cache=tmp_path / "cache", wheel_dir=wheels)
    one_line_exit_2(proc, "sglang 9.7.1 refuses this launch at startup", f"{HOOK}:", "--speculative-eagle-topk")
    one_line_exit_2(kvfence("affected", "--gpu", "V100", "9.7.1", "--attention-backend", "fa3",
                            cache=tmp_path / "cache", wheel_dir=wheels), "--gpu 'V100'")


# -- the real releases ------------------------------------------------------------------------------------------
REAL = os.environ.get("KVFENCE_TEST_WHEELS")


@functools.lru_cache(maxsize=None)
def real_facts(version: str) -> dict:
    if not REAL:
        pytest.skip("set $KVFENCE_TEST_WHEELS to a folder of sglang wheels")
    found = sorted(Path(REAL).glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.skip(f"no sglang-{version} wheel in $KVFENCE_TEST_WHEELS (pip download sglang=={version} --no-deps)")
    return launch_args.read(Wheel(found[0]), version)


@pytest.mark.parametrize("version, backend, where", [
    ("0.5.10", "fa3", "sglang/srt/server_args.py:3084"),
    ("0.5.10", "trtllm_mha", "sglang/srt/server_args.py:3069"),
    ("0.5.20", "trtllm_mha", "sglang/srt/arg_groups/speculative_hook.py:918"),
    ("0.5.20", "fa3", "sglang/srt/arg_groups/speculative_hook.py:988"),
    ("0.5.22", "trtllm_mha", "sglang/srt/arg_groups/speculative_hook.py:1086"),
    ("0.5.23", "trtllm_mha", "sglang/srt/arg_groups/speculative_hook.py:1177"),
    ("0.5.23", "fa3", "sglang/srt/arg_groups/speculative_hook.py:1274"),
])
def test_real_releases_refuse_steps_without_topk_at_their_own_line(version, backend, where):
    with pytest.raises(BadInput, match=f"{where}: `(self|cfg).speculative_eagle_topk > 1` with "
                                       "--speculative-eagle-topk unset"):
        resolved(real_facts(version), backend, "--speculative-num-steps", "5", version=version)


@pytest.mark.parametrize("version, flag, guard, cap", [
    ("0.5.10", "--cuda-graph-max-bs", "sglang/srt/server_args.py:3053", 256),
    ("0.5.20", "--cuda-graph-max-bs-decode", "sglang/srt/arg_groups/speculative_hook.py:900", 256),
    ("0.5.23", "--cuda-graph-max-bs-decode", "sglang/srt/arg_groups/speculative_hook.py:1159", 256),
])
def test_real_releases_choose_and_compute_as_their_code_does(version, flag, guard, cap):
    facts = real_facts(version)
    assert facts["eagle"]["auto"]["guard_source"] == guard and facts["graph"]["flag"] == flag
    auto = resolved(facts, "triton", version=version)
    assert (auto.num_steps, auto.topk, auto.draft_tokens) == (3, 1, 4)
    assert (auto.graph_cap, auto.max_running, auto.max_bs) == (cap, 48, 48) and auto.eager_note
    assert resolved(facts, "triton", gpu="B200", version=version).graph_cap == 512


def test_a_model_config_is_read_as_bounded_json(tmp_path):
    """``--model-path``'s config.json is JSON data: one line, exit 2, for one nested past the parser or too large."""
    (tmp_path / "config.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(BadInput, match="not a readable config.json"):
        parse_deployment("9.7.1", ["--attention-backend", "fa3", "--model-path", str(tmp_path)])
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["X"], "pad": "x" * (5 << 20)}))
    with pytest.raises(BadInput, match="larger than"):
        parse_deployment("9.7.1", ["--attention-backend", "fa3", "--model-path", str(tmp_path)])
    (tmp_path / "config.json").write_text(json.dumps({"architectures": "LlamaForCausalLM"}))
    with pytest.raises(BadInput, match="no architectures list"):
        parse_deployment("9.7.1", ["--attention-backend", "fa3", "--model-path", str(tmp_path)])


def test_a_hostile_test_is_unknown_and_a_raise_message_one_line(facts):
    """A recorded test nested past the evaluator's depth is UNKNOWN (skipped), never a traceback; a message the
    release raises is printed on one line."""
    ev = launch_resolve.LaunchEval({"speculative_eagle_topk": 1}, {})
    assert ev("not " * 5000 + "x.speculative_eagle_topk") is launch_resolve.UNKNOWN
    assert ev("x.speculative_eagle_topk == 1 and x.page_size > 1") is launch_resolve.UNKNOWN  # page not said
    assert ev("x.speculative_eagle_topk == 1 or y.anything") is True  # Python's short circuit
    wheel_text = HOOK_TEXT.replace('"trtllm_mha backend only supports topk = 1 for speculative decoding."',
                                   '"line one\\nline two"')
    assert "line one line two" in launch_args.raise_text(ast.parse(wheel_text).body[0].body[3].body[0].body)
