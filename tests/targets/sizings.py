"""Sizing plug-ins that return what no row width may be (tests/test_bad_input.py)."""


def as_bool(n, topk, ctx, num_steps):
    return True


def as_float(n, topk, ctx, num_steps):
    return n * topk * (ctx + num_steps) * 1.5


def huge(n, topk, ctx, num_steps):
    return 10**30


def exits(n, topk, ctx, num_steps):
    raise SystemExit(0)


def hangs_past_one_request(n, topk, ctx, num_steps):
    """Correct for one request (the parent's up-front probe), then never returns: a hung job."""
    import time

    while n > 1:
        time.sleep(1)
    return n * topk * (ctx + num_steps)
