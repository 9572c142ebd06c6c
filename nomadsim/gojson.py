"""Go's error texts for the values the simulator decodes the way Nomad's Go
code does: `encoding/json` syntax errors (its scanner's states and wording),
its type errors for the shapes the exec route reads, and `strconv.ParseBool`
and `strconv.Quote`. Nomad puts these texts into its answers verbatim
(`failed to marshal command into json: invalid character ...`), so a client
that shows or matches them sees the same words from the simulator.

The scanner follows the states of Go's `encoding/json/scanner.go` (facts
about its behaviour, not its code): the first byte that no state accepts is
reported as `invalid character 'c' <context>`, input that ends inside a value
as `unexpected end of JSON input`."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from typing import Any

_SPACE = frozenset(b" \t\r\n")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'bfnrt\\/"')
# Go's maxNestingDepth.
_MAX_DEPTH = 10_000

_OBJECT_KEY, _OBJECT_VALUE, _ARRAY_VALUE = range(3)


class GoSyntaxError(ValueError):
    """A Go `json.SyntaxError`: its text is what Go's `err.Error()` gives."""


def quote(text: str) -> str:
    """Go's `strconv.Quote` for valid UTF-8 text."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_SHORT_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


def _quote_char(c: int) -> str:
    """Go's scanner names an offending byte as the rune of the same value."""
    if c == ord("'"):
        return "'\\''"
    if c == ord('"'):
        return "'\"'"
    return "'" + quote(chr(c))[1:-1] + "'"


