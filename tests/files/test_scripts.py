"""The scripts that run in the runner, run here with the real bash, GNU tar
and find, in a scratch directory: what a copy deletes, refuses and writes,
what a listing gives for names `ls -l` cannot carry, what a read prints."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.execution.command import ExecSettings
from controller.files import listing, scripts
from controller.files.upload import parse

SETTINGS = ExecSettings(unprivileged_wrapper=())


def copy_input(files: dict[str, bytes | None], delete: list[str]) -> bytes:
    """What the service sends the copy script for this request."""
    body = {
        "delete": delete,
        "copy": [
            {"path": p} if d is None else {"path": p, "content": base64.b64encode(d).decode()}
            for p, d in files.items()
        ],
    }
    with tempfile.TemporaryFile() as spool:
        spool.write(json.dumps(body).encode())
        spool.flush()
        upload = parse(spool.fileno())
        return b"".join(scripts.copy_input(spool.fileno(), upload, 1_700_000_000))


def copy(
    workdir: Path, files: dict[str, bytes | None], delete: list[str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        scripts.copy_command(),
        input=copy_input(files, delete or []),
        cwd=workdir,
        capture_output=True,
        timeout=10,
    )


def test_copy_writes_modes_and_content(tmp_path: Path) -> None:
    done = copy(tmp_path, {"d/": None, "d/e/f.txt": b"x" * 1000, "top": b""})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "d/e/f.txt").read_bytes() == b"x" * 1000
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o1777
    assert stat.S_IMODE((tmp_path / "d/e/f.txt").stat().st_mode) == 0o744
    assert (tmp_path / "top").read_bytes() == b""
    if os.geteuid() == 0:
        assert (tmp_path / "d/e/f.txt").stat().st_uid == 0


def test_deletions_come_first_and_the_glob_keeps_its_meaning(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old/x").write_text("x")
    (tmp_path / "y").write_text("y")
    (tmp_path / ".hidden").write_text("h")  # `./*` does not match dot files, as in Poseidon
    done = copy(tmp_path, {"old/": None, "new": b"n"}, delete=["./*"])
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", "new", "old"]
    assert list((tmp_path / "old").iterdir()) == []


def test_a_literal_star_is_not_a_glob_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "a*").write_text("star")
    (tmp_path / "ab").write_text("keep")
    assert copy(tmp_path, {}, delete=["a*"]).returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == ["ab"]


def test_a_directory_where_a_file_goes_is_refused_before_anything_is_copied(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir/keep").write_text("k")
    (tmp_path / "file").write_text("f")
    done = copy(tmp_path, {"first": b"1", "dir": b"x", "file/below": b"y"})
    assert done.returncode == scripts.CONFLICT
    assert scripts.conflicts(done.stdout) == [("f", "dir"), ("d", "file")]
    assert not (tmp_path / "first").exists()
    # the same copy after deleting what was in the way
    done = copy(tmp_path, {"first": b"1", "dir": b"x", "file/below": b"y"}, delete=["dir", "file"])
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "dir").read_bytes() == b"x"


def test_a_failing_path_fails_the_copy_and_the_others_are_written(tmp_path: Path) -> None:
    done = copy(tmp_path, {"ok": b"fine", "/proc/nrc-cannot-write": b"no"})
    assert done.returncode == 1
    assert b"nrc-cannot-write" in done.stderr
    assert (tmp_path / "ok").read_bytes() == b"fine"


ODD = [
    "with space",
    "new\nline",
    "quote\"and'apostrophe",
    "arrow -> here",
    "tab\there",
    "-dash",
]


def run_list(
    workdir: Path, path: str, recursive: bool = True, privileged: bool = True
) -> tuple[int, list[listing.Entry], bytes]:
    done = subprocess.run(
        scripts.list_command(privileged, SETTINGS),
        input=scripts.list_input(path, recursive, privileged),
        cwd=workdir,
        capture_output=True,
        timeout=10,
    )
    records = listing.Records()
    entries = [listing.entry(f, path, recursive) for f in records.feed(done.stdout)]
    assert not records.partial
    return done.returncode, entries, done.stderr


def test_listing_is_exact_for_names_ls_cannot_carry(tmp_path: Path) -> None:
    os.mkdir(tmp_path / "sub")
    for name in ODD:
        (tmp_path / "sub" / name).write_text(name)
    raw = b"bytes \xff\xfe"
    with open(os.path.join(os.fsencode(tmp_path), b"sub", raw), "wb") as f:
        f.write(b"12345")
    os.symlink("target -> with arrow", tmp_path / "sub/link")
    code, entries, _ = run_list(tmp_path, "./")
    assert code == 0
    names = {e.name: e for e in entries}
    expected = {"./sub", *(f"./sub/{n}" for n in ODD), "./sub/bytes \udcff\udcfe", "./sub/link"}
    assert set(names) == expected
    assert names["./sub/bytes \udcff\udcfe"].size == 5
    link = names["./sub/link"]
    assert (link.entry_type, link.link_target) == ("l", "target -> with arrow")
    assert names["./sub"].entry_type == "d"
    assert names["./sub/with space"].permissions == "rw-r--r--"


def test_listing_names_follow_poseidon(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d/f").write_text("f")
    assert [e.name for e in run_list(tmp_path, "d")[1]] == ["d/f"]
    assert [e.name for e in run_list(tmp_path, "d/")[1]] == ["d/f"]
    assert {e.name for e in run_list(tmp_path, ".", recursive=False)[1]} == {"d"}
    assert [e.name for e in run_list(tmp_path, "d/f")[1]] == ["d/f"]
    assert run_list(tmp_path, "d/")[1][0].json().startswith(b'{"name":"d/f","entryType":"-"')


def test_listing_a_missing_path_fails_without_output(tmp_path: Path) -> None:
    code, entries, stderr = run_list(tmp_path, "nothing")
    assert (code, entries) == (scripts.MISSING, [])
    assert b"no such file" in stderr


def test_listing_of_an_empty_directory_is_empty(tmp_path: Path) -> None:
    assert run_list(tmp_path, "./")[:2] == (0, [])


def read(
    workdir: Path, path: str, start: int | None = None, length: int = 0, privileged: bool = True
) -> subprocess.CompletedProcess[bytes]:
    stdin = scripts.read_input(path, privileged)
    if start is not None:
        stdin += scripts.range_input(start, length)
    return subprocess.run(
        scripts.read_command(privileged, SETTINGS),
        input=stdin,
        cwd=workdir,
        capture_output=True,
        timeout=10,
    )


def test_read_prints_size_and_mtime_then_the_span(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(bytes(range(256)) * 4)
    os.utime(tmp_path / "f", (1_600_000_000, 1_600_000_000))
    done = read(tmp_path, "f", 10, 20)
    line, _, rest = done.stdout.partition(b"\n")
    assert scripts.parse_stat(line) == (1024, 1_600_000_000)
    assert rest == (bytes(range(256)) * 4)[10:30]
    whole = read(tmp_path, "f", 0, 1024).stdout.partition(b"\n")[2]
    assert whole == bytes(range(256)) * 4


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        (lambda p: None, scripts.MISSING),
        (lambda p: (p / "x").mkdir(), scripts.IS_DIRECTORY),
        (lambda p: os.mkfifo(p / "x"), scripts.NOT_REGULAR),
    ],
    ids=["missing", "directory", "fifo"],
)
def test_read_refuses_what_is_not_a_file(tmp_path: Path, setup: object, code: int) -> None:
    setup(tmp_path)  # type: ignore[operator]
    done = read(tmp_path, "x")
    assert done.returncode == code
    assert done.stdout == b""


# -- hostile names: links a student planted, names that look like options ----------


def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A working directory with `out`, a link to a directory outside it."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "victim.txt").write_text("v")
    os.symlink(outside, work / "out")
    return work, outside


@pytest.mark.parametrize(
    "files", [{"out/pwned.txt": b"x"}, {"out/new/": None}, {"out/": None}, {"out/d/f": b"x"}]
)
def test_a_copy_below_a_link_is_refused_naming_it(
    tmp_path: Path, files: dict[str, bytes | None]
) -> None:
    work, outside = planted(tmp_path)
    done = copy(work, {"first": b"1", **files})
    assert done.returncode == scripts.CONFLICT, done.stderr
    assert ("l", "out") in scripts.conflicts(done.stdout)
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert not (work / "first").exists()  # refused before anything is copied


def test_a_deletion_below_a_link_is_refused_naming_it(tmp_path: Path) -> None:
    work, outside = planted(tmp_path)
    done = copy(
        work, {}, delete=["out/victim.txt", "out/./victim.txt", "/" + str(work) + "/out/victim.txt"]
    )
    assert done.returncode == scripts.CONFLICT
    assert scripts.conflicts(done.stdout)[0] == ("l", "out")
    assert (outside / "victim.txt").exists()
    # the link itself can be deleted, and a file copied over a link replaces it
    assert copy(work, {}, delete=["out"]).returncode == 0
    os.symlink(outside / "victim.txt", work / "over")
    assert copy(work, {"over": b"new"}).returncode == 0
    assert (outside / "victim.txt").read_text() == "v"
    assert not (work / "over").is_symlink()


def test_privileged_list_and_read_never_follow_a_link(tmp_path: Path) -> None:
    work, outside = planted(tmp_path)
    (outside / "secret").write_text("root only")
    os.symlink(outside / "secret", work / "leak")
    code, entries, stderr = run_list(work, "out/")
    assert (code, entries) == (scripts.LINK, [])
    assert scripts.link_refused(stderr) == "out"
    code, entries, _ = run_list(work, "leak")  # the link itself is listed, not its target
    assert (code, [(e.entry_type, e.link_target) for e in entries]) == (
        0,
        [("l", str(outside / "secret"))],
    )
    for path in ("leak", "out/secret"):
        done = read(work, path, 0, 100)
        assert (done.returncode, done.stdout) == (scripts.LINK, b"")
    assert scripts.link_refused(read(work, "leak", 0, 100).stderr) == "leak"
    # unprivileged, the user reads what it could read anyway
    assert read(work, "leak", 0, 100, privileged=False).stdout.endswith(b"root only")


def test_a_name_is_never_an_option(tmp_path: Path) -> None:
    (tmp_path / "-delete").mkdir()
    (tmp_path / "-delete/inside").write_text("i")
    (tmp_path / "keep").write_text("k")
    for privileged in (True, False):
        code, entries, _ = run_list(tmp_path, "-delete", privileged=privileged)
        assert (code, [e.name for e in entries]) == (0, ["-delete/inside"])
    assert (tmp_path / "keep").exists()
    (tmp_path / "--help").write_text("h")
    assert read(tmp_path, "--help", 0, 1).stdout.endswith(b"\nh")
    assert copy(tmp_path, {"-f": b"x"}, delete=["--help"]).returncode == 0
    assert not (tmp_path / "--help").exists() and (tmp_path / "-f").exists()


# An interpreter the unprivileged user may run (this venv may be below /root).
STUDENT_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
SWAPPER = """
import ctypes, os, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(sys.argv[1])
print("swapping", flush=True)
while True:  # `d` and `l` trade places atomically (RENAME_EXCHANGE), often
    libc.renameat2(-100, b"d", -100, b"l", 2)
    time.sleep(random.random() * float(sys.argv[2]))
