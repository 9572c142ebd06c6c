"""HTTP Range requests for downloads (RFC 9110 §14). Pure.

One range is served as 206 with Content-Range; a request without Range, or
with one this server ignores (several ranges, another unit, bad syntax — the
RFC lets a server ignore those), gets the whole file as 200. A range that
starts at or beyond the end is 416. `If-Range` with the file's
Last-Modified date serves the range only while the file is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime

# One `bytes=<first>-<last>` needs far less; a longer header is refused
# (400) before it is parsed, whatever it holds.
MAX_RANGE_HEADER = 200
# More digits than any file size has (2^63 has 19): such a position lies
# beyond every file, and is never turned into an int (whose conversion of
# thousands of digits is slow, and refused beyond 4,300).
MAX_DIGITS = 19


class RangeTooLong(ValueError):
    """400: the Range header is longer than its bound (NRC_FILES_MAX_RANGE_HEADER,
    MAX_RANGE_HEADER by default)."""


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


def checked(header: str | None, max_length: int = MAX_RANGE_HEADER) -> str | None:
    """The header, or RangeTooLong."""
    if header is not None and len(header) > max_length:
        raise RangeTooLong(f"the Range header is longer than {max_length} characters")
    return header


def _spec(header: str) -> tuple[str, str] | None:
    """(first, last) digits of `bytes=first-last`, either may be empty; None
    for anything else. Partitions and strips only: linear in the header."""
    unit, eq, spec = header.partition("=")
    if not eq or unit.strip() != "bytes" or "," in spec:
        return None  # not a range, another unit, or several ranges
    first, dash, last = spec.partition("-")
    first, last = first.strip(), last.strip()
    if not dash or not all(p == "" or (p.isascii() and p.isdigit()) for p in (first, last)):
        return None
    return first, last


def _number(digits: str) -> int | None:
    """The digits' value; None when it exceeds any file size."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= MAX_DIGITS else None


def requested(header: str | None, size: int, if_range: str | None, mtime: int) -> Span | None:
    """The one span to serve, None for the whole file; Unsatisfiable for 416."""
    if not header:
        return None
    if if_range is not None and not _unchanged(if_range, mtime):
        return None
    spec = _spec(checked(header) or "")
    if spec is None:
        return None
    first, last = spec
    if not first and not last:
        return None
    if not first:
        # The last N bytes (N beyond any size: all of them).
        suffix = _number(last)
        if suffix == 0:
            raise Unsatisfiable
        length = size if suffix is None else min(suffix, size)
        if length == 0:
            raise Unsatisfiable
        return Span(size - length, length)
    start = _number(first)
    end = _number(last) if last else None
    if start is None:
        raise Unsatisfiable  # beyond any file
    if last and end is not None and end < start:
        return None  # invalid: ignored
    if start >= size:
        raise Unsatisfiable
    end = size - 1 if end is None else min(end, size - 1)
    return Span(start, end - start + 1)


def _unchanged(if_range: str, mtime: int) -> bool:
    # Only dates: this server sends no ETag, so an entity tag never matches.
    try:
        return int(parsedate_to_datetime(if_range).timestamp()) == mtime
    except (TypeError, ValueError, IndexError):
        return False
