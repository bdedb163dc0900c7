"""``kvfence campaign`` without Ray: the shards it builds, its one-line refusals, ``--engine local`` end to end, and
that nothing but ``--engine ray`` ever imports Ray (tests/test_campaign_ray.py runs the Ray engine)."""

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.campaign.local import gpu_slots
from kvfence.campaign.shards import DEFAULT_SHARD_TIMEOUT_S, SHARD_STARTUP_S, build_shards, read_plan
from kvfence.campaign.task import status_of
from kvfence.cli.campaign import _check_target
from kvfence.errors import BadInput

pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--device", "cpu", "--mode", "eager", "--topk", "2", "--num-steps", "1", "--ctx", "6", "--max-bs", "2"]


def kvfence(*args, pre: str = ""):
    """``python -m kvfence ARGS`` (``pre``: Python run first in the same process, e.g. to hide a module)."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    code = f"import sys\n{pre}\nfrom kvfence.__main__ import main\nsys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def build(targets, shards=2, **kw):
    kw = dict(dict(default_shards=shards, seed=7, database="/db", parse=_check_target, timeout=None, gpus=1.0), **kw)
    return build_shards(targets, **kw)


def test_a_target_becomes_n_fuzz_shards_with_the_campaigns_seed_database_and_one_job_each():
    specs = build([{"sizing": "prefix", "max-seconds": 60, "device": "cpu"}], shards=3)
    assert [(s.index, s.count, s.seed, s.name) for s in specs] == [(i, 3, 7, f"t1-s{i}-of-3") for i in (1, 2, 3)]
    argv = specs[1].argv
    assert argv[argv.index("--shard") + 1] == "2/3" and argv[argv.index("--seed") + 1] == "7"
    assert argv[argv.index("--database") + 1] == "/db" and argv[argv.index("--jobs") + 1] == "1"
    assert "--quiet" in argv and "--out" not in argv
    # A time budget bounds the shard's timeout: the budget, shrinking and start-up.
    assert specs[0].timeout_s == 60 + 60 + SHARD_STARTUP_S
    assert build([{}], shards=1)[0].timeout_s == DEFAULT_SHARD_TIMEOUT_S


def test_a_plan_s_target_overrides_its_defaults_and_sets_its_own_shard_count(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"defaults": {"sizing": "fixed", "max_examples": 9, "no-target": True},
                                "targets": [{"shards": 2}, {"contract": "slot-mapping", "sizing": "safe", "seed": 3}]}))
    specs = build(read_plan(str(plan)), shards=1)
    assert [(s.target, s.index, s.count, s.seed) for s in specs] == [(1, 1, 2, 7), (1, 2, 2, 7), (2, 1, 1, 3)]
    assert "--no-target" in specs[0].argv and specs[0].argv[specs[0].argv.index("--sizing") + 1] == "fixed"
    assert specs[2].label == "slot-mapping kernel reference sizing safe"


@pytest.mark.parametrize("doc, message", [
    ({"targets": [{"no-such-flag": 1}]}, "target 1: unrecognized arguments: --no-such-flag 1"),
    ({"targets": [{"out": "x"}]}, "'out' is set by the campaign for each shard"),
    ({"targets": [{"sizing": "nope"}]}, "unknown sizing 'nope'"),
    ({"targets": []}, "at least one target"),
    ({"targets": [{"shards": 0}]}, "shards must be a positive integer"),
    ({"targets": [{}], "extra": 1}, "unknown top-level key(s) extra"),
])
def test_a_bad_plan_is_one_line_before_any_shard(tmp_path, doc, message):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    with pytest.raises(BadInput) as err:
        build(read_plan(str(plan)))
    assert message in str(err.value)


def test_gpu_slots_pack_fractional_shards_on_each_card():
    assert gpu_slots(["0", "1"], 1.0) == ["0", "1"]
    assert gpu_slots(["0", "1"], 0.5) == ["0", "0", "1", "1"]
    assert gpu_slots(["0"], 0.0) == [] and gpu_slots([], 1.0) == []
    with pytest.raises(BadInput):
        gpu_slots(["0"], 2.0)


def test_a_shard_s_status_is_its_result_never_a_reason_to_rerun_it():
    assert status_of(0, {"findings": []}, False) == "clean"
    assert status_of(1, {"findings": [{}]}, False) == "findings"
    assert status_of(1, {"findings": []}, False) == "problems"
    assert status_of(2, None, False) == "bad-input"
    assert status_of(130, {"findings": []}, False) == "interrupted"
    assert status_of(-9, None, False) == "died"
    assert status_of(0, {"findings": []}, True) == "timeout"


def test_nothing_but_the_ray_engine_imports_ray():
    # The command line (every command's parser, campaign's included) loads without Ray ...
    probe = subprocess.run([sys.executable, "-c", "import sys\nfrom kvfence import cli\ncli.build_parser()\n"
                            "import kvfence.campaign.local, kvfence.campaign.outcome\nprint('ray' in sys.modules)"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert probe.stdout.strip() == "False", probe.stderr
    # ... and no module of the package names Ray but the extra's own.
    for path in sorted((ROOT / "harness").rglob("*.py")):
        names = {alias.name.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.ImportFrom) and node.module}
        assert "ray" not in names or path.relative_to(ROOT).as_posix() == "harness/campaign/ray_engine.py", path


def test_engine_ray_without_ray_is_one_line_and_exit_2(tmp_path):
    res = kvfence("campaign", "--engine", "ray", "--out", tmp_path / "out", *SMALL, pre="sys.modules['ray'] = None")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        'kvfence: error: --engine ray needs Ray: pip install "kvfence[ray]" (or run --engine local)']
    assert not (tmp_path / "out").exists()


@pytest.mark.long
def test_local_engine_finds_a_planted_bug_merges_its_shards_and_a_case_replays(tmp_path):
    out = tmp_path / "out"
    res = kvfence("campaign", "--shards", "2", "--parallel", "2", "--sizing", "prefix", "--max-examples", "20",
                  "--seed", "1", "--out", out, *SMALL)
    assert res.returncode == 1, res.stderr
    doc = json.loads((out / "summary.json").read_text())
    assert [(r["shard"], r["status"]) for r in doc["shards"]] == [("t1-s1-of-2", "findings"),
                                                                    ("t1-s2-of-2", "findings")]
    assert doc["examples"] == sum(r["examples"] for r in doc["shards"]) > 0
    assert doc["campaign_run"]["engine"] == "local" and doc["campaign_run"]["seed"] == 1
    assert "2/2 shards done" in res.stderr and (out / "report.html").is_file()
    case = sorted((out / "cases").glob("*.json"))[0]
    replay = kvfence("repro", case)
    assert replay.returncode == 1, replay.stderr


def test_a_shard_past_its_timeout_is_stopped_named_and_the_campaign_exits_1(tmp_path):
    out = tmp_path / "out"
    res = kvfence("campaign", "--shard-timeout", "10", "--sizing", "safe", "--max-examples", "100000",
                  "--out", out, *SMALL)
    assert res.returncode == 1, res.stderr
    doc = json.loads((out / "summary.json").read_text())
    (row,) = doc["shards"]
    assert row["status"] == "timeout" and "10 s timeout" in row["note"]
    # Stopped with SIGTERM, the shard still wrote what it checked: merged, and named as a problem.
    assert row["examples"] > 0 and doc["examples"] == row["examples"] and doc["findings"] == []
    assert doc["shard_problems"] == [f"shard t1-s1-of-1 (draft kernel reference sizing safe) timeout: {row['note']}"]
    assert "timeout" in res.stderr
    # The one report names the shard, with what happened to it.
    report = (out / "report.md").read_text()
    assert "## Shards" in report and "| t1-s1-of-1 | draft kernel reference sizing safe |" in report
    assert "| timeout |" in report and "<h2>Shards</h2>" in (out / "report.html").read_text()


def test_shards_packed_on_a_card_share_the_memory_one_fuzz_would_take(monkeypatch):
    from kvfence.campaign import task
    from kvfence.engine import budget

    monkeypatch.setattr(task.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(budget, "free_device_memory", lambda: 10 * 2**30)
    half = build([{"device": "cuda"}], gpus=0.5)[0]
    assert task.packed_budget(half) == ["--max-gpu-mem", str(int(10 * 2**30 * budget.DEFAULT_FRACTION * 0.5))]
    # A whole card, a budget the target gives, or the CPU: fuzz's own default.
    assert task.packed_budget(build([{"device": "cuda"}], gpus=1.0)[0]) == []
    assert task.packed_budget(build([{"device": "cuda", "max-gpu-mem": "2G"}], gpus=0.5)[0]) == []
    assert task.packed_budget(build([{"device": "cpu"}], gpus=0.5)[0]) == []


def test_the_rayjob_manifest_runs_a_campaign_command_kvfence_parses():
    yaml = pytest.importorskip("yaml")  # Ray's own dependency
    import shlex

    from kvfence.cli import build_parser

    doc = yaml.safe_load((ROOT / "docs" / "ray" / "rayjob.yaml").read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob" and doc["spec"]["shutdownAfterJobFinishes"]
    workers = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert all(w["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for w in workers)
    # The entrypoint's kvfence command, its shell substitutions given values, is one the parser takes.
    inner = shlex.split(doc["spec"]["entrypoint"])[2]
    inner = inner.replace("$(date +%Y%m%d)", "20261207").replace("$(date +%F)", "2026-12-07")
    argv = shlex.split(inner.replace('"$KVFENCE_REDIS_URL"', "redis://redis.internal:6379/0"))
    assert argv[:2] == ["kvfence", "campaign"]
    args = build_parser().parse_args(argv[1:])
    assert (args.engine, args.address, args.device, args.gpus_per_shard) == ("ray", "auto", "cuda", 0.5)


def test_an_earlier_campaign_in_the_folder_is_set_aside_before_this_one_merges(tmp_path):
    from kvfence.campaign.outcome import set_aside_earlier

    (tmp_path / "shards" / "t1-s3-of-4").mkdir(parents=True)
    (tmp_path / "shards" / "t1-s3-of-4" / "summary.json").write_text("{}")
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "0123abcd.json").write_text("{}")
    (tmp_path / ".hypothesis").mkdir()  # the example database stays: its failures are replayed first
    earlier = set_aside_earlier(tmp_path)
    assert earlier["count"] == 1 and Path(earlier["folder"]).parent == tmp_path / "cases" / "earlier"
    assert not (tmp_path / "shards").exists() and not list((tmp_path / "cases").glob("*.json"))
    (moved,) = (tmp_path / "earlier").iterdir()
    assert (moved / "shards" / "t1-s3-of-4" / "summary.json").is_file() and (tmp_path / ".hypothesis").is_dir()
    assert set_aside_earlier(tmp_path) is None  # nothing left to move


def test_crash_and_hang_cases_found_on_cuda_get_a_compute_sanitizer_follow_up_and_cpu_ones_say_why_not(tmp_path):
    from kvfence.campaign.outcome import follow_up_cases
    from kvfence.cli.campaign import CPU_CASES, _no_follow_ups, _sweep_commands

    doc = {"merged": {"runs": [{"dir": "gpu-shard", "device": "cuda"}, {"dir": "cpu-shard", "device": "cpu"}]},
           "findings": [{"case": "c/a.json", "kind": "CRASH"}, {"case": "c/b.json", "kind": "HANG"},
                        {"case": "c/c.json", "kind": "VALUE_MISMATCH"}],
           "cases": {"c/a.json": {"found_in": ["gpu-shard"]}, "c/b.json": {"found_in": ["cpu-shard"]},
                     "c/c.json": {"found_in": ["gpu-shard"]}}}
    on_cuda, on_cpu = follow_up_cases(doc)
    assert on_cuda == [Path("c/a.json")] and on_cpu == [Path("c/b.json")]
    assert _no_follow_ups(on_cpu) == {"cases": 1, "status": "skipped", "why": CPU_CASES, "results": []}
    assert _no_follow_ups([])["status"] == "none"
    case = tmp_path / "cases" / "a.json"
    case.parent.mkdir()
    case.write_text("{}")
    ((name, cmd),) = _sweep_commands([case], tmp_path / "out")
    # One sweep per case, over a folder holding that case alone, memcheck on it.
    folder = Path(cmd[cmd.index("--cases") + 1])
    assert name == "a" and cmd[1:4] == ["-m", "kvfence", "sweep"] and [p.name for p in folder.iterdir()] == ["a.json"]
    assert cmd[cmd.index("--tools") + 1] == "memcheck"


def test_ctrl_c_on_the_local_engine_stops_the_running_shard_which_writes_its_outputs(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"targets": [{"max-examples": 2}, {"max-seconds": 600, "max-examples": 100000}]}))
    out = tmp_path / "out"
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.Popen([sys.executable, "-m", "kvfence", "campaign", "--plan-file", str(plan), "--parallel", "2",
                             "--sizing", "safe", "--seed", "2", "--out", str(out), *SMALL], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "1/2 shards done" in line:
            break
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 130 and (out / "summary.json").is_file(), "".join(lines) + stderr
    doc = json.loads((out / "summary.json").read_text())
    rows = {r["target"]: r for r in doc["shards"]}
    # The running shard was stopped as an interrupted fuzz run: what it checked is merged too.
    assert rows[1]["status"] == "clean" and rows[2]["status"] == "interrupted" and rows[2]["examples"] > 0
    assert doc["examples"] == 2 + rows[2]["examples"] and doc["campaign_run"]["interrupted"] == "SIGINT"
