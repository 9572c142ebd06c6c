"""What runs in the runner for each file operation, and what it reads. Pure.

Each operation is one bash script in one exec without a TTY. Paths never go
on its command line (Nomad carries the command as JSON text, which cannot
hold bytes that are not UTF-8, and a long list would not fit a URL): the
script reads them from stdin, NUL-terminated, so any name works. The scripts
need bash and GNU coreutils, findutils and tar, as Poseidon's images have.

No path is ever followed through a symbolic link a student may have made
(the runner's code is hostile; the scripts run as root): every operation that
could write, delete or read as root enters the path's parent directory one
component at a time (`WALK`), refusing a link, and acts on `./name` there. A
relative path reaches a command only as `./path`, so that no name (`-delete`)
is read as an option.

- copy (as root, as Poseidon does): the deletions, an empty record, the
  checks (`f<path>`: must not be a directory; `d<path>`: must be one if it
  exists, and not a link), an empty record, then per directory its path,
  the size of its archive and the archive (`tar.segments`), then an empty
  record. Deletions run first, `./*` unquoted so that its glob expands; a
  deletion below a link is refused (`l<link>`). A failed check prints
  `f<path>`, `d<path>` or `l<path>` (NUL-terminated), reads the rest of its
  input and exits CONFLICT before anything is copied: under Docker's exec
  (Nomad <= 1.8) input still on its way when the output ends turns the exit
  into an error. Otherwise each archive is extracted in its directory
  (entered by `WALK`, missing parents made); a link met there (a race with
  the student's code) skips that archive and ends in CONFLICT; any other
  failure (of rm or tar) exits 1 with its message on stderr, after
  everything that could be written is written.
- list: the path, `1`/`0` (recursive) and `1`/`0` (privileged); GNU find
  (`-P`: never following a link) prints seven NUL-terminated fields per
  entry (`listing.FIELDS`).
- read: the path and `1`/`0` (privileged); the script prints
  `<size> <mtime>\\n`, then reads `<start> <length>` (chosen by the controller
  from the size and the request's Range) and prints those bytes of the
  file. Privileged, a link as the file is refused too, and the file is
  opened once and checked to be the inode its name had.

List and read run as a client's command does (`command.as_client`): as the
unprivileged user (the NRC_EXEC_UNPRIVILEGED_WRAPPER) unless privileged, and
without Nomad's variables.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from controller.execution.command import MARKER, ExecSettings, as_client
from controller.files import tar
from controller.files.paths import ancestors, to_bytes
from controller.files.upload import Upload

CONFLICT = 3
MISSING = 2
IS_DIRECTORY = 4
NOT_REGULAR = 5
UNREADABLE = 6
LINK = 7

# `walk DIR CREATE`: enter DIR one component at a time from the working
# directory (or `/`), never through a symbolic link: a component that is a
# link stops the walk (2), as does one that is missing (1; with CREATE=1 it
# is made, as tar makes a missing parent) or not a directory (3); `$at` is
# where it stopped. `cd` follows links, so the identity (device:inode) of
# what `[ -L ]` saw is compared with where `cd` arrived: a directory swapped
# for a link in between is refused too. Its caller runs in a subshell, so
# the shell's own directory never changes.
WALK = r"""walk() {
  local rest=$1 done='' comp id
  at=.
  case $rest in /*) cd / || return 4; done=/; at=/; rest=${rest#/};; esac
  while [ -n "$rest" ]; do
    comp=${rest%%/*}
    if [ "$comp" = "$rest" ]; then rest=''; else rest=${rest#*/}; fi
    { [ -z "$comp" ] || [ "$comp" = . ]; } && continue
    at=$done$comp; done=$at/
    if [ "$2" = 1 ] && [ ! -e "./$comp" ] && [ ! -L "./$comp" ]; then
      mkdir -- "./$comp" 2>/dev/null
    fi
    [ -L "./$comp" ] && return 2
    [ -e "./$comp" ] || return 1
    [ -d "./$comp" ] || return 3
    id=$(stat -c %d:%i -- "./$comp") || return 4
    cd -P -- "./$comp" 2>/dev/null || return 4
    [ "$(stat -c %d:%i .)" = "$id" ] || return 2
  done
}
# `split PATH`: $parent and $name (trailing slashes dropped).
split() {
  local p=$1
  while [ "${#p}" -gt 1 ] && [ "${p%/}" != "$p" ]; do p=${p%/}; done
  case $p in
    /) parent=/; name=. ;;
    */*) parent=${p%/*}; name=${p##*/}; parent=${parent:-/} ;;
    *) parent=.; name=$p ;;
  esac
}
"""

COPY = (
    r"""export LC_ALL=C
