"""``latticectl work``: run a command for each record of a group, acking on exit 0, nacking otherwise.

Each of ``concurrency`` threads has its own connection and loop: dequeue (blocking on the daemon, no
polling), run the command with the payload on stdin and ``LATTICE_*`` variables set, extend the lease
while the command runs longer than a third of its visibility (so a slow task is not redelivered under
it), then ack or nack. ``--max`` stops after that many records, ``--idle`` when no record came for that
long; otherwise it runs until interrupted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from latticed.api.client.blocking_client import Client, Lease
from latticed.errors import ConnectionClosedError, LeaseError, OwnerUnreachableError

#: How long one dequeue waits when no ``--idle`` is given (then it simply asks again).
LONG_WAIT_S = 60.0
#: After Ctrl-C, how long running commands get to finish (they got the SIGINT too) so their records are
#: acked or nacked rather than left to expire.
GRACE_S = 5.0


def lease_env(lease: Lease, socket_path: Path | None) -> dict[str, str]:
    """The ``LATTICE_*`` variables describing a lease (what a script needs to ack, nack or extend it)."""
    env = {
        "LATTICE_GROUP": lease.group,
        "LATTICE_QUEUE": lease.queue,
        "LATTICE_OFFSET": str(lease.offset),
        "LATTICE_LEASE": lease.lease,
        "LATTICE_ATTEMPT": str(lease.attempt),
        "LATTICE_CORRELATION_ID": lease.correlation_id,
        "LATTICE_EXPIRES_AT": f"{lease.expires_at:.3f}",
    }
    if lease.key is not None:
        env["LATTICE_KEY"] = lease.key.decode("utf-8", "replace")
    if socket_path is not None:
        env["LATTICED_SOCKET"] = str(socket_path)
    return env


@dataclass
class WorkSummary:
    acked: int = 0
    nacked: int = 0
    lost: int = 0  # the lease ended before the command did (expired, or settled by ack_up_to)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def processed(self) -> int:
        return self.acked + self.nacked + self.lost

    def as_dict(self) -> dict[str, int]:
        return {"processed": self.processed, "acked": self.acked, "nacked": self.nacked, "lost": self.lost}


class Worker:
    """Shared state of one ``work`` run; :meth:`run` blocks until done (or raises KeyboardInterrupt)."""

    def __init__(
        self,
        socket_path: Path | None,
        group: str,
        command: Sequence[str],
        *,
        concurrency: int = 1,
        visibility: float | None = None,
        max_records: int | None = None,
        idle: float | None = None,
        nack_delay: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.group = group
        self.command = list(command)
        self.concurrency = concurrency
        self.visibility = visibility
        self.max_records = max_records
        self.idle = idle
        self.nack_delay = nack_delay
        self.env = dict(os.environ if env is None else env)
        self.summary = WorkSummary()
        self._stop = threading.Event()
        self._taken = 0
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []
        self._busy = 0

    def check_command(self) -> None:
        """Refuse at once a command that cannot be run (before anything is leased for it)."""
        program = self.command[0] if self.command else ""
        if not program:
            raise OSError(errno.ENOENT, "no command to run", "")
        if os.sep in program:
            found = os.path.isfile(program) and os.access(program, os.X_OK)
        else:
            found = shutil.which(program, path=self.env.get("PATH", os.defpath)) is not None
        if not found:
            raise OSError(errno.ENOENT, "cannot run the command (not found, or not executable)", program)

    def run(self) -> WorkSummary:
        self.check_command()
        threads = [
            threading.Thread(target=self._thread, name=f"work-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)
        except KeyboardInterrupt:
            self._stop.set()
            deadline = time.monotonic() + GRACE_S
            while self._busy and time.monotonic() < deadline:
                time.sleep(0.05)
            raise
        if self._errors:
            raise self._errors[0]
        return self.summary

    def _reserve(self) -> bool:
        with self._lock:
            if self.max_records is not None and self._taken >= self.max_records:
                return False
            self._taken += 1
            return True

    def _unreserve(self) -> None:
        with self._lock:
            self._taken -= 1

    def _thread(self) -> None:
        try:
            with Client(self.socket_path) as client:
                while not self._stop.is_set() and self._reserve():
                    lease = client.dequeue(self.group, self.visibility, wait=self.idle or LONG_WAIT_S)
                    if lease is None:
                        self._unreserve()
                        if self.idle is not None:
                            return
                        continue
                    with self._lock:
                        self._busy += 1
                    try:
                        if self._stop.is_set():  # stopped while it waited: give it straight back
                            with contextlib.suppress(LeaseError, OwnerUnreachableError):
                                client.nack(self.group, lease, 0.0, reason="the worker stopped")
                            return
                        self._process(client, lease)
                    finally:
                        with self._lock:
                            self._busy -= 1
        except BaseException as exc:
            self._errors.append(exc)
            self._stop.set()

    def _process(self, client: Client, lease: Lease) -> None:
        env = {**self.env, **lease_env(lease, self.socket_path)}
        try:
            proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, env=env)
        except OSError as exc:  # gone or changed since the check: give the record back, then stop
            with contextlib.suppress(LeaseError, ConnectionClosedError, OwnerUnreachableError):
                client.nack(self.group, lease, 0.0, reason=f"cannot run {self.command[0]}: {exc.strerror}")
            raise OSError(exc.errno, f"cannot run the command ({exc.strerror})", self.command[0]) from exc
        payload: bytes | None = lease.value
        # Renew the lease when a third of its visibility is left, for as long as the command runs.
        visibility = max(lease.expires_at - time.time(), 0.003)
        while True:
            try:
                proc.communicate(payload, timeout=visibility / 3)
                break
            except subprocess.TimeoutExpired:
                payload = None
                # A lease that ended under us: the record is delivered again and our ack will be refused.
                with contextlib.suppress(LeaseError):
                    client.extend(self.group, lease, visibility)
        try:
            if proc.returncode == 0:
                client.ack(self.group, lease)
                outcome = "acked"
            else:
                reason = f"command exited with status {proc.returncode}"
                client.nack(self.group, lease, self.nack_delay, reason=reason)
                outcome = "nacked"
        except (LeaseError, ConnectionClosedError, OwnerUnreachableError):
            outcome = "lost"  # redelivered once its lease ends (an unreachable owner may still count it)
        with self.summary.lock:
            setattr(self.summary, outcome, getattr(self.summary, outcome) + 1)


__all__ = ["LONG_WAIT_S", "WorkSummary", "Worker", "lease_env"]
