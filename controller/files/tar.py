"""The archive a `PATCH /files` extracts in the runner, produced as a stream.

Entries as Poseidon writes them, because images and CodeOcean expect them:
directories mode 01777 (sticky, so unprivileged code can create files in
them without deleting others'), files 0744, both owned by root (uid/gid 0).
Names are the cleaned paths, absolute ones included (the runner extracts with
`--absolute-names`: the sandbox is the boundary, not the path). Bytes that are
not UTF-8 go into the names as the bytes they stand for. Long names use GNU
tar's long-name entries (`tarfile`'s GNU format), which every GNU tar reads.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator

from controller.files.upload import Copy, Upload, content_chunks

DIR_MODE = 0o1777
FILE_MODE = 0o744
BLOCK = tarfile.BLOCKSIZE


def header(copy: Copy, mtime: int) -> bytes:
    info = tarfile.TarInfo(copy.path)
    info.type = tarfile.DIRTYPE if copy.is_dir else tarfile.REGTYPE
    info.mode = DIR_MODE if copy.is_dir else FILE_MODE
    info.size = 0 if copy.is_dir else copy.size
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def stream(fd: int, upload: Upload, mtime: int) -> Iterator[bytes]:
    """The archive, piece by piece: each entry's header, its content decoded
    from the spool `fd`, padding; then the two empty blocks that end it."""
    for copy in upload.copies:
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