def parse_bool(text: str) -> bool:
    """`strconv.ParseBool`, ValueError carrying Go's text when it is not one."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"strconv.ParseBool: parsing {quote(text)}: invalid syntax")


Step = Callable[[int], "Step"]


class _Scanner:
    """One pass of Go's JSON scanner over bytes: each state takes a byte and
    returns the next state, or raises GoSyntaxError."""

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.end_top = False

    def ended(self) -> bool:
        """Whether a whole top-level value has been read (a method, so that
        checks before and after a step are not narrowed together)."""
        return self.end_top

    def fail(self, c: int, context: str) -> Step:
        raise GoSyntaxError(f"invalid character {_quote_char(c)} {context}")

    def push(self, kind: int) -> None:
        self.stack.append(kind)
        if len(self.stack) > _MAX_DEPTH:
            raise GoSyntaxError("exceeded max depth")

    def pop(self) -> Step:
        self.stack.pop()
        if not self.stack:
            self.end_top = True
            return self.end_top_state
        return self.end_value

    def begin_value_or_empty(self, c: int) -> Step:
        if c in _SPACE:
            return self.begin_value_or_empty
        if c == ord("]"):
            return self.end_value(c)
        return self.begin_value(c)

    def begin_value(self, c: int) -> Step:
        if c in _SPACE:
            return self.begin_value
        if c == ord("{"):
            self.push(_OBJECT_KEY)
            return self.begin_string_or_empty
        if c == ord("["):
            self.push(_ARRAY_VALUE)
            return self.begin_value_or_empty
        if c == ord('"'):
            return self.in_string
        if c == ord("-"):
            return self.negative
        if c == ord("0"):
            return self.zero
        if c in _DIGITS:
            return self.one_to_nine
        if c == ord("t"):
            return self.literal("true", 1)
        if c == ord("f"):
            return self.literal("false", 1)
        if c == ord("n"):
            return self.literal("null", 1)
        return self.fail(c, "looking for beginning of value")

    def begin_string_or_empty(self, c: int) -> Step:
        if c in _SPACE:
            return self.begin_string_or_empty
        if c == ord("}"):
            self.stack[-1] = _OBJECT_VALUE
            return self.end_value(c)
        return self.begin_string(c)

    def begin_string(self, c: int) -> Step:
        if c in _SPACE:
            return self.begin_string
        if c == ord('"'):
            return self.in_string
        return self.fail(c, "looking for beginning of object key string")

    def end_value(self, c: int) -> Step:
        if not self.stack:
            self.end_top = True
            return self.end_top_state(c)
        if c in _SPACE:
            return self.end_value
        kind = self.stack[-1]
        if kind == _OBJECT_KEY:
            if c == ord(":"):
                self.stack[-1] = _OBJECT_VALUE
                return self.begin_value
            return self.fail(c, "after object key")
        if kind == _OBJECT_VALUE:
            if c == ord(","):
                self.stack[-1] = _OBJECT_KEY
                return self.begin_string
            if c == ord("}"):
                return self.pop()
            return self.fail(c, "after object key:value pair")
        if c == ord(","):
            return self.begin_value
        if c == ord("]"):
            return self.pop()
        return self.fail(c, "after array element")

    def end_top_state(self, c: int) -> Step:
        if c not in _SPACE:
            return self.fail(c, "after top-level value")
        return self.end_top_state

    def in_string(self, c: int) -> Step:
        if c == ord('"'):
            return self.end_value
        if c == ord("\\"):
            return self.in_string_escape
        if c < 0x20:
            return self.fail(c, "in string literal")
        return self.in_string

    def in_string_escape(self, c: int) -> Step:
        if c in _ESCAPES:
            return self.in_string
        if c == ord("u"):
            return self.unicode_escape(4)
        return self.fail(c, "in string escape code")

    def unicode_escape(self, left: int) -> Step:
        def step(c: int) -> Step:
            if c not in _HEX:
                return self.fail(c, "in \\u hexadecimal character escape")
            return self.in_string if left == 1 else self.unicode_escape(left - 1)

        return step

    def negative(self, c: int) -> Step:
        if c == ord("0"):
            return self.zero
        if c in _DIGITS:
            return self.one_to_nine
        return self.fail(c, "in numeric literal")

    def one_to_nine(self, c: int) -> Step:
        if c in _DIGITS:
            return self.one_to_nine
        return self.zero(c)

    def zero(self, c: int) -> Step:
        if c == ord("."):
            return self.dot
        if c in (ord("e"), ord("E")):
            return self.exponent
        return self.end_value(c)

    def dot(self, c: int) -> Step:
        if c in _DIGITS:
            return self.dot_digits
        return self.fail(c, "after decimal point in numeric literal")

    def dot_digits(self, c: int) -> Step:
        if c in _DIGITS:
            return self.dot_digits
        if c in (ord("e"), ord("E")):
            return self.exponent
        return self.end_value(c)

    def exponent(self, c: int) -> Step:
        if c in (ord("+"), ord("-")):
            return self.exponent_sign
        return self.exponent_sign(c)

    def exponent_sign(self, c: int) -> Step:
        if c in _DIGITS:
            return self.exponent_digits
        return self.fail(c, "in exponent of numeric literal")

    def exponent_digits(self, c: int) -> Step:
        if c in _DIGITS:
            return self.exponent_digits
        return self.end_value(c)

    def literal(self, word: str, at: int) -> Step:
        def step(c: int) -> Step:
            if c != ord(word[at]):
                return self.fail(c, f"in literal {word} (expecting {_quote_char(ord(word[at]))})")
            return self.end_value if at == len(word) - 1 else self.literal(word, at + 1)

        return step


# What `in_string` passes over without changing state: every byte but the
# quote, the backslash and the control characters.
_PLAIN = re.compile(rb'[^"\\\x00-\x1f]+')


def _past_plain(data: bytes, i: int) -> int:
    """Where a run of such bytes from `i` ends: the scanners below skip it in
    one match instead of feeding `in_string` byte by byte (strings are most
    of what a large message holds)."""
    plain = _PLAIN.match(data, i)
    return plain.end() if plain is not None else i


def check_syntax(data: bytes) -> None:
    """Go's `checkValid`: GoSyntaxError with Go's text at the first error."""
    scanner = _Scanner()
    step: Step = scanner.begin_value
    in_string = scanner.in_string
    i, size = 0, len(data)
    while i < size:
        if step == in_string:
            i = _past_plain(data, i)
            if i == size:
                break
        step = step(data[i])
        i += 1
    if scanner.ended():
        return
    # At the end Go feeds one space, which completes a bare number.
    step(ord(" "))
    if not scanner.ended():
        raise GoSyntaxError("unexpected end of JSON input")


class Number(str):
    """A JSON number kept as written, as Go names it in its errors."""


def _decode(data: bytes) -> Any:
    # Go takes invalid UTF-8 inside strings and makes it U+FFFD.
    return json.loads(data.decode("utf-8", "replace"), parse_int=Number, parse_float=Number)


def loads(text: str | bytes) -> Any:
    """`json.Unmarshal`'s view of the input: GoSyntaxError with Go's text
    when it is not JSON. Numbers stay `Number` strings."""
    data = text.encode() if isinstance(text, str) else text
    check_syntax(data)
    return _decode(data)


def loads_message(text: str | bytes) -> Any:
    """A `json.Decoder`'s view of one WebSocket message (gorilla/websocket's
    ReadJSON): the first value, whatever follows it ignored; input that ends
    before the value does is `unexpected EOF`."""
    data = text.encode() if isinstance(text, str) else text
    scanner = _Scanner()
    step: Step = scanner.begin_value
    in_string = scanner.in_string
    i, end = 0, len(data)
    while i < end:
        if scanner.ended():
            end = i
            break
        if step == in_string:
            i = _past_plain(data, i)
            if i == end:
                continue  # the input ends inside the string
        try:
            step = step(data[i])
        except GoSyntaxError:
            # The byte after a top-level value ends it; Go complains only later.
            if scanner.ended():
                end = i
                break
            raise
        i += 1
    else:
        if not scanner.ended():
            with contextlib.suppress(GoSyntaxError):
                step(ord(" "))
            if not scanner.ended():
                raise GoSyntaxError("unexpected EOF")
    return _decode(data[:end])


def kind(value: Any) -> str:
    """How Go's decoder names a JSON value in an UnmarshalTypeError."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Number):
        return "number"
    return "string"


def string_list(text: str) -> list[str] | None:
    """`json.Unmarshal` into a Go `[]string`: None for `null`, ValueError with
    Go's text otherwise. A `null` element is an empty string, as in Go."""
    value = loads(text)
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"json: cannot unmarshal {kind(value)} into Go value of type []string")
    out = []
    for item in value:
        if item is None:
            out.append("")
        elif isinstance(item, str) and not isinstance(item, Number):
            out.append(item)
        else:
            # Go reports the first mismatch after decoding the rest.
            raise ValueError(f"json: cannot unmarshal {kind(item)} into Go value of type string")
    return out
