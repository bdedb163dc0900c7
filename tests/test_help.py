"""The command line explains itself: every flag has help that shows its default, every command lists its
exit codes, usage lines carry the name the user typed, and no command at all prints the command list."""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence import cli
from kvfence.cli.common import _Parser

ROOT = Path(__file__).resolve().parents[1]
#: Runs ``kvfence.cli:main`` exactly as the ``kvfence`` console script does (``main()`` with no arguments).
CONSOLE_SCRIPT = "import sys; from kvfence.cli import main; sys.exit(main())"


def run(argv, *, console_script=False, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    head = ["-c", CONSOLE_SCRIPT] if console_script else ["-m", "kvfence"]
    return subprocess.run([sys.executable, *head, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def subcommands(parser: argparse.ArgumentParser) -> dict:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def undocumented(parser: argparse.ArgumentParser) -> list:
    """Options whose rendered help is empty or does not say what the default is."""
    formatter = parser._get_formatter()
    problems = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        text = formatter._expand_help(action) if action.help else ""
        if not text.strip():
            problems.append(f"{action.option_strings[0]}: no help")
        elif "default" not in text:
            problems.append(f"{action.option_strings[0]}: help does not show the default")
    return problems


COMMANDS = sorted(subcommands(cli.build_parser()))


def test_the_checker_catches_a_flag_without_help_or_default():
    """The check below must be able to fail: a plain argparse parser with terse flags is caught."""
    bad = argparse.ArgumentParser()
    bad.add_argument("--budget", type=int, default=5)
    bad.add_argument("--name", default="x", help="a name")
    assert undocumented(bad) == ["--budget: no help", "--name: help does not show the default"]
    good = _Parser(prog="t")
    good.add_argument("--budget", type=int, default=5, help="a budget")
    good.add_argument("--fast", action="store_true", help="go fast")
    good.add_argument("--pin", default=None, help="pin it (default: drawn)")
    assert undocumented(good) == []
    assert "(default: 5)" in good.format_help() and "(default: off)" in good.format_help()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_has_help_that_shows_its_default(command):
    assert undocumented(subcommands(cli.build_parser())[command]) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_help_lists_its_exit_codes(command):
    proc = run([command, "--help"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m kvfence {command} ")
    codes = proc.stdout.split("exit codes:\n", 1)[1]
    listed = [int(m) for m in re.findall(r"^  (\d)  \S", codes, flags=re.M)]
    assert 0 in listed and 2 in listed, codes
    # Help renders defaults in place: no unexpanded format string reaches the user.
    assert "%(" not in proc.stdout


def test_the_console_script_names_itself_kvfence():
    scripts = re.search(r"\[project\.scripts\]\s*\n(.*?)(\n\[|\Z)", (ROOT / "pyproject.toml").read_text(), re.S)
    assert re.search(r'^kvfence\s*=\s*"kvfence\.__main__:main"', scripts.group(1), re.M)  # one start for both
    proc = run(["fuzz", "--help"], console_script=True)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: kvfence fuzz ")
    proc = run(["fuzz", "--mode", "lazy"], console_script=True)
    assert proc.returncode == 2 and proc.stderr.startswith("kvfence: error: fuzz: argument --mode")


@pytest.mark.parametrize("console_script", [True, False])
def test_a_usage_error_names_the_program_once(console_script):
    proc = run(["fuzz", "--no-such-flag"], console_script=console_script)
    assert proc.returncode == 2
    assert proc.stderr == "kvfence: error: unrecognized arguments: --no-such-flag\n"
    proc = run(["report", "--merge"], console_script=console_script)
    assert proc.returncode == 2 and proc.stderr.startswith("kvfence: error: report: argument --merge")


@pytest.mark.parametrize("console_script, name", [(True, "kvfence"), (False, "python -m kvfence")])
def test_no_command_prints_the_command_list(console_script, name):
    proc = run([], console_script=console_script)
    # Exit 2 (not 0): a script that lost its arguments must not pass silently.
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"usage: {name} ") and "error" not in proc.stderr
    for command in COMMANDS:
        assert re.search(rf"^    {command}\s+\S", proc.stderr, re.M), command
    assert f"Run '{name} COMMAND --help'" in proc.stderr


def test_prefix_is_described_by_what_it_is():
    text = run(["fuzz", "--help"]).stdout
    # argparse wraps help lines at hyphens too ("CUDA-" at a line's end, "graph" on the next): joined back
    flat = re.sub(r"(?<=\w-) (?=\w)", "", " ".join(text.split()))
    assert "prefix (the pre-fix CUDA-graph policy, W = max_bs*ctx, missing the topk factor)" in flat
    assert "seed's bug" not in flat
