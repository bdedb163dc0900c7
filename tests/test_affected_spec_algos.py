"""``kvfence affected`` for SGLang's DFlash family (``--speculative-algorithm DFLASH|DSPARK``, answered by the
request-row writer contract, docs/contract.md §10) and for vLLM launch commands (answered by the slot-mapping
contract, §11).

The flag readings run everywhere. The answers run the releases' own kernels, so they need the real wheels on disk
(a folder named by ``KVFENCE_TEST_WHEELS``: sglang 0.5.23, vllm 0.34.0) and are skipped without them, as
tests/test_req_to_token.py's are. Each answer is paired: a DFLASH deployment whose page-1 row lacks the step's
reservation is AFFECTED with the kind the kernel showed, the same at page 16 is not; so is EAGLE at page 1 with topk 4,
and not with topk 1; a vLLM command whose model
kvfence cannot see is UNKNOWN (exit 3), the same command with the model's config.json on this host is NOT
AFFECTED, and a declared narrow cache group is AFFECTED with the kernel's kind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.errors import BadInput
from kvfence.release.affected import parse_deployment
from kvfence.release.affected_vllm import human_int, is_vllm_command, parse_vllm

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
#: A folder of release wheels for the tests that read real releases (none: they skip).
WHEELS = Path(os.environ["KVFENCE_TEST_WHEELS"]) if os.environ.get("KVFENCE_TEST_WHEELS") else None
_AT_HAND = WHEELS is not None and WHEELS.is_dir()
SGLANG = sorted(WHEELS.glob("sglang-0.5.23-*.whl")) if _AT_HAND else []
VLLM = sorted(WHEELS.glob("vllm-0.34.0-*.whl")) if _AT_HAND else []
needs_sglang = pytest.mark.skipif(not SGLANG, reason="no sglang-0.5.23 wheel in $KVFENCE_TEST_WHEELS "
                                                     "(pip download sglang==0.5.23 --no-deps)")
needs_vllm = pytest.mark.skipif(not VLLM, reason="no vllm-0.34.0 wheel in $KVFENCE_TEST_WHEELS "
                                                 "(pip download vllm==0.34.0 --no-deps)")

#: SGLang's DFLASH launch as its docs give it (the draft's block, 16, said by its flag).
DFLASH = ["python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--speculative-algorithm", "DFLASH",
          "--speculative-draft-model-path", "z-lab/Qwen3-8B-DFlash-b16", "--speculative-dflash-block-size", "16",
          "--attention-backend", "flashinfer", "--context-length", "32768", "--mem-fraction-static", "0.8"]
#: A vLLM launch with an EAGLE-3 draft.
VLLM_CMD = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--block-size", "16", "--max-model-len", "4096",
            "--speculative-config", json.dumps({"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                                "num_speculative_tokens": 3}), "--tensor-parallel-size", "1"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf")
    return {"KVFENCE_WHEEL_DIR": str(WHEELS), "KVFENCE_CACHE": str(tmp_path_factory.mktemp("cache")),
            "KVFENCE_OFFLINE": "1", "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub")}


def _kvfence(*argv, env, cwd):
    full = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "kvfence", "affected", "--device", "cpu", "--out", str(cwd / "out"),
                           *argv], cwd=cwd, env=full, capture_output=True, text=True, timeout=600)


def _line(proc, contract: str) -> str:
    found = [x for x in proc.stdout.splitlines() if f": {contract} (" in x]
    assert len(found) == 1, proc.stdout + proc.stderr
    return found[0]


def _one_line_exit_2(proc, needle: str) -> None:
    errors = [x for x in proc.stderr.strip().splitlines() if x.startswith("kvfence: error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and needle in errors[0], proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


# -- the flags, read as SGLang and vLLM read them (no wheel) ----------------------------------------------------
def test_dflash_family_flags_are_read_as_sglang_resolves_them():
    dep = parse_deployment("0.5.23", DFLASH)
    assert (dep.algorithm, dep.draft_tokens, dep.num_steps, dep.topk, dep.ctx) == ("DFLASH", 16, 1, 1, 32768)
    assert dep.describe() == "sglang 0.5.23, flashinfer, CUDA graphs, DFLASH, 16 draft tokens, ctx 32768"
    # Without a block SGLang takes the draft checkpoint's, else 16: kvfence assumes 16 and says so.
    dep = parse_deployment("0.5.23", ["--attention-backend", "fa3", "--speculative-algorithm", "dflash",
                                      "--speculative-num-steps", "4"])
    assert dep.draft_tokens == 16 and dep.num_steps == 1
    assert any("16 draft tokens" in a for a in dep.assumed) and any("steps 1, not 4" in a for a in dep.assumed)
    # DSPARK: D = gamma + 1 (gamma 7 by default).
    assert parse_deployment("0.5.23", ["--attention-backend", "fa3", "--speculative-algorithm", "DSPARK",
                                       "--speculative-dspark-block-size", "16"]).draft_tokens == 17
    assert parse_deployment("0.5.23", ["--attention-backend", "fa3", "--speculative-algorithm",
                                       "DSPARK"]).draft_tokens == 8
    # NEXTN is EAGLE; EAGLE's defaults are unchanged.
    dep = parse_deployment("0.5.23", ["--attention-backend", "fa3", "--speculative-algorithm", "NEXTN"])
    assert (dep.algorithm, dep.num_steps, dep.topk, dep.draft_tokens) == ("EAGLE", 3, 1, 4)
    for flags, said in (
            (["--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8",
              "--speculative-dflash-block-size", "16"], "differ"),
            (["--speculative-algorithm", "DSPARK", "--speculative-num-draft-tokens", "8",
              "--speculative-dspark-block-size", "16"], "gamma"),
            (["--speculative-algorithm", "NGRAM"], "not NGRAM's worker"),
            (["--speculative-algorithm", "MEDUSA"], "is not one of SGLang's")):
        with pytest.raises(BadInput, match=said):
            parse_deployment("0.5.23", ["--attention-backend", "fa3", *flags])


def test_req_to_token_takes_sglangs_page_size():
    from kvfence.contracts.req_to_token.affected import page_of

    for backend, page, expected in (("fa3", None, 1), ("fa3", 16, 16), ("trtllm_mha", None, 64),
                                    ("trtllm_mha", 32, 32), ("flashmla", 1, 64), ("trtllm_mla", 16, 64)):
        flags = ["--attention-backend", backend, "--speculative-algorithm", "DFLASH"]
        dep = parse_deployment("0.5.23", flags + (["--page-size", str(page)] if page else []))
        assert page_of(dep)[0] == expected, (backend, page)


def test_vllm_commands_are_recognised_and_their_flags_read(tmp_path):
    assert is_vllm_command(VLLM_CMD) and is_vllm_command(["python", "-m", "vllm.entrypoints.openai.api_server"])
    assert not is_vllm_command(DFLASH)
    assert (human_int("4096", "f"), human_int("32k", "f"), human_int("32K", "f"), human_int("auto", "f")) == \
        (4096, 32000, 32768, None)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                                      "max_position_embeddings": 40960}))
    dep = parse_vllm("0.34.0", ["vllm", "serve", str(tmp_path), "--speculative-config.method", "ngram",
                                "--speculative-config.num_speculative_tokens=2", "-dcp", "2"])
    assert dep.architectures == ("Qwen3ForCausalLM",) and dep.max_model_len == 40960
    assert (dep.spec_method, dep.spec_tokens, dep.dcp, dep.block_size) == ("ngram", 2, 2, 16)
    assert any("max_position_embeddings" in a for a in dep.assumed) and any("--block-size 16" in a
                                                                            for a in dep.assumed)
    for argv, said in ((["vllm", "serve", "M", "--max-model-len", "4x"], "--max-model-len"),
                       (["vllm", "serve", "M", "--speculative-config", "{"], "not JSON"),
                       (["vllm", "serve", "M", "--blok-size", "16"], "did you mean --block-size"),
                       (["--max-model-len", "4096", "--foo"], "is not one kvfence reads")):
        with pytest.raises(BadInput, match=said):
            parse_vllm("0.34.0", argv)


# -- SGLang 0.5.23's own wheel and kernel -------------------------------------------------------------------------
@needs_sglang
def test_dflash_at_page_1_is_affected_with_what_the_kernel_showed_and_page_16_is_not(env, tmp_path):
    proc = _kvfence("--verbose", "0.5.23", *DFLASH, env=env, cwd=tmp_path)  # the full lines
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = _line(proc, "req-to-token")
    assert "req-to-token (DFLASH decode step, page 1): AFFECTED" in line and "severity: silent overwrite" in line
    # the arithmetic, stated as arithmetic: the row, the reservation, the positions past it
    assert "reserves 32 positions (2 * D)" in line and "its row holds ctx + 20 = 32788" in line
    assert "8 position(s) past the row (arithmetic: ROW_RESERVED_PAST_WIDTH)" in line
    # the condition: page size (SGLang's default), context, D; the kind the release's kernel showed
    assert "at page 1 (SGLang's default without --page-size" in line and "ctx 32768, D 16" in line
    assert "the release's kernel showed STRAY_WRITE;" in line and "--page-size 16" in line
    assert "draft decode kv_indices: NOT LAUNCHED" in proc.stdout  # DFLASH builds no multi-step draft backend
    case = line.rsplit("case: ", 1)[1].split(";")[0]
    again = subprocess.run([sys.executable, "-m", "kvfence", "repro", case, "--device", "cpu"], cwd=tmp_path,
                           env=dict(os.environ, TRITON_INTERPRET="1", **env), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 1 and "STRAY_WRITE" in again.stdout, again.stdout + again.stderr

    clean = _kvfence("--json", "0.5.23", *DFLASH, "--page-size", "16", env=env, cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    doc = json.loads(clean.stdout)
    assert doc["deployment"]["algorithm"] == "DFLASH" and doc["exit_code"] == 0
    rows = [v for v in doc["verdicts"] if v["contract"] == "req-to-token"]
    assert len(rows) == 1 and rows[0]["status"] == "not affected" and rows[0]["observed"] == []
    assert "its row holds ctx + 47" in rows[0]["condition"] and "fits its row (arithmetic)" in rows[0]["condition"]
    assert any("dflash_info_v2.py:" in e for e in rows[0]["evidence"])


@needs_sglang
def test_eagle_at_page_1_with_topk_4_is_affected_by_its_own_reading_and_topk_1_is_not(env, tmp_path):
    """A policy is not evidence: 0.5.23 gives EAGLE at page 1 with topk > 1 a reservation of 2 * max(steps * topk,
    D) against a row of ctx + 4 + D (eagle_utils.py:891-898 checks it only at page > 1), and its kernel spills."""
    flags = ["--attention-backend", "fa3", "--speculative-eagle-topk", "4", "--speculative-num-steps", "3",
             "--speculative-num-draft-tokens", "8"]
    proc = _kvfence("--verbose", "0.5.23", *flags, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = _line(proc, "req-to-token")
    assert "req-to-token (EAGLE decode step, page 1): AFFECTED" in line and "severity: silent overwrite" in line
    assert "reserves 24 positions (2 * max(steps * topk, D))" in line and "its row holds ctx + 12 = 4108" in line
    assert "8 position(s) past the row" in line and "the release's kernel showed STRAY_WRITE;" in line
    assert "--speculative-num-steps 2" in line and "--page-size 16" in line
    case = line.rsplit("case: ", 1)[1].split(";")[0]
    again = subprocess.run([sys.executable, "-m", "kvfence", "repro", case, "--device", "cpu"], cwd=tmp_path,
                           env=dict(os.environ, TRITON_INTERPRET="1", **env), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 1 and "STRAY_WRITE" in again.stdout, again.stdout + again.stderr
    doc = json.loads(_kvfence("--json", "0.5.23", *flags, env=env, cwd=tmp_path).stdout)
    [rows] = [v for v in doc["verdicts"] if v["contract"] == "req-to-token"]
    assert rows["basis"] == "the release's kernel showed it" and rows["observed"] == ["STRAY_WRITE"]
    assert any("eagle_utils.py:" in e for e in rows["evidence"])
    # topk 1 (SGLang's automatic choice): the reservation, 2 * 4, fits a row of ctx + 8.
    clean = _kvfence("--json", "0.5.23", "--attention-backend", "fa3", env=env, cwd=tmp_path)
    [rows] = [v for v in json.loads(clean.stdout)["verdicts"] if v["contract"] == "req-to-token"]
    assert rows["status"] == "not affected" and rows["basis"] == "the width arithmetic", rows
    assert "reserves 8 positions" in rows["condition"] and "its row holds ctx + 8" in rows["condition"]


# -- vLLM 0.34.0's own wheel and kernel ---------------------------------------------------------------------------
@pytest.mark.long  # vLLM's wheel (228 MB) is not fetched by .ci/run: tox -e long with KVFENCE_TEST_WHEELS holding it
@needs_vllm
def test_a_vllm_command_is_unknown_until_the_model_is_seen_then_clean(env, tmp_path):
    unknown = _kvfence("0.34.0", *VLLM_CMD, env=env, cwd=tmp_path)
    assert unknown.returncode == 3, unknown.stdout + unknown.stderr
    line = _line(unknown, "slot-mapping")
    assert "slot-mapping (_compute_slot_mappings_kernel, model runner V2): UNKNOWN" in line
    assert "the model's architecture is not known" in line and "--kv-cache-group" in line
    assert "were one there, the release's kernel showed VALUE_MISMATCH" in line
    # The same command, with the target's and the draft's config.json in the Hugging Face cache of this host.
    hub = Path(env["HF_HUB_CACHE"])
    for repo, arch in (("meta-llama/Llama-3.1-8B-Instruct", "LlamaForCausalLM"),
                       ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "LlamaForCausalLMEagle3")):
        snap = hub / f"models--{repo.replace('/', '--')}" / "snapshots" / "0123abc"
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(json.dumps({"architectures": [arch], "max_position_embeddings": 131072}))
    clean = _kvfence("0.34.0", *VLLM_CMD, env=env, cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    line = _line(clean, "slot-mapping")
    assert "): NOT AFFECTED;" in line and "LlamaForCausalLM (model_executor/models/llama.py" in line
    assert "so is the draft (LlamaForCausalLMEagle3" in line and "256 block(s) at block 16" in line
    assert "4 token(s) up to position 4095) mapped every token to its own row's blocks" in line
    # A cache group of the model's own, declared, whose row is narrower than max_model_len: the kernel's kind.
    narrow = _kvfence("--json", "--kv-cache-group", "4:1", "0.34.0", *VLLM_CMD, env=env, cwd=tmp_path)
    assert narrow.returncode == 1, narrow.stdout + narrow.stderr
    verdict = json.loads(narrow.stdout)["verdicts"][0]
    assert verdict["status"] == "affected" and verdict["observed"] == ["VALUE_MISMATCH"]
    assert "from position 4 on a token's block index passes its row" in verdict["condition"]
    assert "vllm#54296" in verdict["fixed"] and Path(verdict["case_file"]).is_file()
    _one_line_exit_2(_kvfence("0.34.0", *VLLM_CMD, "--max-model-len", "lots", env=env, cwd=tmp_path),
                     "--max-model-len 'lots'")
    _one_line_exit_2(_kvfence("--kv-cache-group", "4:1", "0.5.23", *DFLASH, env=env, cwd=tmp_path),
                     "--kv-cache-group describes a vLLM deployment")
