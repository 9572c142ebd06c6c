"""A `PATCH /files` body, read without holding it in memory.

The body (up to NRC_FILES_MAX_UPLOAD, 100 MiB by default) is first spooled to
an unlinked temporary file as it arrives. It is then read twice, never whole:

1. Parsing: `ijson` checks the JSON's structure while `StringRegions` hands it
   every string as `""` and remembers where the real string lies in the
   spool. Keys and paths are then decoded from their few bytes; a file's
   content is checked as base64 straight from the spool, so a 100 MiB file
   never becomes a Python string. The result is an `Upload`: deletions and
   copies, each copy's content a `Content` region with its decoded size.
2. Sending: `content_chunks` decodes a region again, chunk by chunk, into the
   tar stream (`controller.files.tar`).

So a body that is bad anywhere is refused (400, naming the item) before the
runner is touched, and the controller's memory does not grow with the upload.

Content is standard base64, as Poseidon's Go `[]byte` is; like Go we skip CR
and LF in it and want the padding. JSON escapes in content other than `\\/`,
`\\n` and `\\r` never occur in base64 and are refused as such.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import ijson

from controller.files.paths import BadPath, clashes, clean, to_bytes

CHUNK = 64 * 1024
# Keys and paths are decoded whole; longer than this is neither.
MAX_NAME_RAW = 64 * 1024


class BadUpload(ValueError):
    """The body is not a valid `PATCH /files` request; the message names where."""


@dataclass(frozen=True)
class Region:
    """Where a JSON string's raw text (between its quotes) lies in the spool."""

    offset: int
    length: int
    escaped: bool  # holds a backslash


@dataclass(frozen=True)
class Content:
    region: Region
    size: int  # decoded bytes


@dataclass(frozen=True)
class Copy:
    path: str  # cleaned
    is_dir: bool
    content: Content | None  # None: a directory or an empty file

    @property
    def size(self) -> int:
        return self.content.size if self.content else 0


@dataclass(frozen=True)
class Upload:
    deletions: tuple[str, ...]
    copies: tuple[Copy, ...]

    @property
    def content_bytes(self) -> int:
        return sum(c.size for c in self.copies)


# -- strings out of ijson's sight ------------------------------------------------------

_STRING_END = re.compile(rb'["\\]')


