"""``kvfence campaign --engine ray`` on a local Ray cluster of this CPU machine with 4 logical GPUs (docs/campaigns.md).

CI runs all but Ctrl-C (``long``: CI runs Ctrl-C on the local engine, tests/test_campaign_cli.py). On an idle 2-core
machine the module takes ~90 s (the planted bug on 4 shards with its 4 replays ~33 s, the killed worker ~13 s);
under other load several times that.

One head node for the module (``ray start --head --block --num-cpus 2 --num-gpus 4``, its own temp folder and port,
token auth as Ray 2.60 sets it up), stopped at the end. Each test runs the command line as a user does. They skip
only where Ray is not installed (``pip install "kvfence[ray]"``; CI installs it through the ``test`` extra).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parent.parent
CRASHERS = ROOT / "tests" / "targets" / "crashers.py"
#: A tiny draft config: the prefix sizing overflows on its first examples, the safe one never.
SMALL = ["--device", "cpu", "--mode", "eager", "--topk", "2", "--num-steps", "1", "--ctx", "6", "--max-bs", "2"]
#: The env of the head and of every command: Ray 2.60's token auth on, the token file of this machine.
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """The head node's address; the node (its whole process group) is stopped after the module."""
    temp = tempfile.mkdtemp(prefix="kvr")  # short: Ray's unix sockets live under it
    port, agent_port = _free_port(), _free_port()
    log = open(Path(temp) / "head.log", "w")
    head = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
                             "--num-cpus", "2", "--num-gpus", "4", "--port", str(port), "--include-dashboard",
                             "false", "--temp-dir", temp, "--disable-usage-stats",
                             # its own agent port (the default is fixed): two clusters may run at once under xdist
                             "--dashboard-agent-listen-port", str(agent_port)],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **RAY_ENV),
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while "block forever" not in (Path(temp) / "head.log").read_text():
        assert head.poll() is None and time.monotonic() < deadline, (Path(temp) / "head.log").read_text()[-2000:]
        time.sleep(0.5)
    yield f"127.0.0.1:{port}"
    # The node's processes (GCS, raylet, workers) are all in the head's process group: SIGKILL ends them at once
    # (a SIGTERM'd ``ray start --block`` takes ~30 s tidying up a cluster that is thrown away anyway).
    os.killpg(head.pid, signal.SIGKILL)
    head.wait()
    log.close()
    shutil.rmtree(temp, ignore_errors=True)


