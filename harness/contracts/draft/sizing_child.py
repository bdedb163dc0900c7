"""The child that runs a sizing plug-in's callable (``python -m kvfence.contracts.draft.sizing_child SPEC PID SHOWN``).

``kvfence.contracts.draft.targets.IsolatedSizing`` starts it and sends one JSON line per call; it answers each with
``{"width": W}`` or ``{"bad_input": why}`` on the stdout it saved, pointing the plug-in's own prints at
stderr. It ignores SIGINT (a Ctrl-C is the run's to handle) and dies with its parent.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Dict, Optional

from kvfence.contracts.draft.targets import resolve_sizing
from kvfence.engine.worker import IN_WORKER_ENV
from kvfence.errors import BadInput


def _die_with(parent: Optional[int]) -> None:
    """Be killed when ``parent`` dies (Linux ``PR_SET_PDEATHSIG``), even while a hung plug-in call keeps
    this process from reading stdin's end; exit now if it is already gone."""
    if parent is None:
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # no such call here: stdin's end is the only guard
    if os.getppid() != parent:
        os._exit(0)


def main(argv=None) -> None:
    """The child: resolve the plug-in here, then answer one JSON line per call on the saved stdout."""
    os.environ[IN_WORKER_ENV] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the run's to handle; stdin's end ends this
    args = argv if argv is not None else sys.argv[1:]
    spec = args[0]
    _die_with(int(args[1]) if len(args) > 1 else None)
    shown = args[2] if len(args) > 2 else spec  # the spec as the user gave it (spec: its file made absolute)

    def said(text: str) -> str:
        return text.replace(repr(spec), repr(shown))
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the plug-in's prints go to stderr, not into the answers
    try:
        policy = resolve_sizing(spec)
    except BadInput as exc:
        policy, refused = None, said(str(exc))
    for line in sys.stdin:
        if policy is None:
            answer: Dict[str, object] = {"bad_input": refused}
        else:
            n, topk, ctx, num_steps, window = json.loads(line)
            try:
                answer = {"width": policy(n, topk, ctx, num_steps, **window)}
            except BadInput as exc:
                answer = {"bad_input": said(str(exc))}
            except KeyboardInterrupt:  # raised by the plug-in, not a Ctrl-C (this process ignores SIGINT)
                answer = {"bad_input": f"sizing {shown!r} raised KeyboardInterrupt when called for n={n}, "
                                       f"topk={topk}, ctx={ctx}, num_steps={num_steps}"}
        protocol.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
