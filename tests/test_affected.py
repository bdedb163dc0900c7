"""``kvfence affected VERSION SGLANG-FLAGS``: one line per contract in SGLang's words (kvfence.release.affected).

Two synthetic releases (tests/test_shipped.py's toy backends, named as SGLang names its draft backends):
in 0.0.7 the Triton backend's CUDA-graph buffer lacks the topk factor (the seed's bug) and FlashInfer's
has room for the draft tokens; 0.0.8 fixes Triton. The answer must come from the flags alone, name the
condition, the severity, the release that fixes it and a case file that replays, and refuse what it cannot
read. The page-table contracts' answers are tests/test_affected_sites.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_shipped import BACKENDS, GOOD_CHECK, RUNNER, TOY_RUNNER, TOY_UTILS, UTILS, backend
from test_upstream import FAKE_MODULE, MODULE, kvfence, make_wheel, one_line_exit_2

from kvfence.errors import BadInput
from kvfence.release.affected import parse_deployment

SAFE = "max_bs * self.topk * (self.max_context_len + self.speculative_num_steps)"


def _release(folder: Path, version: str, triton_graph: str) -> Path:
    text = "import torch\n\n" + "\n\n".join([
        backend("TritonMultiStepDraftBackend", triton_graph),
        backend("FlashInferMultiStepDraftBackend", SAFE),
    ])
    return make_wheel(folder, version, {MODULE: FAKE_MODULE, RUNNER: TOY_RUNNER, BACKENDS: text})


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("affected-wheels")
    _release(folder, "0.0.7", "max_bs * self.max_context_len")  # no topk factor
    _release(folder, "0.0.8", SAFE)
    return folder


def test_the_seeds_bug_is_one_line_with_its_condition_fix_and_case(wheels, tmp_path, device):
    cache, out = tmp_path / "cache", tmp_path / "out"
    flags = ["0.0.7", "--attention-backend", "triton", "--speculative-eagle-topk", "2", "--speculative-num-steps", "2",
             "--speculative-num-draft-tokens", "4", "--context-length", "32", "--cuda-graph-max-bs", "2"]
    proc = kvfence("affected", "--device", device, "--out", str(out), "--verbose", *flags, cache=cache,
                   wheel_dir=wheels)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    # One contract the backend launches: its graph mode, and its eager mode, which a graph deployment reaches
    # with a batch above the capture buckets.
    assert len(lines) == 2, proc.stdout
    line, eager = lines
    assert line.startswith("sglang 0.0.7, triton, CUDA graphs, topk 2, 2 steps, 4 draft tokens, ctx 32")
    assert "(TritonMultiStepDraftBackend, graph): AFFECTED" in line and "writes past its row" in line
    assert "fixed in 0.0.8" in line and "severity: silent overwrite" in line
    assert "the release's kernel showed GUARD_OVERWRITE" in line  # damage the kernel showed, nothing arithmetic
    assert "SIZING_VIOLATION" not in line
    # The condition is the least total length that overflows, a formula in the context length; not a witness.
    assert "a launch whose lengths add up to at least ctx" in line and "each on average" not in line
    assert "(TritonMultiStepDraftBackend, eager): NOT AFFECTED" in eager
    assert "reached by batches above the largest capture bucket (--cuda-graph-max-bs 2)" in eager
    case = line.split("case: ")[1].split(";")[0]
    assert Path(case).is_file()
    replay = kvfence("repro", case, "--device", device, cache=cache, wheel_dir=wheels)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "basis: the release's kernel showed it" in line
    # The graph line's own eager mode is clean: --disable-cuda-graph avoids it, before the fixing release.
    assert "avoided with --disable-cuda-graph (its eager path fits)" in line
    # The default output: a header, then one short line per verdict (status, site, severity, basis, the shortest
    # avoidance, the case file), the rest under --verbose.
    short = kvfence("affected", "--device", device, "--out", str(out), *flags, cache=cache, wheel_dir=wheels)
    assert short.returncode == 1, short.stdout + short.stderr
    head, graph, eager = short.stdout.strip().splitlines()
    assert head.startswith("sglang 0.0.7, triton, CUDA graphs, topk 2") and "assumed: --verbose lists them" in head
    assert graph.startswith("AFFECTED draft decode kv_indices (TritonMultiStepDraftBackend, graph): silent overwrite;")
    assert "; basis: the release's kernel showed it; avoid: --disable-cuda-graph or sglang 0.0.8+; case: " in graph
    assert len(graph.split("; case: ")[0]) <= 200 and "condition" not in graph and "GUARD_OVERWRITE" not in graph
    assert eager == ("NOT AFFECTED draft decode kv_indices (TritonMultiStepDraftBackend, eager); basis: the width "
                     "arithmetic")


def test_a_sound_backend_and_the_fixed_release_are_not_affected(wheels, tmp_path, device):
    cache = tmp_path / "cache"
    for version, name in (("0.0.7", "flashinfer"), ("0.0.8", "triton")):
        proc = kvfence("affected", "--device", device, "--out", str(tmp_path / "out"), version,
                       "--attention-backend", name, "--speculative-eagle-topk", "2", "--speculative-num-steps", "2",
                       "--speculative-num-draft-tokens", "4", "--context-length", "32", "--cuda-graph-max-bs", "2",
                       cache=cache, wheel_dir=wheels)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "NOT AFFECTED" in proc.stdout and "AFFECTED;" not in proc.stdout.replace("NOT AFFECTED", "")


def test_a_host_check_that_fires_gives_its_condition_case_and_avoidance(tmp_path, device):
    """The fix's host check (test_shipped.GOOD_CHECK) rejects a launch with a request within the steps of the context
    length: the line is AFFECTED (server down) on the check's arithmetic, says the least launch that fires it, writes
    the case file (``repro`` replays the check) and names fewer steps, which no admitted request then reaches."""
    checked = backend("FlashInferMultiStepDraftBackend", "row_width(max_bs, self.topk, self.max_context_len)",
                      check=GOOD_CHECK)
    text = ("import torch\nfrom sglang.srt.speculative.toy_utils import row_width, used_len, used_len_wrong, fits, "
            "sneaky\n\n" + checked)
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "0.0.9", {MODULE: FAKE_MODULE, RUNNER: TOY_RUNNER, UTILS: TOY_UTILS, BACKENDS: text})
    cache = tmp_path / "cache"
    proc = kvfence("affected", "--device", device, "--out", str(tmp_path / "out"), "--json", "0.0.9",
                   "--attention-backend", "flashinfer", "--speculative-eagle-topk", "2", "--speculative-num-steps", "4",
                   "--speculative-num-draft-tokens", "4", "--context-length", "32", "--disable-cuda-graph",
                   cache=cache, wheel_dir=wheels)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [v] = [v for v in json.loads(proc.stdout)["verdicts"] if v["contract"] == "draft decode kv_indices"]
    assert v["status"] == "affected" and v["severity"] == "server down" and v["basis"] == "the width arithmetic"
    assert "rejected by the release's host check" in v["condition"] and "at least ctx" in v["condition"]
    assert v["avoid"] and v["avoid"][0].startswith("--speculative-num-steps 3") and "host check" in v["reader"]
    assert Path(v["case_file"]).is_file()
    replay = kvfence("repro", v["case_file"], "--device", device, cache=cache, wheel_dir=wheels)
    assert "HOST_CHECK_FIRED" in replay.stdout, replay.stdout + replay.stderr


def test_a_launch_command_is_read_and_an_unknown_flag_refused(wheels, tmp_path, device):
    cache = tmp_path / "cache"
    launch = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--speculative-algorithm", "EAGLE",
              "--attention-backend", "triton", "--speculative-eagle-topk", "2", "--speculative-num-steps", "2",
              "--speculative-num-draft-tokens", "4", "--context-length", "32", "--cuda-graph-max-bs", "2"]
    proc = kvfence("affected", "--device", device, "--out", str(tmp_path / "o"), "0.0.7", *launch, cache=cache,
                   wheel_dir=wheels)
    assert proc.returncode == 1 and "AFFECTED" in proc.stdout, proc.stdout + proc.stderr
    one_line_exit_2(kvfence("affected", "0.0.7", "--attention-backend", "triton", "--speculative-eagle-top", "2",
                            cache=cache, wheel_dir=wheels), "--speculative-eagle-top", "did you mean")
    one_line_exit_2(kvfence("affected", "0.0.7", "--attention-backend", "triton", "--mem-fraction-static", "0.8",
                            cache=cache, wheel_dir=wheels), "--mem-fraction-static", "not one kvfence reads")
    one_line_exit_2(kvfence("affected", "0.0.7", "--speculative-eagle-topk", "2", cache=cache, wheel_dir=wheels),
                    "--attention-backend")
    one_line_exit_2(kvfence("affected", "0.0.7", "--attention-backend", "nope", cache=cache, wheel_dir=wheels),
                    "'nope' is not one of SGLang's")
    one_line_exit_2(kvfence("affected", "0.0.7", "--attention-backend", "flashinfr", cache=cache, wheel_dir=wheels),
                    "'flashinfr' is not one of SGLang's (did you mean flashinfer?")


def test_sglangs_defaults_are_applied_and_said():
    dep = parse_deployment("0.5.23", ["--attention-backend", "triton"])
    assert (dep.num_steps, dep.topk, dep.draft_tokens, dep.graphs) == (3, 1, 4, True)
    assert any("automatic choice" in a for a in dep.assumed) and any("--context-length" in a for a in dep.assumed)
    # topk 1: SGLang sets the draft tokens to steps + 1 whatever the flag says.
    dep = parse_deployment("0.5.23", ["--attention-backend", "fa3", "--speculative-eagle-topk", "1",
                                      "--speculative-num-steps", "5", "--speculative-num-draft-tokens", "8",
                                      "--disable-cuda-graph", "--context-length=8192"])
    assert (dep.draft_tokens, dep.mode, dep.ctx) == (6, "eager", 8192)
    with pytest.raises(BadInput, match="--speculative-num-draft-tokens"):
        parse_deployment("0.5.23", ["--attention-backend", "triton", "--speculative-eagle-topk", "4"])
    # In a launch command other flags are SGLang's business, but a misspelling of one kvfence reads is not
    # taken for a default, and a backend of its own for the draft is refused, not silently ignored.
    launch = ["python", "-m", "sglang.launch_server", "--attention-backend", "triton", "--cuda-graph-bs", "1", "2"]
    assert parse_deployment("0.5.23", launch).backend == "triton"
    with pytest.raises(BadInput, match="did you mean --context-length"):
        parse_deployment("0.5.23", launch + ["--context-len", "8192"])
    with pytest.raises(BadInput, match="split backends"):
        parse_deployment("0.5.23", launch + ["--speculative-draft-attention-backend", "fa3"])
    with pytest.raises(BadInput, match="context-length"):
        parse_deployment("0.5.23", ["--attention-backend", "triton", "--context-length", "2"])