"""
    + WALK
    + r"""failed=0
conflict=0
while IFS= read -r -d '' p && [ -n "$p" ]; do
  if [ "$p" = './*' ]; then rm -rf -- ./* || failed=1; continue; fi
  split "$p"
  ( walk "$parent" 0; code=$?
    if [ "$code" = 2 ]; then printf 'l%s\0' "$at"; exit 3; fi
    [ "$code" = 0 ] || exit 0
    rm -rf -- "./$name" )
  case $? in 0) ;; 3) conflict=1 ;; *) failed=1 ;; esac
done
while IFS= read -r -d '' c && [ -n "$c" ]; do
  p=${c:1}
  if [ "${c:0:1}" = f ]; then
    if [ -d "$p" ] && [ ! -L "$p" ]; then printf '%s\0' "$c"; conflict=1; fi
  elif [ -L "$p" ]; then printf 'l%s\0' "$p"; conflict=1
  elif [ -e "$p" ] && [ ! -d "$p" ]; then printf '%s\0' "$c"; conflict=1
  fi
done
# Refusing, it still reads its input to the end: under Docker (Nomad <= 1.8)
# input left unread when the output ends replaces the exit code with an error.
[ "$conflict" = 0 ] || { cat >/dev/null; exit 3; }
while IFS= read -r -d '' dir && [ -n "$dir" ]; do
  IFS= read -r -d '' size
  ( walk "$dir" 1; code=$?
    if [ "$code" != 0 ]; then
      head -c "$size" >/dev/null
      [ "$code" = 2 ] && { printf 'l%s\0' "$at"; exit 3; }
      printf '%s: cannot enter %s\n' "$dir" "$at" >&2; exit 1
    fi
    head -c "$size" | {
      tar --extract --ignore-zeros --preserve-permissions --file=-; s=$?
      cat >/dev/null; exit "$s"; } )
  case $? in 0) ;; 3) conflict=1 ;; *) failed=1 ;; esac
done
[ "$conflict" = 0 ] || exit 3
exit "$failed"
"""
)

# List and read take `1` (privileged: as root) to walk to the path's parent
# without following a link and refuse a link there (LINK, naming it on
# stderr, NUL-terminated); either way a relative path is given to find and
# stat as `./path`, so that no name reads as an option.
LIST = (
    r"""export LC_ALL=C
IFS= read -r -d '' p; IFS= read -r -d '' recursive; IFS= read -r -d '' strict
"""
    + WALK
    + r"""if [ "$strict" = 1 ]; then
  split "$p"
  walk "$parent" 0; code=$?
  if [ "$code" = 2 ]; then printf 'symbolic link: %s\0' "$at" >&2; exit 7; fi
  if [ "$code" != 0 ]; then echo "no such file or directory" >&2; exit 2; fi
  # `dir/` names what `dir` leads to: a link there is refused, not listed.
  case $p in */) [ -L "./$name" ] && { printf 'symbolic link: %s\0' "${p%/}" >&2; exit 7; } ;; esac
  [ "$p" = / ] || p=./$name
