"""CPU of a link start against the number of queues held: the peer's HELLO schedules every queue (sans-IO
session only: no sockets, no store). Linear means the 30,000-queue figure is about 3x the 10,000 one.

    .venv/bin/python bench/bench_link_start.py [--sizes 10000,30000]
"""

from __future__ import annotations

import argparse
import time

from latticed.crdt import queue as core
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.protocol.replication import PROTOCOL_VERSION, NeedDelta, ReplicationSession
from latticed.protocol.replication_messages import Digest, Hello, encode_message


def link_start(queues: int) -> float:
    """Seconds of CPU for start, the peer's HELLO and its full digest, and the first window of asks."""
    owner = Identity.from_seed(b"o" * 32)
    state = core.commit(core.empty_state(owner.public_key, "q"), owner, now_ms=1, records=[Record(b"x")] * 5)
    summary = state.summary()
    local = {(owner.public_key, f"q{i}", 0): summary for i in range(queues)}
    hello = encode_message(Hello(PROTOCOL_VERSION, None, None))
    digest = encode_message(Digest(tuple((key, core.Summary()) for key in local)))
    started = time.process_time()
    session = ReplicationSession()
    session.start(local)
    session.receive_message(hello)
    session.receive_message(digest)
    asked = sum(isinstance(e, NeedDelta) for e in iter(session.next_event, None))
    assert asked == session.window
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,30000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    figures = {n: min(link_start(n) for _ in range(3)) for n in sizes}
    for n, seconds in figures.items():
        print(
            f"link start with {n:,} queues: {seconds * 1000:,.0f} ms CPU ({seconds / n * 1e6:.1f} us/queue)"
        )
    first = sizes[0]
    for n in sizes[1:]:
        print(
            f"  {n:,}/{first:,}: {figures[n] / figures[first]:.2f}x the time for {n / first:.1f}x the queues"
        )


if __name__ == "__main__":
    main()
