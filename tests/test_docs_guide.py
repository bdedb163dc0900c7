"""README.md is a short guide and the rest of the documentation lives in docs/ by task: the README's length
and line widths, its required sections, one command name, links that resolve, and docs/cli.md generated from
the parser (``docs/make_cli_reference.py``) so it cannot drift from the command line."""

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: Pages other pieces of the project own; the README must link them (checked to exist where present).
#: Pages the README must link (the answers its sections point to).
REQUIRED_LINKS = {"docs/own-kernel.md", "docs/shipped-sizing.md", "docs/security.md"}
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links(text: str, base: Path):
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans hold no links (`kernel[grid](...)`)
    for target in LINK.findall(text):
        if not re.match(r"[a-z]+://", target):
            yield (base / target).resolve().relative_to(ROOT).as_posix()


def test_readme_is_a_short_guide_with_the_sections_a_newcomer_needs():
    lines = README.splitlines()
    assert 150 <= len(lines) <= 220, len(lines)
    assert not [n for n, line in enumerate(lines, 1) if len(line) > 120]
    headings = re.findall(r"^## (.+)$", README, re.M)
    for needed in ("Quickstart", "Read a finding", "Test your own kernel", "Test your own kernel in your CI",
                   "Is my deployment affected?", "Where to go next"):
        assert needed in headings, headings
    section = lambda name: README.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]  # noqa: E731
    assert "docs/own-kernel.md" in section("Test your own kernel in your CI")
    assert "docs/shipped-sizing.md" in section("Is my deployment affected?")
    assert "minutes" in section("Quickstart")  # how long the steps take


def test_one_command_name_and_no_placeholder():
    docs = [README] + [p.read_text() for p in (ROOT / "docs").glob("*.md")]
    for text in docs:
        assert not re.search(r"python -m kvfence (fuzz|repro|report|mutants|sweep|upstream)\b", text)
        assert "<kvfence repository URL>" not in text


def test_every_local_link_of_the_readme_and_docs_resolves():
    pages = {"README.md": README, **{f"docs/{p.name}": p.read_text() for p in (ROOT / "docs").glob("*.md")}}
    missing = {}
    for name, text in pages.items():
        for target in _links(text, (ROOT / name).parent):
            if not (ROOT / target).exists():
                missing.setdefault(name, []).append(target)
    assert missing == {}
    linked = set(_links(README, ROOT))
    assert REQUIRED_LINKS <= linked
    # Every page of docs/ is reachable from the README.
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} - linked <= {"docs/contract.md"} - linked


def test_the_link_checker_sees_a_broken_link(tmp_path):
    assert list(_links("[a](docs/x.md#y) [b](https://example.org) [c](../BENCHMARKS.md)", ROOT / "docs")) == [
        "docs/docs/x.md", "BENCHMARKS.md"]


def test_the_cli_reference_is_what_the_parser_says():
    tool = runpy.run_path(str(ROOT / "docs" / "make_cli_reference.py"))
    text = tool["render"]()
    assert (ROOT / "docs" / "cli.md").read_text() == text, "run: python docs/make_cli_reference.py"
    from kvfence.cli import build_parser

    parser = build_parser("kvfence")
    # Every flag of every command is on the page (the check above is not vacuous), but the suppressed ones
    # a --jobs parent gives its children.
    import argparse

    flags, hidden = set(), set()
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            names = {o for o in action.option_strings if o.startswith("--") and o != "--help"}
            (hidden if action.help is argparse.SUPPRESS else flags).update(names)
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                stack.extend(action.choices.values())
    assert flags and all(f"`{flag}" in text for flag in flags), sorted(f for f in flags if f"`{f}" not in text)
    # (whole flags: campaign's --plan-file is on the page, fuzz's hidden --plan is not)
    assert hidden == {"--plan"} and not any(re.search(rf"`{flag}(?![\w-])", text) for flag in hidden)


