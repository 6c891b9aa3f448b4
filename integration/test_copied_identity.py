"""Two daemons running one identity (an owner's data directory copied to a second one), both writing, both
dialling one relay, as real processes on loopback: the relay serves both and says so, the later one
refuses its own writes (exit 6) until its operator claims the identity, and what both wrote meets on the
relay (the queue is flagged forked there)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any

from daemon_calls import LatticedProcess, client, ctl, dial_address, info, write_after_start
from polling import wait_until

Factory = Callable[..., LatticedProcess]
LOCAL = ["--listen", "127.0.0.1:0", "--no-mdns"]


def identity(daemon: LatticedProcess) -> dict[str, Any]:
    with client(daemon) as c:
        facts = c.identity_runs()
    assert facts is not None
    return facts


def test_a_copied_identity_is_flagged_the_later_daemon_stops_writing_and_both_histories_meet(
    latticed_process: Factory,
) -> None:
    relay = latticed_process(args=LOCAL)
    owner = latticed_process(args=LOCAL)
    with client(owner) as c:
        queue = c.queue_create("events")
        c.offer_batch("events", [(b"shared-%d" % i, None, ()) for i in range(10)])
    owner.stop()
    copy = latticed_process(start=False, args=LOCAL)
    shutil.copytree(owner.data_dir, copy.data_dir)
    owner.start()
    copy.start()
    # Each signs once it heard what the peers it knew of hold, or found them gone (its start gate).
    owner_batch = [(b"owner-%d" % i, None, ()) for i in range(5)]
    write_after_start(owner, lambda c: c.offer_batch("events", owner_batch), "the owner's 5 records")
    copy_batch = [(b"copy-%d" % i, None, ()) for i in range(3)]
    write_after_start(copy, lambda c: c.offer_batch("events", copy_batch), "the copy's 3 records")

    # The owner meets the relay first, then the copy does.
    hub = dial_address(relay)
    with client(owner) as c:
        c.peers_add(hub)
    wait_until(lambda: info(relay, queue).get("end_offset") == 15, "the owner's 15 records on the relay")
    with client(copy) as c:
        c.peers_add(hub)

    # The relay: both served, the duplicate logged, shown and counted; both histories meet there.
    wait_until(lambda: bool(identity(relay)["seen_twice"]), "the relay to see the identity twice")
    wait_until(lambda: info(relay, queue).get("forked") is True, "the fork flagged on the relay")
    (seen,) = identity(relay)["seen_twice"]
    with client(owner) as c:
        owner_id = c.identity()
    assert seen["identity"] == owner_id
    assert "peer.duplicate_identity" in relay.log_text()

    def both_runs_listed() -> list[dict[str, Any]]:
        with client(relay) as c:
            return [r for r in c.peers() if r.get("public_key") == owner_id]

    # Both links listed at once. Seen twice in CI with one row: a delta read racing the fork's freeze (its
    # rows past the fork point moved aside) raised and closed a run's link until it redialled; that read
    # now starts again from the frozen value (bench/RESULTS.md, "Copied identity"). A link may still end
    # for reasons of its own, and what must hold is that both runs are served and shown: wait for it.
    def shown(rows: list[dict[str, Any]]) -> bool:
        return (
            len(rows) == 2
            and any(r.get("duplicate_identity") for r in rows)
            and all(r.get("status") == "connected" for r in rows)
            and all("two daemons, one identity" in str(r.get("reason")) for r in rows)
        )

    wait_until(
        lambda: shown(both_runs_listed()),
        "both runs of the identity listed on the relay, connected and flagged",
        diagnose=lambda: repr(both_runs_listed()),
    )
    with client(relay) as c:
        values = [e.value for e in c.range(queue, 0, 10)]
        rows = [r for r in c.peers() if r.get("public_key") == owner_id]
        counters = c.status()["replication"]
    assert values[:10] == [b"shared-%d" % i for i in range(10)]  # what both share
    assert len(rows) == 2 and any(r.get("duplicate_identity") for r in rows), rows
    assert all(r["status"] == "connected" and "two daemons, one identity" in r["reason"] for r in rows), rows
    assert counters["duplicate_identities"] >= 1
    doctor = ctl(relay, "doctor", "--json")
    checks = json.loads(doctor.stdout)["checks"]
    assert any(c["check"] == "duplicate identity" and c["ok"] is False for c in checks)
    status = ctl(relay, "status")
    assert status.exit_code == 0 and "runs twice" in status.stdout

    # The copy, the later run, refuses its own writes: exit 6, one line naming the other and the way out.
    wait_until(lambda: identity(copy)["refusing"] is not None, "the copy to refuse its writes")
    refused = ctl(copy, "offer", "events", "one more")
    assert refused.exit_code == 6, refused.output
    assert "Traceback" not in refused.output
    [line] = refused.stderr.splitlines()
    assert line.startswith("latticectl: error: ")
    assert "another daemon runs this identity" in line and "latticectl identity claim" in line
    assert identity(copy)["other_runs"][0]["this_daemon_is"] == "later"
    doctor = json.loads(ctl(copy, "doctor", "--json").stdout)["checks"]
    assert any(c["check"] == "identity" and c["ok"] is False for c in doctor)
    # The owner, the earlier run, was told too and keeps writing.
    wait_until(lambda: bool(identity(owner)["other_runs"]), "the owner to be told")
    assert identity(owner)["other_runs"][0]["this_daemon_is"] == "earlier"
    assert identity(owner)["refusing"] is None
    assert ctl(owner, "identity").exit_code == 0

    # The operator decides: the copy is the one to keep (after stopping the owner).
    owner.stop()
    claimed = ctl(copy, "identity", "claim")
    assert claimed.exit_code == 0, claimed.output
    assert "it signs again" in claimed.stderr
    assert identity(copy)["refusing"] is None
