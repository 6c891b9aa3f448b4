"""``latticectl queue repair`` between real daemon processes: a replica's copy of a core-2 queue changed on
disk while the replica was stopped is found corrupt at its restart (not served, doctor advises the
command), repaired, and fetched again from the owner, which wrote nothing meanwhile: it ends identical
to the owner's, records and metadata, and doctor no longer names it."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

from daemon_calls import LatticedProcess, client, ctl, dial_address
from polling import wait_until

from latticed.errors import NotFoundError
from latticed.storage.codec import pack
from latticed.storage.store import db_path

Factory = Callable[..., LatticedProcess]
LOCAL = ["--listen", "127.0.0.1:0", "--no-mdns"]


def _entries(daemon: LatticedProcess, queue: str) -> list[tuple[Any, ...]] | None:
    """Every record of ``queue`` as the daemon serves it (None while it holds no such queue)."""
    with client(daemon) as c:
        try:
            return [(e.offset, e.key, e.value, e.timestamp, e.headers) for e in c.range(queue, 0, 1 << 40)]
        except NotFoundError:
            return None


def _store_checks(daemon: LatticedProcess) -> list[dict[str, Any]]:
    with client(daemon) as c:
        return [check for check in c.doctor() if check["check"] == "store"]


def _connected(daemon: LatticedProcess) -> bool:
    with client(daemon) as c:
        return any(row.get("status") == "connected" for row in c.peers())


def test_a_replica_copy_changed_on_disk_is_repaired_and_fetched_again_identical(
    latticed_process: Factory,
) -> None:
    owner = latticed_process(args=LOCAL)
    replica = latticed_process(args=LOCAL)
    with client(owner) as c:
        address = c.queue_create("events", {"team": "a"}, core=2)
        c.offer_batch("events", [(b"v%d" % i, b"k%d" % (i % 3), ()) for i in range(20)])
        wanted_info = c.queue_info("events")
    wanted = _entries(owner, address)
    assert wanted is not None and len(wanted) == 20
    with client(replica) as c:
        c.peers_add(dial_address(owner))
    wait_until(lambda: _entries(replica, address) == wanted, "the replica's copy of the owner's queue")

    replica.stop()
    conn = sqlite3.connect(db_path(replica.data_dir))
    try:
        conn.execute(
            "UPDATE queue2 SET meta = ? WHERE q = (SELECT q FROM queues WHERE name = 'events')",
            (pack([["team", "evil"]]),),
        )
        conn.commit()
    finally:
        conn.close()
    replica.start()

    refused = ctl(replica, "range", address, "0", "10")
    assert refused.exit_code == 7, refused.output  # StorageError: not served
    checks = _store_checks(replica)
    assert len(checks) == 1 and f"`latticectl queue repair {address}`" in checks[0]["fix"]
    wait_until(lambda: _connected(replica), "the replica's link to the owner")

    repaired = ctl(replica, "queue", "repair", address, "--json")
    assert repaired.exit_code == 0, repaired.output
    reply = json.loads(repaired.stdout)
    assert reply["repaired"] is True and reply["records"] == 20 and reply["links_restarted"] >= 1

    wait_until(lambda: _entries(replica, address) == wanted, "the copy fetched again from the owner")
    with client(replica) as c:
        again = c.queue_info(address)
    for field in ("meta", "start_offset", "end_offset", "core", "epoch"):
        assert again.get(field) == wanted_info.get(field), field
    assert _store_checks(replica) == []
    with client(owner) as c:
        assert c.queue_info("events")["end_offset"] == 20  # the owner wrote nothing meanwhile
