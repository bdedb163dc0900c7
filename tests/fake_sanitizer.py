"""A fake ``compute-sanitizer`` for CPU tests: a script put first on PATH that behaves as the
``FAKE_SCENARIO`` environment variable says (writes the XML report, the log, the child's status file
and exits with the code that scenario needs), so every signal path of ``kvfence.sanitizer.tool`` runs."""

import os
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"

FAKE_TOOL = r'''#!{python}
"""Fake compute-sanitizer: behaves as FAKE_SCENARIO says, writing the XML, the log and the child's status."""
import json, os, shutil, subprocess, sys, time
argv = sys.argv[1:]
xml = argv[argv.index("--save") + 1]
status = argv[argv.index("kvfence.sanitizer_child") + 1]
fixtures = os.environ["FAKE_FIXTURES"]
scenario = os.environ["FAKE_SCENARIO"]
EMPTY = "<?xml version='1.0'?><ComputeSanitizerOutput></ComputeSanitizerOutput>"
def child(code, error=None):
    doc = {{"exit": code}}
    if error:
        doc["error"] = error
    open(status, "w").write(json.dumps(doc))
def summary(n):
    print(f"========= ERROR SUMMARY: {{n}} errors")
if scenario == "hang":
    subprocess.Popen(["sleep", "60"])  # a grandchild: the whole group must be killed
    time.sleep(60)
if scenario in ("clean", "reproduces", "no_summary", "exit86_no_errors", "summary_only", "dead_child",
                "child_bad_input", "exit_mismatch"):
    open(xml, "w").write(EMPTY)
if scenario in ("errors", "errors_exit_ignored"):
    shutil.copy(os.path.join(fixtures, "sanitizer_memcheck_overflow_nocache.xml"), xml)
if scenario == "bad_xml":
    open(xml, "w").write("<ComputeSanitizerOutput><record>")
    print(open(os.path.join(fixtures, "sanitizer_memcheck_overflow_nocache.txt")).read())
if scenario == "child_bad_input":
    print("kvfence: error: case file c.json: not JSON")
    child(2)
elif scenario == "dead_child":
    pass  # killed before it could write its status
elif scenario == "reproduces":
    child(1)
else:
    child(0)
if scenario not in ("no_summary", "bad_xml"):
    summary({{"errors": 6, "errors_exit_ignored": 6, "summary_only": 5}}.get(scenario, 0))
sys.exit({{"errors": 86, "exit86_no_errors": 86, "summary_only": 86, "bad_xml": 86, "dead_child": 139,
          "reproduces": 1, "exit_mismatch": 1}}.get(scenario, 0))
'''




def install_fake_tool(tmp_path, monkeypatch) -> Path:
    """Write the fake tool to ``tmp_path/bin`` and put it first on PATH; returns its path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "compute-sanitizer"
    tool.write_text(FAKE_TOOL.format(python=sys.executable))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_FIXTURES", str(FIXTURES))
    monkeypatch.setenv("FAKE_SCENARIO", "clean")
    return tool
