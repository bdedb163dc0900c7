"""``python -m kvfence COMMAND``: the command line. Each command's parser and handler live in its own module
of ``kvfence.cli``; this module assembles them and runs one.

Exit codes (``kvfence.errors``): 0 no finding, 1 findings, 2 bad input or unusable environment, always
as one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import List, Optional

from kvfence.cli import affected, campaign, check_contract, fuzz, mutants, report, repro, sweep, upstream
from kvfence.cli.common import EXIT_CODES, _Parser, _stderr, declared_options_of, deferred_contract, parse_command_line
from kvfence.errors import EXIT_BAD_INPUT, BadInput

#: The name the command line gives itself: the console script is ``kvfence``; ``python -m kvfence``
#: passes its own name (``kvfence.__main__``), so usage lines show what the user actually typed.
PROG = "kvfence"

#: The command modules, in the order ``--help`` lists them.
COMMANDS = (fuzz, campaign, repro, report, mutants, sweep, upstream, affected, check_contract)


#: The commands whose flags include those the contract ``--contract`` names declares (``Contract.options``).
DECLARING = (fuzz, campaign)
_DECLARING_NAMES = [m.__name__.rsplit(".", 1)[-1] for m in DECLARING]


def build_parser(prog: str = PROG, argv: Optional[List[str]] = None, *, child: bool = True) -> argparse.ArgumentParser:
    """The command line's parser. ``fuzz`` and ``campaign`` take the flags of the contract ``argv`` names (the
    default contract's without ``argv``; none when it is not one of kvfence's own and this is no boundary child:
    its record is loaded in the child, ``_run``)."""
    parser = _Parser(prog=prog, description="kvfence: differential fuzzing and memory-safety "
                     "harness for the kernels that build and read paged-KV index tables",
                     epilog=f"Run '{prog} COMMAND --help' for a command's flags and exit codes.\n\n{EXIT_CODES}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    contract, options = declared_options_of(argv, _DECLARING_NAMES, child)
    for command in COMMANDS:  # the order of the command list in --help
        if command in DECLARING:
            command.add_parser(sub, contract, options)
        else:
            command.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None, prog: str = PROG) -> int:
    """Run one command; ``prog`` is the name usage lines show (``kvfence`` or ``python -m kvfence``)."""
    from kvfence.engine import boundary
    from kvfence.engine.clock import command_clock
    from kvfence.engine.interrupt import signals_interrupt

    child = boundary.enter_child()
    prog = boundary.child_prog(prog) if child else prog  # a child's lines spell what the user typed
    # In a boundary child the user's signal (passed on by the parent) is told from a contract's KeyboardInterrupt.
    with command_clock(), (signals_interrupt() if child else contextlib.nullcontext()):
        code = _run(argv, prog, child)
    boundary.report({"exit": code})  # a child's status, once the command returned (kvfence.engine.boundary)
    return code


def _plugin_contracts(args) -> List[str]:
    """The contracts the command is about that are not kvfence's own (their code runs in a child); when none is
    but the command names a sizing plug-in (``--sizing file.py:attr``, user code called for every config drawn),
    the contract it sizes: the command runs in a child all the same."""
    from kvfence.engine.boundary_parent import foreign
    from kvfence.engine.kernels import is_plugin
    from kvfence.engine.registry import default_name

    module = next((m for m in COMMANDS if getattr(m, "contracts_of", None) and args.func.__module__ == m.__name__),
                  None)
    names = module.contracts_of(args) if module is not None else []
    plugins = foreign(names)
    if not plugins and is_plugin(getattr(args, "sizing", None)):
        plugins = [next((n for n in names if isinstance(n, str)), None) or default_name()]
    return plugins


def _os_error(exc: OSError) -> str:
    """One line for an ``OSError``: the path(s) it names, what the system said and its errno."""
    import errno

    name = errno.errorcode.get(exc.errno, f"errno {exc.errno}") if exc.errno else type(exc).__name__
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    return f"{paths or type(exc).__name__}: {exc.strerror or exc} ({name})"


def _run(argv: Optional[List[str]], prog: str, child: bool = False) -> int:
    args = None
    try:
        words = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser(prog, words, child=child)
        deferred = deferred_contract(words, _DECLARING_NAMES, child)
        if deferred:  # a plug-in's flags are known only in the child that loads it: it parses the command line
            from kvfence.engine.boundary_parent import run_command

            known, _ = parser.parse_known_args([w for w in words if w not in ("-h", "--help")])
            return run_command(words, [deferred], _stderr, getattr(known, "max_seconds", None), prog)
        try:
            args = parse_command_line(parser, words)
        except SystemExit as exc:  # --help printed (argparse's errors are BadInput): a status a boundary child reports
            return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
        if args.command is None:
            # No command: the command list, on stderr with exit 2 so a script that lost its arguments
            # does not pass silently.
            parser.print_help(sys.stderr)
            return EXIT_BAD_INPUT
        plugins = [] if child else _plugin_contracts(args)
        if plugins:  # a plug-in contract's code cannot end, pass or hide this command (kvfence.engine.boundary)
            from kvfence.engine.boundary_parent import run_command

            return run_command(list(sys.argv[1:] if argv is None else argv), plugins, _stderr,
                               getattr(args, "max_seconds", None), prog)
        if not child:
            return args.func(args)
        return _run_as_child(args)
    except BadInput as exc:
        _stderr(f"kvfence: error: {exc}")
        return EXIT_BAD_INPUT
    except OSError as exc:  # a write no command turned into its own line (a full disk, a read-only folder)
        _stderr(f"kvfence: error: {_os_error(exc)}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:  # kvfence.engine.interrupt.Interrupted carries SIGTERM's 143
        if args is None:  # the command modules still importing or the parser: as kvfence.__main__ says it
            _stderr("kvfence: interrupted while starting (no command ran; nothing was written)")
            return 130
        _stderr("kvfence: interrupted")
        return getattr(exc, "exit_code", 130)


def _run_as_child(args) -> int:
    """The command in a boundary child (kvfence.engine.boundary): what escapes it is the contract's, one line."""
    from kvfence.engine.boundary import refusal, unexpected
    from kvfence.engine.interrupt import Interrupted, pending

    try:
        return args.func(args)
    except BadInput as exc:
        _stderr(f"kvfence: error: {refusal(exc)}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted) or pending() is not None:
            raise
        _stderr(f"kvfence: error: {unexpected(KeyboardInterrupt('no signal came'))}")
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - a plug-in contract's failure, or what it returned
        _stderr(f"kvfence: error: {unexpected(exc)}")
        return EXIT_BAD_INPUT
