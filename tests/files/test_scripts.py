"""The scripts that run in the runner, run here with the real bash, GNU tar
and find, in a scratch directory: what a copy deletes, refuses and writes,
what a listing gives for names `ls -l` cannot carry, what a read prints."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from controller.execution.command import ExecSettings
from controller.files import listing, scripts
from controller.files.tar import stream
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
        archive = b"".join(stream(spool.fileno(), upload, 1_700_000_000))
    return b"".join(scripts.copy_preamble(upload)) + archive


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
    assert scripts.conflicts(done.stdout) == [(False, "dir"), (True, "file")]
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
    workdir: Path, path: str, recursive: bool = True
) -> tuple[int, list[listing.Entry], bytes]:
    done = subprocess.run(
        scripts.list_command(True, SETTINGS),
        input=scripts.list_input(path, recursive),
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
    workdir: Path, path: str, start: int | None = None, length: int = 0
) -> subprocess.CompletedProcess[bytes]:
    stdin = scripts.read_input(path)
    if start is not None:
        stdin += scripts.range_input(start, length)
    return subprocess.run(
        scripts.read_command(True, SETTINGS),
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
