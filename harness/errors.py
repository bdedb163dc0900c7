"""The one exception type for bad input, and the exit codes every command uses."""

from __future__ import annotations

import re

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
        # One line, whatever the caller passed, and no URL credential: the CLI prints exactly this.
        super().__init__(printable(redact(" ".join(str(message).split())), limit=None))


def require(condition: bool, message: str) -> None:
    """Raise ``BadInput(message)`` unless ``condition`` holds (argument validation, Hypothesis-style)."""
    if not condition:
        raise BadInput(message)


#: ``scheme://`` then everything up to the last ``@`` of the word: the userinfo, however it is spelled
#: (a password may hold ``/``, ``:``, ``@`` or ``#`` when the user did not percent-encode it).
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)\S*@")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***`` (``redis://***@host:6379/0``).
    Every message, record and file that may quote a command-line value goes through this."""
    return _URL_USERINFO.sub(r"\1***@", str(text))


def redact_word(word: str) -> str:
    """One command-line value with its URL credentials replaced by ``***``; unlike ``redact`` it also
    covers a password holding spaces (the value is one word however it is spelled)."""
    word = str(word)
    start = word.find("://")
    at = word.rfind("@")
    return word if start < 0 or at < start else word[:start + 3] + "***" + word[at:]


def printable(value, limit: int | None = 200) -> str:
    """``value`` as text safe for one terminal line: control characters (escape codes, newlines) shown
    as ``\\x1b``-style escapes, and at most ``limit`` characters (hostile records can be long)."""
    text = "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in str(value))
    return text if limit is None or len(text) <= limit else text[:limit] + "..."
