"""What runs in the runner for each file operation, and what it reads. Pure.

Each operation is one bash script in one exec without a TTY. Paths never go
on its command line (Nomad carries the command as JSON text, which cannot
hold bytes that are not UTF-8, and a long list would not fit a URL): the
script reads them from stdin, NUL-terminated, so any name works. The scripts
need bash and GNU coreutils, findutils and tar, as Poseidon's images have.

- copy (as root, as Poseidon does): the deletions, an empty record, the
  checks (`f<path>`: must not be a directory; `d<path>`: must be one if it
  exists), an empty record, then the tar archive. Deletions run first, `./*`
  unquoted so that its glob expands. A failed check prints `f<path>` or
  `d<path>` (NUL-terminated), reads the rest of its input (the archive) and
  exits CONFLICT before anything is copied: under Docker's exec (Nomad <= 1.8)
  input still on its way when the output ends turns the exit into an error.
  Otherwise tar extracts; any failure (of rm or tar) exits 1 with its
  message on stderr, after everything that could be written is written.
- list: the path and `1`/`0` (recursive); GNU find prints seven
  NUL-terminated fields per entry (`listing.FIELDS`).
- read: the path; the script prints `<size> <mtime>\\n`, then reads
  `<start> <length>` (chosen by the controller from the size and the
  request's Range) and prints those bytes of the file.

List and read run as a client's command does (`command.as_client`): as the
unprivileged user (the NRC_EXEC_UNPRIVILEGED_WRAPPER) unless privileged, and
without Nomad's variables.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from controller.execution.command import MARKER, ExecSettings, as_client
from controller.files.paths import ancestors, to_bytes
from controller.files.upload import Upload

CONFLICT = 3
MISSING = 2
IS_DIRECTORY = 4
NOT_REGULAR = 5
UNREADABLE = 6

COPY = r"""export LC_ALL=C
failed=0
while IFS= read -r -d '' p && [ -n "$p" ]; do
  if [ "$p" = './*' ]; then rm -rf -- ./* || failed=1
  else rm -rf -- "$p" || failed=1
  fi
done
conflict=0
while IFS= read -r -d '' c && [ -n "$c" ]; do
  p=${c:1}
  if [ "${c:0:1}" = f ]; then
    if [ -d "$p" ] && [ ! -L "$p" ]; then printf '%s\0' "$c"; conflict=1; fi
  elif [ -e "$p" ] && [ ! -d "$p" ]; then printf '%s\0' "$c"; conflict=1
  fi
done
# Refusing, it still reads its input to the end: under Docker (Nomad <= 1.8)
# input left unread when the output ends replaces the exit code with an error.
[ "$conflict" = 0 ] || { cat >/dev/null; exit 3; }
tar --extract --absolute-names --preserve-permissions --file=- || failed=1
exit "$failed"
"""

LIST = r"""export LC_ALL=C
IFS= read -r -d '' p; IFS= read -r -d '' recursive
if [ ! -e "$p" ] && [ ! -L "$p" ]; then echo "no such file or directory" >&2; exit 2; fi
format='%M\0%s\0%T@\0%u\0%g\0%l\0%P\0'
if [ -d "$p" ] && [ ! -L "$p" ]; then
  if [ "$recursive" = 1 ]; then exec find "$p" -mindepth 1 -printf "$format"; fi
  exec find "$p" -mindepth 1 -maxdepth 1 -printf "$format"
fi
exec find "$p" -maxdepth 0 -printf "$format"
"""

READ = r"""export LC_ALL=C
IFS= read -r -d '' p
if [ -d "$p" ]; then echo "it is a directory" >&2; exit 4; fi
if [ ! -e "$p" ]; then echo "no such file" >&2; exit 2; fi
if [ ! -f "$p" ]; then echo "it is not a regular file" >&2; exit 5; fi
if [ ! -r "$p" ]; then echo "permission denied" >&2; exit 6; fi
stat -L -c '%s %Y' -- "$p" || exit 6
IFS=' ' read -r -d '' start length || exit 0
tail -c "+$((start + 1))" -- "$p" | head -c "$length"
"""


def copy_command(marker: str | None = None) -> list[str]:
    """The copy, as root; with `marker`, its processes carry it (`MARKER`)."""
    export = f"export {shlex.quote(f'{MARKER}={marker}')}\n" if marker else ""
    return ["/bin/bash", "-c", export + COPY]


def list_command(privileged: bool, settings: ExecSettings, marker: str | None = None) -> list[str]:
    return as_client(LIST, privileged, settings, marker)


def read_command(privileged: bool, settings: ExecSettings, marker: str | None = None) -> list[str]:
    return as_client(READ, privileged, settings, marker)


def _record(path: str) -> bytes:
    return to_bytes(path) + b"\0"


def copy_preamble(upload: Upload) -> Iterator[bytes]:
    """What the copy script reads before the archive."""
    for path in upload.deletions:
        yield _record(path)
    yield b"\0"
    directories: set[str] = set()
    for copy in upload.copies:
        needed = [*ancestors(copy.path), copy.path] if copy.is_dir else ancestors(copy.path)
        for directory in needed:
            if directory not in directories:
                directories.add(directory)
                yield b"d" + _record(directory)
        if not copy.is_dir:
            yield b"f" + _record(copy.path)
    yield b"\0"


def conflicts(stdout: bytes) -> list[tuple[bool, str]]:
    """The copy script's failed checks: (a directory was expected, path)."""
    out: list[tuple[bool, str]] = []
    for record in stdout.split(b"\0"):
        if record[:1] in (b"d", b"f"):
            out.append((record[:1] == b"d", record[1:].decode("utf-8", "surrogateescape")))
    return out


def list_input(path: str, recursive: bool) -> bytes:
    return _record(path) + (b"1\0" if recursive else b"0\0")


def read_input(path: str) -> bytes:
    return _record(path)


def range_input(start: int, length: int) -> bytes:
    return f"{start} {length}".encode("ascii") + b"\0"


def parse_stat(line: bytes) -> tuple[int, int]:
    """`<size> <mtime>` as the read script prints it."""
    size, mtime = line.split()
    return int(size), int(mtime)
