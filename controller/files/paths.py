"""Paths as clients send them and as the runner's file system takes them. Pure.

Paths travel to the runner as bytes, never through a command line: a name may
hold any byte but NUL, and Nomad's exec request carries the command as JSON
text, which cannot hold bytes that are not UTF-8. In the API, such bytes are
the lone surrogates U+DC80–U+DCFF (Python's `surrogateescape`): that is how a
listing names them and how a request gives them back.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

# Longer than Linux's PATH_MAX (4,096 bytes) cannot name anything.
MAX_PATH_BYTES = 4096


class BadPath(ValueError):
    """A path no file system takes; the message says why."""


def to_bytes(path: str) -> bytes:
    """The path's bytes; BadPath when it holds NUL or a surrogate that stands
    for no byte."""
    if "\0" in path:
        raise BadPath("contains a NUL character, which no file name can hold")
    try:
        raw = path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise BadPath("contains a lone surrogate that stands for no byte") from None
    if len(raw) > MAX_PATH_BYTES:
        raise BadPath(f"is longer than {MAX_PATH_BYTES} bytes")
    return raw


def from_bytes(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def clean(path: str) -> str:
    """Go's `path.Clean`, which Poseidon applies to the names in its archive:
    `a//b/./c/..` is `a/b`, `./x` is `x`, `/..` is `/`."""
    cleaned = posixpath.normpath(path)
    # POSIX keeps a leading `//`; Go (and so Poseidon) does not.
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def split(path: str) -> tuple[str, str]:
    """(parent directory, last component) of a cleaned path: `a/b` is
    (`a`, `b`), `b` is (`.`, `b`), `/b` is (`/`, `b`), `.` is (`.`, `.`)."""
    parent, slash, name = path.rpartition("/")
    if not slash:
        return ".", name
    return parent or "/", name or "."


def ancestors(path: str) -> Iterator[str]:
    """The directories above a cleaned path, nearest last (`a/b/c`: `a`,
    `a/b`); not `/` and not `.`, which always exist."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent not in ("", "."):
            yield parent


@dataclass(frozen=True)
class Clash:
    """Two items of one request that cannot both be: `file` is copied as a
    file, and `directory` needs it to be a directory."""

    file: int  # the index of the copy item
    directory: int


def clashes(items: Iterable[tuple[str, bool]]) -> Clash | None:
    """The first clash among copy items given as (cleaned path, is a
    directory), or None. A later copy of the same file simply replaces an
    earlier one, as tar does."""
    files: dict[str, int] = {}
    directories: dict[str, int] = {}
    for index, (path, is_dir) in enumerate(items):
        needed = [*ancestors(path), path] if is_dir else list(ancestors(path))
        for directory in needed:
            if directory in files:
                return Clash(files[directory], index)
            directories.setdefault(directory, index)
        if not is_dir:
            if path in directories:
                return Clash(index, directories[path])
            files[path] = index
    return None
