"""The flags a contract declares (``kvfence.contract.Option``) on the commands that take them (``fuzz``,
``campaign``): which contract a command line names, its declared options, and the parse that refuses a flag the
contract does not declare in one line.

argparse knows a command's flags before it parses; a contract's are known once the contract is, so the command
line is read twice: ``of_command_line`` finds ``--contract NAME`` (the default contract without it) and loads that
record's options, then the parser built with them parses everything. A contract not of kvfence's own is loaded only
in the boundary child that runs the command (``kvfence.engine.boundary``): the parent hands the whole command line
over unparsed (``deferred``).
"""

from __future__ import annotations

import argparse
from typing import List, Optional, Sequence, Tuple

from kvfence.contract import Option
from kvfence.engine import registry
from kvfence.errors import BadInput

_FLAG = "--contract"
#: The shortest abbreviation of ``--contract`` argparse takes (``--co`` and ``--c`` are ambiguous on fuzz).
_SHORTEST = "--con"


def _names_contract(word: str) -> bool:
    flag = word.split("=", 1)[0]
    return len(flag) >= len(_SHORTEST) and _FLAG.startswith(flag)


def named(words: Sequence[str]) -> str:
    """The contract ``--contract`` names in ``words`` (its last one, as argparse takes it), else the default."""
    name = registry.default_name()
    for i, word in enumerate(words):
        if _names_contract(word):
            if "=" in word:
                name = word.split("=", 1)[1]
            elif i + 1 < len(words):
                name = words[i + 1]
    return name


def _command(words: Optional[Sequence[str]], commands: Sequence[str]) -> Optional[str]:
    return words[0] if words and words[0] in commands else None


def of_command_line(words: Optional[Sequence[str]], commands: Sequence[str],
                    child: bool) -> Tuple[str, Tuple[Option, ...]]:
    """``(contract, its declared options)`` for the command ``words`` run (without ``words``: the default
    contract's, for the reference and the tests). No options where the command takes none, the name is no
    registered contract (the parser refuses it) or the contract is a plug-in and this is no boundary child."""
    if words is None:
        name = registry.default_name()
        return name, tuple(registry.get(name).options)
    name = named(words[1:])
    if _command(words, commands) is None or name not in registry.names():
        return name, ()
    if not child and not registry.builtin(name):
        return name, ()
    return name, tuple(registry.get(name).options)


def deferred(words: Sequence[str], commands: Sequence[str], child: bool) -> Optional[str]:
    """The plug-in contract whose child must parse ``words`` (its flags are known only where it is loaded)."""
    if child or _command(words, commands) is None:
        return None
    name = named(words[1:])
    return name if name in registry.names() and not registry.builtin(name) else None


def parse(parser: argparse.ArgumentParser, words: List[str]) -> argparse.Namespace:
    """``words`` parsed; a flag the command's contract does not declare is one line naming the contract."""
    args, extra = parser.parse_known_args(words)
    if not extra:
        return args
    options = getattr(args, "declared_options", None)
    flags = [w.split("=", 1)[0] for w in extra if w.startswith("--")]
    if options is not None and flags:
        raise BadInput(f"{args.command}: --contract {args.contract} takes no {', '.join(flags)} (its options: "
                       f"{', '.join(o.flag for o in options) or 'none'}; "
                       f"'kvfence {args.command} --contract {args.contract} --help' lists them)")
    parser.error(f"unrecognized arguments: {' '.join(extra)}")
    raise AssertionError("parser.error returns no value")  # pragma: no cover - _Parser.error raises
