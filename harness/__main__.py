"""``python -m kvfence`` and the ``kvfence`` console script start here (see ``kvfence.cli``).

A Ctrl-C while Python is still importing kvfence's modules (the first ~0.2 s, before any command has set
its signal handling) ends the process with exit 130 and one line, not a ``KeyboardInterrupt`` traceback:
no command has run then, so nothing was written.
"""

import sys


def main(argv=None, prog: str = "kvfence") -> int:
    try:
        from kvfence.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("kvfence: interrupted while starting (no command ran; nothing was written)\n")
        return 130
    return run(argv, prog)


if __name__ == "__main__":
    sys.exit(main(prog="python -m kvfence"))
