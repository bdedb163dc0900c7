"""``python -m harness``: see ``harness.cli``. Usage lines name it ``python -m harness``."""

import sys

from harness.cli import main

sys.exit(main(prog="python -m harness"))
