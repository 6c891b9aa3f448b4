"""Structured logging: JSON lines parse and carry fields; text lines are key=value."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from latticed.errors import MalformedError
from latticed.process.logs import JsonFormatter, TextFormatter, configure_logging, get_logger, log_event


@pytest.fixture(autouse=True)
def restore_root() -> Iterator[None]:
    """configure_logging changes the root logger; undo exactly that so pytest's own handlers survive."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in root.handlers[:]:
        if isinstance(handler.formatter, JsonFormatter | TextFormatter):
            root.removeHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


def setup(fmt: str, level: str = "debug") -> io.StringIO:
    stream = io.StringIO()
    configure_logging(level, fmt, stream=stream)  # type: ignore[arg-type]
    return stream


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_event_carries_fields() -> None:
    stream = setup("json")
    log = get_logger("latticed.net.test")
    log_event(log, "peer.rejected", peer=b"\x01\xab", reason="not allowed", queue=Path("/q"), n=3)
    [rec] = lines(stream)
    assert rec["event"] == "peer.rejected"
    assert rec["level"] == "info"
    assert rec["logger"] == "latticed.net.test"
    assert rec["peer"] == "01ab"  # bytes as hex
    assert rec["reason"] == "not allowed"
    assert rec["queue"] == "/q"
    assert rec["n"] == 3
    assert isinstance(rec["ts"], str)
    assert rec["ts"].endswith("Z")
    assert "msg" not in rec


def test_json_plain_message_with_extra_and_exception() -> None:
    stream = setup("json")
    log = get_logger("latticed.store")
    try:
        raise RuntimeError("disk on fire")
    except RuntimeError:
        log.exception("flush failed for %s", "q1", extra={"queue": "q1"})
    [rec] = lines(stream)
    assert rec["msg"] == "flush failed for q1"
    assert rec["level"] == "error"
    assert rec["queue"] == "q1"
    assert "disk on fire" in str(rec["exc"])


def test_fields_named_like_logrecord_attributes_or_output_keys() -> None:
    # `module`/`name` would crash stdlib logging's extra=; `ts`/`msg` would overwrite our own keys.
    stream = setup("json")
    log_event(get_logger("latticed.t"), "x", module="m", name="n", ts=1, msg="hi", logger="l")
    [rec] = lines(stream)
    assert rec["module"] == "m"
    assert rec["name"] == "n"
    assert rec["ts_"] == 1
    assert rec["msg_"] == "hi"
    assert rec["logger_"] == "l"
    assert rec["logger"] == "latticed.t"


def test_level_filters_and_event_level() -> None:
    stream = setup("json", level="WARNING")
    log = get_logger("latticed.t")
    log_event(log, "quiet")
    log_event(log, "loud", level=logging.ERROR)
    assert [r["event"] for r in lines(stream)] == ["loud"]


def test_text_format() -> None:
    stream = setup("text")
    log_event(get_logger("latticed.t"), "peer.connected", peer="ab12", addr="[::1]:7000", note="two words")
    line = stream.getvalue().strip()
    assert " INFO latticed.t peer.connected " in line
    assert "peer=ab12" in line
    assert "addr=[::1]:7000" in line
    assert 'note="two words"' in line


def test_configure_is_idempotent_and_validates() -> None:
    first = setup("json")
    second = setup("text")
    get_logger("latticed.t").info("once")
    assert first.getvalue() == ""
    assert second.getvalue().count("once") == 1
    with pytest.raises(MalformedError):
        configure_logging("loud", "json")
    with pytest.raises(MalformedError):
        configure_logging("info", "xml")  # type: ignore[arg-type]
