"""Daemon-wide faults an operator must hear about without asking: a forked queue and a filling disk.

Each is logged once when it starts (a fork: once per queue and run, at WARNING, with the proof's hash; low
disk: when free space falls under the threshold, and once more when it is back) and shown by ``latticectl
status`` for as long as it lasts. Peer faults (refused handshakes, clock skew) belong to the replication
service: :mod:`latticed.net.peer_faults`.

What "low" means is :mod:`latticed.host.diskspace`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import trio

from latticed.crdt.head import KIND_QUEUE, QueueKind
from latticed.crdt.queue import QueueState
from latticed.host.diskspace import DiskUsage, disk_is_low, disk_usage
from latticed.process.logs import get_logger, log_event
from latticed.process.ticks import next_tick

log = get_logger(__name__)


class ForkedCore2(Protocol):
    """The engine's core-2 queues as fault visibility reads them (:class:`~latticed.storage.core2_view.
    Core2View`)."""

    async def load_all(self) -> None: ...

    def forked_entries(self) -> list[dict[str, Any]]: ...


class HealthStore(Protocol):
    """What fault visibility reads of the store (:class:`~latticed.storage.engine.Engine`); a Protocol,
    so the API, which shows it, does not import the engine."""

    @property
    def public_key(self) -> bytes: ...

    def queues(self, kind: int = KIND_QUEUE) -> list[int]: ...

    def state(self, q: int) -> QueueState: ...

    @property
    def core2(self) -> ForkedCore2: ...


__all__ = ["DISK_CHECK_INTERVAL_S", "ForkedCore2", "Health", "HealthStore", "fork_label"]

DISK_CHECK_INTERVAL_S: Final = 30.0


def fork_label(state: QueueState) -> str:
    """``OWNER/NAME`` for a queue; KV namespaces and groups say what they are."""
    address = f"{state.owner.hex()}/{state.name}"
    if state.kind == QueueKind.QUEUE:
        return address
    return f"{address} ({QueueKind(state.kind).name.lower()})"


def _proof_hash(state: QueueState) -> str | None:
    return state.fork.digest().hex() if state.fork is not None else None


@dataclass
class Health:
    """Fork and disk watch of one daemon, for the log and ``status``."""

    engine: HealthStore
    data_dir: Path
    usage: Callable[[Path], DiskUsage] = disk_usage
    interval: float = DISK_CHECK_INTERVAL_S
    disk: DiskUsage | None = None
    disk_low: bool = False
    disk_error: str | None = None
    _forks_logged: set[tuple[bytes, str, int]] = field(default_factory=set)
    #: Set by :meth:`disk_suspect`: sample now, not at the next tick.
    _recheck: trio.Event = field(default_factory=trio.Event)

    # ------------------------------------------------------------------ forks
    def on_change(self, state: QueueState) -> None:
        """Engine change listener (every commit): log a queue the first time it is seen forked."""
        if state.forked:
            key = (state.owner, state.name, int(state.kind))
            if key not in self._forks_logged:
                self._forks_logged.add(key)
                log_event(
                    log,
                    "queue.forked",
                    level=logging.WARNING,
                    queue=fork_label(state),
                    proof=_proof_hash(state),
                    owned=state.owner == self.engine.public_key,
                    hint="its owner signed two histories; see docs/operations.md",
                )

    def scan_forks(self) -> None:
        """At start: what an earlier run flagged is logged once in this one too."""
        for kind in QueueKind:
            for q in self.engine.queues(kind):
                self.on_change(self.engine.state(q))

    async def scan_forks2(self) -> None:
        """At start: load every core-2 value, so that what reads loaded values only (a scrape) counts
        every frozen queue."""
        await self.engine.core2.load_all()

    def forked_queues(self) -> list[dict[str, Any]]:
        """Every forked queue: core 1's (stopped, with the proof's hash) and core 2's frozen ones (among
        the loaded values: all of them once :meth:`scan_forks2` or :meth:`forks` ran)."""
        out = []
        for kind in QueueKind:
            for q in self.engine.queues(kind):
                state = self.engine.state(q)
                if state.forked:
                    out.append(
                        {
                            "queue": fork_label(state),
                            "kind": QueueKind(state.kind).name.lower(),
                            "proof": _proof_hash(state),
                            "owned": state.owner == self.engine.public_key,
                        }
                    )
        out.extend(self.engine.core2.forked_entries())
        return out

    async def forks(self) -> list[dict[str, Any]]:
        """:meth:`forked_queues`, every core-2 value loaded first."""
        await self.engine.core2.load_all()
        return self.forked_queues()

    # ------------------------------------------------------------------ disk
    def check_disk(self) -> None:
        """Sample the data directory's file system now (blocking) and :meth:`record` it."""
        self.record(self._sample())

    def _sample(self) -> DiskUsage | OSError:
        try:
            return self.usage(self.data_dir)
        except OSError as exc:
            return exc

    def record(self, sample: DiskUsage | OSError) -> None:
        """Take a sample; log when the disk becomes low and when it recovers (not on every sample)."""
        if isinstance(sample, OSError):
            if self.disk_error is None:
                log_event(
                    log, "disk.unknown", level=logging.WARNING, path=str(self.data_dir), error=str(sample)
                )
            self.disk_error = str(sample)
            return
        self.disk_error = None
        self.disk = sample
        low = disk_is_low(sample.free, sample.total, was_low=self.disk_low)
        if low != self.disk_low:
            log_event(
                log,
                "disk.low" if low else "disk.ok",
                level=logging.WARNING if low else logging.INFO,
                path=sample.path,
                free_bytes=sample.free,
                total_bytes=sample.total,
                hint="free space, or set retention on your queues; writes fail with exit 7 once it is full"
                if low
                else None,
            )
        self.disk_low = low

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check the disk now and every ``interval`` seconds until cancelled, and at once after a write
        failed (statvfs off the loop: a hung network file system must not stall it)."""
        self.record(await trio.to_thread.run_sync(self._sample))
        task_status.started()
        while True:
            # With the daemon's other periodic jobs, or sooner when a write failed.
            with trio.move_on_at(next_tick(trio.current_time(), self.interval)):
                await self._recheck.wait()
            self._recheck = trio.Event()
            await self.refresh_disk()

    def disk_suspect(self) -> None:
        """A write failed on the store (on the event loop): sample the disk now, not in up to
        ``interval`` seconds, so ``status`` and the log say "full" while writes fail."""
        self._recheck.set()

    async def refresh_disk(self) -> None:
        """Sample the disk now (``status`` asks first: its figures are then never stale)."""
        self.record(await trio.to_thread.run_sync(self._sample))

    def disk_status(self) -> dict[str, Any] | None:
        if self.disk is None:
            return None if self.disk_error is None else {"path": str(self.data_dir), "error": self.disk_error}
        return {
            "path": self.disk.path,
            "free_bytes": self.disk.free,
            "total_bytes": self.disk.total,
            "low": self.disk_low,
        }

    def status(self) -> dict[str, Any]:
        """What ``status`` adds: forked queues and the data directory's free space."""
        return {"forked_queues": self.forked_queues(), "disk": self.disk_status()}