else
  case $p in /*) ;; *) p=./$p ;; esac
fi
if [ ! -e "$p" ] && [ ! -L "$p" ]; then echo "no such file or directory" >&2; exit 2; fi
format='%M\0%s\0%T@\0%u\0%g\0%l\0%P\0'
if [ -d "$p" ] && [ ! -L "$p" ]; then
  if [ "$recursive" = 1 ]; then exec find -P "$p" -mindepth 1 -printf "$format"; fi
  exec find -P "$p" -mindepth 1 -maxdepth 1 -printf "$format"
fi
exec find -P "$p" -maxdepth 0 -printf "$format"
"""
)

READ = (
    r"""export LC_ALL=C
IFS= read -r -d '' p; IFS= read -r -d '' strict
"""
    + WALK
    + r"""shown=$p
if [ "$strict" = 1 ]; then
  split "$p"
  walk "$parent" 0; code=$?
  if [ "$code" = 2 ]; then printf 'symbolic link: %s\0' "$at" >&2; exit 7; fi
  if [ "$code" != 0 ]; then echo "no such file" >&2; exit 2; fi
  p=./$name
  if [ -L "$p" ]; then printf 'symbolic link: %s\0' "$shown" >&2; exit 7; fi
else
  case $p in /*) ;; *) p=./$p ;; esac
fi
if [ -d "$p" ]; then echo "it is a directory" >&2; exit 4; fi
if [ ! -e "$p" ]; then echo "no such file" >&2; exit 2; fi
if [ ! -f "$p" ]; then echo "it is not a regular file" >&2; exit 5; fi
if [ ! -r "$p" ]; then echo "permission denied" >&2; exit 6; fi
# What is read is the file that was checked: opened once, and (privileged)
# the same inode as the name had when it was not a link.
id=$(stat -c %d:%i -- "$p") || exit 6
exec 3<"$p" || exit 6
if [ "$strict" = 1 ] && [ "$(stat -L -c %d:%i - <&3)" != "$id" ]; then
  printf 'symbolic link: %s\0' "$shown" >&2; exit 7
fi
stat -L -c '%s %Y' - <&3 || exit 6
IFS=' ' read -r -d '' start length || exit 0
tail -c "+$((start + 1))" <&3 | head -c "$length"
"""
)


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


def copy_input(fd: int, upload: Upload, mtime: int) -> Iterator[bytes]:
    """All the copy script reads: the preamble, then per directory its path,
    its archive's size and the archive (`tar.segments`), then an empty record."""
    yield from copy_preamble(upload)
    for segment in tar.segments(upload):
        yield _record(segment.directory)
        yield str(tar.size(segment.copies, mtime)).encode("ascii") + b"\0"
        yield from tar.stream(fd, segment.copies, mtime)
    yield b"\0"


def conflicts(stdout: bytes) -> list[tuple[str, str]]:
    """The copy script's refusals: (kind, path), the kind `d` (a directory
    was expected), `f` (a file was) or `l` (a symbolic link is in the way)."""
    out: list[tuple[str, str]] = []
    for record in stdout.split(b"\0"):
        if record[:1] in (b"d", b"f", b"l"):
            out.append((record[:1].decode(), record[1:].decode("utf-8", "surrogateescape")))
    return out


def link_refused(stderr: bytes) -> str | None:
    """The path a privileged list or read refused as a symbolic link (LINK)."""
    head, sep, _ = stderr.partition(b"\0")
    prefix = b"symbolic link: "
    if sep and head.startswith(prefix):
        return head[len(prefix) :].decode("utf-8", "surrogateescape")
    return None


def list_input(path: str, recursive: bool, privileged: bool) -> bytes:
    return _record(path) + (b"1\0" if recursive else b"0\0") + (b"1\0" if privileged else b"0\0")


def read_input(path: str, privileged: bool) -> bytes:
    return _record(path) + (b"1\0" if privileged else b"0\0")


def range_input(start: int, length: int) -> bytes:
    return f"{start} {length}".encode("ascii") + b"\0"


def parse_stat(line: bytes) -> tuple[int, int]:
    """`<size> <mtime>` as the read script prints it."""
    size, mtime = line.split()
    return int(size), int(mtime)
