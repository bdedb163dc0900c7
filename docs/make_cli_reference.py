"""Write docs/cli.md, the command-line reference, from kvfence's argparse parser (``kvfence.cli.build_parser``).

    python docs/make_cli_reference.py           # rewrite docs/cli.md
    python docs/make_cli_reference.py --check   # exit 1 when docs/cli.md differs from the parser

The page is built from the parser's actions (flags, metavars, choices, defaults, help), not from argparse's
formatted help, so it reads the same under every Python version. ``tests/test_docs_guide.py`` runs the
check: a flag added without regenerating the page fails CI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "cli.md"


def _subcommands(parser: argparse.ArgumentParser):
    """``(name, help, subparser)`` of each subcommand, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    takes = action.nargs != 0
    meta = action.metavar or (action.dest.upper() if takes and not action.choices else "")
    if action.choices and takes and not action.metavar:
        meta = "{" + ",".join(map(str, action.choices)) + "}"
    if action.nargs in ("+", "*"):
        meta += " ..."
    return ", ".join(f"`{o}{' ' + meta if meta and takes else ''}`" for o in action.option_strings)


def _default(action: argparse.Action) -> str:
    if not action.option_strings:
        return "required" if action.nargs not in ("?", "*") else "optional"
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if action.default is None or action.default is argparse.SUPPRESS:
        return "-"
    return f"`{action.default}`"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    try:
        return text % {"default": action.default, "prog": prog}
    except (KeyError, TypeError, ValueError):
        return text


def _declared(parser: argparse.ArgumentParser) -> set:
    """The dests of the flags the parser's contract declares (``Contract.options``)."""
    return {o.name for o in parser.get_default("declared_options") or ()}


def _table(actions: list, path: str) -> list:
    if not actions:
        return []
    return ["| argument | default | meaning |", "|---|---|---|",
            *[f"| {_flag(a)} | {_cell(_default(a))} | {_cell(_help(a, path))} |" for a in actions], ""]


def contract_options() -> list:
    """Each of kvfence's own contracts' declared flags (``kvfence fuzz --contract NAME --help`` lists them)."""
    from kvfence.cli import build_parser
    from kvfence.engine import registry

    out = ["## Contract options", "",
           "`fuzz` and `campaign` take the flags the contract `--contract` names declares (`Contract.options`, "
           "docs/contract-api.md); `kvfence fuzz --contract NAME --help` lists them. kvfence's own contracts:", ""]
    for name in registry.names():
        if not registry.builtin(name):
            continue
        fuzz = dict((n, sub) for n, _, sub in _subcommands(build_parser("kvfence", ["fuzz", "--contract", name])))
        declared = [a for a in fuzz["fuzz"]._actions if a.dest in _declared(fuzz["fuzz"])]
        out += [f"### `--contract {name}`", ""]
        out += _table(declared, "kvfence fuzz") or ["none", ""]
    return out


def section(path: str, parser: argparse.ArgumentParser, summary: str, level: int) -> list:
    """One command's section: what it does, its flags table, its exit codes; then its own subcommands."""
    out = [f"{'#' * level} `{path}`", ""]
    if summary:
        out += [_cell(summary), ""]
    if parser.description:
        out += [_cell(parser.description), ""]
    # A flag whose help is suppressed (what a --jobs parent passes its children) is not the user's to give.
    rows = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
            and a.help is not argparse.SUPPRESS]
    declared = _declared(parser)
    if rows:
        out += _table([a for a in rows if a.dest not in declared], path)
    if declared:
        out += [f"The flags of the default contract, `{parser.get_default('contract')}` (`--contract NAME` takes "
                "NAME's own instead: [Contract options](#contract-options)):", ""]
        out += _table([a for a in rows if a.dest in declared], path)
    if parser.epilog:
        out += ["```text", parser.epilog.strip(), "```", ""]
    for name, text, sub in _subcommands(parser):
        out += section(f"{path} {name}", sub, text, level + 1)
    return out


def render() -> str:
    from kvfence.cli import build_parser

    parser = build_parser("kvfence")
    commands = list(_subcommands(parser))
    out = ["# Command-line reference", "",
           "Generated from the argparse parser by `python docs/make_cli_reference.py`; do not edit by hand.",
           "`kvfence COMMAND --help` prints the same on the terminal; `python -m kvfence` is the same command line.",
           "", "Commands: " + ", ".join(f"[`{name}`](#kvfence-{name})" for name, _, _ in commands) + "; the flags "
           "each contract declares: [Contract options](#contract-options).", ""]
    for name, text, sub in commands:
        out += section(f"kvfence {name}", sub, text, 2)
    out += contract_options()
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    args = argparse.ArgumentParser(description="write docs/cli.md from kvfence's parser")
    args.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is not what the parser says")
    ns = args.parse_args(argv)
    text = render()
    if ns.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python docs/make_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
