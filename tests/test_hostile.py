"""Hostile data and odd faults (issue 24): each probe class stays fixed.

Every probe is bad input or a fault that must end as one line on stderr and exit 2 (never a traceback,
never a silent pass), or a wrong result that must now be right. Most run the CLI in this process
(``kvfence.cli.main``) for speed; process-level faults (signals, workers, plug-ins that kill their
process) run real processes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from kvfence import cli
from kvfence.errors import BadInput, printable, redact, redact_word

ROOT = Path(__file__).resolve().parent.parent


def one_line_exit_2(capsys, argv, needle):
    """Run the CLI in this process: exit 2 and one ``kvfence: error:`` line naming ``needle``."""
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("kvfence: error:") and needle in lines[0], lines[0]
    return lines[0]


# -- secrets ----------------------------------------------------------------------------------------------
PASSWORDS = ["hunter2", "pw/with/slashes", "p@ss#word", "a:b/c?d"]


@pytest.mark.parametrize("password", PASSWORDS)
def test_url_credentials_are_redacted_however_the_password_is_spelled(password):
    url = f"redis://:{password}@db.example:6399/3"
    assert password not in redact(f"see {url} now") and "db.example:6399/3" in redact(url)
    assert password not in redact_word(url) and redact_word(url).endswith("@db.example:6399/3")
    assert redact("no url here: a@b") == "no url here: a@b"


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_bad_redis_url_message_never_holds_the_password(capsys, tmp_path, password):
    line = one_line_exit_2(capsys, ["fuzz", "--device", "cpu", "--out", tmp_path / "o", "--database",
                                    f"redis://:{password}@host:63x9/0"], "port")
    assert password not in line and "***" in line


def test_a_password_with_a_slash_is_parsed_as_a_password():
    from kvfence.workflow.campaign import parse_database

    spec = parse_database("redis://:pw/x@host:6399/2")
    assert (spec.host, spec.port, spec.db, spec.password) == ("host", 6399, 2, "pw/x")
    assert "pw" not in spec.display


def test_the_password_can_come_from_the_environment(monkeypatch):
    from kvfence.workflow.campaign import REDIS_PASSWORD_ENV, parse_database

    monkeypatch.setenv(REDIS_PASSWORD_ENV, "from-env")
    assert parse_database("redis://host:6399/0").password == "from-env"
    assert parse_database("redis://:in-url@host:6399/0").password == "in-url"
    monkeypatch.delenv(REDIS_PASSWORD_ENV)
    assert parse_database("redis://host:6399/0").password is None


def test_the_lock_record_keeps_no_password(tmp_path, monkeypatch):
    from kvfence.workflow import outlock

    monkeypatch.setattr(sys, "argv", ["kvfence", "fuzz", "--database", "redis://:se/cret@h:1/0", "--out", "x"])
    outlock.acquire(tmp_path, announce=lambda line: None)
    try:
        text = (tmp_path / outlock.LOCK_NAME).read_text()
        assert "se/cret" not in text and "redis://***@h:1/0" in text
        assert (tmp_path / outlock.LOCK_NAME).stat().st_mode & 0o077 == 0
    finally:
        outlock.release_all()


def test_bad_input_messages_carry_no_terminal_escapes():
    assert "\x1b" not in str(BadInput("host \x1b[2J\x1b]0;pwned\x07 here"))
    assert printable("a\x1bb\nc") == "a\\x1bb\\nc"


def test_a_redis_that_accepts_and_never_answers_times_out_on_time(monkeypatch):
    from kvfence.workflow import campaign

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    monkeypatch.setattr(campaign, "REDIS_TIMEOUT_S", 0.5)
    start = time.monotonic()
    with pytest.raises(BadInput, match="cannot reach Redis"):
        campaign.open_database(campaign.parse_database(f"redis://127.0.0.1:{server.getsockname()[1]}/0"))
    assert time.monotonic() - start < 3 * 0.5 + 1
    server.close()
