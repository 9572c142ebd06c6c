"""How a file operation fails, each error saying what the client can do:
`Unreadable` (424: the path is missing, cannot be read, or is not a file),
`Conflict` (409: a directory where a file must go, or the other way round),
`CopyFailed` (500: the runner could not do it; its own words),
`RangeNotSatisfiable` (416), `ExecFailed` (Nomad refused or broke off the
exec: the caller checks whether the runner was lost), and `Interrupted` (a
stream cut off after its answer started). The answers themselves are
`controller.dataplane.answers`' table.
"""

from __future__ import annotations

from controller.nomad.errors import ExecError


class FileError(Exception):
    """`since`: when (event loop time) the exec that met the failure was
    opened, if one was: what happened on the runner before it, Nomad shows
    a client's report later (dataplane.runners)."""

    def __init__(self, message: str, since: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.since = since


class Unreadable(FileError):
    pass


class Conflict(FileError):
    pass


class CopyFailed(FileError):
    pass


class Interrupted(FileError):
    pass


class RangeNotSatisfiable(FileError):
    def __init__(self, size: int) -> None:
        super().__init__(f"the range lies beyond the file's {size} bytes")
        self.size = size


class ExecFailed(FileError):
    def __init__(self, error: ExecError) -> None:
        super().__init__(error.reason)
        self.error = error
