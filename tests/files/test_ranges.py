"""Range requests (RFC 9110 §14) for downloads: one span, whole file, 416."""

from __future__ import annotations

import pytest

from controller.files.ranges import Span, Unsatisfiable, http_date, requested

SIZE = 1000
MTIME = 1_700_000_000


@pytest.mark.parametrize(
    ("header", "span"),
    [
        (None, None),
        ("", None),
        ("bytes=0-99", Span(0, 100)),
        ("bytes=100-", Span(100, 900)),
        ("bytes=-100", Span(900, 100)),
        ("bytes=-5000", Span(0, 1000)),
        ("bytes=990-2000", Span(990, 10)),
        ("bytes=999-999", Span(999, 1)),
        (" bytes = 5 - 9 ", Span(5, 5)),
        ("bytes=0-1,5-6", None),  # several ranges: ignored, the whole file
        ("items=0-1", None),  # another unit: ignored
        ("bytes=9-5", None),  # invalid: ignored
        ("bytes=-", None),
        ("garbage", None),
    ],
)
def test_requested(header: str | None, span: Span | None) -> None:
    assert requested(header, SIZE, None, MTIME) == span


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=5000-6000", "bytes=-0"])
def test_unsatisfiable(header: str) -> None:
    with pytest.raises(Unsatisfiable):
        requested(header, SIZE, None, MTIME)


def test_an_empty_file_has_no_byte_to_serve() -> None:
    with pytest.raises(Unsatisfiable):
        requested("bytes=-10", 0, None, MTIME)
    assert requested(None, 0, None, MTIME) is None


def test_if_range_serves_the_span_only_while_the_file_is_unchanged() -> None:
    assert requested("bytes=0-9", SIZE, http_date(MTIME), MTIME) == Span(0, 10)
    assert requested("bytes=0-9", SIZE, http_date(MTIME - 1), MTIME) is None
    assert requested("bytes=0-9", SIZE, '"an-etag"', MTIME) is None


def test_content_range() -> None:
    assert Span(900, 100).content_range(SIZE) == "bytes 900-999/1000"
