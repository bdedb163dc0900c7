"""A sizing plug-in's callable runs in a process of its own, so what it does cannot end the caller's.

``--sizing file.py:attr`` (and ``check_kernel(sizing=...)``, ``--kvfence-sizing``) is user code that the
strategies call for every config they draw. Called in the fuzzing process (or in the user's pytest), an
``os._exit(0)`` there would end the run with exit 0 and no output: a silent pass in CI. So, outside the
processes where a plug-in's death is already handled (the checking worker, where it is the case's
``CRASH``, and this module's own child), ``resolve_sizing`` returns an ``IsolatedSizing``: each distinct call
goes to one child process (``python -m kvfence.cases.sizing_child SPEC``) over a pipe, as plain JSON. A child
that exits, dies of a signal or does not answer within ``CALL_TIMEOUT_S`` is ``BadInput`` naming the call:
one line and exit 2, never a silent pass or a hang. The child's stdout is the protocol, so it points the
plug-in's own prints at stderr.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from typing import Dict, Optional, Tuple

from kvfence.errors import BadInput

#: Seconds one call of a sizing plug-in may take (a width is arithmetic: this is a hang, not slowness).
CALL_TIMEOUT_S = 30.0
#: Set (to "1") in the processes that call a sizing plug-in themselves: the checking worker and the child.
IN_PROCESS_ENV = "KVFENCE_SIZING_IN_PROCESS"


def in_process() -> bool:
    return os.environ.get(IN_PROCESS_ENV) == "1"


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"died of {signal.Signals(-code).name}"
        except ValueError:
            return f"died of signal {-code}"
    return f"ended its process (exit code {code})"


class IsolatedSizing:
    """``(n, topk, ctx, num_steps, **window) -> width`` of the plug-in ``spec``, computed in a child process
    started on the first call and kept for the next; answers are kept per distinct call."""

    def __init__(self, spec: str, timeout_s: float = CALL_TIMEOUT_S):
        self.spec, self.timeout_s = spec, timeout_s
        self._proc: Optional[subprocess.Popen] = None
        self._answers: Dict[Tuple, int] = {}

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, **{IN_PROCESS_ENV: "1"})
        return subprocess.Popen([sys.executable, "-m", "kvfence.cases.sizing_child", self.spec, str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env=env, text=True, bufsize=1)

    def _fail(self, call: str, what: str) -> BadInput:
        self.close()
        return BadInput(f"sizing {self.spec!r} {what} when called for {call} (a sizing must return a row width)")

    def __call__(self, n: int, topk: int, ctx: int, num_steps: int, **window) -> int:
        key = (n, topk, ctx, num_steps, tuple(sorted(window.items())))
        if key in self._answers:
            return self._answers[key]
        call = f"n={n}, topk={topk}, ctx={ctx}, num_steps={num_steps}"
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        proc = self._proc
        try:
            proc.stdin.write(json.dumps([n, topk, ctx, num_steps, window]) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._fail(call, _ended(proc.wait())) from None
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
        if not ready:
            raise self._fail(call, f"did not return within {self.timeout_s:g}s")
        line = proc.stdout.readline()
        if not line:
            raise self._fail(call, _ended(proc.wait()))
        try:
            answer = json.loads(line)
        except ValueError:
            raise self._fail(call, "answered something other than a width") from None
        if "bad_input" in answer:
            raise BadInput(str(answer["bad_input"]))
        width = answer.get("width")
        if type(width) is not int:
            raise self._fail(call, "answered something other than a width")
        self._answers[key] = width
        return width

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            self._proc = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


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
    from kvfence.cases.targets import resolve_sizing

    os.environ[IN_PROCESS_ENV] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the run's to handle; stdin's end ends this
    args = argv if argv is not None else sys.argv[1:]
    spec = args[0]
    _die_with(int(args[1]) if len(args) > 1 else None)
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the plug-in's prints go to stderr, not into the answers
    try:
        policy = resolve_sizing(spec)
    except BadInput as exc:
        policy, refused = None, str(exc)
    for line in sys.stdin:
        if policy is None:
            answer = {"bad_input": refused}
        else:
            n, topk, ctx, num_steps, window = json.loads(line)
            try:
                answer = {"width": policy(n, topk, ctx, num_steps, **window)}
            except BadInput as exc:
                answer = {"bad_input": str(exc)}
            except KeyboardInterrupt:  # raised by the plug-in, not a Ctrl-C (this process ignores SIGINT)
                answer = {"bad_input": f"sizing {spec!r} raised KeyboardInterrupt when called for n={n}, "
                                       f"topk={topk}, ctx={ctx}, num_steps={num_steps}"}
        protocol.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
