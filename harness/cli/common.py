"""The argparse pieces the commands share: the parser class (a usage error is one line, exit 2), its help
formatter, exit-code epilogs, value types, output-path checks, the ``--out`` lock, one-line output errors, and
the flag groups: where cases run (fuzz, repro), the kernel, mode and layout flags of fuzz, and the
flags a contract declares (``add_declared_options``).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from kvfence.contract import Option
from kvfence.errors import EXIT_BAD_INPUT, EXIT_CLEAN, EXIT_FINDINGS, BadInput, require

_BAD = "bad input or unusable environment (one line on stderr)"


def _exit_codes(zero: str = "no finding", one: Optional[str] = "findings", two: str = _BAD) -> str:
    """An epilog listing a command's exit codes (``kvfence.errors``)."""
    rows = [(EXIT_CLEAN, zero), (EXIT_FINDINGS, one), (EXIT_BAD_INPUT, two)]
    return "exit codes:\n" + "\n".join(f"  {code}  {text}" for code, text in rows if text)


#: Exit codes shared by every command; a command's epilog may state what 0 and 1 mean for it.
EXIT_CODES = _exit_codes()


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows every option's default.

    ``%(default)s`` is appended unless the help text already says what the default is (options whose
    default is ``None`` describe it in words, e.g. "default: drawn by Hypothesis"); a flag that only
    switches something on says "default: off". The epilog (exit codes) keeps its line breaks.
    """

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2 (no usage dump).

    Every parser (subcommands included, also ones added later) shows defaults in its help and, unless
    it states its own, the shared exit codes in its epilog.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("epilog", EXIT_CODES)
        # The formatter keeps line breaks (for the exit-code list), so long lines are wrapped here.
        for key in ("description", "epilog"):
            if kwargs.get(key):
                kwargs[key] = "\n".join(textwrap.fill(line, 88, break_on_hyphens=False,
                                                      subsequent_indent=" " * (len(line) - len(line.lstrip())))
                                        for line in kwargs[key].splitlines())
        super().__init__(*args, **kwargs)

    def error(self, message):
        # main() prints "kvfence: error: ..."; name only the command after the program (``fuzz: ...``).
        command = self.prog.split("kvfence", 1)[-1].strip()
        raise BadInput(f"{command}: {message}" if command else message)


def _int_at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``, with a one-line error naming ``what`` it must be."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "a non-negative integer")


def _seconds(minimum_exclusive: bool):
    """An argparse type: finite seconds, > 0 (``minimum_exclusive``) or >= 0; NaN and inf are refused."""

    def parse(text: str) -> float:
        import math

        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > 0 if minimum_exclusive else value >= 0)
        if not ok:
            what = "a positive" if minimum_exclusive else "a non-negative"
            raise argparse.ArgumentTypeError(f"expected {what} finite number of seconds, got {text!r}")
        return value

    return parse


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _writable(path: Optional[str], what: str) -> Optional[Path]:
    """Fail before any work if an output path cannot be written (its folder must exist)."""
    if path is None:
        return None
    require(path.strip() != "", f"{what}: empty path (name a file)")  # Path("") would mean the current folder
    p = Path(path)
    require(p.parent.is_dir() if str(p.parent) else True, f"{what} {path}: folder {p.parent} does not exist")
    require(not p.is_dir(), f"{what} {path} is a directory")
    require(not p.exists() or p.is_file(), f"{what} {path}: not a regular file")
    from kvfence.engine.outdir import probe_folder

    probe_folder(p.parent if str(p.parent) else Path("."), what, path)
    return p


def _out_dir(path: str) -> Path:
    """``--out``: must be a folder or not exist yet (created only once all input has been validated)."""
    require(path.strip() != "", "--out: empty path (name a folder)")  # Path("") would mean the current folder
    p = Path(path)
    require(not p.exists() or p.is_dir(), f"--out {path}: exists and is not a directory")
    from kvfence.engine.outdir import probe_folder

    probe_folder(p, "--out", path)
    return p


def _lock_out(out_dir: Path) -> None:
    """Create ``--out`` and hold its lock (kvfence.engine.outlock): a second run into it is refused, exit 2."""
    from kvfence.engine import outlock

    outlock.acquire(out_dir, announce=_stderr)


def _add_worker_args(p: argparse.ArgumentParser) -> None:
    """Where cases run (kvfence.engine.worker): a worker process that may crash or hang, or this process."""
    from kvfence.engine.supervisor import DEFAULT_CASE_TIMEOUT

    p.add_argument("--case-timeout", type=_seconds(True), default=DEFAULT_CASE_TIMEOUT,
                   help="seconds a small case may run before it is a HANG (scaled up by the case's size)")
    p.add_argument("--in-process", action="store_true",
                   help="launch kernels in this process instead of a worker (debugging: a crash ends the run)")


def _add_target_args(p: argparse.ArgumentParser, *, sizing_default: Optional[str] = "safe") -> None:
    p.add_argument("--kernel", default="reference",
                   help="kernel under test: reference (the contract's own; the draft's also reference-blocked), "
                        "mutant:NAME, sglang==VERSION or vllm==VERSION (the release's own, from its wheel), "
                        "package.module:attr or path/file.py:attr")
    p.add_argument("--sizing", default=sizing_default,
                   help="row-width policy, one of the contract's named ones (the draft's: eager, fixed, prefix (the "
                        "pre-fix CUDA-graph policy, W = max_bs*ctx, missing the topk factor), safe, window-fixed / "
                        "window-no-topk (the window rail's), sglang==VERSION:BACKEND, or module:attr / file.py:attr)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="cpu: Triton interpreter; cuda: compiled kernels in CUDA graphs; auto: cuda when present")
    p.add_argument("--no-audit", action="store_true",
                   help="CPU only: turn off the interpreter address audit (OOB_READ/OOB_WRITE; on by default)")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", default="graph", choices=["graph", "eager"],
                   help="graph: buffers sized once at max_bs, batches padded to a capture bucket; "
                        "eager: buffers sized per batch")
    p.add_argument("--layout", default="redzone", choices=["redzone", "production"],
                   help="redzone: a guard after every step row; production: rows contiguous, as upstream")


def _add_contract_arg(p: argparse.ArgumentParser) -> None:
    from kvfence.engine import registry

    p.add_argument("--contract", default=registry.default_name(), choices=registry.names(),
                   help="which kernel contract (a record registered under the entry-point group kvfence.contracts; "
                        "docs/contract.md): the draft kernel, the sliding-window read rail, the page-table "
                        "builders (§9), or another package's; its own flags are listed by "
                        "'kvfence fuzz --contract NAME --help'")


#: What the commands keep in their parsed arguments besides their flags (``set_defaults``): no option's name.
SET_BY_COMMANDS = frozenset({"func", "command", "declared_options", "fuzz_defaults", "campaign_defaults", "run_flags"})


def _option_type(option: Option) -> Callable[[str], object]:
    """An argparse type: ``option.parse``, its one-line refusal as argparse's."""

    def parse(text: str) -> object:
        try:
            return option.parse(text)
        except BadInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = option.type.__name__  # argparse names the type in its "invalid value" line
    return parse


