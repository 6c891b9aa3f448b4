"""Offers into another daemon's queue with real daemon processes on loopback and the real CLI: B (listed
as a producer) offers into A's queue, C (not listed) is refused with nothing written, every replica holds
the same records with the producer's identity on each, and an unreachable owner exits 14 after --wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polling import wait_until
from test_workqueue_mesh import client, ctl, free_port, linked

from cli.boundary import ExitCode
from latticed.errors import LatticedError

LatticedProcess = Any
Factory = Callable[..., LatticedProcess]


def held(daemon: LatticedProcess, queue: str, end: int) -> Callable[[], bool]:
    def check() -> bool:
        with client(daemon) as c:
            try:
                return int(c.queue_info(queue)["end_offset"]) >= end
            except LatticedError:
                return False

    return check


def test_producers_offer_into_the_owners_queue_and_others_are_refused(
    latticed_process: Factory, tmp_path: Path
) -> None:
    port = free_port()
    a = latticed_process(args=["--listen", f"127.0.0.1:{port}", "--no-mdns"])
    peer = ["--listen", "127.0.0.1:0", "--no-mdns", "--peer", f"127.0.0.1:{port}"]
    b, c = latticed_process(args=peer), latticed_process(args=peer)
    ids = []
    for d in (a, b, c):
        with client(d) as cl:
            ids.append(cl.identity())
    a_id, b_id, c_id = ids
    wait_until(lambda: linked(b, a_id) and linked(c, a_id), "B and C to connect to A")
    assert ctl(a, "queue", "create", "feed", "--producers", b_id).returncode == 0
    feed = f"{a_id}/feed"

    done = ctl(b, "offer", feed, "hello", "--header", "h=1")
    assert (done.returncode, done.stdout.strip()) == (0, "0"), done.stderr
    lines = tmp_path / "lines.txt"
    lines.write_text("one\ntwo\nthree\n")
    done = ctl(b, "offer", feed, "--file", str(lines))
    assert (done.returncode, done.stdout.strip()) == (0, "1..3"), done.stderr

    refused = ctl(c, "offer", feed, "nope")
    assert refused.returncode == ExitCode.NOT_OWNER, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and c_id in refused.stderr

    stamp = ("lattice.producer", b_id.encode())
    for d in (a, b, c):  # every replica: the same records, each naming who offered it
        wait_until(held(d, feed, 4), "the records to replicate")
        with client(d) as cl:
            entries = cl.range(feed, 0, 10)
        assert [e.value for e in entries] == [b"hello", b"one", b"two", b"three"]
        assert [tuple(e.headers) for e in entries] == [(("h", b"1"), stamp), *[(stamp,)] * 3]

    # '*': every daemon of the network may offer
    assert ctl(a, "queue", "edit", "feed", "--producers", "*").returncode == 0
    done = ctl(c, "offer", feed, "from c")
    assert (done.returncode, done.stdout.strip()) == (0, "4"), done.stderr

    # the owner goes away: B waits --wait, then exits 14, nothing written
    a.stop()
    started = time.monotonic()
    gone = ctl(b, "offer", feed, "lost", "--wait", "1")
    assert gone.returncode == ExitCode.OWNER_UNREACHABLE, gone.stderr
    assert 1.0 <= time.monotonic() - started < 20
    assert len(gone.stderr.strip().splitlines()) == 1
