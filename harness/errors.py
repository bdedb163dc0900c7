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
        # One line, whatever the caller passed, and no URL credential: the CLI prints exactly this.
        super().__init__(printable(redact(" ".join(str(message).split())), limit=None))


def require(condition: object, message: str) -> None:
    """Raise ``BadInput(message)`` unless ``condition`` holds (argument validation, Hypothesis-style)."""
    if not condition:
        raise BadInput(message)


_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***`` (``redis://***@host:6379/0``).
    Every message, record and file that may quote a command-line value goes through this.

    A URL is ``scheme://`` (a letter, then letters, digits, ``+ . -``) and its userinfo everything up to the
    last ``@`` of the same whitespace-free word (a password may hold ``/``, ``:``, ``@`` or ``#`` when the
    user did not percent-encode it). One left-to-right pass: linear in the text, whatever it holds."""
    text = str(text)
    out, pos, n = [], 0, len(text)
    end, last_at = -1, -1  # the word holding the last ``://`` seen: where it ends, and its last ``@``
    while True:
        mark = text.find("://", pos)
        if mark < 0:
            break
        start = mark
        while start > pos and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        while start < mark and not text[start].isalpha():  # a scheme begins with a letter
            start += 1
        if mark >= end:
            # A new word: its end and last ``@`` are found once, however many ``://`` it holds (scanning
            # the rest of the word again for each would make a long word of them quadratic).
            end = mark + 3
            while end < n and not text[end].isspace():
                end += 1
            last_at = text.rfind("@", mark + 3, end)
        at = last_at if last_at >= mark + 3 else -1
        if start < mark and at >= 0:
            out.append(text[pos:mark + 3] + "***")
            pos = at
        else:
            out.append(text[pos:mark + 3])
            pos = mark + 3
    out.append(text[pos:])
    return "".join(out)


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