class StringRegions:
    """A file-like view of the spooled JSON in which every string reads `""`;
    each string's region is queued, in document order, for `take`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._offset = 0  # of the next byte read from the spool
        self._regions: deque[Region] = deque()
        self._in_string = False
        self._start = 0
        self._escaped = False
        self._after_backslash = False

    def take(self) -> Region:
        return self._regions.popleft()

    def read(self, size: int = CHUNK) -> bytes:
        if size == 0:
            return b""  # ijson's probe of the type
        while True:
            data = os.pread(self._fd, max(size, CHUNK), self._offset)
            if not data:
                if self._in_string:
                    raise BadUpload("invalid JSON: the body ends inside a string")
                return b""
            base = self._offset
            self._offset += len(data)
            out = self._scan(data, base)
            if out:
                return out

    def _scan(self, data: bytes, base: int) -> bytes:
        out = bytearray()
        i = 0
        n = len(data)
        while i < n:
            if not self._in_string:
                j = data.find(b'"', i)
                if j < 0:
                    out += data[i:]
                    break
                out += data[i:j]
                self._in_string = True
                self._start = base + j + 1
                self._escaped = False
                self._after_backslash = False
                i = j + 1
                continue
            if self._after_backslash:
                # The escaped character (a quote or backslash among them).
                self._after_backslash = False
                i += 1
                continue
            match = _STRING_END.search(data, i)
            if match is None:
                break
            k = match.start()
            if data[k] == 0x5C:  # backslash
                self._escaped = True
                self._after_backslash = True
                i = k + 1
                continue
            end = base + k
            self._regions.append(Region(self._start, end - self._start, self._escaped))
            self._in_string = False
            out += b'""'
            i = k + 1
        return bytes(out)


def read_region(fd: int, region: Region) -> Iterator[bytes]:
    offset, left = region.offset, region.length
    while left > 0:
        data = os.pread(fd, min(CHUNK, left), offset)
        if not data:
            raise BadUpload("the upload's spool ended early")
        offset += len(data)
        left -= len(data)
        yield data


def decode_string(fd: int, region: Region) -> str:
    """A short JSON string from its region, exactly as JSON defines it (lone
    surrogates kept: they name bytes that are not UTF-8)."""
    if region.length > MAX_NAME_RAW:
        raise ValueError(f"longer than {MAX_NAME_RAW} bytes")
    raw = b"".join(read_region(fd, region))
    try:
        value = json.loads(b'"' + raw + b'"')
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a valid JSON string ({exc})") from None
    assert isinstance(value, str)
    return value


# -- base64 content, streamed --------------------------------------------------------------

_ESCAPE = re.compile(rb"\\(.)", re.DOTALL)
_UNESCAPED = {b"/": b"/", b"n": b"", b"r": b""}


def _unescape(match: re.Match[bytes]) -> bytes:
    replacement = _UNESCAPED.get(match.group(1))
    if replacement is None:
        raise binascii.Error(f"the escape \\{match.group(1).decode('latin-1')} is not base64")
    return replacement


class Base64Stream:
    """Standard base64 decoded piece by piece; `binascii.Error` when it is not.
    Padding is only allowed at the very end (held back until `finish`)."""

    def __init__(self) -> None:
        self._carry = b""

    def feed(self, text: bytes) -> bytes:
        text = self._carry + text.replace(b"\r", b"").replace(b"\n", b"")
        # The last quantum may hold padding: keep it until the end is known.
        cut = max(0, (len(text) - 1) // 4 * 4)
        body, self._carry = text[:cut], text[cut:]
        if b"=" in body:
            raise binascii.Error("padding before the end")
        return base64.b64decode(body, validate=True)

    def finish(self) -> bytes:
        tail, self._carry = self._carry, b""
        if len(tail) % 4:
            raise binascii.Error("its length is not a multiple of 4 (padding missing?)")
        return base64.b64decode(tail, validate=True)


def content_chunks(fd: int, region: Region) -> Iterator[bytes]:
    """The decoded bytes of a content string; binascii.Error when it is not
    base64."""
    decoder = Base64Stream()
    carry = b""
    for raw in read_region(fd, region):
        if region.escaped:
            raw = carry + raw
            # An odd run of backslashes at the end: its escape continues in
            # the next piece.
            run = len(raw) - len(raw.rstrip(b"\\"))
            carry, raw = (raw[-1:], raw[:-1]) if run % 2 else (b"", raw)
            raw = _ESCAPE.sub(_unescape, raw)
        decoded = decoder.feed(raw)
        if decoded:
            yield decoded
    if carry:
        raise binascii.Error("it ends inside an escape")
    last = decoder.finish()
    if last:
        yield last


# -- the document ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Bounds on what one upload may list, whatever its size in bytes: each
    item and each path costs memory and time far beyond its bytes."""

    max_items: int = 10_000  # deletions and copies together
    max_path_bytes: int = 4 * 1024 * 1024  # all paths together


class _Events:
    """ijson's events with the real value of every string (decoded on demand)."""

    def __init__(self, fd: int, limits: Limits | None = None) -> None:
        self.fd = fd
        self.limits = limits or Limits()
        self.items = 0
        self.path_bytes = 0
        self._strings = StringRegions(fd)
        self._events = ijson.basic_parse(self._strings, buf_size=CHUNK, use_float=True)

    def next(self) -> tuple[str, Region | None]:
        try:
            event, _ = next(self._events)
        except StopIteration:
            raise BadUpload("invalid JSON: the body ended early") from None
        except ijson.JSONError as exc:
            raise BadUpload(f"invalid JSON: {_first_line(exc)}") from None
        if event in ("map_key", "string"):
            return event, self._strings.take()
        return event, None

    def end(self) -> None:
        try:
            extra = next(self._events, None)
        except ijson.JSONError as exc:
            raise BadUpload(f"invalid JSON: {_first_line(exc)}") from None
        if extra is not None:
            raise BadUpload("invalid JSON: more than one value in the body")


def _first_line(exc: Exception) -> str:
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return str(text).strip().splitlines()[0] if str(text).strip() else type(exc).__name__


def _skip(events: _Events, event: str, region: Region | None) -> None:
    """Consume one value (already begun with `event`); short strings inside
    it are still checked, so the body as a whole is valid JSON."""
    if region is not None and region.length <= MAX_NAME_RAW:
        try:
            decode_string(events.fd, region)
        except ValueError as exc:
            raise BadUpload(f"invalid JSON: a string is {exc}") from None
    if event not in ("start_map", "start_array"):
        return
    depth = 1
    while depth:
        inner, inner_region = events.next()
        if inner in ("start_map", "start_array"):
            depth += 1
        elif inner in ("end_map", "end_array"):
            depth -= 1
        elif inner_region is not None:
            _skip(events, inner, inner_region)


def _key(events: _Events, region: Region | None) -> str | None:
    assert region is not None
    try:
        return decode_string(events.fd, region)
    except ValueError as exc:
        raise BadUpload(f"invalid JSON: a key is {exc}") from None