BENCHMARKS = (ROOT / "BENCHMARKS.md").read_text()
RESULTS = ROOT / "benchmarks" / "results"


def quoted_keys(text: str):
    """``(file, top-level key)`` of every ``results file: key`` cell of BENCHMARKS.md's tables."""
    for cell in re.findall(r"\| (`[\w.-]+\.json`: [^|]+) \|", text):
        # A cell may quote several files: `a.json`: `k1`, `k2`; `b.json`: `k3`.
        for part in re.split(r"(?=`[\w.-]+\.json`: )", cell):
            named = re.match(r"`([\w.-]+\.json)`: (.*)", part, re.S)
            if named:
                for key in re.findall(r"`([^`]+)`", named.group(2)):
                    yield named.group(1), re.split(r"[.\[]", key, maxsplit=1)[0]


def test_benchmarks_quote_files_and_keys_that_exist_and_are_no_diary():
    quoted = list(quoted_keys(BENCHMARKS))
    assert len({name for name, _ in quoted}) >= 10, quoted
    import json

    for name, key in quoted:
        doc = json.loads((RESULTS / name).read_text())
        assert key in doc, f"BENCHMARKS.md quotes {name}: {key}, which the file does not have"
    assert not re.search(r"\bsession\b|\$OUT|\bruns? \d+\b|not run yet", BENCHMARKS)
    # No results file that BENCHMARKS.md does not name: a figure nobody quotes is a figure nobody keeps true.
    unnamed = sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.name not in BENCHMARKS)
    assert unnamed == [], f"results files BENCHMARKS.md does not name: {unnamed}"
    # One script runs every GPU benchmark; no numbered one-off device scripts.
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.sh"))
    assert scripts == ["gpu.sh"], scripts
    parts = re.search(r'^ALL="([^"]+)"', (ROOT / "benchmarks" / "gpu.sh").read_text(), re.M).group(1).split()
    for part in set(re.findall(r"\| `([a-z-]+)` \| `h200", BENCHMARKS)):
        assert part in parts, part


def test_the_benchmark_key_reader_sees_each_key():
    row = "| x | 1 | | `throughput` | `h200.json`: `a_b` (passes: `c`), `rows[variant=x].d` |"
    assert list(quoted_keys(row)) == [("h200.json", "a_b"), ("h200.json", "c"), ("h200.json", "rows")]
    # Names with hyphens, and several files in one cell, each with its own keys.
    row = "| x | 1 | | same | `cpu_contract_mutants_fa3-decode.json`: `passed`, `rows`; `b-c.json`: `cases` |"
    assert list(quoted_keys(row)) == [("cpu_contract_mutants_fa3-decode.json", "passed"),
                                      ("cpu_contract_mutants_fa3-decode.json", "rows"), ("b-c.json", "cases")]


def _doc_commands():
    """Every command line of a ```bash block of README.md and docs/*.md (continuations joined, comments cut),
    as (page, tokens)."""
    import shlex

    for page in [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")):
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                try:
                    tokens = shlex.split(line, comments=True)
                except ValueError:
                    continue
                while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):  # VAR=value before the command
                    tokens = tokens[1:]
                if tokens:
                    yield page.relative_to(ROOT).as_posix(), tokens


def _options(parser) -> dict:
    """``{subcommand path: option strings}`` of the kvfence parser, nested subcommands included."""
    import argparse

    out = {}

    def walk(p, path):
        out[path] = {s for a in p._actions for s in a.option_strings}
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, path + (name,))
    walk(parser, ())
    return out