def add_declared_options(p: argparse.ArgumentParser, contract: str, options: Sequence[Option]) -> None:
    """The flags contract ``contract`` declares (``Contract.options``), in a group of their own; a flag that is one
    of the command's own is one line naming both."""
    group = p.add_argument_group(f"contract {contract}'s options",
                                 "declared by the contract (Contract.options); another contract's: "
                                 "--contract NAME --help")
    taken = {a.dest for a in p._actions} | set(p._defaults) | SET_BY_COMMANDS
    for option in options:
        require(option.name not in taken, f"contract {contract!r}: its option {option.flag} would overwrite kvfence's "
                                          f"own {option.name!r} of {p.prog}: rename it")
        try:  # choices=None is argparse's own default: any value
            group.add_argument(option.flag, dest=option.name, type=_option_type(option), default=option.default,
                               help=option.help or "(the contract's)", choices=option.choices)
        except argparse.ArgumentError:
            raise BadInput(f"contract {contract!r}: its option {option.flag} is one of kvfence's own flags of "
                           f"{p.prog}: rename it") from None


def declared_pins(args: argparse.Namespace) -> Dict[str, object]:
    """The declared options given away from their defaults, by the draw field each pins (``RunPlan.pins``)."""
    return {o.key: getattr(args, o.name) for o in args.declared_options if getattr(args, o.name) != o.default}


