"""Type-check the package ``kvfence`` with mypy, configured in pyproject.toml ([tool.mypy]).

The repository keeps the project's layout (harness/ is ``kvfence``; kernels/, strategies/ and reports/ are
``kvfence.kernels`` etc.) and the packaging maps it (``[tool.setuptools] package-dir``), so mypy cannot check the
tree by path: this builds the import tree the packaging makes, as symbolic links in a temporary folder, from the
same package-dir table, and runs mypy on the package there. The cache stays in .mypy_cache/ of the checkout.

    python .ci/typecheck.py                 # the package; exits with mypy's status (0: no error)
    python .ci/typecheck.py --tree DIR      # only builds the import tree in DIR (for a test that checks plug-ins)
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kvfence"


def build_tree(into: Path) -> Path:
    """Link the checkout's folders into ``into/kvfence/...`` as the packaging maps them; returns ``into``."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = into / PACKAGE
    top.mkdir(parents=True)
    for child in sorted((ROOT / package_dir[PACKAGE]).iterdir()):
        if child.name != "__pycache__":
            (top / child.name).symlink_to(child)
    for name, folder in package_dir.items():
        if name != PACKAGE:
            (into / Path(*name.split("."))).symlink_to(ROOT / folder)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, help="only build the import tree in this (new) folder")
    args = parser.parse_args(argv)
    if args.tree is not None:
        build_tree(args.tree)
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvfence-typecheck-") as tmp:
        tree = build_tree(Path(tmp))
        status = subprocess.call(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
             "--cache-dir", str(ROOT / ".mypy_cache"), "-p", PACKAGE],
            cwd=tree)
    print(f"typecheck: mypy on {PACKAGE} took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
