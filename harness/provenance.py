"""Which code wrote a results file: the ``code`` stamp every JSON writer of measurements adds.

A figure is only as true as the code it names. The stamp holds the commit the writer believed it ran
(``KVFENCE_CODE_COMMIT`` where the checkout has no git history, as on a lent GPU machine, else ``git rev-parse
HEAD``) and a digest of the source it actually ran. The digest is computed the way git names file contents (a
blob id per file), so a checker can recompute it from the commit alone (``digest_of_commit``): a stamp whose
digest differs from its commit's was written by an uncommitted tree, and says so by not matching.

Only a source checkout has a digest; an installed wheel stamps ``{"commit": null, "digest": null}`` and says why.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Iterable, Optional, Tuple

# The code a measurement can depend on: the package, the benchmark scripts that write results files, and the
# planted kernels the benchmarks load from tests/targets. Tests and docs do not change a measured figure.
SOURCE_FOLDERS = ("harness", "kernels", "strategies", "reports", "benchmarks", "tests/targets")
SOURCE_SUFFIXES = (".py", ".sh")
_SKIPPED_PARTS = ("__pycache__",)
_SKIPPED_PREFIXES = ("reports/out/",)
COMMIT_VARIABLE = "KVFENCE_CODE_COMMIT"


def _counted(path: str) -> bool:
    return (path.endswith(SOURCE_SUFFIXES) and not path.startswith(_SKIPPED_PREFIXES)
            and not any(part in _SKIPPED_PARTS for part in path.split("/")))


def blob_id(content: bytes) -> str:
    """git's name for a file's contents (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def digest(entries: Iterable[Tuple[str, str]]) -> str:
    """The digest of ``(repository path, blob id)`` pairs: the counted ones, in path order."""
    lines = sorted(f"{path}\0{blob}\n" for path, blob in entries if _counted(path))
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def source_root() -> Optional[Path]:
    """The repository this kvfence runs from, or None for an installed package (no source checkout)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "harness" / "provenance.py").is_file() else None


def _skipped_folder(rel: str) -> bool:
    """A folder the digest never walks: ``__pycache__``, and ``reports/out/``, where every run writes its
    outputs and other runs delete theirs while this one reads."""
    return rel.rsplit("/", 1)[-1] in _SKIPPED_PARTS or (rel + "/").startswith(_SKIPPED_PREFIXES)


def digest_of_tree(root: Path) -> str:
    """The digest of the source files on disk under ``root`` (what this process runs). Every results file and
    run summary is stamped with it, so the walk stays out of skipped folders (its time does not grow with the
    outputs beside the source) and passes over a folder that vanishes under it (``os.walk`` skips what it
    cannot list): a stamp must never end a run before its summary is written."""
    entries = []
    for folder in SOURCE_FOLDERS:
        for here, folders, files in os.walk(root / folder):
            rel_here = Path(here).relative_to(root).as_posix()
            folders[:] = [f for f in folders if not _skipped_folder(f"{rel_here}/{f}")]
            for name in files:
                rel, path = f"{rel_here}/{name}", Path(here) / name
                if _counted(rel) and path.is_file():
                    entries.append((rel, blob_id(path.read_bytes())))
    return digest(entries)


def digest_of_commit(root: Path, commit: str) -> str:
    """The digest of the same files at ``commit``, read from git (raises CalledProcessError for an unknown one)."""
    listing = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "--full-tree", commit, "--", *SOURCE_FOLDERS],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    entries = []
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob":
            entries.append((path, blob))
    return digest(entries)


def _head_commit(root: Path) -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def code_stamp() -> dict:
    """``{"commit", "digest"}`` of the code this process runs (BENCHMARKS.md: which code wrote a figure)."""
    root = source_root()
    if root is None:
        return {"commit": None, "digest": None, "note": "an installed package, not a source checkout"}
    commit = os.environ.get(COMMIT_VARIABLE) or _head_commit(root)
    return {"commit": commit, "digest": digest_of_tree(root)}


def stamped(doc: dict) -> dict:
    """``doc`` with its ``code`` stamp (a copy; the stamp goes last, after the measurements)."""
    return {**{k: v for k, v in doc.items() if k != "code"}, "code": code_stamp()}
