"""The retention service inside a daemon (in-process): a policy it cannot read is reported, not enforced and
not fatal; a failing check is logged and retried later, never the daemon's end; a commit that crosses a
limit is cut without waiting for the timer; the API refuses what a policy cannot be."""

from __future__ import annotations

import logging
import sqlite3
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.inprocess import InProcessDaemon, start_in_process

from latticed.crdt import queue as core
from latticed.crdt.queue import QueueState
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import MalformedError, NotOwnerError
from latticed.host.config import DaemonConfig
from latticed.host.retention_policy import MAX_BYTES_KEY, RetentionPolicy
from latticed.process.logs import EVENT_ATTR
from latticed.storage import prune

STRANGER = Identity.from_seed(b"t" * 32)


@pytest.fixture
def daemon() -> Iterator[InProcessDaemon]:
    root = Path(tempfile.mkdtemp(prefix="ld-ret-"))
    # A long interval: nothing here may wait for the timer.
    d = start_in_process(
        DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock", retention_interval_s=3600.0)
    )
    yield d
    d.stop()


@contextmanager
def _cut_of_q(daemon: InProcessDaemon, cut: trio.Event) -> Iterator[None]:
    """Sets ``cut`` once queue ``q`` (on either fork core) commits a start above 0."""

    def listener(state: QueueState | QueueState2) -> None:
        start = state.held[0] if isinstance(state, QueueState2) else state.start
        if state.name == "q" and start > 0:
            cut.set()

    core2 = daemon.handle.engine.core2
    with daemon.handle.changes.subscribed(listener), core2.subscribed(lambda _, s: s and listener(s)):
        yield


def test_a_commit_over_a_limit_is_cut_without_the_timer(daemon: InProcessDaemon) -> None:
    engine = daemon.handle.engine
    cut = trio.Event()

    async def until_cut() -> int:
        with trio.fail_after(10):
            await cut.wait()
        return (await engine.bounds(engine.resolve("q")))[0]

    with _cut_of_q(daemon, cut):
        with daemon.client() as c:
            c.queue_create("q", retention=RetentionPolicy(max_records=50))
            c.offer_batch("q", [(b"x", None, ())] * 200)
        assert daemon.call(until_cut) == 200 - 47  # 95 % of the limit is kept
    with daemon.client() as c:
        assert c.retention_get("q")["records"] == 47
        assert c.status()["retention"]["truncations"] == 1


def test_truncations_are_counted_in_records_and_bytes_and_served_as_metrics(tmp_path: Path) -> None:
    config = DaemonConfig(
        data_dir=tmp_path / "data",
        socket_path=tmp_path / "api.sock",
        retention_interval_s=3600.0,
        metrics_listen=("127.0.0.1", 0),
    )
    daemon = start_in_process(config)
    try:
        cut = trio.Event()

        async def until_cut() -> None:
            with trio.fail_after(10):
                await cut.wait()
                await trio.testing.wait_all_tasks_blocked()  # retention counts after its commit

        with _cut_of_q(daemon, cut), daemon.client() as c:
            c.queue_create("q", retention=RetentionPolicy(max_records=50))
            c.offer_batch("q", [(b"x" * 100, None, ())] * 200)
            daemon.call(until_cut)
            counters = c.status()["retention"]
            address = c.status()["metrics"]
        assert counters["records_truncated"] == 200 - 47
        # Each record takes its 100-byte value, a timestamp and a 32-byte chain value, and more.
        assert counters["bytes_truncated"] >= 153 * 132
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        assert f'latticed_retention_truncated_records_total{{role="owner"}} {153:.1f}' in text
        assert (
            f'latticed_retention_truncated_bytes_total{{role="owner"}} {counters["bytes_truncated"]:.1f}'
            in text
        )
        assert 'latticed_retention_truncated_records_total{role="replica"} 0.0' in text
    finally:
        daemon.stop()


def test_a_policy_it_cannot_read_is_reported_and_not_fatal(
    daemon: InProcessDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    # A queue of another owner whose metadata holds a value this version cannot read.
    state = core.commit(
        core.empty_state(STRANGER.public_key, "theirs"),
        STRANGER,
        now_ms=1,
        records=[Record(value=b"v")],
        meta_updates={MAX_BYTES_KEY: "lots"},
    )

    async def merge() -> None:
        await daemon.handle.engine.merge_delta(core.delta(state))

    with caplog.at_level(logging.WARNING, logger="latticed.services.retention_service"):
        daemon.call(merge)
    address = f"{STRANGER.public_key.hex()}/theirs"
    with daemon.client() as c:
        shown = c.retention_get(address)
        assert shown["policy"]["max_bytes"] is None and "lots" in shown["problems"][0]
        assert not shown["owned"] and shown["records"] == 1
        with pytest.raises(NotOwnerError):
            c.retention_set(address, max_bytes=5)
        assert c.status()["uptime_s"] >= 0  # still serving
    assert any(getattr(r, EVENT_ATTR, None) == "retention.bad_policy" for r in caplog.records)


def test_a_failing_check_is_logged_and_the_daemon_goes_on(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    called = threading.Event()

    def broken(*args: Any, **kwargs: Any) -> prune.Plan:
        called.set()
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(prune, "plan", broken)
    with caplog.at_level(logging.WARNING, logger="latticed.services.retention_service"), daemon.client() as c:
        c.queue_create("fails")
        c.offer_batch("fails", [(b"x", None, ())] * 20)
        c.retention_set("fails", max_records=5)  # a new policy is checked at once
        assert called.wait(10)
        while c.status()["retention"]["failures"] == 0:  # counted once the thread's error is back
            pass
        # Logged once, and not tried again at once (a busy loop would have failed many times by the
        # time these round trips through the daemon's loop are done)...
        failures = [c.status()["retention"]["failures"] for _ in range(3)]
        assert failures == [1, 1, 1]
        assert c.queue_info("fails")["end_offset"] == 20  # and it goes on serving
        # ...but again after another step's worth of records (or at the timer's next round).
        called.clear()
        c.offer("fails", b"one more")
        assert called.wait(10)
        assert c.status()["retention"]["failures"] in (1, 2)  # the second is being logged
    assert any(getattr(r, EVENT_ATTR, None) == "retention.failed" for r in caplog.records)


def test_the_api_refuses_what_a_policy_cannot_be(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        c.queue_create("p")
        for bad in ({"max_bytes": -1}, {"max_records": "5"}, {"keep_unsettled": "yes"}):
            with pytest.raises(MalformedError):
                c.call("retention_set", queue="p", **bad)
        with pytest.raises(MalformedError):
            c.queue_create("p2", {"retention.max_age_ms": "a week"})
        with pytest.raises(MalformedError):
            c.meta_set("p", "retention.max_records", "0")
        assert c.retention_get("p")["policy"] == RetentionPolicy().to_wire()
        shown = c.retention_set("p", max_bytes=1000, keep_unsettled=True)
        assert shown["policy"] == RetentionPolicy(max_bytes=1000, keep_unsettled=True).to_wire()
        assert c.retention_set("p", max_bytes=None)["policy"]["max_bytes"] is None
        assert c.meta_list("p") == {"retention.keep_unsettled": "true"}
