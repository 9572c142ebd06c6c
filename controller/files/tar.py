"""The archives a `PATCH /files` extracts in the runner, produced as streams.

Entries as Poseidon writes them, because images and CodeOcean expect them:
directories mode 01777 (sticky, so unprivileged code can create files in
them without deleting others'), files 0744, both owned by root (uid/gid 0).
There is one archive per directory (`segments`): its entries are named by
their last component only, so that tar, extracting in a directory the copy
script entered without following a link, never resolves a path itself (GNU
tar follows a link among a member's parent directories). Bytes that are not
UTF-8 go into the names as the bytes they stand for; long names use GNU
tar's long-name entries (`tarfile`'s GNU format), which every GNU tar reads.
"""

from __future__ import annotations

import dataclasses
import tarfile
from collections.abc import Iterator, Sequence

from controller.files.paths import split
from controller.files.upload import Copy, Upload, content_chunks

DIR_MODE = 0o1777
FILE_MODE = 0o744
BLOCK = tarfile.BLOCKSIZE


@dataclasses.dataclass(frozen=True)
class Segment:
    """The copies whose parent is `directory`, each named by its last component."""

    directory: str
    copies: tuple[Copy, ...]


def segments(upload: Upload) -> list[Segment]:
    """The copies grouped by parent directory, the groups in order of first
    appearance, each keeping its copies' order (a later copy of a path
    replaces an earlier one, and both are in one group)."""
    groups: dict[str, list[Copy]] = {}
    for copy in upload.copies:
        parent, name = split(copy.path)
        groups.setdefault(parent, []).append(dataclasses.replace(copy, path=name))
    return [Segment(parent, tuple(copies)) for parent, copies in groups.items()]


def header(copy: Copy, mtime: int) -> bytes:
    info = tarfile.TarInfo(copy.path)
    info.type = tarfile.DIRTYPE if copy.is_dir else tarfile.REGTYPE
    info.mode = DIR_MODE if copy.is_dir else FILE_MODE
    info.size = 0 if copy.is_dir else copy.size
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def size(copies: Sequence[Copy], mtime: int) -> int:
    """The bytes `stream` produces for these copies."""
    total = 2 * BLOCK
    for copy in copies:
        total += len(header(copy, mtime))
        if copy.content is not None:
            total += _padded(copy.size)
    return total


def stream(fd: int, copies: Sequence[Copy], mtime: int) -> Iterator[bytes]:
    """The archive, piece by piece: each entry's header, its content decoded
    from the spool `fd`, padding; then the two empty blocks that end it."""
    for copy in copies:
        yield header(copy, mtime)
        if copy.content is None:
            continue
        written = 0
        for piece in content_chunks(fd, copy.content.region):
            written += len(piece)
            yield piece
        if written != copy.size:
            raise RuntimeError(f"{copy.path!r}: the spool changed ({written} != {copy.size})")
        if copy.size % BLOCK:
            yield b"\0" * (BLOCK - copy.size % BLOCK)
    yield b"\0" * (2 * BLOCK)
