"""The PATCH /files body, parsed from a spool without holding it: what is
accepted, what is refused (naming the item), and that contents decode to
exactly the bytes sent however the JSON is written and wherever the spool's
reads cut it."""

from __future__ import annotations

import base64
import json
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.files import upload
from controller.files.upload import BadUpload, Copy, Upload, content_chunks, parse


def parsed(body: bytes) -> tuple[Upload, list[bytes]]:
    with tempfile.TemporaryFile() as spool:
        spool.write(body)
        spool.flush()
        result = parse(spool.fileno())
        contents = [
            b"".join(content_chunks(spool.fileno(), c.content.region)) if c.content else b""
            for c in result.copies
        ]
        return result, contents


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(params=[upload.CHUNK, 7], ids=["chunk-64k", "chunk-7"])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Every test also runs with reads of 7 bytes: strings, escapes and
    base64 quanta then straddle the reads everywhere."""
    monkeypatch.setattr(upload, "CHUNK", request.param)
    return int(request.param)


def test_codeoceans_body(chunk: int) -> None:
    body = {
        "copy": [
            {"path": "src/"},
            {"path": "src/main.py", "content": b64(b"print(input())\n")},
            {"path": "empty"},
            {"path": "null", "content": None},
        ],
        "delete": ["./*"],
    }
    result, contents = parsed(json.dumps(body).encode())
    assert result.deletions == ("./*",)
    assert result.copies == (
        Copy("src", True, None),
        Copy("src/main.py", False, result.copies[1].content),
        Copy("empty", False, None),
        Copy("null", False, None),
    )
    assert contents == [b"", b"print(input())\n", b"", b""]
    assert result.content_bytes == 15


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"copy":[{"path":"a","content":"aGVs\\/G8="}]}', b"hel\xfco"),
        (b'{"copy":[{"path":"a","content":"aGVs\\nbG8="}]}', b"hello"),
        (b'{"copy":[{"path":"a","content":"aGVs\\r\\nbG8="}]}', b"hello"),
        (b'{"copy":[{"path":"a","content":""}]}', b""),
        (b' {"copy" : [ {"content":"aGk=" , "path":"a"} ] } ', b"hi"),
    ],
)
def test_content_as_json_may_write_it(body: bytes, expected: bytes, chunk: int) -> None:
    assert parsed(body)[1] == [expected]


def test_directories_ignore_content_and_paths_are_cleaned(chunk: int) -> None:
    body = {"copy": [{"path": "./a//b/", "content": "not even base64"}, {"path": "/abs/./f"}]}
    result, _ = parsed(json.dumps(body).encode())
    assert result.copies == (Copy("a/b", True, None), Copy("/abs/f", False, None))


def test_names_with_any_character_and_bytes_that_are_not_utf8(chunk: int) -> None:
    names = ['with "quotes" \\ and\nnewline -> arrow', "café ünïcode", "raw \udcff\udce9"]
    body = {"copy": [{"path": n} for n in names], "delete": names}
    result, _ = parsed(json.dumps(body).encode())
    assert [c.path for c in result.copies] == names
    assert result.deletions == tuple(names)


def test_unknown_fields_are_ignored_as_poseidon_does(chunk: int) -> None:
    body = b'{"x":{"y":[1,"two",null,{"z":true}]},"copy":[{"path":"a","mode":7}],"w":"v"}'
    assert parsed(body)[0].copies == (Copy("a", False, None),)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "invalid JSON"),
        (b"[]", "must be a JSON object"),
        (b'"x"', "must be a JSON object"),
        (b"{", "invalid JSON"),
        (b'{"copy":[]} {}', "invalid JSON"),
        (b'{"copy":[{"path":"a"}', "invalid JSON"),
        (b'{"copy":[{"path":"a', "ends inside a string"),
        (b'{"copy":{}}', "copy must be an array"),
        (b'{"delete":"./*"}', "delete must be an array"),
        (b'{"delete":[1]}', r"delete\[0\]: a path must be a string"),
        (b'{"copy":["a"]}', r"copy\[0\] must be an object"),
        (b'{"copy":[{"content":"aGk="}]}', r"copy\[0\]: path is missing"),
        (b'{"copy":[{"path":""}]}', r"copy\[0\]: the path is empty"),
        (b'{"copy":[{"path":7}]}', r"copy\[0\]: a path must be a string"),
        (b'{"copy":[{"path":"a\\u0000b"}]}', r"copy\[0\]: the path 'a\\x00b' contains a NUL"),
        (b'{"copy":[{"path":"\\ud800"}]}', "lone surrogate"),
        (b'{"copy":[{"path":"a","content":7}]}', "content must be a base64 string"),
        (b'{"copy":[{"path":"ok"},{"path":"a","content":"aGk"}]}', r"copy\[1\] \('a'\): content"),
        (b'{"copy":[{"path":"a","content":"a=Gk"}]}', "not valid base64"),
        (b'{"copy":[{"path":"a","content":"aG!k"}]}', "not valid base64"),
        (b'{"copy":[{"path":"a","content":"aG\\u0041k"}]}', "not valid base64"),
        (b'{"copy":[{"path":"a","content":"aGk=\\"}]}', "invalid JSON|not valid base64"),
        (b'{"copy":[{"path":"a","path":"b"}]}', "duplicate key 'path'"),
        (b'{"copy":[],"copy":[]}', "duplicate key 'copy'"),
        (b'{"x":"\\q"}', "invalid JSON: a string is not a valid JSON string"),
        (b'{"copy":[{"path":"a\xff"}]}', "not a valid JSON string"),
        (b'{"copy":[{"path":"a"},{"path":"a/b"}]}', r"copy\[0\] writes 'a' as a file"),
        (b'{"copy":[{"path":"x/"},{"path":"x"}]}', r"copy\[1\] writes 'x' as a file"),
    ],
)
def test_bad_bodies_name_the_problem(body: bytes, message: str, chunk: int) -> None:
    with pytest.raises(BadUpload, match=message):
        parsed(body)


_paths = st.text(
    st.characters(codec="utf-8", exclude_characters="\0/") | st.sampled_from("\udcff\udc80"),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(
    files=st.lists(st.tuples(_paths, st.binary(max_size=300)), min_size=1, max_size=6),
    ascii_only=st.booleans(),
    escape_slashes=st.booleans(),
    chunk=st.integers(1, 64),
)
def test_any_body_gives_back_exactly_what_was_sent(
    files: list[tuple[str, bytes]], ascii_only: bool, escape_slashes: bool, chunk: int
) -> None:
    body: dict[str, Any] = {"copy": [{"path": p, "content": b64(d)} for p, d in files]}
    text = json.dumps(body, ensure_ascii=ascii_only)
    if escape_slashes:
        text = text.replace("/", "\\/")  # as PHP's and old Ruby encoders write it
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(upload, "CHUNK", chunk)
        result, contents = parsed(text.encode("utf-8", "surrogatepass"))
    assert [c.path for c in result.copies] == [p for p, _ in files]
    assert contents == [d for _, d in files]
    assert [c.size for c in result.copies] == [len(d) for _, d in files]