def test_every_documented_command_uses_options_that_exist():
    """Docs cannot drift from the command line: each ``kvfence``/``python -m kvfence`` line's options belong to
    its subcommand, and each ``pytest`` line's options are pytest's, its plugins' or kvfence's plugin's."""
    import subprocess
    import sys

    from kvfence.cli import build_parser
    from kvfence.release.affected import FLAGS as SGLANG_FLAGS

    options = _options(build_parser())
    options[("affected",)] = options[("affected",)] | set(SGLANG_FLAGS)  # SGLang's flags, after the release
    help_text = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=ROOT, capture_output=True,
                               text=True, timeout=120).stdout
    pytest_options = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text))
    checked, wrong = 0, []
    for page, tokens in _doc_commands():
        if tokens[:3] == ["python", "-m", "kvfence"] or tokens[:3] == ["python3", "-m", "kvfence"]:
            tokens = ["kvfence"] + tokens[3:]
        if tokens[0].endswith("kvfence") and len(tokens) > 1:
            path = ()
            for t in tokens[1:]:
                if path + (t,) in options:
                    path += (t,)
                elif not t.startswith("-"):
                    break
            flags = {t.split("=", 1)[0] for t in tokens[1:] if t.startswith("--")}
            if path == ("affected",) and any("launch_server" in t or t == "serve" or "vllm.entrypoints" in t
                                             for t in tokens):
                flags &= options[path]  # a launch command's other flags are SGLang's (vLLM's), not kvfence's
            wrong += [(page, " ".join(tokens), f) for f in sorted(flags - options[path] - {"--help"})]
            checked += 1
        elif tokens[0] == "pytest" or tokens[:3] == ["python", "-m", "pytest"]:
            flags = {t.split("=", 1)[0] for t in tokens if t.startswith("-") and not t.startswith("---")}
            wrong += [(page, " ".join(tokens), f) for f in sorted(flags - pytest_options)]
            checked += 1
    assert checked >= 30 and not wrong, wrong


_MUTANTS_FIELDS = []


