"""Structured logging on stdlib :mod:`logging`: one JSON object per line, or readable ``key=value`` text.

Call sites name an *event* and attach fields instead of formatting prose, so logs can be grepped and
parsed::

    log = get_logger(__name__)
    log_event(log, "peer.rejected", peer=key.hex(), reason="not in allowed_peers")

Plain ``log.info("text %s", x, extra={"queue": q})`` works too; ``extra`` fields are emitted alongside.
Output goes to stderr, which systemd sends to the journal.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Literal, TextIO

from latticed.errors import MalformedError

#: LogRecord attribute holding :func:`log_event`'s fields, kept apart so no field can clash with
#: LogRecord's own attributes (``name``, ``module``, ``msg``...).
FIELDS_ATTR = "latticed_fields"
EVENT_ATTR = "event"

#: Keys the formatters emit themselves; a field of the same name gets a trailing underscore.
RESERVED = frozenset({"ts", "level", "logger", "event", "msg", "exc", "stack"})

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def get_logger(name: str) -> logging.Logger:
    """The module's logger; pass ``__name__`` so levels can be tuned per package."""
    return logging.getLogger(name)


def log_event(
    logger: logging.Logger,
    event: str,
    /,
    level: int = logging.INFO,
    exc_info: bool | BaseException = False,
    **fields: object,
) -> None:
    """Log a named event (dotted, e.g. ``peer.rejected``) with structured fields.

    ``level`` and ``exc_info`` are the only reserved keyword names.
    """
    if logger.isEnabledFor(level):
        logger.log(
            level, event, exc_info=exc_info, stacklevel=2, extra={EVENT_ATTR: event, FIELDS_ATTR: fields}
        )


class EveryInterval:
    """Lets an event that may repeat without end (a bug hit at every idle tick) into the log at most once
    an interval: the first at once, then the first after each interval, told how many were held back, so
    that the log keeps its other events and still says how often it happened. Not thread-safe: one per
    thread that logs the event. ``clock``: seconds, monotonic (injected by tests)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._held = 0

    def allow(self) -> int | None:
        """None: hold this one back (counted); else log it, with the returned count of those held back
        since the last one let through."""
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            self._held += 1
            return None
        held, self._last, self._held = self._held, now, 0
        return held


def record_fields(record: logging.LogRecord) -> dict[str, object]:
    """The structured fields of a record: ``extra=`` attributes plus :func:`log_event` fields."""
    out: dict[str, object] = {}
    for key, value in record.__dict__.items():
        if key not in _STANDARD_ATTRS and key not in (FIELDS_ATTR, EVENT_ATTR):
            out[key] = value
    extra = getattr(record, FIELDS_ATTR, None)
    if isinstance(extra, Mapping):
        out.update(extra)
    return {(f"{k}_" if k in RESERVED else k): v for k, v in out.items()}


def _timestamp(record: logging.LogRecord) -> str:
    when = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _plain(value: object) -> object:
    """JSON fallback for values json cannot encode: bytes as hex, paths and the rest as str."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, PurePath):
        return str(value)
    return repr(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``event`` or ``msg``, then fields."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, object] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        event = getattr(record, EVENT_ATTR, None)
        if isinstance(event, str):
            obj["event"] = event
        else:
            obj["msg"] = record.getMessage()
        obj.update(record_fields(record))
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            obj["stack"] = self.formatStack(record.stack_info)
        return json.dumps(obj, default=_plain, ensure_ascii=False)


def _text_value(value: object) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        text = bytes(value).hex()
    elif isinstance(value, str | PurePath):
        text = str(value)
    else:
        text = repr(value)
    if not text or any(c.isspace() or c in '"=\\' for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


class TextFormatter(logging.Formatter):
    """``TS LEVEL logger event key=value ...``: for terminals, where JSON is hard to read."""

    def format(self, record: logging.LogRecord) -> str:
        event = getattr(record, EVENT_ATTR, None)
        head = event if isinstance(event, str) else record.getMessage()
        parts = [_timestamp(record), record.levelname, record.name, head]
        parts += [f"{k}={_text_value(v)}" for k, v in record_fields(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class _LatticedHandler(logging.StreamHandler[TextIO]):
    """Marks the handler :func:`configure_logging` installed so a second call replaces it."""


def configure_logging(
    level: str | int, fmt: Literal["json", "text"] = "json", stream: TextIO | None = None
) -> logging.Handler:
    """Send all logging (ours and libraries') to ``stream`` (stderr) in ``fmt``; idempotent.

    ``level`` is a name (``"info"``, case-insensitive) or a :mod:`logging` number. Returns the handler
    so tests can remove it.
    """
    if isinstance(level, str):
        numeric = logging.getLevelName(level.upper())
        if not isinstance(numeric, int):
            raise MalformedError(f"unknown log level {level!r}")
        level = numeric
    formatter: logging.Formatter
    if fmt == "json":
        formatter = JsonFormatter()
    elif fmt == "text":
        formatter = TextFormatter()
    else:
        raise MalformedError(f"unknown log format {fmt!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _LatticedHandler)]:
        root.removeHandler(old)
        old.close()
    handler = _LatticedHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    return handler


__all__ = [
    "EveryInterval",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "get_logger",
    "log_event",
    "record_fields",
]
