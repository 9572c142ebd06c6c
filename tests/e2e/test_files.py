"""Files end to end, as a learning platform uses them: PATCH, list and
download over HTTP against the simulator, whose exec runs the scripts for
real in the runner's working directory. Then the whole CodeOcean run and its
unhappy paths, and every bad input with its 4xx."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import yaml
from jsonschema import Draft4Validator

from tests.helpers import Http, wait_until
from tests.reference import document
from tests.support.world import AUTH, World, read_all, world_with

# The student's interpreter: one the unprivileged user may run (the
# simulator's setuser is a real uid when root, and this venv's python may
# live below a directory only root enters, such as /root).
PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


@pytest.fixture
def world(make_sim: Any) -> Iterator[World]:
    with world_with(make_sim) as w:
        yield w


def task_dir(world: World, runner: str) -> str:
    alloc = world.alloc_of(runner)["ID"]
    return str(world.sim.call(lambda: world.sim.sim.task_dir(alloc, "default-task")))


def test_copy_list_download(world: World) -> None:
    runner = world.claim()
    payload = bytes(range(256)) * 5
    r = world.patch_files(runner, {"src/": None, "src/a.txt": b"hello", "b.bin": payload})
    assert r.status_code == 204, r.text
    files = world.files(runner)
    assert set(files) == {"./src", "./src/a.txt", "./b.bin"}
    assert files["./src"]["entryType"] == "d"
    assert files["./src"]["permissions"] == "rwxrwxrwt"
    entry = files["./src/a.txt"]
    assert (entry["entryType"], entry["size"], entry["permissions"]) == ("-", 5, "rwxr--r--")
    assert abs(entry["modificationTime"] - time.time()) < 60
    assert {"owner", "group"} <= set(entry)
    d = world.download(runner, "./b.bin")
    assert d.status_code == 200
    assert d.content == payload
    assert d.headers["Content-Length"] == str(len(payload))
    assert d.headers["Content-Type"] == "application/octet-stream"
    assert d.headers["Content-Disposition"] == 'attachment; filename="./b.bin"'


def test_later_copies_see_earlier_ones_and_deletions_come_first(world: World) -> None:
    runner = world.claim()
    assert (
        world.patch_files(runner, {"keep/": None, "keep/a": b"1", "gone": b"2"}).status_code == 204
    )
    r = world.patch_files(runner, {"keep/b": b"3"}, delete=["gone", "missing-is-fine"])
    assert r.status_code == 204, r.text
    assert set(world.files(runner)) == {"./keep", "./keep/a", "./keep/b"}
    r = world.patch_files(runner, {"fresh": b"4"}, delete=["./*"])
    assert r.status_code == 204
    assert set(world.files(runner)) == {"./fresh"}


def test_absolute_paths_and_listing_other_paths(world: World) -> None:
    runner = world.claim()
    base = task_dir(world, runner)
    assert world.patch_files(runner, {f"{base}/abs/x.txt": b"abs"}).status_code == 204
    assert world.download(runner, "abs/x.txt").content == b"abs"
    assert set(world.files(runner, path=f"{base}/abs")) == {f"{base}/abs/x.txt"}
    assert set(world.files(runner, path="abs", recursive="false")) == {"x.txt"}
    assert set(world.files(runner, path="abs/x.txt")) == {"abs/x.txt"}
    assert world.files(runner, path="abs/", recursive="garbage-means-true")


def test_every_name_a_file_system_allows(world: World) -> None:
    runner = world.claim()
    names = ["with space", "new\nline", "quo\"te's", "a -> b", "ünï", "\udcff\udcfe raw"]
    assert (
        world.patch_files(
            runner, {f"odd/{n}": n.encode("utf-8", "surrogateescape") for n in names}
        ).status_code
        == 204
    )
    base = task_dir(world, runner)
    os.symlink("target -> arrow", os.path.join(base, "odd", "link"))
    files = world.files(runner)
    assert set(files) == {"./odd", "./odd/link", *(f"./odd/{n}" for n in names)}
    assert files["./odd/link"]["linkTarget"] == "target -> arrow"
    for name in names:
        r = world.download(runner, f"odd/{name}")
        assert r.status_code == 200, (name, r.text)
        assert r.content == name.encode("utf-8", "surrogateescape")
    disposition = world.download(runner, "odd/\udcff\udcfe raw").headers["Content-Disposition"]
    assert disposition == "attachment; filename=\"odd/__ raw\"; filename*=UTF-8''odd%2F%FF%FE%20raw"


def file_header_schema() -> dict[str, Any]:
    """Poseidon's FileHeader with the four fields its implementation emits
    beyond its description (`pkg/dto/dto.go`: linkTarget, permissions, owner,
    group); still no other property."""
    schemas = yaml.safe_load(document("poseidon-api.yaml").read_text())["components"]["schemas"]
    header: dict[str, Any] = schemas["FileHeader"]
    string = {"type": "string"}
    header["properties"] |= {
        "linkTarget": string,
        "permissions": string,
        "owner": string,
        "group": string,
    }
    return header


def test_a_listing_is_poseidons_file_header_list(world: World) -> None:
    runner = world.claim()
    assert world.patch_files(runner, {"d/": None, "d/f": b"1"}).status_code == 204
    os.symlink("d/f", os.path.join(task_dir(world, runner), "link"))
    listing = world.list_files(runner).json()
    assert set(listing) == {"files"}
    validator = Draft4Validator(file_header_schema())
    for entry in listing["files"]:
        assert not [e.message for e in validator.iter_errors(entry)], entry
    assert {e["name"] for e in listing["files"]} == {"./d", "./d/f", "./link"}


def test_a_listing_streams_its_json(world: World) -> None:
    runner = world.claim()
    run = world.run(
        runner, "mkdir many && cd many && seq 1 3000 | xargs touch", privilegedExecution=True
    )
    assert run.last == {"type": "exit", "data": 0}
    r = world.list_files(runner, path="many")
    assert r.status_code == 200
    assert "Content-Length" not in r.headers  # streamed as it is produced
    assert len(r.json()["files"]) == 3000


def test_ranges(world: World) -> None:
    runner = world.claim()
    data = os.urandom(100_000)
    assert world.patch_files(runner, {"f": data}).status_code == 204
    r = world.download(runner, "f", Range="bytes=1000-1999")
    assert r.status_code == 206
    assert r.content == data[1000:2000]
    assert r.headers["Content-Range"] == "bytes 1000-1999/100000"
    assert r.headers["Content-Length"] == "1000"
    r = world.download(runner, "f", Range="bytes=-10")
    assert (r.status_code, r.content) == (206, data[-10:])
    resumed = world.download(
        runner, "f", Range="bytes=99000-", **{"If-Range": r.headers["Last-Modified"]}
    )
    assert (resumed.status_code, resumed.content) == (206, data[99000:])
    r = world.download(runner, "f", Range="bytes=100000-")
    assert r.status_code == 416
    assert r.headers["Content-Range"] == "bytes */100000"
    r = world.download(runner, "f", Range="bytes=0-1,5-6")
    assert (r.status_code, r.content) == (200, data)


# -- bad input: a clear 4xx each, and nothing half-done that a retry cannot fix ----


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"delete":["./*"],"copy":[{"path":"a","content":"not base64!"}]}',
            "copy[0] ('a'): content is not valid base64",
        ),
        (b'{"delete":["./*"],"copy":[{"path":"a\\u0000b","content":""}]}', "NUL"),
        (
            b'{"delete":["./*"],"copy":[{"path":"ok","content":"aGk="},{"path":"ok/x"}]}',
            "copy[0] writes 'ok' as a file",
        ),
        (b'{"delete":["./*"],"copy":[{"path":"ok"}]', "invalid JSON"),
        (b"", "invalid JSON"),
    ],
)
def test_bad_bodies_change_nothing(world: World, body: bytes, message: str) -> None:
    runner = world.claim()
    assert world.patch_files(runner, {"before": b"kept"}).status_code == 204
    r = world.patch_raw(runner, body)
    assert r.status_code == 400, r.text
    assert message in r.json()["message"]
    assert set(world.files(runner)) == {"./before"}, (
        "the body was refused before the runner was touched"
    )


def test_a_directory_where_a_file_goes_is_409_and_deleting_it_first_fixes_it(world: World) -> None:
    runner = world.claim()
    assert world.patch_files(runner, {"d/": None, "d/x": b"1", "f": b"2"}).status_code == 204
    r = world.patch_files(runner, {"d": b"file now"})
    assert r.status_code == 409
    assert "'d' is a directory" in r.json()["message"]
    r = world.patch_files(runner, {"f/below": b"x"})
    assert r.status_code == 409
    assert "'f' is not a directory" in r.json()["message"]
    assert world.patch_files(runner, {"d": b"file now"}, delete=["d"]).status_code == 204
    assert world.download(runner, "d").content == b"file now"


def test_an_upload_over_the_limit_is_413(make_sim: Any) -> None:
    with world_with(make_sim, NRC_FILES_MAX_UPLOAD="1000") as w:
        runner = w.claim()
        body = json.dumps(
            {"copy": [{"path": "big", "content": base64.b64encode(b"x" * 2000).decode()}]}
        )
        r = w.patch_raw(runner, body.encode())
        assert r.status_code == 413
        assert "larger than 1000 bytes" in r.json()["message"]

        def chunked() -> Iterator[bytes]:
            yield body.encode()[:500]
            yield body.encode()[500:]

        r = requests.patch(
            w.url(f"/runners/{runner}/files"), data=chunked(), headers=AUTH, timeout=10
        )
        assert r.status_code == 413
        assert w.list_files(runner).json() == {"files": []}
        # other routes keep their own limit
        r = w.patch_files(runner, {"small": b"y" * 100})
        assert r.status_code == 204


def test_missing_paths_and_directories_are_424(world: World) -> None:
    runner = world.claim()
    assert world.patch_files(runner, {"dir/": None}).status_code == 204
    r = world.list_files(runner, path="nothing")
    assert r.status_code == 424
    assert "'nothing' cannot be listed" in r.json()["message"]
    r = world.download(runner, "nothing")
    assert r.status_code == 424
    assert "'nothing' cannot be read: no such file" in r.json()["message"]
    r = world.download(runner, "dir")
    assert r.status_code == 424
    assert "'dir' is not a file: it is a directory" in r.json()["message"]
    r = requests.get(world.url(f"/runners/{runner}/files/raw"), headers=AUTH, timeout=10)
    assert (r.status_code, r.json()["message"]) == (400, "invalid request: path: Field required")
    r = world.list_files(runner, path="a\0b")
    assert r.status_code == 400
    assert "NUL" in r.json()["message"]


def test_unknown_and_released_runners_are_410(world: World) -> None:
    runner = world.claim()
    assert (
        requests.delete(world.url(f"/runners/{runner}"), headers=AUTH, timeout=10).status_code
        == 204
    )
    for r in (
        world.patch_files(runner, {"a": b"1"}),
        world.list_files(runner),
        world.download(runner, "a"),
        world.patch_files("no-such-runner", {"a": b"1"}),
    ):
        assert r.status_code == 410, r.text
        assert "unknown or was released" in r.json()["message"]


def test_the_token_is_required(world: World) -> None:
    runner = world.claim()
    r = requests.get(world.url(f"/runners/{runner}/files"), timeout=10)
    assert r.status_code == 401


@pytest.mark.parametrize("operation", ["download", "list", "copy"])
def test_right_after_a_reset_a_file_operation_names_the_loss(world: World, operation: str) -> None:
    """The first file operation after a restart — whether or not any event
    has reached the controller yet — answers 410 naming the reset, never a
    missing file, an empty listing or a copy into the fresh directory."""
    runner = world.claim()
    assert world.patch_files(runner, {"marker": b"mine"}).status_code == 204
    alloc = world.alloc_of(runner)["ID"]
    Http(world.sim.address).request("POST", f"/_sim/allocation/{alloc}/crash")
    r = {
        "download": lambda: world.download(runner, "marker"),
        "list": lambda: world.list_files(runner),
        "copy": lambda: world.patch_files(runner, {"a": b"1"}),
    }[operation]()
    assert r.status_code == 410, r.text
    assert "restarted" in r.json()["message"]
    for again in (world.download(runner, "marker"), world.list_files(runner)):
        assert again.status_code == 410
        assert "restarted" in again.json()["message"]


def test_file_operations_keep_the_runner_from_expiring(world: World) -> None:
    runner = world.claim(timeout_s=1)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        r = world.list_files(runner)
        assert r.status_code == 200, r.text
        time.sleep(0.3)  # the client's own pace: well inside its 1 s timeout
    assert world.runner_status(runner)[0] == 200


# -- the CodeOcean run ---------------------------------------------------------------

PROGRAM = b"""\
import sys
name = input("name? ")
with open("out/result.txt", "w") as f:
    f.write(f"hello {name}\\n")