def _mutants_fields() -> set:
    """The top-level fields ``kvfence mutants --json`` writes today: one tiny run of the command itself (one
    mutant of a table contract, one seed, one example: about two seconds on the CPU), read back. It runs on the
    session's device: on a CUDA machine the interpreter may be refused (Triton 3.6 with numpy 2.4), and a command
    that writes no file must say why here, not as a missing file."""
    if not _MUTANTS_FIELDS:
        import json
        import os
        import subprocess
        import sys
        import tempfile

        from kvfence.engine import registry

        contract = "fa3-decode-metadata"
        device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "mutants.json"
            done = subprocess.run([sys.executable, "-m", "kvfence", "mutants", "--contract", contract, "--only",
                                   registry.get(contract).mutants[0].name, "--seeds", "1", "--max-examples", "1",
                                   "--device", device, "--quiet", "--json", str(out)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert out.exists(), f"kvfence mutants --device {device} wrote no {out.name} (exit {done.returncode}): " \
                                 f"{done.stderr.strip()[-800:]}"
            _MUTANTS_FIELDS.append(set(json.loads(out.read_text())))
    return _MUTANTS_FIELDS[0]


def _writer_fields(doc: dict):
    """``(writer, the top-level fields it emits today)`` for a results file written by one of kvfence's own
    JSON writers, recognised by the fields that only that writer emits (today, or in an earlier format of the
    same command); None for another writer's file."""
    from kvfence.contracts.draft.compare import Comparison
    from kvfence.engine import summary
    from kvfence.engine.result import FuzzResult

    if summary.MARKER in doc:
        one = summary.build(FuzzResult(), run={}, case_path=None)
        if (doc.get("jobs") or 1) > 1:  # a --jobs run's summary is the merge of its jobs'
            return "kvfence fuzz --jobs N --json", set(summary.merge([one], run={}, elapsed_s=1.0))
        return "kvfence fuzz --json", set(one)
    if "not_exercised" in doc and "rows" in doc:
        return "kvfence mutants --verifiers both --json", set(Comparison("cuda", 1, 0, None).to_dict())
    contracts = doc.get("contracts")
    today = isinstance(contracts, dict) and contracts and all(
        isinstance(r, dict) and "rows_planned" in r for r in contracts.values())
    # the self-test's report: today one per contract under "contracts"; written before, the draft kernel's at the
    # top level (required_rate, mutants, reference) or one contract's (rows_planned)
    if today or "required_rate" in doc or "rows_planned" in doc or (
            "mutants" in doc and "reference" in doc and "benchmark" not in doc):
        return "kvfence mutants --json", _mutants_fields() - {"code"}
    return None


def test_each_quoted_results_file_has_every_field_its_writer_emits_today():
    """A results file BENCHMARKS.md quotes was written by the current code's writer: it holds every
    top-level field that writer emits today (a file written before a field was added is stale: measure it
    again with the row's command, or stop quoting it)."""
    import json

    stale = {}
    for name in sorted({name for name, _ in quoted_keys(BENCHMARKS)}):
        found = _writer_fields(json.loads((RESULTS / name).read_text()))
        if found is not None:
            writer, fields = found
            # The code stamp is the freshness test's (test_each_quoted_results_file_names_the_code_that_wrote_it).
            missing = sorted(fields - set(json.loads((RESULTS / name).read_text())) - {"code"})
            if missing:
                stale[name] = f"{writer} emits {missing} today"
    assert stale == {}


def test_the_freshness_check_sees_a_file_written_before_a_field():
    from kvfence.engine import summary
    from kvfence.engine.result import FuzzResult

    doc = summary.build(FuzzResult(), run={}, case_path=None)
    writer, fields = _writer_fields(doc)
    assert writer == "kvfence fuzz --json" and fields == set(doc)
    old = {k: v for k, v in doc.items() if k != "examples_per_s"}
    assert fields - set(old) == {"examples_per_s"}


def _quoting_lines(name: str):
    """The lines of BENCHMARKS.md that quote ``name`` as a results file (``| `name`: key |``)."""
    return [line for line in BENCHMARKS.splitlines() if f"`{name}`:" in line]


def test_each_quoted_results_file_names_the_code_that_wrote_it():
    """Every figure names its code. A results file BENCHMARKS.md quotes carries its writer's ``code`` stamp
    (kvfence.provenance); the stamp's digest is the digest of the commit it names (so it was not written by an
    uncommitted tree), that commit is in this branch's history, and each line quoting the file names that
    commit: a file cannot name an older commit than the code its row describes. A file written before stamps
    existed is quoted only on a line that says so ("older code")."""
    import json
    import subprocess

    from kvfence.provenance import digest_of_commit

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the stamps' commits cannot be read")
    wrong = {}
    for name in sorted({name for name, _ in quoted_keys(BENCHMARKS)}):
        stamp = json.loads((RESULTS / name).read_text()).get("code")
        lines = _quoting_lines(name)
        if not stamp:
            if not all("older code" in line for line in lines):
                wrong[name] = "no code stamp, and a line quoting it does not say 'older code'"
            continue
        commit = stamp.get("commit") or ""
        known = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", commit, "HEAD"],
                               capture_output=True).returncode == 0 if commit else False
        if not known:
            wrong[name] = f"stamped with {commit or 'no commit'}, which is not in this branch's history"
        elif digest_of_commit(ROOT, commit) != stamp.get("digest"):
            wrong[name] = f"its digest is not {commit[:9]}'s: written by a tree with uncommitted changes"
        elif not all(commit[:7] in line for line in lines):
            wrong[name] = f"a line quoting it does not name its commit {commit[:7]}"
    assert wrong == {}


def test_a_code_stamp_matches_its_commit_only_while_the_tree_is_that_commit(tmp_path):
    """The stamp's digest is recomputable from git: equal for the committed tree, different once a counted
    source file changes or an untracked one appears; caches and files outside the source folders do not count."""
    import subprocess

    from kvfence.provenance import digest_of_commit, digest_of_tree

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                       env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                            "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})

    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "a.py").write_text("x = 1\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "gpu.sh").write_text("echo\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("text\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    committed = digest_of_commit(tmp_path, "HEAD")
    assert digest_of_tree(tmp_path) == committed
    (tmp_path / "harness" / "__pycache__").mkdir()
    (tmp_path / "harness" / "__pycache__" / "a.cpython-311.py").write_text("cache\n")
    (tmp_path / "docs" / "x.md").write_text("changed\n")
    assert digest_of_tree(tmp_path) == committed
    (tmp_path / "harness" / "a.py").write_text("x = 2\n")
    assert digest_of_tree(tmp_path) != committed
    (tmp_path / "harness" / "a.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "new.py").write_text("")
    assert digest_of_tree(tmp_path) != committed


def test_the_code_stamp_stays_out_of_the_runs_outputs(tmp_path, monkeypatch):
    """Every run summary is stamped as it is written, while other runs write and delete folders under
    ``reports/out/``: the digest never lists a folder there (here, each such listing fails as a folder deleted
    mid-walk would), so stamping cannot end a run before its summary is written."""
    import os

    from kvfence import provenance

    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "a.py").write_text("x = 1\n")
    (tmp_path / "reports" / "out" / "run" / "cases").mkdir(parents=True)
    (tmp_path / "reports" / "render.py").write_text("y = 2\n")
    (tmp_path / "reports" / "out" / "run" / "plugin.py").write_text("z = 3\n")  # an output, not source
    expected = provenance.digest([("harness/a.py", provenance.blob_id(b"x = 1\n")),
                                  ("reports/render.py", provenance.blob_id(b"y = 2\n"))])
    listing = os.scandir

    def scandir(path="."):
        if "reports/out" in os.fspath(path).replace(os.sep, "/"):
            raise FileNotFoundError(2, "deleted by another run", os.fspath(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert provenance.digest_of_tree(tmp_path) == expected


#: A time a page states: "5-18 s", "20 s", "2 minutes", "~25 s", "about a minute", "a few minutes".
DURATION = re.compile(r"(?:~|about )?(?:\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?|a few|a) (?:s|seconds?|minutes?)\b")


def readme_timings():
    """``(command, time)`` for every time README.md states for one of kvfence's own commands: the quickstart table's
    ``takes`` cell of a `kvfence ...` step, and a time in the parentheses that follow a `kvfence ...` command or
    end its sentence's first clause (``kvfence fuzz`` with no flags ... (20 s to 2 minutes ...))."""
    text = " ".join(README.split())
    out = []
    for command, takes in re.findall(r"\| `(kvfence [^`]+)` \| ([^|]+) \|", text):
        out += [(command, t) for t in DURATION.findall(takes)]
    for command, aside in re.findall(r"`(kvfence [^`]+)`(?:[^`(|]|`[^`]*`){0,160}?\(([^)]*)\)", text):
        out += [(command, t) for t in DURATION.findall(aside)]
    return out


def test_every_time_the_readme_states_for_a_kvfence_command_is_a_measured_run_in_benchmarks():
    """README.md's times for kvfence's own commands (seconds to a finding, a run's length) are the ones
    BENCHMARKS.md's row "README's timings" measured, each beside its command as README names it."""
    timings = readme_timings()
    assert {c for c, _ in timings} >= {"kvfence fuzz --sizing prefix", "kvfence fuzz",
                                      "kvfence upstream matrix --shipped --versions 0.4.3..0.5.23"}, timings
    (row,) = [line for line in BENCHMARKS.splitlines() if line.startswith("| README's timings")]
    for command, said in timings:
        at = row.find(f"`{command}`" + ("" if command != "kvfence fuzz" else " (no flags)"))
        assert at >= 0, f"README times `{command}`, which BENCHMARKS' README row does not run"
        assert said in row[at:row.find("; `", at) if row.find("; `", at) > 0 else None], (command, said)
