"""The request-row writer contract's decode-context-parallel axis (docs/contract.md §10, "Decode context
parallelism"): under ``--dcp-size N`` SGLang's KV allocator pages at ``page_size * N`` and the decode step aligns
its end to that page, while SGLang 0.5.18 sized the row's headroom at the scheduled page (sglang#35424, fixed in
0.5.19). The case model by hand (no kernel), a release built here in SGLang's shape (kvfence's kernel text, the
sizing written for this test: never SGLang's) whose headroom takes the scheduled page spills under DCP, shrunk to
a minimal case ``repro`` replays, and the fixed headroom holds it; SGLang 0.5.18 and 0.5.19 themselves where their
wheels are in ``$KVFENCE_TEST_WHEELS``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_req_to_token import _kvfence, _release

from kvfence.contracts.req_to_token.case import ReqToTokenCase
from kvfence.contracts.req_to_token.record import REQ_TO_TOKEN
from kvfence.engine.launch import bind
from kvfence.errors import BadInput

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

WHEELS = Path(os.environ["KVFENCE_TEST_WHEELS"]) if os.environ.get("KVFENCE_TEST_WHEELS") else None
REAL = {v: sorted(WHEELS.glob(f"sglang-{v}-*.whl")) if WHEELS is not None and WHEELS.is_dir() else []
        for v in ("0.5.18", "0.5.19")}


def test_the_step_end_aligns_to_the_allocator_page_and_old_case_files_load_at_dcp_1():
    """Page 16 under DCP 2, reserve 8, EAGLE steps 3 topk 1 D 4: a request committed at 1 (ctx 5, the wall
    ctx - 4) ends at ceil(9 / 32) * 32 = 32; the 0.5.18-shape headroom max(4 + D, 2 * alloc_len + P - 1) = 23 at
    the scheduled page gives a row of 28, the fix's (at the allocator's page 32) 5 + 39 = 44; without DCP the same
    request ends at 16 and every sizing holds it."""
    case = ReqToTokenCase(5, 16, 4, 3, 1, 8, (1,), (1,), (0,), 1, 0, 2).validate()
    assert case.alloc_page == 32 and case.end(0) == 32
    widths = {name: REQ_TO_TOKEN.sizings[name](case, "graph") for name in REQ_TO_TOKEN.sizings}
    assert widths["scheduled-page"] == 28 and widths["pr33581"] == 44
    assert widths["safe-scheduled-page"] == 5 + 8 + 15 and widths["safe"] == 5 + 8 + 31
    found = REQ_TO_TOKEN.findings_before_launch(bind(REQ_TO_TOKEN, case, "scheduled-page"))
    assert [(f.start, f.stop) for f in found] == [(28, 32)] and "DCP 2: allocator page 32" in found[0].detail
    assert not REQ_TO_TOKEN.findings_before_launch(bind(REQ_TO_TOKEN, case, "pr33581"))
    no_dcp = ReqToTokenCase(5, 16, 4, 3, 1, 8, (1,), (1,), (0,), 1).validate()
    assert no_dcp.end(0) == 16 and not REQ_TO_TOKEN.findings_before_launch(bind(REQ_TO_TOKEN, no_dcp,
                                                                                "scheduled-page"))
    old = REQ_TO_TOKEN.to_json(no_dcp)
    del old["dcp_size"]  # a case file written before the DCP axis
    assert REQ_TO_TOKEN.from_json(old) == no_dcp and REQ_TO_TOKEN.from_json(old).dcp_size == 1
    for bad, said in ((0, "dcp_size must be in"), ("2", "dcp_size must be an integer")):
        with pytest.raises(BadInput, match=said):
            REQ_TO_TOKEN.from_json(dict(old, dcp_size=bad))


@pytest.fixture
def dcp_env(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    # 0.5.18's shape: the headroom at the scheduled page; 0.5.19's: at page_size * attn_dcp_size
    _release(wheels, "9.9.3", "True", "get_schedule().page_size", allocator=True)
    _release(wheels, "9.9.4", "True", "get_schedule().page_size * get_parallel().attn_dcp_size", allocator=True)
    return {"KVFENCE_WHEEL_DIR": str(wheels), "KVFENCE_CACHE": str(tmp_path / "cache"), "KVFENCE_OFFLINE": "1"}


def _sizing_text(version: str, monkeypatch, env) -> str:
    """What ``kvfence upstream sizing VERSION --contract req-to-token`` prints (in this process: the command's
    wiring is test_req_to_token's)."""
    from kvfence.contracts.req_to_token.shipped import RowsTool

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return "\n".join(RowsTool().sizing_lines(version, lambda message: None))


def test_a_release_whose_headroom_takes_the_scheduled_page_spills_under_dcp_and_the_fix_holds_it(tmp_path, dcp_env,
                                                                                                 monkeypatch):
    """The release's allocator page is read from its allocator builder (not assumed): its sizing table shows the
    DCP row spilling with the line; the fuzz under its sizing at --dcp-size 2 --page-size 16 finds the writer
    past the row, shrinks to one request at the wall, and the fixed release's rows hold the same case."""
    sizing = _sizing_text("9.9.3", monkeypatch, dcp_env)
    line = next(x for x in sizing.splitlines() if x.startswith("  EAGLE  page 16  DCP 2 "))
    assert "row ctx + 23, reserve 8 past committed -> 10 position(s) past the row at the wall" in line, line
    assert "allocator page 32: sglang/srt/mem_cache/kv_cache_configurator.py:" in sizing
    fixed = _sizing_text("9.9.4", monkeypatch, dcp_env)
    assert "  EAGLE  page 16  DCP 2 steps 3, topk 1, D 4: row ctx + 39, reserve 8 past committed -> fits" \
        in fixed, fixed
    run = _kvfence("fuzz", "--contract", "req-to-token", "--kernel", "sglang==9.9.3", "--sizing",
                   "sglang==9.9.3:EAGLE", "--dcp-size", "2", "--page-size", "16", "--device", "cpu", "--seed", "0",
                   "--out", str(tmp_path / "out"), cwd=tmp_path, env=dcp_env)
    assert run.returncode == 1 and "GUARD_OVERWRITE" in run.stdout, run.stdout + run.stderr
    path = next(x for x in run.stdout.splitlines() if " repro " in x and x.endswith(".json")).split()[-1]
    case = json.loads(Path(path).read_text())["case"]["case"]
    assert (case["page_size"], case["dcp_size"], len(case["committed"])) == (16, 2, 1)
    assert case["committed"] == [case["ctx"] - 4]  # the admitted wall
    again = _kvfence("repro", path, "--device", "cpu", cwd=tmp_path, env=dcp_env)
    assert again.returncode == 1 and "GUARD_OVERWRITE" in again.stdout, again.stdout + again.stderr
    held = _kvfence("repro", path, "--device", "cpu", "--sizing", "sglang==9.9.4:EAGLE", cwd=tmp_path, env=dcp_env)
    assert held.returncode == 0 and "PASS: no findings" in held.stdout, held.stdout + held.stderr


# -- SGLang 0.5.18 and 0.5.19 themselves, where their wheels are on disk --------------------------------------------
@pytest.mark.skipif(not (REAL["0.5.18"] and REAL["0.5.19"]),
                    reason="no sglang-0.5.18 and 0.5.19 wheels in $KVFENCE_TEST_WHEELS (pip download --no-deps)")
def test_sglang_0_5_18_rows_spill_under_dcp_on_its_own_writer_and_0_5_19_holds_them(tmp_path, monkeypatch):
    """CI cost: about 40 s on 2 cores (two wheel reads, one fuzz to its first failure, one repro, one witness)."""
    env = {"KVFENCE_WHEEL_DIR": str(WHEELS), "KVFENCE_CACHE": str(tmp_path / "cache"), "KVFENCE_OFFLINE": "1"}
    old = _sizing_text("0.5.18", monkeypatch, env)
    assert ("  EAGLE  page 16  DCP 2 steps 3, topk 1, D 4: row ctx + 23, reserve 8 past committed -> 10 position(s)"
            " past the row at the wall") in old
    assert "allocator page 32: sglang/srt/mem_cache/kv_cache_configurator.py:1715" in old
    assert "row: sglang/srt/mem_cache/allocation_sizing.py:16,17,21,22,23,24,28,29,30,47,59,60,61,65,66" in old
    new = _sizing_text("0.5.19", monkeypatch, env)
    assert "  EAGLE  page 16  DCP 2 steps 3, topk 1, D 4: row ctx + 39, reserve 8 past committed -> fits" \
        in new and "allocator page 32: sglang/srt/mem_cache/kv_cache_configurator.py:1941" in new
    run = _kvfence("fuzz", "--contract", "req-to-token", "--kernel", "sglang==0.5.18", "--sizing",
                   "sglang==0.5.18:EAGLE", "--dcp-size", "2", "--page-size", "16", "--device", "cpu", "--seed", "0",
                   "--out", str(tmp_path / "out"), cwd=tmp_path, env=env)
    assert run.returncode == 1 and "GUARD_OVERWRITE" in run.stdout, run.stdout + run.stderr
    path = next(x for x in run.stdout.splitlines() if " repro " in x and x.endswith(".json")).split()[-1]
    assert json.loads(Path(path).read_text())["case"]["case"]["dcp_size"] == 2
    held = _kvfence("repro", path, "--device", "cpu", "--sizing", "sglang==0.5.19:EAGLE", cwd=tmp_path, env=env)
    assert held.returncode == 0 and "PASS: no findings" in held.stdout, held.stdout + held.stderr
    _affected_answers_the_dcp_spill(tmp_path, monkeypatch, env)


@pytest.mark.long  # a fuzz to its budget on the real wheel
@pytest.mark.skipif(not REAL["0.5.19"], reason="no sglang-0.5.19 wheel in $KVFENCE_TEST_WHEELS")
def test_sglang_0_5_19_writer_is_clean_under_its_own_rows_at_dcp(tmp_path):
    env = {"KVFENCE_WHEEL_DIR": str(WHEELS), "KVFENCE_CACHE": str(tmp_path / "cache"), "KVFENCE_OFFLINE": "1"}
    clean = _kvfence("fuzz", "--contract", "req-to-token", "--kernel", "sglang==0.5.19", "--sizing",
                     "sglang==0.5.19:EAGLE", "--dcp-size", "2", "--page-size", "16", "--device", "cpu", "--seed", "0",
                     "--out", str(tmp_path / "clean"), cwd=tmp_path, env=env)
    assert clean.returncode == 0 and "no findings" in clean.stdout, clean.stdout + clean.stderr


def _affected_answers_the_dcp_spill(tmp_path, monkeypatch, env):
    """``affected`` reads --dcp-size from a launch command: AFFECTED on 0.5.18 (the release's kernel seen writing
    past the row), fixed in 0.5.19, avoided with --dcp-size 1; the same deployment without DCP gets no line."""
    from kvfence.contracts.req_to_token.affected import rows_verdicts
    from kvfence.release.affected import parse_deployment

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    launch = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8", "--dcp-size", "2",
              "--attention-backend", "flashinfer", "--page-size", "16", "--speculative-algorithm", "EAGLE",
              "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
              "--context-length", "32000"]
    dep = parse_deployment("0.5.18", launch)
    assert dep.dcp_size == 2
    (v,) = rows_verdicts(dep, ["0.5.18", "0.5.19"], tmp_path / "aff", "cpu")
    assert v.status == "affected" and v.fixed_in == "0.5.19", v.to_json()
    assert "aligned to the allocator's page 16 x DCP 2 = 32; its row holds ctx + 23 = 32023: 9 position(s)" \
        in v.condition and "STRAY_WRITE" in v.seen
    assert any(a.startswith("--dcp-size 1") for a in v.avoid), v.avoid
    without = parse_deployment("0.5.18", [t for t in launch if t not in ("--dcp-size", "2")])
    # Without DCP the same EAGLE deployment gets the row line too (every EAGLE deployment does), and it fits.
    [fits] = rows_verdicts(without, ["0.5.18", "0.5.19"], tmp_path / "aff1", "cpu")
    assert without.dcp_size == 1 and fits.status == "not affected", fits.to_json()


def test_affected_reads_sglangs_dcp_flag_under_both_its_names():
    """SGLang's ``dcp_size`` field is the flag ``--dcp-size`` with the alias ``--decode-context-parallel-size``
    (0.5.18: ``server_args.py:1018-1025``, the name from ``arg_utils.py:208-210``); a bad size is one line."""
    from kvfence.release.affected import parse_deployment

    base = ["--attention-backend", "flashinfer", "--page-size", "16"]
    assert parse_deployment("0.5.18", base).dcp_size == 1
    assert parse_deployment("0.5.18", base + ["--dcp-size", "4"]).dcp_size == 4
    assert parse_deployment("0.5.18", base + ["--decode-context-parallel-size=2"]).dcp_size == 2
    assert "DCP 4" in parse_deployment("0.5.18", base + ["--dcp-size", "4"]).describe()
    with pytest.raises(BadInput, match=r"--dcp-size 0: must be 1\.\.64"):
        parse_deployment("0.5.18", base + ["--dcp-size", "0"])