print("done", name)
"""


def codeocean_copy(world: World, runner: str, files: dict[str, bytes]) -> requests.Response:
    """CodeOcean's copy: every distinct directory first, then the files, and
    `delete: ["./*"]` (lib/runner/strategy/poseidon.rb)."""
    directories = sorted({os.path.dirname(p) + "/" for p in files if os.path.dirname(p)})
    body = {
        "copy": [{"path": d} for d in directories]
        + [{"path": p, "content": base64.b64encode(c).decode()} for p, c in files.items()],
        "delete": ["./*"],
    }
    return world.patch_raw(runner, json.dumps(body).encode())


def claim_and_copy(world: World, files: dict[str, bytes], runner: str | None = None) -> str:
    """Runner#copy_files: on any error, a new runner and one more copy."""
    runner = runner or world.claim(timeout_s=180)
    r = codeocean_copy(world, runner, files)
    if r.status_code != 204:
        runner = world.claim(timeout_s=180)
        r = codeocean_copy(world, runner, files)
    assert r.status_code == 204, r.text
    return runner


def test_the_codeocean_run(world: World) -> None:
    files = {"main.py": PROGRAM, "out/.keep": b"", "data/input.txt": b"ignored"}
    runner = claim_and_copy(world, files)
    ws_url = world.execute(runner, f"{PYTHON} main.py", timeLimit=20)
    with world.connect(ws_url) as ws:
        started = time.monotonic()
        assert json.loads(ws.recv(timeout=10)) == {"type": "start"}
        ws.send('{"cmd":"result","data":"Ada"}\n')  # what CodeOcean forwards: JSON plus "\n"
        run = read_all(ws, started, start_read=True)
    assert run.last == {"type": "exit", "data": 0}
    assert run.close_code == 1000
    assert 'done {"cmd":"result","data":"Ada"}' in run.stdout
    listing = world.files(runner, path="./", recursive="true", privilegedExecution="false")
    kept = {n for n, e in listing.items() if e["entryType"] in "-d"}
    assert kept == {
        "./main.py",
        "./out",
        "./out/.keep",
        "./out/result.txt",
        "./data",
        "./data/input.txt",
    }
    d = world.download(runner, "./out/result.txt")
    assert d.content == b'hello {"cmd":"result","data":"Ada"}\n'
    assert d.headers["Content-Length"] == str(len(d.content))
    assert (
        requests.delete(world.url(f"/runners/{runner}"), headers=AUTH, timeout=10).status_code
        == 204
    )


