"""Bad input through the real CLI: one line naming the problem, exit 2, no traceback, nothing overwritten."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import launch_of
from kvfence.engine import casefile

ROOT = Path(__file__).resolve().parent.parent
SIZINGS = ROOT / "tests" / "targets" / "sizings.py"
GOOD = casefile.document(launch_of(Case(Config(topk=2, num_steps=1, ctx=4, max_bs=2, sizing="prefix"),
                                         Batch((3,), (1,), 5))), [], device="cpu", source="test")


def mutated(path_in_doc, value):
    doc = json.loads(json.dumps(GOOD))
    *parents, last = path_in_doc
    target = doc
    for key in parents:
        target = target[key]
    target[last] = value
    return json.dumps(doc)


# (id, case-file text or None, argv with {case} / {dir} / {out} / {json} placeholders, what stderr must name)
INPUTS = [
    ("truncated", json.dumps(GOOD)[:80], ["repro", "{case}"], "malformed JSON"),
    ("garbage", "{not json", ["repro", "{case}"], "malformed JSON"),
    ("empty", "", ["repro", "{case}"], "file is empty"),
    ("not-utf8", b"\xff\xfe\x00bad", ["repro", "{case}"], "not UTF-8"),
    ("nan", json.dumps(GOOD).replace('"token_seed": 5', '"token_seed": NaN'), ["repro", "{case}"], "NaN"),
    ("top-level-list", "[1, 2]", ["repro", "{case}"], "top level must be a JSON object"),
    ("no-marker", json.dumps({"case": GOOD["case"]}), ["repro", "{case}"], "not a kvfence case file"),
    ("schema-v2", mutated([casefile.MARKER], 2), ["repro", "{case}"], "schema version 2"),
    ("topk-string", mutated(["case", "case", "config", "topk"], "2"), ["repro", "{case}"], "config.topk"),
    ("topk-zero", mutated(["case", "case", "config", "topk"], 0), ["repro", "{case}"], "config.topk"),
    ("ctx-negative", mutated(["case", "case", "config", "ctx"], -4), ["repro", "{case}"], "config.ctx"),
    ("seq-len-zero", mutated(["case", "case", "batch", "seq_lens"], [0]), ["repro", "{case}"], "seq_lens"),
    ("seq-len-over-ctx", mutated(["case", "case", "batch", "seq_lens"], [9]), ["repro", "{case}"], "exceed ctx"),
    ("pool-rows-repeated", mutated(["case", "case", "batch", "req_pool_indices"], [1, 1]), ["repro", "{case}"],
     "req_pool_indices"),
    ("int32-overflow", json.dumps(dict(GOOD, case=dict(GOOD["case"], case=dict(GOOD["case"]["case"], config=dict(
        GOOD["case"]["case"]["config"], topk=64, ctx=2**24, max_bs=2, buckets=[1, 2]))))), ["repro", "{case}"],
     "2**31"),
    ("unknown-sizing-in-file", mutated(["case", "sizing"], "huge"), ["repro", "{case}"], "unknown sizing"),
    ("unknown-kernel-in-file", mutated(["case", "kernel"], "fastest"), ["repro", "{case}"], "unknown kernel"),
    ("bad-finding-kind", mutated(["findings"], [{"kind": "OOPS", "buffer": "b", "region": "r"}]), ["repro", "{case}"],
     "findings[0].kind"),
    ("missing-file", None, ["repro", "{dir}/nope.json"], "no such file"),
    ("directory", None, ["repro", "{dir}"], "not a regular file"),
    ("repro-sizing-override", json.dumps(GOOD), ["repro", "{case}", "--sizing", "huge"], "unknown sizing"),
    ("repro-kernel-missing-file", json.dumps(GOOD), ["repro", "{case}", "--kernel", "{dir}/gone.py:launch"],
     "does not exist"),
    ("repro-cuda", json.dumps(GOOD), ["repro", "{case}", "--device", "cuda"], "--device cuda"),
    ("fuzz-cuda", None, ["fuzz", "--device", "cuda", "--out", "{out}", "--json", "{json}"], "--device cuda"),
    ("fuzz-unknown-sizing", None, ["fuzz", "--device", "cpu", "--sizing", "huge", "--out", "{out}"], "unknown sizing"),
    ("fuzz-unknown-kernel", None, ["fuzz", "--device", "cpu", "--kernel", "fastest", "--out", "{out}"],
     "unknown kernel"),
    ("fuzz-int32-overflow", None, ["fuzz", "--device", "cpu", "--topk", "64", "--ctx", "40000000", "--max-bs", "4",
                                   "--out", "{out}", "--json", "{json}"], "2**31"),
    ("fuzz-zero-examples", None, ["fuzz", "--device", "cpu", "--max-examples", "0", "--out", "{out}"],
     "positive integer"),
    ("fuzz-negative-topk", None, ["fuzz", "--device", "cpu", "--topk", "-2", "--out", "{out}"], "positive integer"),
    ("fuzz-out-is-a-file", None, ["fuzz", "--device", "cpu", "--out", "{json}"], "not a directory"),
    ("fuzz-json-folder-missing", None, ["fuzz", "--device", "cpu", "--out", "{out}", "--json", "{dir}/no/s.json"],
     "does not exist"),
    # Crash-proof runs (issue 10): unwritable outputs, sizing plug-ins, sizes refused by arithmetic.
    ("fuzz-json-in-proc", None, ["fuzz", "--device", "cpu", "--out", "{out}", "--json", "/proc/kvfence.json"],
     "cannot write"),
    ("fuzz-out-read-only", None, ["fuzz", "--device", "cpu", "--out", "/proc/kvfence-out"], "cannot write"),
    ("fuzz-sizing-bool", None, ["fuzz", "--device", "cpu", "--sizing", f"{SIZINGS}:as_bool", "--out", "{out}"], "bool"),
    ("fuzz-sizing-float", None, ["fuzz", "--device", "cpu", "--sizing", f"{SIZINGS}:as_float", "--out", "{out}"],
     "float"),
    ("fuzz-sizing-huge", None, ["fuzz", "--device", "cpu", "--sizing", f"{SIZINGS}:huge", "--out", "{out}"],
     "returned width"),
    ("fuzz-sizing-sys-exit", None, ["fuzz", "--device", "cpu", "--sizing", f"{SIZINGS}:exits", "--out", "{out}"],
     "SystemExit"),
    ("fuzz-page-size-2**40", None, ["fuzz", "--device", "cpu", "--page-size", str(2**40), "--out", "{out}"],
     "config too large"),
    # The budget is pinned: without --max-gpu-mem it is the device's (a GPU's free memory fits ctx 10**8).
    ("fuzz-ctx-10**8", None, ["fuzz", "--device", "cpu", "--ctx", str(10**8), "--max-gpu-mem", "4G", "--out", "{out}"],
     "memory budget"),
    ("fuzz-shrink-seconds-nan", None, ["fuzz", "--device", "cpu", "--shrink-seconds", "nan", "--out", "{out}"],
     "finite number"),
    ("fuzz-shrink-seconds-negative", None, ["fuzz", "--device", "cpu", "--shrink-seconds", "-1", "--out", "{out}"],
     "non-negative"),
    ("fuzz-case-timeout-zero", None, ["fuzz", "--device", "cpu", "--case-timeout", "0", "--out", "{out}"],
     "positive"),
    ("fuzz-resume-ignored-flags", None, ["fuzz", "--resume", "--device", "cpu", "--out", "{out}", "--topk", "2"],
     "--topk"),
    ("case-5000-digit-number", json.dumps(GOOD).replace('"page_size": 1', '"page_size": 1' + "0" * 5000),
     ["repro", "{case}"], "page_size" if sys.version_info < (3, 11) else "number"),
    ("case-page-size-2**130", mutated(["case", "case", "config", "page_size"], 2**130), ["repro", "{case}"],
     "config too large"),
    ("report-missing-dir", None, ["report", "{dir}/nowhere"], "no such directory"),
    ("report-bad-summary", None, ["report", "{out}"], "summary"),
]


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("name, text, argv, needle", INPUTS, ids=[i[0] for i in INPUTS])
def test_bad_input_is_one_line_and_exit_2(tmp_path, device, name, text, argv, needle):
    out = tmp_path / "out"
    (out / "cases").mkdir(parents=True)
    # An earlier run's outputs, which no refused command may touch.
    (out / "summary.json").write_text('{"kvfence_summary": 1, "truncated' if name == "report-bad-summary"
                                      else '{"earlier": true}\n')
    (out / "report.html").write_text("<html>earlier</html>\n")
    (out / "cases" / "abc.json").write_text(json.dumps(GOOD))
    (tmp_path / "existing.json").write_text('{"keep": "me"}\n')
    case = tmp_path / "case.json"
    if text is not None:
        case.write_bytes(text if isinstance(text, bytes) else text.encode())
    if name.endswith("-cuda") and torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --device cuda is not bad input here")
    before = snapshot(tmp_path)
    args = [a.format(case=case, dir=tmp_path, out=out, json=tmp_path / "existing.json") for a in argv]
    if not name.endswith("-cuda"):
        # The input is what is bad, not the device: run on this session's device.
        args = [device if prev == "--device" else a for prev, a in zip([None] + args, args)]
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    res = subprocess.run([sys.executable, "-m", "kvfence", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert 1 <= len(lines) <= 2, res.stderr
    assert "Traceback" not in res.stderr
    assert lines[-1].startswith("kvfence: error:") and needle in lines[-1], lines[-1]
    assert snapshot(tmp_path) == before  # nothing overwritten, nothing new


def test_at_least_twenty_inputs():
    assert len(INPUTS) >= 20


@pytest.mark.parametrize("argv", [["--page-size", str(2**40)], ["--ctx", str(10**8), "--max-gpu-mem", "4G"],
                                  ["--shrink-seconds", "nan"],
                                  ["--sizing", f"{SIZINGS}:as_bool"], ["--json", "/proc/kvfence.json"]],
                         ids=["page-size", "ctx", "shrink-seconds", "sizing", "json"])
def test_out_folder_is_not_created_when_validation_fails(tmp_path, device, argv):
    out = tmp_path / "new" / "out"
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    res = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--device", device, "--out", str(out), *argv],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2 and res.stderr.startswith("kvfence: error:"), res.stderr
    assert not (tmp_path / "new").exists()
