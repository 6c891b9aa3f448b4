"""The retention options of latticectl and latticed without a daemon: what reaches the client, what a typo
does (exit 2, nothing sent), and the defaults --help shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import cli.common
import cli.ctl
import cli.latticed_command
from latticed.host.retention_policy import RetentionPolicy

runner = CliRunner()
WIDE = {"COLUMNS": "250"}


def ctl(*args: str, **kwargs: Any) -> Result:
    return runner.invoke(cli.ctl.app, list(args), prog_name="latticectl", **kwargs)


@dataclass
class Recorder:
    """A client that records each call and answers ``outcome``."""

    outcome: Any = None
    calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = field(default_factory=list)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        def call(*args: object, **kwargs: object) -> Any:
            self.calls.append((name, args, kwargs))
            return self.outcome

        return call


def record(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> Recorder:
    recorder = Recorder(outcome)
    monkeypatch.setattr(cli.common, "Client", lambda *a, **k: recorder)
    return recorder


SHOWN = {
    "queue": "ab/q",
    "owned": True,
    "policy": {"max_age_ms": None, "max_bytes": 50_000_000, "max_records": None, "keep_unsettled": True},
    "problems": [],
    "start_offset": 10,
    "end_offset": 20,
    "records": 10,
    "bytes": 2500,
    "floor": 0,
    "replica_max_bytes": None,
}


def test_create_puts_the_policy_in_the_first_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = record(monkeypatch, "ab/q").calls
    result = ctl("queue", "create", "q", "--max-bytes", "50MB", "--max-age", "7d", "--keep-unsettled")
    assert result.exit_code == 0, result.output
    [(name, args, kwargs)] = calls
    assert (name, args) == ("queue_create", ("q", None))
    assert kwargs["retention"] == RetentionPolicy(7 * 86_400_000, 50_000_000, None, True)
    calls.clear()
    assert ctl("queue", "create", "plain").exit_code == 0
    assert calls[0][2]["retention"] is None


def test_set_sends_only_what_was_given_and_says_what_it_did(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = record(monkeypatch, SHOWN).calls
    result = ctl("queue", "retention", "set", "q", "--max-bytes", "50MB", "--max-age", "none")
    assert result.exit_code == 0 and result.stdout == ""
    assert calls == [("retention_set", ("q",), {"max_bytes": 50_000_000, "max_age_ms": None})]
    assert result.stderr.startswith("retention of ab/q: max age none, max bytes 47.68 MiB")
    calls.clear()
    assert ctl("queue", "retention", "set", "q", "--max-records", "0", "--no-keep-unsettled").exit_code == 0
    assert calls[0][2] == {"max_records": None, "keep_unsettled": False}


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["queue", "retention", "set", "q", "--max-bytes", "lots"], "--max-bytes"),
        (["queue", "retention", "set", "q", "--max-age", "soon"], "--max-age"),
        (["queue", "retention", "set", "q", "--max-records", "1e6"], "--max-records"),
        (["queue", "create", "q", "--max-age", "-1d"], "--max-age"),
        (["queue", "retention", "set", "q"], "--max-age"),  # nothing to set
    ],
)
def test_a_typo_is_exit_2_and_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, args: list[str], option: str
) -> None:
    calls = record(monkeypatch, SHOWN).calls
    result = ctl(*args)
    assert result.exit_code == 2 and option in result.stderr and calls == []


def test_show_prints_the_policy_and_what_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    record(monkeypatch, {**SHOWN, "owned": False, "replica_max_bytes": 20_000_000, "floor": 10})
    text = " ".join(ctl("queue", "retention", "show", "ab/q").stdout.split())
    shown = ["max bytes: 47.68 MiB", "keep unsettled: yes", "the owner's daemon"]
    shown.append("replica cap here: 19.07 MiB")
    for part in shown:
        assert part in text, (part, text)
    assert "held here: 10 records, 2.44 KiB, offsets 10..19" in text and "dropped here below: 10" in text


def test_help_shows_the_defaults() -> None:
    create = " ".join(ctl("queue", "create", "--help", env=WIDE).stdout.split())
    assert create.count("[default: (no limit)]") == 3 and "[default: (--no-keep-unsettled)]" in create
    change = " ".join(ctl("queue", "retention", "set", "--help", env=WIDE).stdout.split())
    assert change.count("[default: (unchanged)]") == 4
    run = " ".join(runner.invoke(cli.latticed_command.app, ["run", "--help"], env=WIDE).stdout.split())
    assert "--replica-max-bytes" in run and "[default: (no cap)]" in run and "[default: (10.0)]" in run
