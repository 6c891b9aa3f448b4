"""A relay's whole turn for one live one-record core-2 push, sans IO: where the event loop's Python goes.

Usage: python bench/bench_relay_turn.py [--records N] [--warmup W] [--commit-every K] [--rounds R]
                                         [--pause MS] [--wire] [--storage]

Three real :class:`~latticed.protocol.core2_session.Core2Link` pairs on the daemon's features (compact,
repeat-headers, window2): the owner A's link to the relay B, B's upstream link, B's downstream link and
D's. For each of A's commits (built before timing: the owner's work) the relay's parts are timed apart:

- ``decode``: the DELTA2's frame unpacked and :meth:`Core2Link.receive` (the compact codec), the event;
- ``check``: :meth:`AheadPushes.check` against the value ahead (steps, ``verify_delta``, join) and
  :meth:`AheadPushes.note_push` (what the engine host's ``submit_merge2`` does on the event loop);
- ``pass_on``: the downstream link's ``local_update``, its ``NeedDelta2`` answered from the push as it
  came (:meth:`AheadPushes.relay`), ``provide_delta`` and the encoded message;
- ``d_ack``: D's ACK read on B's downstream link (D's own verification is not timed);
- ``complete``: every ``K`` records a "commit": the upstream link's ``delta_applied`` of each push, the
  change told to both links (``local_update``), the ACK encoded (no storage thread: its work is another
  budget, ``--storage`` below).

Two options bring the turn closer to the daemon's: ``--wire`` carries every message as the transport
does (sealed by a :class:`~latticed.protocol.secure.SecureChannel`, written to a socketpair, read and
opened: B's side of each in B's parts), and ``--pause MS`` sleeps before each push, as a relay waits
for the next live record (the parts are then timed on the thread's CPU clock: what runs meanwhile, other
processes or an idle CPU, leaves the caches cold, and the same Python costs 2-4 times as much).
``--storage`` adds a real storage thread (a :class:`~latticed.storage.writer.Writer` on a scratch store,
its merge linger) committing each push's ``MergeSteps2`` as the engine host submits it, the relay
waiting for each commit of ``K`` (not timed) and reading the committed value as the daemon does; the
thread's CPU a record is printed as ``storage``.

Prints µs a record per part, the median of ``R`` rounds over fresh links.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.net.core2_ahead import AheadPushes
from latticed.net.core2_engine_host import MergeSteps2
from latticed.protocol.core2_compact import REPEAT_HEADERS
from latticed.protocol.core2_session import Core2Link, Delta2Received, NeedDelta2
from latticed.protocol.core2_steps import outgoing
from latticed.protocol.core2_wire import link_summary
from latticed.protocol.handshake import Initiator, Responder
from latticed.protocol.replication_messages import QueueKey, unpack_message
from latticed.protocol.secure import SecureChannel
from latticed.protocol.versions import HEADS_V2, WINDOW2
from latticed.storage.jobs import Job
from latticed.storage.writer import Writer

PARTS = ("decode", "check", "pass_on", "d_ack", "complete", "storage")
FEATURES = frozenset({HEADS_V2, "compact", REPEAT_HEADERS, WINDOW2})
OWNER = Identity.from_seed(b"r" * 32)
KEY: QueueKey = (OWNER.public_key, "relay-turn", 0)
MAX_BYTES = 8 * 1024 * 1024


def line(n: int, size: int = 100) -> list[QueueState2]:
    """The owner's states: one record, then ``n`` live one-record commits."""
    state = queue2.empty_state(OWNER.public_key, KEY[1])
    states = [queue2.commit(state, OWNER, now_ms=1_700_000_000_000, records=[Record(bytes(size))])]
    for i in range(n):
        now = 1_700_000_001_000 + 5 * i
        value = i.to_bytes(4, "big") * (size // 4)
        states.append(queue2.commit(states[-1], OWNER, now_ms=now, records=[Record(value, timestamp=now)]))
    return states


class Wire:
    """One direction of a link as the daemon carries it: the sender's :class:`SecureChannel` seals a
    message into a frame written to a socketpair; the receiver reads it, buffers it and opens it. None
    (``--wire`` off): the message is passed as it is."""

    def __init__(self) -> None:
        key, now = bytes(range(32)), 1_700_000_000_000
        initiator = Initiator(seed=b"\x11" * 32, network_key=key, now_ms=now)
        responder = Responder(seed=b"\x22" * 32, network_key=key, now_ms=now)
        initiator.receive_data(
            responder.receive_data(initiator.receive_data(responder.receive_data(initiator.initiate())))
        )
        self.tx, self.rx = SecureChannel(initiator.result), SecureChannel(responder.result)
        self.socks = socket.socketpair()
        for sock in self.socks:
            sock.setblocking(False)

    def send(self, message: bytes) -> None:
        frame = self.tx.seal(message)
        assert os.write(self.socks[0].fileno(), frame) == len(frame)

    def receive(self) -> bytes:
        """The next message: one already read, else what one read of the socket brings (written before)."""
        message = self.rx.next_message()
        if message is None:
            self.rx.receive_data(os.read(self.socks[1].fileno(), 65536))
            message = self.rx.next_message()
        assert message is not None
        return message

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


class Storage:
    """A real storage thread (:class:`Writer`, its merge linger) committing B's pushes between them, as
    the daemon's does: each verified push becomes the ``MergeSteps2`` the engine host submits; its CPU
    is read from the thread's own clock."""

    def __init__(self, first: QueueState2) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="relay-turn-")
        self.writer = Writer(Path(self._dir.name) / "store.db", Identity.from_seed(b"s" * 32), on_done=_done)
        self.writer.start()
        thread = self.writer._thread
        assert thread is not None and thread.ident is not None
        self._clock = time.pthread_getcpuclockid(thread.ident)
        out = outgoing(first, None, 1 << 16, MAX_BYTES)
        job = MergeSteps2(out.delta, out.steps)
        self.wait([self.submit(job)])
        self.q = job.result.q

    def submit(self, job: MergeSteps2) -> MergeSteps2:
        job.done = threading.Event()
        self.writer.submit(job)
        return job

    def wait(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            job.done.wait()
            assert job.error is None, job.error

    def loaded(self) -> QueueState2:
        value = self.writer.core2.loaded(self.q)
        assert value is not None
        return value

    def cpu_ns(self) -> int:
        return time.clock_gettime_ns(self._clock)

    def close(self) -> None:
        self.writer.stop()
        self._dir.cleanup()


def _done(jobs: Sequence[Job], *_: object) -> None:
    for job in jobs:
        job.done.set()


def linked_pair(
    held: QueueState2, features: frozenset[str] = FEATURES, key: QueueKey = KEY
) -> tuple[Core2Link, Core2Link]:
    """Two core-2 links agreed on ``features`` that have exchanged their summaries of queue ``key`` at
    ``held``: as a relay's upstream or downstream link is once connected."""
    left, right = Core2Link(), Core2Link()
    for link in (left, right):
        link.agree(features)
        link.start({key: link_summary(held)})
    for sender, receiver in ((left, right), (right, left)):
        for m in sender.messages_to_send():
            receiver.receive(unpack_message(m))
    return left, right


def waitable_job() -> Job:
    """A storage job whose completion a thread can wait for."""
    job = Job()
    job.done = threading.Event()
    return job


def turn(
    states: list[QueueState2],
    warmup: int,
    every: int,
    pause: float = 0.0,
    wire: bool = False,
    storage: bool = False,
) -> dict[str, float]:
    """One round over ``states``: µs a record per part, past the first ``warmup`` records; ``pause``:
    seconds slept before each push (the daemon's pace: what other processes run meanwhile evicts the
    caches, so each part is timed on the thread's CPU clock, not the wall); ``wire``: every message
    sealed, written, read and opened as the transport does (B's side of it timed in B's parts);
    ``storage``: a real storage thread commits the pushes (``every`` is then its linger's), its CPU a
    record in ``storage``."""
    clock: Callable[[], int] = time.thread_time_ns if pause else time.perf_counter_ns
    a, b_up = linked_pair(states[0])
    b_down, d = linked_pair(states[0])
    # A -> B, B -> D, D -> B, B -> A
    ab, bd, db, ba = (Wire() for _ in range(4)) if wire else (None, None, None, None)
    store = Storage(states[0]) if storage else None
    ahead, loaded, q = AheadPushes(), states[0] if store is None else store.loaded(), 1
    spent = dict.fromkeys(PARTS, 0)
    waiting: list[tuple[int, Job]] = []
    counted = 0
    storage_from = 0

    def complete(loaded: QueueState2, value: QueueState2, n: int) -> tuple[QueueState2, int]:
        """The first ``n`` waiting pushes committed: acknowledged upstream, the links told (the value
        loaded then, and the ns it took on B's side)."""
        t5 = clock()
        stored = value if store is None else store.loaded()
        for _, j in waiting[:n]:
            j.done.set()
        summary = link_summary(stored)
        for seq, _ in waiting[:n]:
            b_up.delta_applied(seq, summary, True)
        b_up.local_update(KEY, summary)
        b_down.local_update(KEY, summary)
        up = b_up.messages_to_send()
        down = b_down.messages_to_send()
        if ba is not None:
            for m in up:
                ba.send(m)
        took = clock() - t5
        if ba is not None:
            up = [ba.receive() for _ in up]
        for m in up:
            a.receive(unpack_message(m))
        assert not down and b_down.next_event() is None
        del waiting[:n]
        return stored, took

    def committed(loaded: QueueState2) -> tuple[QueueState2, int]:
        """The waiting pushes the storage thread committed so far, completed (the loaded value then)."""
        done = next((n for n, (_, j) in enumerate(waiting) if not j.done.is_set()), len(waiting))
        return complete(loaded, loaded, done) if done else (loaded, 0)

    for i in range(1, len(states)):
        if i == warmup + 1 and store is not None:
            storage_from = store.cpu_ns()
        after = states[i]
        a.local_update(KEY, link_summary(after))  # the owner's push (not the relay's work)
        need = a.next_event()
        assert isinstance(need, NeedDelta2)
        a.provide_delta(KEY, outgoing(after, need.since, need.max_records, MAX_BYTES))
        (pushed,) = a.messages_to_send()
        if ab is not None:
            ab.send(pushed)
        if pause:
            time.sleep(pause)
        early = 0
        if store is not None:  # the linger ran out before K pushes: the daemon learns it from the commit
            loaded, early = committed(loaded)
        t0 = clock()
        if ab is not None:
            pushed = ab.receive()
        b_up.receive(unpack_message(pushed), size=len(pushed))
        got = b_up.next_event()
        assert isinstance(got, Delta2Received)
        t1 = clock()
        push = ahead.check(q, loaded, got.delta, got.steps)
        if push is None and store is not None:  # a commit ended meanwhile: learnt first, as the daemon does
            t = clock()
            loaded, ns = committed(loaded)
            early += ns
            t1 += clock() - t  # (the completion counts as such, not as the check)
            push = ahead.check(q, loaded, got.delta, got.steps)
        assert push is not None, "a live push the relay's event loop verifies"
        if store is None:
            job = waitable_job()
        else:
            job = MergeSteps2(
                push.delta, None, verified=push.verified, against=push.against, joined=push.value
            )
            job.may_linger = True
            store.submit(job)
        summary = ahead.note_push(q, push, job, got.delta, got.steps)
        waiting.append((got.seq, job))
        t2 = clock()
        b_down.local_update(KEY, summary)
        ask = b_down.next_event()
        assert isinstance(ask, NeedDelta2)
        out = ahead.relay(q, ask.since, ask.max_records, MAX_BYTES)
        if out is None:
            value = ahead.value(q, loaded)
            assert value is not None
            out = outgoing(value, ask.since, ask.max_records, MAX_BYTES)
        b_down.provide_delta(KEY, out)
        (passed,) = b_down.messages_to_send()
        if bd is not None:
            bd.send(passed)
        t3 = clock()
        took = [t1 - t0, t2 - t1, t3 - t2, 0, early, 0]
        if bd is not None:
            passed = bd.receive()
        d.receive(unpack_message(passed), size=len(passed))  # D (not timed): holds it at once
        arrived = d.next_event()
        assert isinstance(arrived, Delta2Received)
        d.delta_applied(arrived.seq, link_summary(after), True)
        acks = d.messages_to_send()
        if db is not None:
            for m in acks:
                db.send(m)
        t4 = clock()
        if db is not None:
            acks = [db.receive() for _ in acks]
        for m in acks:
            b_down.receive(unpack_message(m))
        took[3] = clock() - t4
        if len(waiting) == every or i == len(states) - 1:
            if store is not None:
                store.wait([j for _, j in waiting])  # (not timed: the thread sleeps)
            loaded, ns = complete(loaded, push.value, len(waiting))
            took[4] += ns
        if i > warmup:
            counted += 1
            for part, ns in zip(PARTS, took, strict=True):
                spent[part] += ns
    for w in (ab, bd, db, ba):
        if w is not None:
            w.close()
    if store is not None:
        spent["storage"] = store.cpu_ns() - storage_from
        store.close()
    return {part: ns / counted / 1000 for part, ns in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--commit-every", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pause", type=float, default=0.0, help="ms slept before each push (0: none)")
    parser.add_argument("--wire", action="store_true", help="seal, write, read and open every message")
    parser.add_argument("--storage", action="store_true", help="a real storage thread commits the pushes")
    args = parser.parse_args()
    states = line(args.records + args.warmup)
    rounds = [
        turn(states, args.warmup, args.commit_every, args.pause / 1000, args.wire, args.storage)
        for _ in range(args.rounds)
    ]
    loop = [sum(us for part, us in r.items() if part != "storage") for r in rounds]
    total = [sum(r.values()) for r in rounds]
    for part in PARTS:
        if part != "storage" or args.storage:
            print(f"{part:10s} {statistics.median(r[part] for r in rounds):7.1f} us a record")
    if args.storage:
        print(f"{'loop':10s} {statistics.median(loop):7.1f} us a record (every part but storage)")
    print(f"{'total':10s} {statistics.median(total):7.1f} us a record ({args.rounds} rounds)")


if __name__ == "__main__":
    main()