def test_a_410_on_copy_leads_to_a_new_runner(world: World) -> None:
    lost = world.claim(timeout_s=180)
    alloc = world.alloc_of(lost)["ID"]
    Http(world.sim.address).request("POST", f"/_sim/allocation/{alloc}/crash")
    wait_until(lambda: world.runner_status(lost)[0] == 410, timeout=10, interval=0.05)
    r = codeocean_copy(world, lost, {"main.py": PROGRAM})
    assert r.status_code == 410
    assert "restarted" in r.json()["message"]
    runner = claim_and_copy(world, {"main.py": PROGRAM}, runner=lost)
    assert runner != lost
    assert world.download(runner, "main.py").content == PROGRAM


def test_the_codeocean_run_into_its_time_limit(world: World) -> None:
    runner = claim_and_copy(world, {"main.py": b"import time\ntime.sleep(60)\n"})
    run = world.run(runner, f"{PYTHON} main.py", timeLimit=1)
    assert run.last == {"type": "timeout"}
    # CodeOcean then destroys the runner
    assert (
        requests.delete(world.url(f"/runners/{runner}"), headers=AUTH, timeout=10).status_code
        == 204
    )


def test_the_codeocean_run_killed_for_memory(world: World) -> None:
    runner = claim_and_copy(
        world, {"main.py": b"print('started', flush=True)\nimport time\ntime.sleep(60)\n"}
    )
    alloc = world.alloc_of(runner)["ID"]
    ws_url = world.execute(runner, f"{PYTHON} main.py", timeLimit=20)
    with world.connect(ws_url) as ws:
        started = time.monotonic()
        assert json.loads(ws.recv(timeout=10)) == {"type": "start"}
        assert "started" in json.loads(ws.recv(timeout=10))["data"]
        Http(world.sim.address).request("POST", f"/_sim/allocation/{alloc}/oom")
        run = read_all(ws, started, start_read=True)
    assert run.last == {"type": "error", "data": "the allocation was OOM Killed"}
    r = world.list_files(runner)
    assert r.status_code == 410
    assert "oom_killed" in r.json()["message"]


