"""Launcher plug-ins that kill, hang or exit the process that launches them (tests/test_worker.py).

Each takes the ``kvfence.contracts.draft.targets.LAUNCH_KWARGS`` keyword arguments. ``misbehave`` and the ``*_on_3``
variants run the reference kernel except for batches whose first request has a given length, so a
test can tell the guilty case from its neighbours in one ``check_many`` list.
"""

import ctypes
import os
import sys
import time

from kvfence.kernels.draft.draft_kv_indices import generate_draft_decode_kv_indices, launch

#: The first request length that triggers the ``*_on_3`` launchers.
TRIGGER = 3


def _reference(**kw):
    launch(generate_draft_decode_kv_indices, **kw)


def segfault(**kw):
    """Reads address 0: SIGSEGV, a real one."""
    ctypes.string_at(0)


def abort(**kw):
    os.abort()


def spin(**kw):
    """Never returns (a kernel whose loop bound is wrong)."""
    while True:
        time.sleep(0.01)


def exit_zero(**kw):
    """``sys.exit(0)`` from the launch: must not end a run as if it were clean."""
    sys.exit(0)


def hard_exit(**kw):
    """``os._exit(0)``: the process vanishes without a signal."""
    os._exit(0)


def exit_on_launch(**kw):
    sys.exit(3)


def _first_len(kw) -> int:
    return int(kw["seq_lens"][0])


#: What ``misbehave`` does for a batch whose first request has this length (other lengths: the reference).
MISBEHAVIOUR = {2: spin, 3: segfault, 4: abort, 5: exit_on_launch, 6: hard_exit}


def misbehave(**kw):
    """One plug-in for every way of dying, chosen by the first request's length (``MISBEHAVIOUR``)."""
    MISBEHAVIOUR.get(_first_len(kw), _reference)(**kw)


def segfault_on_3(**kw):
    if _first_len(kw) == TRIGGER:
        ctypes.string_at(0)
    _reference(**kw)


def noisy_abort_on_3(**kw):
    """Prints to stdout and stderr on every launch and, for the trigger length, writes the kind of text a
    dying CUDA context leaves (C++'s ``terminate called ...``) to stderr, then aborts."""
    print(f"launch of {len(kw['seq_lens'])} request(s)", flush=True)
    if _first_len(kw) == TRIGGER:
        sys.stderr.write("terminate called after throwing an instance of 'c10::Error'\n  what():  CUDA error\n")
        sys.stderr.flush()
        os.abort()
    _reference(**kw)


def spin_on_3(**kw):
    if _first_len(kw) == TRIGGER:
        spin()
    _reference(**kw)


def exit_on_3(**kw):
    if _first_len(kw) == TRIGGER:
        sys.exit(3)
    _reference(**kw)


def slow_wrong(**kw):
    """A wrong value whenever a request is longer than 1, slowly: a run is still shrinking such a
    failure (token seed, pool rows, lengths) when a test signals it. Appends a byte to the file named
    by ``KVFENCE_TEST_MARKER`` for each failing launch."""
    _reference(**kw)
    if int(kw["seq_lens"].max()) > 1:
        kw["kv_indices"][0, 0] = 777_777
        marker = os.environ.get("KVFENCE_TEST_MARKER")
        if marker:
            with open(marker, "a") as fh:
                fh.write("x")
        time.sleep(0.3)


def crash_or_wrong(**kw):
    """Two bugs in one launcher (``fuzz --keep-going`` must find both): a segfault for page size 64
    when a request is longer than 1, a wrong value for page sizes up to 4 when a request is longer
    than 2; the reference kernel otherwise."""
    page_size, longest = int(kw["page_size"]), int(kw["seq_lens"].max())
    if page_size == 64 and longest > 1:
        ctypes.string_at(0)
    _reference(**kw)
    if page_size <= 4 and longest > 2:
        kw["kv_indices"][0, 0] = 777_777