# -- the flags a contract declares -----------------------------------------------------------------------------
# argparse knows a command's flags before it parses; a contract's are known once the contract is, so the command
# line is read twice: ``declared_options_of`` finds ``--contract NAME`` (the default contract without it) and loads
# that record's options, then the parser built with them parses everything (``parse_command_line``). A contract not
# of kvfence's own is loaded only in the boundary child that runs the command (``kvfence.engine.boundary``): the
# parent hands the whole command line over unparsed (``deferred_contract``).
_FLAG = "--contract"
#: The shortest abbreviation of ``--contract`` argparse takes (``--co`` and ``--c`` are ambiguous on fuzz).
_SHORTEST = "--con"


def _names_contract(word: str) -> bool:
    flag = word.split("=", 1)[0]
    return len(flag) >= len(_SHORTEST) and _FLAG.startswith(flag)


def contract_in_words(words: Sequence[str]) -> str:
    """The contract ``--contract`` names in ``words`` (its last one, as argparse takes it), else the default."""
    from kvfence.engine import registry

    name: str = registry.default_name()
    for i, word in enumerate(words):
        if _names_contract(word):
            if "=" in word:
                name = word.split("=", 1)[1]
            elif i + 1 < len(words):
                name = words[i + 1]
    return name


def _command(words: Optional[Sequence[str]], commands: Sequence[str]) -> Optional[str]:
    return words[0] if words and words[0] in commands else None


def declared_options_of(words: Optional[Sequence[str]], commands: Sequence[str],
                    child: bool) -> Tuple[str, Tuple[Option, ...]]:
    """``(contract, its declared options)`` for the command ``words`` run (without ``words``: the default
    contract's, for the reference and the tests). No options where the command takes none, the name is no
    registered contract (the parser refuses it) or the contract is a plug-in and this is no boundary child."""
    from kvfence.engine import registry

    if words is None:
        name = registry.default_name()
        return name, tuple(registry.get(name).options)
    name = contract_in_words(words[1:])
    if _command(words, commands) is None or name not in registry.names():
        return name, ()
    if not child and not registry.builtin(name):
        return name, ()
    return name, tuple(registry.get(name).options)


def deferred_contract(words: Sequence[str], commands: Sequence[str], child: bool) -> Optional[str]:
    """The plug-in contract whose child must parse ``words`` (its flags are known only where it is loaded)."""
    from kvfence.engine import registry

    if child or _command(words, commands) is None:
        return None
    name = contract_in_words(words[1:])
    return name if name in registry.names() and not registry.builtin(name) else None


def parse_command_line(parser: argparse.ArgumentParser, words: List[str]) -> argparse.Namespace:
    """``words`` parsed; a flag another of kvfence's contracts declares but the command's does not is one line
    naming the command's contract and its options."""
    args, extra = parser.parse_known_args(words)
    if not extra:
        return args
    options = getattr(args, "declared_options", None)
    flags = [w.split("=", 1)[0] for w in extra if w.startswith("--")]
    if options is not None and flags and set(flags) <= _builtin_flags():
        raise BadInput(f"{args.command}: --contract {args.contract} takes no {', '.join(flags)} (its options: "
                       f"{', '.join(o.flag for o in options) or 'none'}; "
                       f"'kvfence {args.command} --contract {args.contract} --help' lists them)")
    parser.error(f"unrecognized arguments: {' '.join(extra)}")
    raise AssertionError("parser.error returns no value")  # pragma: no cover - _Parser.error raises


def _builtin_flags() -> Set[str]:
    """The flags kvfence's own contracts declare (read only when a command line has a flag its contract lacks)."""
    from kvfence.engine import registry

    return {o.flag for name in registry.names() if registry.builtin(name) for o in registry.get(name).options}
