"""``python -m kvfence``: see ``kvfence.cli``. Usage lines name it ``python -m kvfence``."""

import sys

from kvfence.cli import main

sys.exit(main(prog="python -m kvfence"))
