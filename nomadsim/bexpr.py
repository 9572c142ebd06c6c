"""Filter expressions (`?filter=`) as Nomad evaluates them with go-bexpr.

Nomad's list endpoints take a boolean expression over the objects they list
(`JobID == "web" and ClientStatus != "failed"`) and return only the objects
it matches; the objects are Nomad's own structs (a whole `Job`, a whole
`Allocation`), not the list stubs. This module parses the grammar of
go-bexpr (`grammar/grammar.peg`) and evaluates it with go-bexpr's rules:

- operators `==`, `!=`, `is empty`, `is not empty`, `"v" in Sel`,
  `"v" not in Sel`, `Sel contains "v"`, `Sel not contains "v"`,
  `Sel matches "re"`, `Sel not matches "re"`; `and`, `or`, `not` and
  parentheses, with `not` binding tightest and `and` before `or`;
- selectors `A.B.C`, `A["map key"]` and `A.0` (a slice element); a value is a
  quoted string (`"..."` with Go escapes, or a raw `` `...` ``), a number, or
  a bare selector (taken as its text);
- the value is converted to the type of the field it is compared with (bool,
  integer, float or string), as go-bexpr coerces it; `in`/`contains` test a
  map's keys, a slice's elements or a substring; `is empty` is length zero;
  `matches` is a regular-expression search;
- a map key that is absent makes `==`, `in`, `is not empty` and `matches`
  false and their negations true; a field the object does not have is an
  error.

Not supported (answered 400, so a test notices): go-bexpr's JSON-pointer
selectors (`"/a/b"`), inline lists (`["a", "b"]`), `is nil` and collection
expressions (`all`/`any`). Parse errors carry go-bexpr's position prefix
(`1:5 (4): `) but not pigeon's list of expected tokens. Regular expressions
are Python's, which agree with Go's RE2 on the common syntax.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Predicate = Callable[[Any], bool]


class FilterSyntaxError(ValueError):
    """The expression does not parse (Nomad: `failed to read filter expression`)."""


class FilterEvalError(ValueError):
    """The expression cannot be evaluated on an object (Nomad: `failed to read result page`)."""


# -- syntax tree -------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    path: tuple[str, ...]

    def __str__(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class Match:
    op: str  # ==, !=, in, not in, is empty, is not empty, matches, not matches
    selector: Selector
    value: str | None  # raw text of the value; None for the emptiness checks


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class Binary:
    op: str  # and | or
    left: Node
    right: Node


Node = Match | Not | Binary


@dataclass(frozen=True)
class Filter:
    """A parsed expression: `matches(obj)` evaluates it on one object."""

    text: str
    root: Node

    def matches(self, obj: Any) -> bool:
        return _evaluate(self.root, obj)

    def equality_set(self, field: str) -> frozenset[str] | None:
        """When the whole expression is `field == "a" or field == "b" ...`,
        the values; else None. Lets a list answer from an index."""
        values: set[str] = set()

        def walk(node: Node) -> bool:
            if isinstance(node, Binary) and node.op == "or":
                return walk(node.left) and walk(node.right)
            if (
                isinstance(node, Match)
                and node.op == "=="
                and node.selector.path == (field,)
                and node.value is not None
            ):
                values.add(node.value)
                return True
            return False

        return frozenset(values) if walk(self.root) else None


# -- parser (go-bexpr's PEG, recursive descent) ---------------------------------------

_IDENT = re.compile(r"[a-zA-Z][a-zA-Z0-9_/]*")
_WS = re.compile(r"[ \t\r\n]+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_INDEX = re.compile(r"\.([0-9]+)")
_GO_ESCAPE = re.compile(
    r"\\(?:[abfnrtv\\'\"]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3})"
)


def parse(text: str) -> Filter:
    """Parse a filter expression; FilterSyntaxError says where it fails."""
    parser = _Parser(text)
    root = parser.expression()
    return Filter(text, root)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    # -- helpers -------------------------------------------------------------------

    def fail(self, message: str, pos: int | None = None) -> FilterSyntaxError:
        at = self.pos if pos is None else pos
        line = self.text.count("\n", 0, at) + 1
        col = at - (self.text.rfind("\n", 0, at) + 1) + 1
        return FilterSyntaxError(f"{line}:{col} ({at}): {message}")

    def ws(self) -> bool:
        m = _WS.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return True
        return False

    def keyword(self, word: str) -> bool:
        """`_ word _` at the current position (whitespace on both sides)."""
        start = self.pos
        if self.ws() and self.text.startswith(word, self.pos):
            self.pos += len(word)
            if self.ws():
                return True
        self.pos = start
        return False

    def eof(self) -> bool:
        return self.pos >= len(self.text)

    # -- grammar -------------------------------------------------------------------

    def expression(self) -> Node:
        self.ws()
        node = self.or_expr()
        self.ws()
        if not self.eof():
            raise self.fail(f"no match found, unexpected {self.text[self.pos]!r}")
        return node

    def or_expr(self) -> Node:
        left = self.and_expr()
        if self.keyword("or"):
            return Binary("or", left, self.or_expr())
        return left

    def and_expr(self) -> Node:
        left = self.not_expr()
        if self.keyword("and"):
            return Binary("and", left, self.and_expr())
        return left

    def not_expr(self) -> Node:
        start = self.pos
        if self.text.startswith("not", self.pos):
            self.pos += 3
            if self.ws():
                operand = self.not_expr()
                # go-bexpr folds `not not x` into `x`.
                return operand.operand if isinstance(operand, Not) else Not(operand)
            self.pos = start
        return self.paren_expr()

    def paren_expr(self) -> Node:
        if self.text.startswith("(", self.pos):
            open_at = self.pos
            self.pos += 1
            self.ws()
            node = self.or_expr()
            self.ws()
            if not self.text.startswith(")", self.pos):
                raise self.fail("Unmatched parentheses", open_at)
            self.pos += 1
            return node
        return self.match_expr()

    def match_expr(self) -> Node:
        start = self.pos
        selector = self.selector()
        if selector is not None:
            after = self.pos
            for op in ("==", "!="):
                self.ws()
                if self.text.startswith(op, self.pos):
                    self.pos += 2
                    self.ws()
                    return Match(op, selector, self.value())
                self.pos = after
            for op in ("contains", "not contains", "matches", "not matches"):
                if self._op_words(op):
                    return Match(op.replace("contains", "in"), selector, self.value())
            for op in ("is empty", "is not empty"):
                if self._op_words(op, trailing=False):
                    return Match(op, selector, None)
            # `word in Sel`: a bare word before `in` is a value.
            found = self._in_selector(str(selector))
            if found is not None:
                return found
            raise self.fail("no match found, expected a match operator", after)
        if self.text.startswith("[", self.pos):
            raise self.fail("inline lists are not supported by the simulator")
        value = self._try_value()
        if value is None:
            raise self.fail("no match found, expected a selector or a value", start)
        found = self._in_selector(value)
        if found is not None:
            return found
        if self.text.startswith('"/', start):
            raise self.fail("JSON-pointer selectors are not supported by the simulator", start)
        raise self.fail("no match found, expected in or not in", self.pos)

    def _in_selector(self, value: str) -> Match | None:
        """`in Sel` or `not in Sel` after a value."""
        for op in ("in", "not in"):
            if self._op_words(op):
                if self.text.startswith("[", self.pos):
                    raise self.fail("inline lists are not supported by the simulator")
                selector = self.selector()
                if selector is None:
                    raise self.fail("Invalid selector")
                return Match(op, selector, value)
        return None

    def _op_words(self, words: str, trailing: bool = True) -> bool:
        """`_ w1 _ w2 ... _` (the last whitespace only when `trailing`)."""
        start = self.pos
        parts = words.split(" ")
        for i, part in enumerate(parts):
            if not self.ws() or not self.text.startswith(part, self.pos):
                self.pos = start
                return False
            self.pos += len(part)
            last = i == len(parts) - 1
            # The last word must not run into an identifier (`is emptyish`).
            if (
                last
                and not trailing
                and self.pos < len(self.text)
                and re.match(r"[a-zA-Z0-9_/]", self.text[self.pos])
            ):
                self.pos = start
                return False
        if trailing and not self.ws():
            self.pos = start
            return False
        return True

    def selector(self) -> Selector | None:
        m = _IDENT.match(self.text, self.pos)
        if m is None:
            return None
        path = [m.group()]
        self.pos = m.end()
        while True:
            if self.text.startswith(".", self.pos):
                ident = _IDENT.match(self.text, self.pos + 1)
                if ident is not None:
                    path.append(ident.group())
                    self.pos = ident.end()
                    continue
                index = _INDEX.match(self.text, self.pos)
                if index is not None:
                    path.append(index.group(1))
                    self.pos = index.end()
                    continue
                return Selector(tuple(path))
            if self.text.startswith("[", self.pos):
                open_at = self.pos
                self.pos += 1
                self.ws()
                key = self._string()
                if key is None:
                    raise self.fail("Invalid index", open_at)
                self.ws()
                if not self.text.startswith("]", self.pos):
                    raise self.fail("Unclosed index expression", open_at)
                self.pos += 1
                path.append(key)
                continue
            return Selector(tuple(path))

    def _try_value(self) -> str | None:
        """A quoted string or a number (a selector-as-value is tried as a selector)."""
        start = self.pos
        text = self._string()
        if text is not None:
            return text
        number = self._number()
        if number is not None:
            return number
        self.pos = start
        return None

    def value(self) -> str:
        start = self.pos
        selector = self.selector()
        if selector is not None:
            return str(selector)
        text = self._try_value()
        if text is None:
            raise self.fail("no match found, expected a value", start)
        return text

    def _number(self) -> str | None:
        m = _NUMBER.match(self.text, self.pos)
        if m is None:
            return None
        end = m.end()
        if end < len(self.text) and self.text[end] not in " \t\r\n)":
            raise self.fail("Invalid number literal", self.pos)
        self.pos = end
        return m.group()

    def _string(self) -> str | None:
        if self.pos >= len(self.text) or self.text[self.pos] not in '"`':
            return None
        quote = self.text[self.pos]
        end = self.text.find(quote, self.pos + 1)
        if quote == '"':
            # A backslash escapes the next character.
            i = self.pos + 1
            while i < len(self.text):
                if self.text[i] == "\\":
                    i += 2
                    continue
                if self.text[i] == '"':
                    break
                i += 1
            end = i if i < len(self.text) else -1
        if end < 0:
            raise self.fail("Unterminated string literal")
        body = self.text[self.pos + 1 : end]
        self.pos = end + 1
        return body if quote == "`" else _unquote(body, self)


def _unquote(body: str, parser: _Parser) -> str:
    """Go's strconv.Unquote of a double-quoted literal's body."""
    if "\\" not in body:
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        if body[i] != "\\":
            out.append(body[i])
            i += 1
            continue
        m = _GO_ESCAPE.match(body, i)
        if m is None:
            raise parser.fail("invalid syntax")
        esc = m.group()
        simple = {
            "a": "\a",
            "b": "\b",
            "f": "\f",
            "n": "\n",
            "r": "\r",
            "t": "\t",
            "v": "\v",
            "\\": "\\",
            "'": "'",
            '"': '"',
        }
        kind = esc[1]
        if kind in simple:
            out.append(simple[kind])
        elif kind in "xuU":
            out.append(chr(int(esc[2:], 16)))
        else:
            out.append(chr(int(esc[1:], 8)))
        i = m.end()
    return "".join(out)


# -- evaluation (go-bexpr's evaluate.go) ------------------------------------------------

_MISSING = object()


def _lookup(obj: Any, selector: Selector) -> Any:
    """The selected value, or _MISSING for an absent map key. A field the
    top-level object does not have is an error, as for a Go struct."""
    value = obj
    for depth, part in enumerate(selector.path):
        if isinstance(value, dict):
            if part in value:
                value = value[part]
                continue
            if depth == 0:
                raise FilterEvalError(
                    f"error finding value in datum: /{'/'.join(selector.path)} at part 0: "
                    f'couldn\'t find key: struct field with name "{part}"'
                )
            return _MISSING
        if isinstance(value, list):
            try:
                value = value[int(part)]
                continue
            except (ValueError, IndexError):
                return _MISSING
        return _MISSING  # through a nil pointer or a scalar
    return value


_BOOL = {
    "1": True,
    "t": True,
    "T": True,
    "TRUE": True,
    "true": True,
    "True": True,
    "0": False,
    "f": False,
    "F": False,
    "FALSE": False,
    "false": False,
    "False": False,
}


def _coerce(raw: str, like: Any) -> Any:
    """The match value converted to the kind of `like` (go-bexpr's Coerce*)."""
    if isinstance(like, bool):
        if raw not in _BOOL:
            raise FilterEvalError(
                f"error getting match value in expression: "
                f'strconv.ParseBool: parsing "{raw}": invalid syntax'
            )
        return _BOOL[raw]
    if isinstance(like, int):
        try:
            return int(raw, 0)
        except ValueError:
            raise FilterEvalError(
                f"error getting match value in expression: "
                f'strconv.ParseInt: parsing "{raw}": invalid syntax'
            ) from None
    if isinstance(like, float):
        try:
            return float(raw)
        except ValueError:
            raise FilterEvalError(
                f"error getting match value in expression: "
                f'strconv.ParseFloat: parsing "{raw}": invalid syntax'
            ) from None
    return raw


def _equal(match: Match, value: Any) -> bool:
    if value is None or isinstance(value, dict | list):
        raise FilterEvalError("unable to find suitable primitive comparison function for matching")
    assert match.value is not None
    return bool(_coerce(match.value, value) == value)


def _contains(match: Match, value: Any) -> bool:
    assert match.value is not None
    raw = match.value
    if value is None:
        return False  # a nil map or slice holds nothing
    if isinstance(value, dict):
        return raw in value
    if isinstance(value, list):
        for item in value:
            if item is None or isinstance(item, dict | list):
                continue
            try:
                if _coerce(raw, item) == item:
                    return True
            except FilterEvalError:
                continue
        return False
    if isinstance(value, str):
        return raw in value
    kind = {bool: "bool", int: "int", float: "float64"}.get(type(value), type(value).__name__)
    raise FilterEvalError(
        f'Cannot perform in/contains operations on type {kind} for selector: "{match.selector}"'
    )


def _empty(match: Match, value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str | list | dict):
        return len(value) == 0
    raise FilterEvalError(f'Cannot perform "is empty" on a {type(value).__name__} value')


_REGEXES: dict[str, re.Pattern[str]] = {}


def _matches(match: Match, value: Any) -> bool:
    assert match.value is not None
    if not isinstance(value, str):
        kind = {bool: "bool", int: "int", float: "float64"}.get(type(value), "struct")
        raise FilterEvalError(f"Value of type {kind} is not convertible to []byte")
    pattern = _REGEXES.get(match.value)
    if pattern is None:
        try:
            pattern = re.compile(match.value)
        except re.error as exc:
            raise FilterEvalError(
                f"Failed to compile regular expression {match.value!r}: {exc}"
            ) from None
        _REGEXES[match.value] = pattern
    return pattern.search(value) is not None


# Whether a missing map key satisfies each operator (go-bexpr's NotPresentDisposition).
_NOT_PRESENT = {
    "==": False,
    "!=": True,
    "in": False,
    "not in": True,
    "is empty": True,
    "is not empty": False,
    "matches": False,
    "not matches": True,
}


def _evaluate(node: Node, obj: Any) -> bool:
    if isinstance(node, Binary):
        if node.op == "and":
            return _evaluate(node.left, obj) and _evaluate(node.right, obj)
        return _evaluate(node.left, obj) or _evaluate(node.right, obj)
    if isinstance(node, Not):
        return not _evaluate(node.operand, obj)
    value = _lookup(obj, node.selector)
    if value is _MISSING:
        return _NOT_PRESENT[node.op]
    op = node.op
    if op == "==":
        return _equal(node, value)
    if op == "!=":
        return not _equal(node, value)
    if op == "in":
        return _contains(node, value)
    if op == "not in":
        return not _contains(node, value)
    if op == "is empty":
        return _empty(node, value)
    if op == "is not empty":
        return not _empty(node, value)
    if op == "matches":
        return _matches(node, value)
    return not _matches(node, value)
