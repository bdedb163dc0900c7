"""A launcher that behaves by ``--jobs`` job: in job 0 it writes nothing (every case a ``MISSING_WRITE``),
in the other jobs it sleeps ``SLEEP_S`` before launching the reference kernel (one long check, as a large
config compiling on a shared GPU is). Which job it runs in is read from the checking worker's parent's
command line (``--out OUT/jobs/job-N``)."""

import os
import time

from kvfence.kernels.draft.draft_kv_indices import generate_draft_decode_kv_indices, launch

SLEEP_S = 120.0


def _job() -> str:
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
        words = fh.read().split(b"\0")
    for word in words:
        if b"/jobs/job-" in word:
            return word.rsplit(b"/jobs/job-", 1)[1].split(b"/")[0].decode()
    return "?"


def wrong_in_job_0_slow_elsewhere(**kw):
    if _job() == "0":
        return  # no store at all
    time.sleep(SLEEP_S)
    launch(generate_draft_decode_kv_indices, **kw)
