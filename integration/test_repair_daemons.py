"""``latticectl queue repair`` between real daemon processes: a replica's copy of a core-2 queue changed on
disk while the replica was stopped is found corrupt at its restart (not served, doctor advises the
command), repaired, and fetched again from the owner, which wrote nothing meanwhile: it ends identical
to the owner's, records and metadata, and doctor no longer names it.

The owner's own queue changed on disk and dropped with ``--drop``: until a peer's copy as long as the one
dropped merged back, creating it or offering to it is refused (exit 6), across a restart of the owner too,
and while only a shorter copy is back; then the fence lifts by itself and the next write lands at the end
the peer holds (no fork anywhere)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from daemon_calls import LatticedProcess, client, ctl, dial_address, wait_gate_open
from held_relay import HeldRelay
from polling import wait_until
from support.corrupt_daemon import tamper
from typer.testing import Result

from cli.boundary import ExitCode
from latticed.errors import NotFoundError
from latticed.protocol.versions import HEADS_V2
from latticed.storage.dropped_own import DROPPED_FILE

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
    tamper(replica.data_dir, "events")
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


def _agreed_core2(daemon: LatticedProcess) -> bool:
    with client(daemon) as c:
        return any(HEADS_V2 in (row.get("features") or ()) for row in c.peers())


def _dropped(daemon: LatticedProcess) -> dict[str, int]:
    """The owner's record of its queues dropped by ``queue repair --drop`` and not back yet."""
    try:
        return dict(json.loads((daemon.data_dir / DROPPED_FILE).read_text()))
    except FileNotFoundError:
        return {}


def _status_forks(daemon: LatticedProcess) -> list[Any]:
    with client(daemon) as c:
        return list(c.status()["forked_queues"])


def _assert_refused_by_the_fence(result: Result, back: int) -> None:
    """One line, exit 6 (BehindPeersError), naming ``--release`` and how many records are back."""
    assert result.exit_code == ExitCode.INTEGRITY, result.output
    assert result.stderr.count("\n") == 1 and "queue repair events --release" in result.stderr
    assert ("it is not here yet" if back == 0 else f"{back} of them are back") in result.stderr


def _assert_fenced(owner: LatticedProcess) -> None:
    """Creating the dropped queue again, or offering to it, is refused by the fence (one line naming
    ``--release``); nothing is written; a read says it was dropped and is fetched back."""
    _assert_refused_by_the_fence(ctl(owner, "queue", "create", "events"), 0)
    _assert_refused_by_the_fence(ctl(owner, "offer", "events", "fork?"), 0)
    read = ctl(owner, "queue", "info", "events")
    assert read.exit_code == ExitCode.NOT_FOUND, read.output
    assert "dropped by `queue repair --drop`" in read.stderr, read.output
    with client(owner) as c:
        assert all(q.get("name") != "events" for q in c.queue_list())


def _pushes_answered(daemon: LatticedProcess, to: LatticedProcess) -> tuple[int, int]:
    """How many deltas ``daemon`` sent to ``to`` on their link now, and how many ``to`` answered (its
    ``peers()`` row's per-link counts, which start with the link; (0, 0) while it is not connected)."""
    with client(to) as c:
        key = c.identity()
    with client(daemon) as c:
        row = next((r for r in c.peers() if r.get("public_key") == key and r.get("connected")), {})
    return int(row.get("deltas_sent") or 0), int(row.get("deltas_acked") or 0)


def _explain_one(owner: LatticedProcess, peer: LatticedProcess, address: str) -> str:
    """For a wait's failure in the one-peer drop tests: the records each holds, the fence file, the
    owner's links, the peer's deltas on their link and the owner's answers, and both logs' tails."""
    return _describe(owner, {"owner": owner, "peer": peer}, address, pushes=(peer, owner))


