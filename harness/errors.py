"""The one exception type for bad input, and the exit codes every command uses."""

from __future__ import annotations

#: No finding.
EXIT_CLEAN = 0
#: At least one finding (or a case that reproduces).
EXIT_FINDINGS = 1
#: Bad input or an unusable environment: malformed case file, unknown kernel, impossible config,
#: missing GPU or tool. Always a one-line message on stderr, never a traceback.
EXIT_BAD_INPUT = 2


class BadInput(ValueError):
    """Input kvfence refuses to run: the message is one line that names the problem."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str):
        # One line, whatever the caller passed: the CLI prints exactly this.
        super().__init__(" ".join(str(message).split()))


def require(condition: bool, message: str) -> None:
    """Raise ``BadInput(message)`` unless ``condition`` holds (argument validation, Hypothesis-style)."""
    if not condition:
        raise BadInput(message)
