"""The reference documents the tests check against, shipped in this folder.

`document(name)` is the one way tests open them: a missing file is an error
naming the file and this folder's README, never a skip, because every file
here ships with the repository.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def document(name: str) -> Path:
    """The path of reference document `name`; raises if the repository lacks it."""
    path = FOLDER / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the reference documents ship with the repository "
            f"(see {FOLDER / 'README.md'}); restore it with `git checkout -- tests/reference`"
        )
    return path