def test_links_a_student_plants_never_redirect_a_file_operation(
    world: World, tmp_path: Any
) -> None:
    """The attacks of issue 24 (finding 1 and 2), as a student's code makes them."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("v")
    (outside / "secret").write_text("root only")
    os.chmod(outside / "secret", 0o600)
    runner = world.claim()
    run = world.run(
        runner,
        f"ln -s {outside} out && ln -s {outside}/secret leak && mkdir -- -delete && touch keep",
    )
    assert run.last == {"type": "exit", "data": 0}, run.frames
    r = world.patch_files(runner, {"out/pwned.txt": b"x", "out/new/": None})
    assert (r.status_code, r.json()["message"]) == (
        409,
        "'out' is a symbolic link: file operations never follow one",
    )
    r = world.patch_files(runner, {}, delete=["out/victim.txt"])
    assert r.status_code == 409 and "'out' is a symbolic link" in r.json()["message"]
    r = requests.get(
        world.url(f"/runners/{runner}/files/raw"),
        params={"path": "leak", "privilegedExecution": "true"},
        headers=AUTH,
        timeout=30,
    )
    assert r.status_code == 409 and "'leak' is a symbolic link" in r.json()["message"]
    r = world.list_files(runner, path="out/", privilegedExecution="true")
    assert r.status_code == 409 and "'out' is a symbolic link" in r.json()["message"]
    r = world.list_files(runner, path="-delete", privilegedExecution="true")
    assert (r.status_code, r.json()) == (200, {"files": []})
    assert sorted(p.name for p in outside.iterdir()) == ["secret", "victim.txt"]
    assert "./keep" in world.files(runner)


def test_a_hostile_range_is_400_or_416_never_500(world: World) -> None:
    """Issue 24, finding 6: a 40 kB Range blocked the event loop for seconds,
    a 5,000-digit one was a 500 with a traceback."""
    runner = world.claim()
    assert world.patch_files(runner, {"f": b"0123456789"}).status_code == 204
    r = world.download(runner, "f", Range="bytes=" + " " * 40_000 + "0-1x")
    assert r.status_code == 400 and "Range" in r.json()["message"]
    assert world.download(runner, "f", Range="bytes=" + "9" * 5000 + "-").status_code == 400
    assert world.download(runner, "f", Range="bytes=" + "9" * 100 + "-").status_code == 416
    r = world.download(runner, "f", Range="bytes=2-" + "9" * 100)
    assert (r.status_code, r.content) == (206, b"23456789")


def test_a_stalled_upload_is_408_and_frees_its_runner(make_sim: Any) -> None:
    """Issue 24, finding 6: a stalled body was held for ever, its runner in use."""
    with world_with(make_sim, NRC_FILES_UPLOAD_IDLE_TIMEOUT="1s") as w:
        runner = w.claim()
        head = (
            f"PATCH /api/v1/runners/{runner}/files HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{w.api.port}\r\nPoseidon-Token: {AUTH['Poseidon-Token']}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", w.api.port), timeout=10) as conn:
            conn.sendall(head.encode() + b'{"copy": [')  # then nothing
            started = time.monotonic()
            answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert time.monotonic() - started < 5
        assert w.patch_files(runner, {"after": b"1"}).status_code == 204
