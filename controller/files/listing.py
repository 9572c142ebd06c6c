"""A runner's directory listing: GNU find's NUL-separated records to
Poseidon's `FileHeader` JSON, as a stream. Pure.

find prints seven fields per entry, each NUL-terminated: the mode string
(`drwxrwxrwt`: its first character is Poseidon's `entryType`, the other nine
its `permissions`), the size, the modification time (seconds, with a
fraction), owner, group, the link target (empty unless a symlink) and the
path below the listed one. NUL is the one byte a name cannot hold, so every
name comes through exactly — spaces, newlines, quotes, ` -> `, bytes that
are not UTF-8 — where parsing `ls -l` (Poseidon) breaks.

Names follow Poseidon: listing `./` recursively gives `./a.txt` and
`./sub/b.txt` (the path without one trailing slash, a slash, the entry's
path below it); a listing that is not recursive gives the bare names; a path
that is not a directory is listed as itself. Bytes that are not UTF-8 appear
as lone surrogates U+DC80–U+DCFF, written as `\\udcXX` escapes (the JSON
stays ASCII), from which `paths.to_bytes` recovers them. A symlink whose
target cannot be read has no `linkTarget`, as in Poseidon.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from controller.files.paths import from_bytes

FIELDS = 7
OPEN = b'{"files":['
CLOSE = b"]}"


@dataclass(frozen=True)
class Entry:
    name: str
    entry_type: str
    link_target: str | None
    size: int
    modification_time: int
    permissions: str
    owner: str
    group: str

    def json(self) -> bytes:
        header: dict[str, object] = {"name": self.name, "entryType": self.entry_type}
        if self.link_target is not None:
            header["linkTarget"] = self.link_target
        header |= {
            "size": self.size,
            "modificationTime": self.modification_time,
            "permissions": self.permissions,
            "owner": self.owner,
            "group": self.group,
        }
        return json.dumps(header, separators=(",", ":")).encode("ascii")


def prefix(path: str, recursive: bool) -> str:
    """What goes before an entry's path below the listed one."""
    return path.removesuffix("/") + "/" if recursive else ""


def entry(fields: list[bytes], path: str, recursive: bool) -> Entry:
    mode, size, mtime, owner, group, target, below = fields
    text = mode.decode("ascii", "replace")
    relative = from_bytes(below)
    return Entry(
        # Empty below: the listed path is not a directory and is its own entry.
        name=prefix(path, recursive) + relative if relative else path,
        entry_type=text[:1],
        link_target=from_bytes(target) if text[:1] == "l" and target else None,
        size=int(size),
        modification_time=int(mtime.split(b".")[0]),
        permissions=text[1:],
        owner=from_bytes(owner),
        group=from_bytes(group),
    )


class Records:
    """find's output, fed as it arrives, back as whole records."""

    def __init__(self) -> None:
        self._fields: list[bytes] = []
        self._rest = b""

    def feed(self, data: bytes) -> list[list[bytes]]:
        parts = (self._rest + data).split(b"\0")
        self._rest = parts.pop()
        records: list[list[bytes]] = []
        for part in parts:
            self._fields.append(part)
            if len(self._fields) == FIELDS:
                records.append(self._fields)
                self._fields = []
        return records

    @property
    def partial(self) -> bool:
        """Output ended inside a record (find was cut off)."""
        return bool(self._fields or self._rest)