"""


@contextlib.contextmanager
def swapping(tmp_path: Path, pace_s: float) -> Iterator[tuple[Path, Path]]:
    """A working directory whose `d` a student's process keeps swapping with
    `l`, a link to a directory outside, pausing up to `pace_s` between swaps:
    (working directory, outside)."""
    user: int | None = None
    if os.geteuid() == 0:  # the student's code runs as someone else
        user = 65534
        tmp_path = Path(tempfile.mkdtemp())  # pytest's own is root's alone
        os.chmod(tmp_path, 0o755)
    work, outside = planted(tmp_path)
    os.chmod(work, 0o777)
    (work / "d").mkdir()
    os.chmod(work / "d", 0o777)
    os.symlink(outside, work / "l")
    swapper = subprocess.Popen(
        [STUDENT_PYTHON, "-c", SWAPPER, str(work), str(pace_s)],
        stdout=subprocess.PIPE,
        user=user,
        group=user,
    )
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == b"swapping\n"
        yield work, outside
    finally:
        swapper.kill()
        swapper.wait()
    if user is not None:
        shutil.rmtree(tmp_path)


def test_a_student_swapping_a_directory_and_a_link_never_gets_a_byte_outside(
    tmp_path: Path,
) -> None:
    with swapping(tmp_path, 0.02) as (work, outside):
        codes = set()
        for i in range(200):
            done = copy(work, {f"d/f{i}": b"x", "d/sub/g": b"y"}, delete=["d/victim.txt"])
            codes.add(done.returncode)
        assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert codes <= {0, scripts.CONFLICT}, codes
    assert codes == {0, scripts.CONFLICT}  # some copies raced the swap, some were refused


def test_the_walk_itself_is_never_redirected_by_a_swap(tmp_path: Path) -> None:
    """Without the checks before it (a swap right after them), at full speed."""
    script = scripts.WALK + 'walk "$1" 1 && echo x > ./f && mkdir ./sub'
    with swapping(tmp_path, 0) as (work, outside):
        codes = [
            subprocess.run(["bash", "-c", script, "walk", "d"], cwd=work, timeout=10).returncode
            for _ in range(200)
        ]
        assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert 2 in codes