def _owner_dropped_its_queue(
    latticed_process: Factory,
) -> tuple[LatticedProcess, LatticedProcess, HeldRelay, str, list[tuple[Any, ...]]]:
    """An owner whose core-2 ``events`` (20 records, held by a peer it dials through a relay) was changed
    on disk while it was stopped, dropped with ``queue repair --drop`` while the relay holds back the
    peer's bytes (so the copy cannot come back yet): the two daemons, the relay, the queue's address and
    its records as the peer holds them.

    The restarted owner's digest names no corrupt queue, so the peer pushes its whole copy at once and
    again after the owner refuses it; the relay is held only once the owner answered both. A push still
    queued in the owner at the drop would be merged after it (legitimately) and bring the 20 back before
    the fence could be seen (flaky25's race, on a loaded machine)."""
    peer = latticed_process(args=LOCAL)
    relay = HeldRelay(int(dial_address(peer).rsplit(":", 1)[1]))
    try:
        owner = latticed_process(args=[*LOCAL, "--peer", f"127.0.0.1:{relay.port}"])
        with client(owner) as c:
            address = c.queue_create("events", {"team": "a"}, core=2)
            c.offer_batch("events", [(b"v%d" % i, b"k%d" % (i % 3), ()) for i in range(20)])
        wanted = _entries(owner, address)
        assert wanted is not None and len(wanted) == 20

        def explain() -> str:
            return _explain_one(owner, peer, address)

        wait_until(
            lambda: _entries(peer, address) == wanted,
            "the peer's copy of the owner's queue",
            diagnose=explain,
        )

        owner.stop()
        tamper(owner.data_dir, "events")
        owner.start()
        assert ctl(owner, "range", "events", "0", "10").exit_code == 7  # StorageError: corrupt, not served
        shown = ctl(owner, "status")  # readable all the same (it failed with exit 7 too), the queue named
        assert shown.exit_code == 0 and "/events: not what its owner signed" in shown.stdout, shown.output
        # A link that settled its features (heads-v2) is restarted by the repair; one still settling would
        # send its first whole digest after the drop anyway, but the reply would count no link.
        wait_until(
            lambda: _agreed_core2(owner),
            "the owner's link to the peer, settled on heads-v2",
            diagnose=explain,
        )

        def answered() -> bool:
            # On the link since the owner's restart: the whole copy and, after its refusal, the resend;
            # every one answered, so nothing of the peer's is still queued in the owner.
            sent, acked = _pushes_answered(peer, owner)
            return sent >= 2 and acked == sent

        wait_until(
            answered, "the owner's answers (refusals) to the peer's push and its resend", diagnose=explain
        )

        relay.hold()
        dropped = ctl(owner, "queue", "repair", "events", "--drop", "--json")
        assert dropped.exit_code == 0, dropped.output
        reply = json.loads(dropped.stdout)
        assert reply["owned"] is True and reply["records"] == 20 and reply["links_restarted"] >= 1
        assert _dropped(owner) == {"events 0": 20}
    except BaseException:
        relay.close()  # the caller closes it once it has it
        raise
    return owner, peer, relay, address, wanted


def _back_and_written(
    owner: LatticedProcess,
    peer: LatticedProcess,
    address: str,
    wanted: list[Any],
    diagnose: Callable[[], str] | None = None,
) -> None:
    """The peer's copy merges back, the fence lifts by itself, and the next write lands at the end the
    peer holds, on both daemons, neither seeing a fork."""
    wait_until(
        lambda: _entries(owner, address) == wanted,
        "the peer's copy merged back into the owner",
        diagnose=diagnose,
    )
    wait_until(
        lambda: _dropped(owner) == {}, "the fence lifted once the copy is back whole", diagnose=diagnose
    )
    written = ctl(owner, "offer", "events", "after")
    assert written.exit_code == 0, written.output
    with client(owner) as c:
        assert c.queue_info("events")["end_offset"] == 21
    after = _entries(owner, address)
    assert after is not None and after[:20] == wanted and after[20][0] == 20 and after[20][2] == b"after"
    wait_until(
        lambda: _entries(peer, address) == after, "the write after the repair on the peer", diagnose=diagnose
    )
    assert _status_forks(owner) == [] and _status_forks(peer) == []
    assert _store_checks(owner) == []


def test_our_own_queue_dropped_is_fenced_until_a_peer_copy_is_back_then_written_at_its_end(
    latticed_process: Factory,
) -> None:
    owner, peer, relay, address, wanted = _owner_dropped_its_queue(latticed_process)
    try:
        _assert_fenced(owner)  # the links restarting, the peer's bytes held back
        assert _entries(owner, address) is None  # nothing came back another way meanwhile
        relay.release()
        _back_and_written(owner, peer, address, wanted, diagnose=lambda: _explain_one(owner, peer, address))
    finally:
        relay.close()


def test_the_fence_outlives_a_restart_of_the_owner_before_the_copy_is_back(latticed_process: Factory) -> None:
    owner, peer, relay, address, wanted = _owner_dropped_its_queue(latticed_process)
    try:
        peer.stop()
        owner.stop()
        owner.start()
        assert _dropped(owner) == {"events 0": 20}
        wait_gate_open(owner, "the fence's refusals after the owner's restart")
        _assert_fenced(owner)  # no peer connected, no link to ask: the file says
        peer.start()
        relay.target_port = int(dial_address(peer).rsplit(":", 1)[1])  # the peer listens on a new port
        relay.release()
        _back_and_written(owner, peer, address, wanted, diagnose=lambda: _explain_one(owner, peer, address))
    finally:
        relay.close()


def _links_on_heads_v2(daemon: LatticedProcess) -> int:
    with client(daemon) as c:
        return sum(HEADS_V2 in (row.get("features") or ()) for row in c.peers())


