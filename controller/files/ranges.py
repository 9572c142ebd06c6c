"""HTTP Range requests for downloads (RFC 9110 §14). Pure.

One range is served as 206 with Content-Range; a request without Range, or
with one this server ignores (several ranges, another unit, bad syntax — the
RFC lets a server ignore those), gets the whole file as 200. A range that
starts at or beyond the end is 416. `If-Range` with the file's
Last-Modified date serves the range only while the file is unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime

_RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*")


@dataclass(frozen=True)
class Span:
    start: int
    length: int

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.start + self.length - 1}/{size}"


class Unsatisfiable(Exception):
    """416: the range lies beyond the file."""


def http_date(epoch_s: int) -> str:
    return formatdate(epoch_s, usegmt=True)


def requested(header: str | None, size: int, if_range: str | None, mtime: int) -> Span | None:
    """The one span to serve, None for the whole file; Unsatisfiable for 416."""
    if not header:
        return None
    if if_range is not None and not _unchanged(if_range, mtime):
        return None
    match = _RANGE.fullmatch(header)
    if match is None:
        return None  # several ranges, another unit, or not a range at all
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:
        # The last N bytes.
        suffix = int(last)
        if suffix == 0:
            raise Unsatisfiable
        length = min(suffix, size)
        if length == 0:
            raise Unsatisfiable
        return Span(size - length, length)
    start = int(first)
    if last and int(last) < start:
        return None  # invalid: ignored
    if start >= size:
        raise Unsatisfiable
    end = min(int(last), size - 1) if last else size - 1
    return Span(start, end - start + 1)


def _unchanged(if_range: str, mtime: int) -> bool:
    # Only dates: this server sends no ETag, so an entity tag never matches.
    try:
        return int(parsedate_to_datetime(if_range).timestamp()) == mtime
    except (TypeError, ValueError, IndexError):
        return False
