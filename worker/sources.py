"""Which files a local data source reads, and whether each lies inside the allowed data roots.

Torch-free: the service checks a submitted source with these (service/policy.py) and the worker checks
again when it reads (worker/data.py), with the same selection of files and the same rule:

* every file is resolved (symlinks followed) and must lie inside one of the roots, so a symlinked file
  or folder inside a root that points outside it is refused;
* the refusal is the same whether the target outside exists or not (no existence oracle);
* roots come from `SWEEPS_DATA_ROOTS` (comma-separated folders) when the worker runs for the service;
  with the variable unset (`sweeps run`, `python -m worker`) every path is allowed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "ROOTS_ENV",
    "TEXT_SUFFIXES",
    "OutsideRoots",
    "TooManyEntries",
    "all_files",
    "candidate_files",
    "is_inside",
    "outside",
    "roots_from_env",
    "text_files",
]

ROOTS_ENV = "SWEEPS_DATA_ROOTS"
TEXT_SUFFIXES = (".txt", ".md")


class OutsideRoots(ValueError):
    """A path that resolves outside every allowed data root."""


class TooManyEntries(ValueError):
    """A folder holds more entries than the caller is willing to look at."""


def roots_from_env() -> list[Path] | None:
    """The allowed data roots of this process: None (no restriction) when SWEEPS_DATA_ROOTS is unset;
    set but empty, no local path is allowed."""
    from worker.settings import WorkerSettings

    return WorkerSettings().data_roots


def is_inside(path: Path | str, roots: Sequence[Path]) -> bool:
    """Whether `path`, with every symlink resolved (what a read would open), lies inside one of `roots`
    (themselves resolved). realpath is non-strict: a missing target resolves as far as it exists, so the
    answer for a path outside the roots does not depend on whether it exists."""
    real = Path(os.path.realpath(path))
    return any(real == root or real.is_relative_to(root) for root in roots)


def _entries(folder: Path, max_entries: int | None) -> Iterator[Path]:
    for seen, entry in enumerate(folder.rglob("*"), start=1):
        if max_entries is not None and seen > max_entries:
            raise TooManyEntries(f"the data source holds more than {max_entries} files and folders")
        yield entry


def candidate_files(folder: Path, max_entries: int | None = None) -> Iterator[Path]:
    """Every entry below `folder` a folder source would read: `*.txt` and `*.md` (any case) whose relative
    path has no hidden part (.git, .venv, ...), regular files and symlinks alike, dangling ones included
    (the caller checks each against the roots before asking whether it is a file). Symlinked folders are
    not entered. Unsorted, lazily; `TooManyEntries` once more than `max_entries` entries of any kind
    were walked (a bound on the work of looking)."""
    for entry in _entries(folder, max_entries):
        if entry.suffix.lower() not in TEXT_SUFFIXES:
            continue
        if any(part.startswith(".") for part in entry.relative_to(folder).parts):
            continue
        if entry.is_symlink() or entry.is_file():
            yield entry


def text_files(folder: Path, roots: Sequence[Path] | None) -> list[Path]:
    """The files a folder source reads, sorted by relative path; `OutsideRoots` when `roots` is given and
    one of them resolves outside it. Dangling symlinks inside the roots are skipped."""
    out = []
    for entry in candidate_files(folder):
        if roots is not None and not is_inside(entry, roots):
            raise outside(entry, folder)
        if entry.is_file():
            out.append(entry)
    return sorted(out, key=lambda f: f.relative_to(folder).as_posix())


def all_files(folder: Path, max_entries: int | None = None) -> Iterator[Path]:
    """Every file and symlink below `folder` (a dataset saved with `save_to_disk` reads any of them);
    `TooManyEntries` as for `candidate_files`."""
    for entry in _entries(folder, max_entries):
        if entry.is_symlink() or entry.is_file():
            yield entry


def outside(entry: Path, folder: Path) -> OutsideRoots:
    rel = entry.relative_to(folder).as_posix()
    rel = rel if len(rel) <= _NAME_CHARS else rel[:_NAME_CHARS] + "..."
    return OutsideRoots(f"{rel!r} in the data source resolves outside the allowed data roots")


_NAME_CHARS = 80  # of a file's relative path in a message
