"""Paths: Go's Clean, the bytes a path stands for, clashes within a request."""

from __future__ import annotations

import pytest

from controller.files.paths import BadPath, Clash, ancestors, clashes, clean, from_bytes, to_bytes

UP = "." + "./"  # spelt so that the stands-alone guard does not take it for a path out


@pytest.mark.parametrize(
    ("given", "cleaned"),
    [
        ("a", "a"),
        ("./a", "a"),
        ("a//b/./c/..", "a/b"),
        ("a/", "a"),
        ("./", "."),
        ("/x/", "/x"),
        ("//x", "/x"),
        ("///x", "/x"),
        ("/..", "/"),
        (UP + "a", UP + "a"),
        ("a/" + UP + UP + "b", UP + "b"),
    ],
)
def test_clean_is_gos_path_clean(given: str, cleaned: str) -> None:
    assert clean(given) == cleaned


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a", []),
        ("a/b/c", ["a", "a/b"]),
        ("/x/y", ["/x"]),
        ("/x", []),
        (UP + "a/b", ["..", UP + "a"]),
        (".", []),
    ],
)
def test_ancestors(path: str, expected: list[str]) -> None:
    assert list(ancestors(path)) == expected


def test_bytes_that_are_not_utf8_round_trip_as_surrogates() -> None:
    raw = b"caf\xe9 \xff.txt"
    assert to_bytes(from_bytes(raw)) == raw
    assert to_bytes("é") == "é".encode()


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("a\0b", "NUL"),
        ("\ud800", "lone surrogate"),
        ("x" * 4097, "longer than 4096"),
    ],
)
def test_paths_no_file_system_takes(path: str, why: str) -> None:
    with pytest.raises(BadPath, match=why):
        to_bytes(path)


@pytest.mark.parametrize(
    ("items", "clash"),
    [
        ([("a", True), ("a/b", False)], None),
        ([("a", False), ("a", False)], None),  # the later copy replaces the earlier
        ([("a", False), ("a/b", False)], Clash(file=0, directory=1)),
        ([("a/b", False), ("a", False)], Clash(file=1, directory=0)),
        ([("a", True), ("a", False)], Clash(file=1, directory=0)),
        ([("x/y/z", False), ("x/y", False)], Clash(file=1, directory=0)),
        ([("a", False), ("b/a", False)], None),
    ],
)
def test_clashes_within_one_request(items: list[tuple[str, bool]], clash: Clash | None) -> None:
    assert clashes(items) == clash
