"""Sizing plug-ins that answer a few calls, then end their process or hang (tests/test_plugin_safety.py)."""

import os
import time

CALLS = [0]


def exits_later(n, topk, ctx, num_steps):
    CALLS[0] += 1
    if CALLS[0] > 3:
        os._exit(0)
    return n * topk * (ctx + num_steps)


def hangs_later(n, topk, ctx, num_steps):
    CALLS[0] += 1
    if CALLS[0] > 3:
        time.sleep(3600)
    return n * topk * (ctx + num_steps)
