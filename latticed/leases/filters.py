"""Group filters: a tiny, safe expression language over a record's key and headers.

OpenData-Queue defines queues by filters over metadata; ours read only the key and headers, never the
payload. Parsed by hand (recursive descent, no ``eval``) into a tree of frozen nodes, then compiled to a
predicate. Grammar::

    expr   = and ("||" and)*
    and    = unary ("&&" unary)*
    unary  = "!" unary | "(" expr ")" | test
    test   = field [op value]            a field alone tests that it exists
    field  = "key" | "header." NAME
    op     = "=" | "!=" | "^=" (prefix) | "$=" (suffix) | "*=" (contains)
    value  = WORD | '"' chars '"'        in quotes, \\" and \\\\ escape

Values compare as UTF-8 bytes. A header test holds when any header of that name matches (names may
repeat, as in Kafka); ``!=`` is the negation of ``=``, so it holds when the field is missing. An empty
filter takes every record. Errors raise :class:`FilterSyntaxError` (a :class:`MalformedError`) with the
position of the offending character.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from latticed.crdt.core_errors import MalformedError
from latticed.crdt.group_spec import MAX_FILTER_CHARS
from latticed.crdt.records import Record

Predicate = Callable[[Record], bool]
MAX_DEPTH = 64
OPS = ("=", "!=", "^=", "$=", "*=")
_SPECIAL = set('=!^$*&|()"')


class FilterSyntaxError(MalformedError):
    """A filter that does not parse; ``position`` is the 0-based index of the offending character."""

    def __init__(self, message: str, position: int):
        super().__init__(f"filter: {message} at position {position}")
        self.position = position


# ---------------------------------------------------------------------------------------------- the tree


@dataclass(frozen=True, slots=True)
class Check:
    """``header`` None means the record key; ``op`` None means "exists"."""

    header: str | None
    op: str | None = None
    value: bytes = b""


@dataclass(frozen=True, slots=True)
class Not:
    inner: Node


@dataclass(frozen=True, slots=True)
class And:
    parts: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    parts: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class All:
    """The empty filter."""


Node = Check | Not | And | Or | All


# ------------------------------------------------------------------------------------------------ lexing


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "word", "string", "op", "&&", "||", "!", "(", ")", "end"
    text: str
    position: int


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith(("&&", "||", "!=", "^=", "$=", "*="), i):
            pair = text[i : i + 2]
            out.append(_Token(pair if pair in ("&&", "||") else "op", pair, i))
            i += 2
        elif c in "=!()":
            out.append(_Token("op" if c == "=" else c, c, i))
            i += 1
        elif c == '"':
            start, i, chars = i, i + 1, []
            while True:
                if i >= n:
                    raise FilterSyntaxError("unterminated string", start)
                c = text[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\":
                    if i + 1 >= n or text[i + 1] not in '"\\':
                        raise FilterSyntaxError('only \\" and \\\\ escapes are allowed', i)
                    c = text[i + 1]
                    i += 1
                chars.append(c)
                i += 1
            out.append(_Token("string", "".join(chars), start))
        elif c in _SPECIAL:
            raise FilterSyntaxError(f"unexpected {c!r}", i)
        else:
            start = i
            while i < n and not text[i].isspace() and text[i] not in _SPECIAL:
                i += 1
            out.append(_Token("word", text[start:i], start))
    out.append(_Token("end", "", n))
    return out


# ----------------------------------------------------------------------------------------------- parsing


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokens(text)
        self.index = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expr(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise FilterSyntaxError(f"nested deeper than {MAX_DEPTH}", self.peek().position)
        parts = [self.conjunction(depth)]
        while self.peek().kind == "||":
            self.take()
            parts.append(self.conjunction(depth))
        return parts[0] if len(parts) == 1 else Or(tuple(parts))

    def conjunction(self, depth: int) -> Node:
        parts = [self.unary(depth)]
        while self.peek().kind == "&&":
            self.take()
            parts.append(self.unary(depth))
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def unary(self, depth: int) -> Node:
        token = self.peek()
        if depth > MAX_DEPTH:
            raise FilterSyntaxError(f"nested deeper than {MAX_DEPTH}", token.position)
        if token.kind == "!":
            self.take()
            return Not(self.unary(depth + 1))
        if token.kind == "(":
            self.take()
            inner = self.expr(depth + 1)
            closing = self.take()
            if closing.kind != ")":
                raise FilterSyntaxError(f"expected ')' (opened at {token.position})", closing.position)
            return inner
        return self.test()

    def test(self) -> Check:
        token = self.take()
        if token.kind != "word":
            what = "end of filter" if token.kind == "end" else repr(token.text)
            raise FilterSyntaxError(f"expected key or header.NAME, found {what}", token.position)
        if token.text == "key":
            header = None
        elif token.text.startswith("header.") and len(token.text) > len("header."):
            header = token.text[len("header.") :]
        else:
            raise FilterSyntaxError(
                f"unknown field {token.text!r} (expected key or header.NAME)", token.position
            )
        if self.peek().kind != "op":
            return Check(header)
        op = self.take().text
        value = self.take()
        if value.kind not in ("word", "string"):
            raise FilterSyntaxError(f"expected a value after {op!r}", value.position)
        return Check(header, op, value.text.encode())


def parse_filter(text: str) -> Node:
    """Parse ``text`` into a tree (``All()`` for an empty filter)."""
    if not isinstance(text, str):
        raise MalformedError("a filter is text")
    if len(text) > MAX_FILTER_CHARS:
        raise FilterSyntaxError(f"longer than {MAX_FILTER_CHARS} characters", MAX_FILTER_CHARS)
    parser = _Parser(text)
    if parser.peek().kind == "end":
        return All()
    node = parser.expr(0)
    extra = parser.peek()
    if extra.kind != "end":
        raise FilterSyntaxError(f"unexpected {extra.text!r} (missing && or ||?)", extra.position)
    return node


# --------------------------------------------------------------------------------------------- compiling


def _compare(op: str | None, value: bytes) -> Callable[[bytes], bool]:
    if op == "=":
        return lambda actual: actual == value
    if op == "^=":
        return lambda actual: actual.startswith(value)
    if op == "$=":
        return lambda actual: actual.endswith(value)
    if op == "*=":
        return lambda actual: value in actual
    return lambda actual: True  # exists


def _compile(node: Node) -> Predicate:
    if isinstance(node, All):
        return lambda record: True
    if isinstance(node, Not):
        inner = _compile(node.inner)
        return lambda record: not inner(record)
    if isinstance(node, And):
        parts = tuple(_compile(p) for p in node.parts)
        return lambda record: all(p(record) for p in parts)
    if isinstance(node, Or):
        parts = tuple(_compile(p) for p in node.parts)
        return lambda record: any(p(record) for p in parts)
    if node.op == "!=":
        equal = _compile(Check(node.header, "=", node.value))
        return lambda record: not equal(record)
    match = _compare(node.op, node.value)
    name = node.header
    if name is None:
        return lambda record: record.key is not None and match(record.key)
    return lambda record: any(k == name and match(v) for k, v in record.headers)


def compile_filter(text: str) -> Predicate:
    """A predicate over records for ``text``; raises :class:`FilterSyntaxError` if it does not parse."""
    return _compile(parse_filter(text))
