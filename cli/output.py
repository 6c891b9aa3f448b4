"""Everything ``latticectl`` prints to stdout goes through :func:`emit`: JSON or text, one helper.

Bytes (values, keys, header values, hash fields, set members) are shown as follows:

* **text**: the UTF-8 text when the bytes are valid UTF-8, else with ``\\xNN`` escapes for the bad bytes.
  Control characters are escaped too (``\\x00``, ``\\x1b``...: a value never drives the terminal),
  except newline and tab in a value shown alone; where one record must stay on one line (entries,
  listings) those are escaped as well (``\\n``, ``\\t``). ``peek --raw`` writes the exact bytes.
* **JSON**: a JSON string when the bytes are valid UTF-8, else the object ``{"base64": "<standard
  base64>"}``; the marker cannot be mistaken for a string value. JSON object *keys* must be strings, so a
  non-UTF-8 hash field becomes the key ``"base64:<standard base64>"``. Sets become sorted arrays,
  entry headers a list of ``[name, value]`` pairs (names may repeat), and an entry an object with
  ``queue``, ``offset``, ``key``, ``value``, ``timestamp`` and ``headers``. Streams of entries are JSON
  Lines: one object per line.

The ``x-dlq`` header of a dead letter (msgpack, written by its group) is shown as readable fields, never
as its bytes: where the record came from (``queue``, ``offset``), ``attempts``, ``reason``, ``last_error``
(text: ``dlq.queue=... dlq.offset=...``; JSON: an object as the header's value).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import msgpack

from cli.boundary import StdoutClosed
from latticed.api.client.blocking_client import Entry

#: Control characters that would break the one-record-per-line layout, as escapes.
_CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


#: The dead-letter header (``DLQ_HEADER`` of latticed/crdt/attempts.py, not imported from there: that would
#: load the signing stack into every latticectl start).
DLQ_HEADER = "x-dlq"


def dead_letter_fields(raw: bytes) -> dict[str, Any]:
    """A dead letter's ``x-dlq`` header as fields (display only: the daemon validates it when it reads
    it). Layout: ``[1, source, offset, attempts, correlation id, reason, dead at ms, history]``, each
    history item ``[number, consumer, leased ms, ended ms, outcome, error?]``."""
    try:
        items = msgpack.unpackb(raw, raw=False)
    except Exception:
        items = None
    if type(items) is not list or len(items) != 8 or items[0] != 1 or type(items[7]) is not list:
        return {"unreadable": f"{len(raw)} bytes that are not a dead-letter header"}
    _, source, offset, attempts, correlation, reason, dead_at, history = items
    errors = [h[5] for h in history if type(h) is list and len(h) > 5 and isinstance(h[5], str) and h[5]]
    return {
        "queue": source,
        "offset": offset,
        "attempts": attempts,
        "reason": reason,
        "last_error": errors[-1] if errors else None,
        "correlation_id": correlation,
        "dead_at_ms": dead_at,
    }


def _header_text(name: str, value: bytes) -> str:
    if name == DLQ_HEADER:
        fields = dead_letter_fields(value)
        return "\t".join(f"dlq.{k}={human(v)}" for k, v in fields.items() if k != "dead_at_ms")
    return f"{human(name)}={text_of_bytes(value, single_line=True)}"


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


#: The same, but newline and tab kept: a value shown on its own keeps its lines.
_CONTROL_ESCAPES_MULTILINE = {c: e for c, e in _CONTROL_ESCAPES.items() if c not in (ord("\n"), ord("\t"))}


def text_of_bytes(data: bytes, *, single_line: bool = False) -> str:
    """Bytes for a human: the text if valid UTF-8, else with ``\\xNN`` escapes for the invalid bytes;
    control characters escaped (newline and tab too with ``single_line``)."""
    text = data.decode("utf-8", "backslashreplace")
    if text.isprintable():  # no control character to escape (C-speed check; translate is the slow part)
        return text
    return text.translate(_CONTROL_ESCAPES if single_line else _CONTROL_ESCAPES_MULTILINE)


def _sort_key(value: object) -> bytes:
    """Order set members by their bytes (members are bytes; anything else by its text)."""
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else repr(value)).encode("utf-8", "surrogatepass")


def _json_key(key: object) -> str:
    if isinstance(key, bytes):
        text = _utf8(key)
        return text if text is not None else "base64:" + base64.b64encode(key).decode("ascii")
    return str(key)


def to_json(value: object) -> Any:
    """A JSON-ready copy of ``value``: bytes, sets, tuples and dataclasses converted as documented above."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        text = _utf8(raw)
        return text if text is not None else {"base64": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, Entry):
        headers = [[n, dead_letter_fields(v) if n == DLQ_HEADER else to_json(v)] for n, v in value.headers]
        return {
            **{f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)},
            "headers": headers,
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {_json_key(k): to_json(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return [to_json(v) for v in sorted(value, key=_sort_key)]
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def human(value: object) -> str:
    """One value as a short single line of text (table cells, ``key: value`` lines)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, bytes):
        return text_of_bytes(value, single_line=True)
    if isinstance(value, Mapping):
        return " ".join(f"{human(k)}={human(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=_sort_key) if isinstance(value, set | frozenset) else value
        return ", ".join(human(v) for v in items) or "-"
    return str(value).translate(_CONTROL_ESCAPES)


def field_lines(fields: Mapping[str, object]) -> list[str]:
    """``label: value`` lines with the values aligned."""
    width = max((len(label) for label in fields), default=0) + 1
    return [f"{label + ':':<{width}} {human(value)}" for label, value in fields.items()]


def table_lines(rows: Iterable[Mapping[str, object]], columns: Mapping[str, str]) -> list[str]:
    """An aligned table: ``columns`` maps each row key to its heading; the last column is not padded."""
    cells = [list(columns.values())] + [[human(row.get(key)) for key in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in cells]


def entry_text(entry: Entry) -> str:
    """An entry on one line: ``OFFSET [key=KEY] [NAME=VALUE]... VALUE``, tab-separated; value last."""
    if entry.key is None and not entry.headers:  # the common shape, without building a list
        return f"{entry.offset}\t{text_of_bytes(entry.value, single_line=True)}"
    parts = [str(entry.offset)]
    if entry.key is not None:
        parts.append("key=" + text_of_bytes(entry.key, single_line=True))
    parts += [_header_text(name, value) for name, value in entry.headers]
    parts.append(text_of_bytes(entry.value, single_line=True))
    return "\t".join(parts)


def write(text: str, *, flush: bool = False) -> None:
    """Write to stdout; a reader that went away becomes :class:`StdoutClosed` (quiet exit at the boundary)."""
    try:
        sys.stdout.write(text)
        if flush:
            sys.stdout.flush()
    except BrokenPipeError:
        raise StdoutClosed from None


def write_bytes(data: bytes) -> None:
    """Write bytes to stdout unchanged (``peek --raw``); a closed pipe as :func:`write`."""
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        raise StdoutClosed from None


def emit(data: object, text: str | Iterable[str] | None, *, as_json: bool, flush: bool = False) -> None:
    """Print ``data`` as one line of JSON, or ``text`` (a line or lines; default: ``human(data)``)."""
    if as_json:
        import json  # noqa: PLC0415 - only --json needs it: a short command does not pay for the import

        write(json.dumps(to_json(data), ensure_ascii=False) + "\n", flush=flush)
        return
    lines = [human(data)] if text is None else [text] if isinstance(text, str) else list(text)
    write("".join(line + "\n" for line in lines), flush=flush)


#: Lines of entries joined into one write by :func:`emit_entries`.
_LINES_PER_WRITE = 1000


def emit_entries(entries: Iterable[Entry], *, as_json: bool, live: bool = False) -> None:
    """Print entries one per line (JSON Lines with ``as_json``); ``live`` flushes each as it arrives.
    Otherwise text is written a thousand lines at a time: one write per line was most of the cost of
    printing a large range."""
    if as_json or live:
        for entry in entries:
            emit(entry, entry_text(entry), as_json=as_json, flush=live)
        return
    lines: list[str] = []
    for entry in entries:
        lines.append(entry_text(entry))
        if len(lines) >= _LINES_PER_WRITE:
            lines.append("")
            write("\n".join(lines))
            lines.clear()
    if lines:
        lines.append("")
        write("\n".join(lines))


def note_unreadable(queue: str, runs: list[tuple[int, int]], *, none_read: bool) -> None:
    """Name the records of a sealed queue this identity could not open (``runs``: ``(first, last)``) in one
    line on stderr, after the records printed; NotReaderError (exit 13) if ``none_read``."""
    from latticed.errors import NotReaderError  # noqa: PLC0415 - only sealed queues get here

    shown = ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs[:8]) + (", ..." if runs[8:] else "")
    why = f"offsets {shown} of {queue} are sealed to key epochs this identity is not a reader of"
    if none_read:
        raise NotReaderError(why)
    with contextlib.suppress(OSError):
        sys.stdout.flush()  # the records first, then the note about the others
        sys.stderr.write(f"latticectl: {why}: left out\n")


__all__ = [
    "emit",
    "emit_entries",
    "entry_text",
    "field_lines",
    "note_unreadable",
    "human",
    "table_lines",
    "text_of_bytes",
    "to_json",
    "write",
    "write_bytes",
]