def campaign(address, *args, **popen):
    cmd = [sys.executable, "-m", "kvfence", "campaign", "--engine", "ray", "--address", address, *map(str, args)]
    env = dict(os.environ, **RAY_ENV)
    env.pop("TRITON_INTERPRET", None)
    if popen:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, **popen)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def fuzz_children(marker: str) -> dict:
    """``{pid: (parent pid, command line)}`` of the running ``kvfence fuzz`` processes whose command names
    ``marker`` (a test's own folder)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in cmd]
        if "fuzz" in words and any(marker in w for w in words):
            found[int(proc.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), words)
    return found


def test_a_planted_bug_is_found_by_every_shard_each_on_its_own_gpu_and_every_case_replays(cluster, tmp_path):
    out = tmp_path / "out"
    res = campaign(cluster, "--shards", "4", "--gpus-per-shard", "1", "--cpus-per-shard", "0.5", "--sizing", "prefix",
                   "--max-examples", "20", "--seed", "3", "--out", out, *SMALL)
    assert res.returncode == 1, res.stderr
    doc = summary(out)
    shards = doc["shards"]
    assert [r["shard"] for r in shards] == [f"t1-s{i}-of-4" for i in range(1, 5)]
    assert all(r["status"] == "findings" and r["examples"] > 0 and r["host"] == socket.gethostname() for r in shards)
    # Each task got one logical GPU of its own from Ray (CUDA_VISIBLE_DEVICES), all four at once.
    assert sorted(r["gpu"] for r in shards) == ["0", "1", "2", "3"]
    assert [r["seed_block"].split(" (")[0] for r in shards] == [f"seed 3 shard {i}/4" for i in range(1, 5)]
    assert doc["examples"] == sum(r["examples"] for r in shards) and len(doc["merged"]["runs"]) == 4
    assert {f["kind"] for f in doc["findings"]} >= {"SIZING_VIOLATION"}
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    assert "4/4 shards done" in res.stderr
    cases = sorted((out / "cases").glob("*.json"))
    assert cases and sorted(str(c) for c in cases) == sorted(doc["cases"])
    for case in cases:  # every merged case file replays the failure on its own
        replay = subprocess.run([sys.executable, "-m", "kvfence", "repro", str(case)], cwd=ROOT, capture_output=True,
                                text=True, timeout=300)
        assert replay.returncode == 1, replay.stdout + replay.stderr


def test_a_clean_campaign_exits_0(cluster, tmp_path):
    out = tmp_path / "out"
    res = campaign(cluster, "--shards", "2", "--sizing", "safe", "--max-examples", "5", "--seed", "3", "--out", out,
                   *SMALL)
    assert res.returncode == 0, res.stderr
    doc = summary(out)
    assert [r["status"] for r in doc["shards"]] == ["clean", "clean"] and doc["findings"] == []
    assert [r["gpu"] for r in doc["shards"]] == [None, None]  # --device cpu: no GPU asked of Ray
    assert doc["examples"] == 10 and doc["shard_problems"] == []


def test_a_crashing_and_a_hanging_shard_are_results_never_retried(cluster, tmp_path):
    plan = tmp_path / "plan.json"
    # The spinning kernel hangs on every case: a short --case-timeout makes it a HANG within seconds.
    plan.write_text(json.dumps({"defaults": {"max-examples": 5, "shrink-seconds": 0},
                                "targets": [{"kernel": f"{CRASHERS}:segfault"},
                                            {"kernel": f"{CRASHERS}:spin", "case-timeout": 0.5}]}))
    out = tmp_path / "out"
    res = campaign(cluster, "--plan-file", plan, "--max-retries", "3", "--seed", "1", "--out", out, *SMALL)
    assert res.returncode == 1, res.stderr
    doc = summary(out)
    rows = {r["target"]: r for r in doc["shards"]}
    assert rows[1]["status"] == rows[2]["status"] == "findings"
    assert rows[1]["attempts"] == rows[2]["attempts"] == 1  # a CRASH or HANG is the shard's result: never run again
    kinds = {Path(f["case"]).name: f["kind"] for f in doc["findings"]}
    assert sorted(set(kinds.values())) == ["CRASH", "HANG"]
    # Found under the interpreter: no compute-sanitizer follow-up, and the summary says why.
    assert doc["campaign_run"]["sanitizer"]["status"] == "skipped" and doc["campaign_run"]["sanitizer"]["cases"] == 2
    assert "compute-sanitizer follow-ups skipped for 2 CRASH/HANG case(s)" in res.stderr


def test_a_worker_killed_mid_run_is_retried_and_nothing_is_lost(cluster, tmp_path):
    out = tmp_path / "out"
    proc = campaign(cluster, "--shards", "2", "--sizing", "safe", "--max-examples", "60", "--seed", "5",
                    "--out", out, *SMALL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    marker = str(out.resolve())
    deadline = time.monotonic() + 240
    victim = None
    while victim is None:  # shard 2's fuzz child, once it runs: its parent is the Ray worker holding the task
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        victim = next((pid for pid, (_, cmd) in fuzz_children(marker).items() if "2/2" in cmd), None)
        time.sleep(0.2)
    worker = fuzz_children(marker)[victim][0]
    time.sleep(2)
    os.kill(worker, signal.SIGKILL)  # the worker dies as on a lost node; its fuzz child dies with it
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode == 0, stderr
    doc = summary(out)
    rows = {r["index"]: r for r in doc["shards"]}
    assert rows[2]["attempts"] == 2 and "WorkerCrashedError" in rows[2]["retried_for"][0]
    assert rows[1]["attempts"] == 1
    assert [rows[i]["status"] for i in (1, 2)] == ["clean", "clean"]
    assert rows[1]["examples"] == rows[2]["examples"] == 60 and doc["examples"] == 120  # nothing lost
    assert victim not in fuzz_children(marker)  # the killed attempt's shard did not live on


@pytest.mark.long  # CI runs Ctrl-C on the local engine (tests/test_campaign_cli.py); this one is Ray's
def test_ctrl_c_cancels_the_running_shards_and_keeps_what_finished(cluster, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"targets": [{"max-examples": 3}, {"max-seconds": 600, "max-examples": 100000}]}))
    out = tmp_path / "out"
    proc = campaign(cluster, "--plan-file", plan, "--sizing", "safe", "--seed", "2", "--out", out, *SMALL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = []
    for line in proc.stderr:  # the live progress line of the quick target
        lines.append(line)
        if "1/2 shards done" in line:
            break
    assert "t1-s1-of-1 clean" in lines[-1], "".join(lines)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and (out / "summary.json").is_file(), "".join(lines) + stderr
    doc = summary(out)
    rows = {r["target"]: r for r in doc["shards"]}
    assert rows[1]["status"] == "clean" and rows[2]["status"] == "cancelled"
    assert doc["examples"] == 3 and doc["campaign_run"]["interrupted"] == "SIGINT"
    deadline = time.monotonic() + 30
    while fuzz_children(str(out.resolve())) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not fuzz_children(str(out.resolve()))  # the cancelled shard's fuzz child is gone too