def _path(events: _Events, where: str, event: str, region: Region | None) -> str:
    if event != "string" or region is None:
        raise BadUpload(f"{where}: a path must be a string")
    try:
        text = decode_string(events.fd, region)
    except ValueError as exc:
        raise BadUpload(f"{where}: the path is {exc}") from None
    if not text:
        raise BadUpload(f"{where}: the path is empty")
    try:
        raw = to_bytes(text)
    except BadPath as exc:
        raise BadUpload(f"{where}: the path {text!r} {exc}") from None
    events.path_bytes += len(raw)
    if events.path_bytes > events.limits.max_path_bytes:
        raise BadUpload(
            f"{where}: the paths take more than {events.limits.max_path_bytes} bytes "
            "(NRC_FILES_MAX_PATH_BYTES)"
        )
    return text


def _items(events: _Events, name: str, shape: str) -> Iterator[tuple[str, Region | None]]:
    """The first event of each item of the array `name` (none for null)."""
    event, _ = events.next()
    if event == "null":
        return
    if event != "start_array":
        raise BadUpload(f"{name} must be {shape}")
    while True:
        event, region = events.next()
        if event == "end_array":
            return
        events.items += 1
        if events.items > events.limits.max_items:
            raise BadUpload(
                f"more than {events.limits.max_items} delete and copy items (NRC_FILES_MAX_ITEMS)"
            )
        yield event, region


def _deletions(events: _Events) -> list[str]:
    return [
        _path(events, f"delete[{index}]", event, region)
        for index, (event, region) in enumerate(_items(events, "delete", "an array of paths"))
    ]


def _content(events: _Events, where: str, path: str, region: Region) -> Content:
    size = 0
    try:
        for piece in content_chunks(events.fd, region):
            size += len(piece)
    except binascii.Error as exc:
        raise BadUpload(f"{where} ({path!r}): content is not valid base64: {exc}") from None
    return Content(region, size)


def _keys(events: _Events, where: str) -> Iterator[str | None]:
    """The keys of an object whose opening brace was read; the caller reads
    each key's value before the next key. A key twice is refused."""
    seen: set[str | None] = set()
    while True:
        event, region = events.next()
        if event == "end_map":
            return
        key = _key(events, region)
        if key in seen:
            raise BadUpload(f"{where}: duplicate key {key!r}")
        seen.add(key)
        yield key


def _copy_item(events: _Events, index: int) -> Copy:
    """One copy item, its opening brace already read."""
    where = f"copy[{index}]"
    path: str | None = None
    content: Region | None = None
    for key in _keys(events, where):
        event, region = events.next()
        if key == "path":
            path = _path(events, where, event, region)
        elif key == "content":
            if event == "string":
                content = region
            elif event != "null":
                raise BadUpload(f"{where}: content must be a base64 string")
        else:
            _skip(events, event, region)
    if path is None:
        raise BadUpload(f"{where}: path is missing")
    if path.endswith("/"):
        # A directory; its content is ignored, as Poseidon does.
        return Copy(clean(path), True, None)
    if content is None or content.length == 0:
        return Copy(clean(path), False, None)
    return Copy(clean(path), False, _content(events, where, path, content))


def _copies(events: _Events) -> list[Copy]:
    copies: list[Copy] = []
    for event, _ in _items(events, "copy", "an array of {path, content} objects"):
        if event != "start_map":
            raise BadUpload(f"copy[{len(copies)}] must be an object with a path")
        copies.append(_copy_item(events, len(copies)))
    return copies


def parse(fd: int, limits: Limits | None = None) -> Upload:
    """The upload in the spool `fd`; BadUpload naming the first problem
    (also going beyond `limits`)."""
    events = _Events(fd, limits)
    event, _ = events.next()
    if event != "start_map":
        raise BadUpload("the body must be a JSON object with delete and copy")
    deletions: list[str] = []
    copies: list[Copy] = []
    for key in _keys(events, "invalid JSON"):
        if key == "delete":
            deletions = _deletions(events)
        elif key == "copy":
            copies = _copies(events)
        else:
            event, region = events.next()
            _skip(events, event, region)
    events.end()
    clash = clashes((c.path, c.is_dir) for c in copies)
    if clash is not None:
        file, directory = copies[clash.file], copies[clash.directory]
        raise BadUpload(
            f"copy[{clash.file}] writes {file.path!r} as a file, but copy[{clash.directory}] "
            f"({directory.path!r}) needs it to be a directory"
        )
    return Upload(tuple(deletions), tuple(copies))