def _describe(
    owner: LatticedProcess,
    daemons: dict[str, LatticedProcess],
    address: str,
    pushes: tuple[LatticedProcess, LatticedProcess] | None = None,
) -> str:
    """For a wait's failure: how much of the queue each daemon holds, the owner's fence file and links,
    the deltas ``pushes[0]`` sent ``pushes[1]`` on their link and the answers, and the daemons' logs'
    tails (what each link did around the drop). A daemon that died or hangs is itself the explanation:
    said, never raised."""

    def held(daemon: LatticedProcess) -> str:
        try:
            entries = _entries(daemon, address)
        except Exception as exc:
            return f"unreadable ({type(exc).__name__}: {exc})"
        return "none" if entries is None else f"{len(entries)} records"

    try:
        with client(owner) as c:
            links = [
                {k: row.get(k) for k in ("public_key", "address", "status", "state")} for row in c.peers()
            ]
    except Exception as exc:
        links = [{"error": f"{type(exc).__name__}: {exc}"}]
    holds = ", ".join(f"{name} {held(daemon)}" for name, daemon in daemons.items())
    lines = [f"holds: {holds}; fence file {_dropped(owner)}", f"owner's peers: {links}"]
    if pushes is not None:
        try:
            sent, acked = _pushes_answered(*pushes)
            lines.append(f"peer's deltas sent the owner {sent}, answered {acked} (on the link now)")
        except Exception as exc:
            lines.append(f"peer's counters unreadable ({type(exc).__name__}: {exc})")
    for name, daemon in daemons.items():
        lines += [f"--- {name}'s log (tail)", daemon.log_text()]
    return "\n".join(lines)


def _explain(owner: LatticedProcess, short: LatticedProcess, whole: LatticedProcess, address: str) -> str:
    """:func:`_describe` for the three-daemon test."""
    return _describe(owner, {"owner": owner, "short": short, "whole": whole}, address)


def test_a_shorter_peer_copy_back_keeps_the_fence_until_a_whole_one_arrives(
    latticed_process: Factory,
) -> None:
    """``short`` held only the first 10 of the 20 records when the owner dropped its queue, ``whole`` all
    20: ``short``'s copy merges back first and the fence holds (offer refused saying 10 are back, create
    refused, the file still names the queue); once ``whole``'s bytes pass, the copy is 20 long, the
    fence lifts by itself, and the next write lands at 20 on all three, none seeing a fork.

    ``whole``'s bytes are held from before the owner's restart, not from after its link came up: the
    owner names no corrupt queue in its digest, so a peer's link pushes its copy at once (and once more
    after the refusal), and a push read before the hold but merged after the drop (a loaded machine)
    brought all 20 back before ``short``'s 10 could be seen alone (CI, session 25)."""
    short, whole = latticed_process(args=LOCAL), latticed_process(args=LOCAL)
    relays = [HeldRelay(int(dial_address(d).rsplit(":", 1)[1])) for d in (short, whole)]
    to_short, to_whole = relays
    try:
        peers = [arg for relay in relays for arg in ("--peer", f"127.0.0.1:{relay.port}")]
        owner = latticed_process(args=[*LOCAL, *peers])
        records = [(b"v%d" % i, b"k%d" % (i % 3), ()) for i in range(20)]
        with client(owner) as c:
            address = c.queue_create("events", {"team": "a"}, core=2)
            c.offer_batch("events", records[:10])
        first = _entries(owner, address)

        def explain() -> str:
            return _explain(owner, short, whole, address)

        for peer in (short, whole):
            wait_until(
                lambda peer=peer: _entries(peer, address) == first,
                "each peer's copy of the first 10",
                diagnose=explain,
            )
        short.stop()
        with client(owner) as c:
            c.offer_batch("events", records[10:])
        wanted = _entries(owner, address)
        assert wanted is not None and len(wanted) == 20 and wanted[:10] == first
        wait_until(
            lambda: _entries(whole, address) == wanted, "the whole copy on the other peer", diagnose=explain
        )

        owner.stop()
        tamper(owner.data_dir, "events")
        to_whole.hold()  # the whole copy cannot come back yet, not even pushed at the restart; the short can
        short.start()
        to_short.target_port = int(dial_address(short).rsplit(":", 1)[1])  # it listens on a new port
        owner.start()
        assert _entries(short, address) == first  # it heard nothing of records 10-19
        wait_until(
            lambda: _links_on_heads_v2(owner) == 1, "the owner's link to short, on heads-v2", diagnose=explain
        )

        dropped = ctl(owner, "queue", "repair", "events", "--drop", "--json")
        assert dropped.exit_code == 0, dropped.output
        reply = json.loads(dropped.stdout)
        assert reply["records"] == 20 and reply["links_restarted"] == 1, reply  # whole's link is not up
        assert _dropped(owner) == {"events 0": 20}
        wait_until(
            lambda: _entries(owner, address) == first,
            "the short copy merged back into the owner",
            diagnose=explain,
        )

        _assert_refused_by_the_fence(ctl(owner, "offer", "events", "fork?"), 10)
        created = ctl(owner, "queue", "create", "events")
        assert created.exit_code == ExitCode.EXISTS, created.output  # the 10 back are the queue
        assert _dropped(owner) == {"events 0": 20}  # the file still names it
        assert _entries(owner, address) == first and _entries(short, address) == first  # nothing written

        to_whole.release()
        _back_and_written(owner, whole, address, wanted, diagnose=explain)
        after = _entries(owner, address)
        wait_until(
            lambda: _entries(short, address) == after,
            "the rest and the write on the short peer",
            diagnose=explain,
        )
        assert _status_forks(short) == []
    finally:
        for relay in relays:
            relay.close()
