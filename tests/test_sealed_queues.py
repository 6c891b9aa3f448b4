"""Sealed queues on one in-process daemon: the owner's own reads and writes, what its store holds, key
epochs racing writes, and other identities' sealed queues (built with the library and merged straight into
the engine, as a network of daemons would deliver them) read as a reader and as a non-reader."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner, Result

import cli.ctl
from cli.boundary import ExitCode
from latticed.crdt import kv
from latticed.crdt import queue as core
from latticed.crdt.head import KIND_KV
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.errors import AlreadyExistsError, MalformedError, NotReaderError, TamperedError
from latticed.facades.lattice_queue import LatticeQueue
from latticed.host.config import DaemonConfig
from latticed.privacy import crypto
from latticed.privacy import meta as sealed_meta
from latticed.storage.jobs import Call
from latticed.storage.kvcompact import CompactKv

runner = CliRunner()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    root = tmp_path_factory.mktemp("sealed")
    d = start_in_process(DaemonConfig(data_dir=root / "data", socket_path=root / "api.sock"))
    yield d
    d.stop()


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def qname() -> str:
    return f"s{secrets.token_hex(4)}"


def store_bytes(daemon: InProcessDaemon) -> bytes:
    """The daemon's SQLite file and its WAL, as they are on disk."""
    data = daemon.config.data_dir
    return b"".join(p.read_bytes() for p in sorted(Path(data).glob("*.db*")) if p.is_file())


def test_the_owner_reads_plaintext_and_its_store_holds_only_ciphertext(daemon: InProcessDaemon) -> None:
    name = qname()
    reader = Identity.generate()
    secret, key, header = (
        b"owner-plaintext-" + secrets.token_bytes(8),
        b"key-" + secrets.token_bytes(6),
        b"hv",
    )
    with daemon.client() as c:
        c.queue_create(name, readers=[reader.public_hex])
        assert c.offer(name, secret, key=key, headers={"h": header}) == 0
        assert c.offer_batch(name, [(b"batch-%d" % i, None, ()) for i in range(5)]) == list(range(1, 6))
        assert c.peek(name, 0) == secret
        entry = c.peek_entry(name, 0)
        assert entry is not None and (entry.key, entry.value, entry.headers) == (
            key,
            secret,
            (("h", header),),
        )
        assert [e.value for e in c.range(name, 0, 9)] == [secret] + [b"batch-%d" % i for i in range(5)]
        read = c.read(name, 0)
        assert read.values[1:] == [b"batch-%d" % i for i in range(5)] and read.keys[0] == key
        assert [e.value for e in c.tail(name, from_offset=4, follow=False)] == [b"batch-3", b"batch-4"]
        first, last = c.first(name), c.last(name)
        assert first is not None and last is not None and (first.value, last.value) == (secret, b"batch-4")
        info = c.queue_info(name)
        assert info["sealed"]["readers"] == sorted([reader.public_hex, c.identity()])
        assert info["sealed"]["readable"] and info["sealed"]["epochs"] == [
            {"epoch": 0, "start": 0, "readers": info["sealed"]["readers"]}
        ]
        address = info["queue"]
    stored = daemon.call(daemon.handle.engine.delta_for, *_split(address), None)
    assert all(r.key is None and not r.headers for r in stored.records)
    assert all(crypto.envelope_epoch(r.value) == 0 for r in stored.records)
    on_disk = store_bytes(daemon)
    assert on_disk and secret not in on_disk and key not in on_disk and b"batch-3" not in on_disk


def _split(address: str) -> tuple[bytes, str]:
    owner, name = address.split("/")
    return bytes.fromhex(owner), name


def test_reserved_metadata_keys_are_refused(daemon: InProcessDaemon) -> None:
    name = qname()
    with daemon.client() as c:
        c.queue_create(name, readers=[])
        with pytest.raises(MalformedError, match="reserved"):
            c.meta_set(name, "sealed.epoch", "7")
        with pytest.raises(MalformedError, match="reserved"):
            c.meta_del(name, "sealed.epoch")
        with pytest.raises(MalformedError, match="reserved"):
            c.queue_create(qname(), {"sealed.epoch": "0"})
        assert c.meta_list(name)["sealed.epoch"] == "0"
    result = ctl(daemon, "meta", "set", name, "sealed.key.0.00", "x")
    assert result.exit_code == ExitCode.USAGE and "reserved" in result.stderr


def test_share_and_unshare_start_epochs_where_the_queue_ends(daemon: InProcessDaemon) -> None:
    name = qname()
    bob, carol = Identity.generate(), Identity.generate()
    with daemon.client() as c:
        c.queue_create(name, readers=[bob.public_hex])
        c.offer_batch(name, [(b"e0-%d" % i, None, ()) for i in range(3)])
        assert c.queue_unshare(name, bob.public_hex) == {"removed": True, "epoch": 1, "start": 3}
        assert c.queue_unshare(name, bob.public_hex)["removed"] is False  # nothing to do, no new epoch
        c.offer(name, b"e1")
        assert c.queue_share(name, carol.public_hex) == [1]
        assert c.queue_share(name, carol.public_hex) == []
        assert c.queue_share(name, carol.public_hex, history=True) == [0]
        assert c.queue_share(name, bob.public_hex) == [1]  # re-shared
        with pytest.raises(MalformedError, match="always a reader"):
            c.queue_unshare(name, c.identity())
        with pytest.raises(MalformedError, match="not sealed"):
            plain = qname()
            c.queue_create(plain)
            c.queue_share(plain, bob.public_hex)
        sealed = c.queue_info(name)["sealed"]
        assert [(e["epoch"], e["start"]) for e in sealed["epochs"]] == [(0, 0), (1, 3)]
        assert set(sealed["epochs"][0]["readers"]) == {c.identity(), bob.public_hex, carol.public_hex}
        assert set(sealed["readers"]) == {c.identity(), bob.public_hex, carol.public_hex}
        assert [e.value for e in c.range(name, 0, 10)] == [b"e0-0", b"e0-1", b"e0-2", b"e1"]
    text = ctl(daemon, "queue", "info", name).stdout
    assert "key epoch 1 from offset 3, this daemon reads it" in text


def test_a_write_racing_an_unshare_is_sealed_under_the_new_epoch(daemon: InProcessDaemon) -> None:
    """Offers sealed on the event loop under the committed epoch, but queued behind a rotation that is not
    committed yet, are sealed again in the storage thread: nothing at or past the new epoch's start is
    readable with the key of the reader it removed."""
    name = qname()
    bob = Identity.generate()
    with daemon.client() as c:
        c.queue_create(name, readers=[bob.public_hex])
        c.offer(name, b"before")
    engine = daemon.handle.engine
    sealer = daemon.handle.sealer
    q = engine.resolve(name)
    gate = threading.Event()

    async def race() -> tuple[int, int]:
        hold = engine.start_job(Call(lambda batch, writer: gate.wait(10)))  # the storage thread waits
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sealer.unshare, q, bob.public_key)
            await trio.testing.wait_all_tasks_blocked()  # its rotation job is queued behind the gate
            assert sealer.sealing(q).current.number == 0  # type: ignore[union-attr]
            job = sealer.start_append(q, [Record(b"raced")])  # sealed under epoch 0 here
            gate.set()
            first: int = await engine.outcome(job)
        await engine.outcome(hold)
        sealing = sealer.sealing(q)
        assert sealing is not None
        return first, sealing.current.start

    offset, start = daemon.call(race)
    assert offset >= start == 1
    stored = daemon.call(engine.row, q, offset)
    assert crypto.envelope_epoch(stored[1]) == 1
    with daemon.client() as c:
        assert c.peek(name, offset) == b"raced"


def test_every_sealed_record_gets_a_fresh_nonce(daemon: InProcessDaemon) -> None:
    name = qname()
    with daemon.client() as c:
        c.queue_create(name, readers=[])
        for _ in range(20):
            c.offer_batch(name, [(b"same", None, ())] * 50)
            c.offer(name, b"same")
        address = c.queue_info(name)["queue"]
    delta = daemon.call(daemon.handle.engine.delta_for, *_split(address), None)
    nonces = [crypto.envelope_nonce(r.value) for r in delta.records]
    assert len(nonces) == 1020 and len(set(nonces)) == 1020
    assert len({r.value for r in delta.records}) == 1020  # same plaintext, different ciphertexts


# ------------------------------------------------------------------ another identity's sealed queue


def foreign_sealed(readers: list[bytes], values: list[bytes]) -> tuple[LatticeQueue, Identity, bytes]:
    """A sealed queue of another identity, written with the library: (queue, owner, epoch 0 key)."""
    owner = Identity.generate()
    queue = LatticeQueue.create(owner, qname())
    content_key = secrets.token_bytes(32)
    for key, value in sealed_meta.seal_new(
        owner.public_key, readers, content_key, secrets.token_bytes
    ).items():
        queue.set_meta(key, value)
    seal(queue, content_key, 0, values)
    return queue, owner, content_key


def seal(queue: LatticeQueue, content_key: bytes, epoch: int, values: list[bytes]) -> None:
    qid = queue.state.queue_id
    run = crypto.seal_run(
        content_key, qid, epoch, [Record(v) for v in values], secrets.token_bytes(24 * len(values))
    )
    queue.offer_many(run)
    queue.commit()


def deliver(daemon: InProcessDaemon, queue: LatticeQueue) -> str:
    daemon.call(daemon.handle.engine.merge_delta, queue.delta())
    return f"{queue.owner.hex()}/{queue.name}"


def test_a_daemon_that_is_not_a_reader_fails_clearly_with_exit_13(daemon: InProcessDaemon) -> None:
    queue, _, _ = foreign_sealed([], [b"not for you", b"nor this"])
    address = deliver(daemon, queue)
    with daemon.client() as c:
        info = c.queue_info(address)
        assert info["end_offset"] == 2 and info["sealed"]["readable"] is False
        for call in (
            lambda: c.peek(address, 0),
            lambda: c.range(address, 0, 1),
            lambda: c.read(address, 0),
            lambda: c.first(address),
            lambda: list(c.tail(address, from_offset=0, follow=False)),
        ):
            with pytest.raises(NotReaderError, match="not a reader of its key epoch 0"):
                call()
    for args in (("peek", address, "0"), ("range", address, "0", "1"), ("tail", address, "--from", "0")):
        result = ctl(daemon, *args)
        assert result.exit_code == ExitCode.NOT_READER == 13, result.output
        assert result.stdout == "" and "is not a reader" in result.stderr


def test_a_reader_reads_its_epochs_and_stops_where_it_was_removed(daemon: InProcessDaemon) -> None:
    me = bytes.fromhex(daemon.handle.engine.public_key.hex())
    queue, owner, _ = foreign_sealed([me], [b"old-%d" % i for i in range(3)])
    address = deliver(daemon, queue)
    with daemon.client() as c:
        assert [e.value for e in c.range(address, 0, 2)] == [b"old-0", b"old-1", b"old-2"]
        assert c.queue_info(address)["sealed"]["readable"] is True
    # The owner removes us: a new epoch from offset 3 on, wrapped only to itself.
    sealing = sealed_meta.parse(queue.meta, owner.public_key)
    assert sealing is not None
    new_key = secrets.token_bytes(32)
    for key, value in sealed_meta.rotate(sealing, new_key, [], 3, secrets.token_bytes).items():
        queue.set_meta(key, value)
    seal(queue, new_key, 1, [b"new-0", b"new-1"])
    deliver(daemon, queue)
    with daemon.client() as c:
        assert [e.value for e in c.range(address, 0, 2)] == [b"old-0", b"old-1", b"old-2"]
        batch = c.read(address, 0)  # what it can open, then the error at the first it cannot
        assert batch.values == [b"old-0", b"old-1", b"old-2"] and batch.next_offset == 3
        with pytest.raises(NotReaderError, match="key epoch 1 \\(its records from offset 3\\)"):
            c.read(address, 3)
        with pytest.raises(NotReaderError):
            c.range(address, 0, 4)
        with pytest.raises(NotReaderError):
            c.peek(address, 4)
        assert c.queue_info(address)["sealed"]["readable_epochs"] == [0]
    # Shared again (current epoch only): the new records open too.
    sealing = sealed_meta.parse(queue.meta, owner.public_key)
    assert sealing is not None
    for key, value in sealed_meta.share(sealing, me, {1: new_key}, secrets.token_bytes).items():
        queue.set_meta(key, value)
    queue.commit()
    deliver(daemon, queue)
    with daemon.client() as c:
        assert [e.value for e in c.range(address, 0, 4)] == [b"old-0", b"old-1", b"old-2", b"new-0", b"new-1"]


def test_range_on_a_removed_reader_prints_what_it_can_open_and_names_the_rest(
    daemon: InProcessDaemon,
) -> None:
    me = bytes.fromhex(daemon.handle.engine.public_key.hex())
    queue, owner, _ = foreign_sealed([me], [b"old-%d" % i for i in range(3)])
    sealing = sealed_meta.parse(queue.meta, owner.public_key)
    assert sealing is not None
    new_key = secrets.token_bytes(32)
    for key, value in sealed_meta.rotate(sealing, new_key, [], 3, secrets.token_bytes).items():
        queue.set_meta(key, value)  # the owner removed us: epoch 1 from offset 3 on
    seal(queue, new_key, 1, [b"new-0", b"new-1"])
    address = deliver(daemon, queue)
    result = ctl(daemon, "range", address, "0", "10")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["0\told-0", "1\told-1", "2\told-2"]
    [note] = result.stderr.splitlines()
    assert "offsets 3..4 of" in note and "not a reader" in note
    lines = [
        json.loads(line) for line in ctl(daemon, "range", address, "1", "4", "--json").stdout.splitlines()
    ]
    assert [(line["offset"], line.get("value"), line.get("unreadable")) for line in lines] == [
        (1, "old-1", None),
        (2, "old-2", None),
        (3, None, True),
        (4, None, True),
    ]
    none = ctl(daemon, "range", address, "3", "4")  # nothing it can open: exit 13, as before
    assert none.exit_code == ExitCode.NOT_READER and none.stdout == "" and "offsets 3..4" in none.stderr
    with daemon.client() as c:
        entries, unreadable = c.range_readable(address, 2, 4)
        assert [e.value for e in entries] == [b"old-2"] and unreadable == [(3, 4)]
        with pytest.raises(NotReaderError):  # without the option: all of it or the error
            c.range(address, 0, 4)
        batch = c.call("read", queue=address, skip_unreadable=True, **{"from": 2})
        assert batch["values"] == [b"old-2"] and batch["unreadable"] == [[3, 4]]
        assert batch["next_offset"] == 5


def test_a_sealed_record_that_does_not_decrypt_is_an_integrity_error(daemon: InProcessDaemon) -> None:
    """The owner itself signed a broken envelope (a bug, or a forger holding its key): exit 6, never the
    ciphertext as the value."""
    me = daemon.handle.engine.public_key
    queue, _, content_key = foreign_sealed([me], [b"fine"])
    envelope = bytearray(
        crypto.seal_run(content_key, queue.state.queue_id, 0, [Record(b"x")], bytes(24)).values[0]
    )
    envelope[-1] ^= 1
    queue.offer_many([Record(bytes(envelope))])
    queue.commit()
    address = deliver(daemon, queue)
    result = ctl(daemon, "peek", address, "1")
    assert result.exit_code == ExitCode.INTEGRITY and "does not decrypt" in result.stderr
    assert ctl(daemon, "peek", address, "0").stdout == "fine\n"


def test_a_record_under_an_epoch_the_metadata_never_declared_is_an_integrity_error(
    daemon: InProcessDaemon,
) -> None:
    """Epoch 5 of a queue whose metadata declares only epoch 0: not an epoch this daemon was left out of
    (exit 13) but a record its owner's metadata does not account for (exit 6)."""
    me = daemon.handle.engine.public_key
    queue, _, content_key = foreign_sealed([me], [b"fine"])
    seal(queue, content_key, 5, [b"from nowhere"])
    address = deliver(daemon, queue)
    result = ctl(daemon, "peek", address, "1")
    assert result.exit_code == ExitCode.INTEGRITY, result.output
    assert "key epoch 5, which the queue's metadata does not declare" in result.stderr
    assert ctl(daemon, "peek", address, "0").stdout == "fine\n"


# ------------------------------------------------------------------ consumer groups


def test_a_group_over_a_sealed_queue_leases_plaintext_and_seals_its_dead_letters(
    daemon: InProcessDaemon,
) -> None:
    name, group = qname(), qname()
    secret = b"group-plaintext-" + secrets.token_bytes(8)
    with daemon.client() as c:
        c.queue_create(name, readers=[])
        c.offer(name, secret, key=b"gk", headers={"gh": b"gv"})
        c.group_create(group, [name], max_attempts=1)
        lease = c.dequeue(group)
        assert lease is not None and (lease.value, lease.key, lease.headers) == (
            secret,
            b"gk",
            (("gh", b"gv"),),
        )
        c.nack(group, lease)  # its one attempt: dead-lettered
        [letter] = c.dlq_list(group)
        assert (letter["value"], letter["key"], letter["offset"]) == (secret, b"gk", 0)
        dlq = c.queue_info(f"{group}.dlq")
        assert dlq["sealed"]["readers"] == [c.identity()] and dlq["end_offset"] == 1
        assert c.peek(f"{group}.dlq", 0) is not None
    assert secret not in store_bytes(daemon)  # neither the source nor the dead letter, in plaintext


def test_a_group_needs_to_read_its_sealed_sources(daemon: InProcessDaemon) -> None:
    me = daemon.handle.engine.public_key
    unreadable, _, _ = foreign_sealed([], [b"x"])
    readable, owner, _ = foreign_sealed([me], [b"old-0", b"old-1"])
    with daemon.client() as c:
        with pytest.raises(NotReaderError):
            c.group_create(qname(), [deliver(daemon, unreadable)])
        address = deliver(daemon, readable)
        group = qname()
        c.group_create(group, [address])
        # Removed at offset 2: the group delivers what it can open, then says why it stops.
        sealing = sealed_meta.parse(readable.meta, owner.public_key)
        assert sealing is not None
        new_key = secrets.token_bytes(32)
        for key, value in sealed_meta.rotate(sealing, new_key, [], 2, secrets.token_bytes).items():
            readable.set_meta(key, value)
        seal(readable, new_key, 1, [b"new-0"])
        deliver(daemon, readable)
        leased = [c.dequeue(group), c.dequeue(group)]
        assert [lease.value for lease in leased if lease is not None] == [b"old-0", b"old-1"]
        with pytest.raises(NotReaderError, match="key epoch 1"):
            c.dequeue(group)


def test_broken_sealing_metadata_of_one_queue_does_not_break_listing_the_others(
    daemon: InProcessDaemon,
) -> None:
    owner = Identity.generate()
    queue = LatticeQueue.create(owner, qname())
    queue.set_meta("sealed.epoch", "0")  # a broken owner: no start, no wraps
    queue.offer(b"x")
    queue.commit()
    address = deliver(daemon, queue)
    with daemon.client() as c:
        listed = {q["queue"]: q for q in c.queue_list()}
        assert "no start offset" in listed[address]["sealed"]["error"]  # shown, not raised
        with pytest.raises(TamperedError, match="no start offset"):
            c.peek(address, 0)
    result = ctl(daemon, "peek", address, "0")  # signed by its owner: an integrity problem, not usage
    assert result.exit_code == ExitCode.INTEGRITY and "no start offset" in result.stderr


# ------------------------------------------------------------------ KV namespaces


def test_the_owners_sealed_kv_namespace_reads_plaintext_and_logs_only_envelopes(
    daemon: InProcessDaemon,
) -> None:
    reader = Identity.generate()
    secret = b"kv-plaintext-" + secrets.token_bytes(8)
    with daemon.client() as c:
        done = c.kv_seal([reader.public_hex])
        assert set(done["sealed"]["readers"]) == {reader.public_hex, c.identity()}
        with pytest.raises(AlreadyExistsError):
            c.kv_seal([])
        c.kv_put("k", secret)
        c.kv_hset("h", b"f", b"hv-" + secret)
        assert c.kv_incr("n", 5) == 5 and c.kv_incr("n") == 6
        assert c.kv_get("k") == secret and c.kv_hget("h", b"f") == b"hv-" + secret
        assert c.kv_list("") == {"h": {b"f": b"hv-" + secret}, "k": secret, "n": 6}
        assert c.kv_unshare(reader.public_hex)["removed"] is True
        c.kv_put("after", b"unshare")
        assert c.kv_get("after") == b"unshare" and c.kv_get("n") == 6
    engine = daemon.handle.engine
    ns = engine.kv_namespace(None)
    log = daemon.call(engine.read, ns, 0, 2**62, 10**6, 1 << 30)
    assert len(log) == 5 and all(k is None for k in log.keys)
    assert [crypto.envelope_epoch(v) for v in log.values] == [0, 0, 0, 0, 1]
    assert not any(secret in v for v in log.values)


def foreign_kv(readers: list[bytes]) -> tuple[LatticeQueue, Identity, bytes]:
    """Another identity's sealed KV namespace, written with the library: (its log, owner, epoch 0 key)."""
    owner = Identity.generate()
    log = LatticeQueue(core.empty_state(owner.public_key, "kv", KIND_KV), owner)
    content_key = secrets.token_bytes(32)
    for key, value in sealed_meta.seal_new(
        owner.public_key, readers, content_key, secrets.token_bytes
    ).items():
        log.set_meta(key, value)
    log.commit()
    return log, owner, content_key


def put_ops(log: LatticeQueue, content_key: bytes, epoch: int, items: dict[str, bytes], hlc: int) -> None:
    ops = [kv.Op("put", hlc + i, key, value) for i, (key, value) in enumerate(items.items())]
    records = [Record(op.encode(), op.key.encode(), 1) for op in ops]
    log.offer_many(
        crypto.seal_run(content_key, log.state.queue_id, epoch, records, secrets.token_bytes(24 * len(ops)))
    )
    log.commit()


def test_another_identitys_sealed_kv_namespace_on_a_reader_and_a_non_reader(daemon: InProcessDaemon) -> None:
    me = daemon.handle.engine.public_key
    hidden, _, hidden_key = foreign_kv([])
    put_ops(hidden, hidden_key, 0, {"a": b"secret a"}, 100)
    deliver(daemon, hidden)
    with daemon.client() as c, pytest.raises(NotReaderError, match="not a reader"):
        c.kv_get("a", owner=hidden.owner.hex())
    result = ctl(daemon, "kv", "get", f"{hidden.owner.hex()}/a")
    assert result.exit_code == ExitCode.NOT_READER, result.output

    log, owner, key0 = foreign_kv([me])
    put_ops(log, key0, 0, {"a": b"one", "b": b"two"}, 100)
    deliver(daemon, log)
    with daemon.client() as c:
        assert c.kv_list("", owner=log.owner.hex()) == {"a": b"one", "b": b"two"}
    # Removed: ops of the new epoch do not open here, so no value can be trusted as current.
    sealing = sealed_meta.parse(log.meta, owner.public_key)
    assert sealing is not None
    key1 = secrets.token_bytes(32)
    for k, v in sealed_meta.rotate(sealing, key1, [], log.end_offset, secrets.token_bytes).items():
        log.set_meta(k, v)
    put_ops(log, key1, 1, {"a": b"changed while away"}, 200)
    deliver(daemon, log)
    with daemon.client() as c, pytest.raises(NotReaderError, match="key epoch 1"):
        c.kv_get("a", owner=log.owner.hex())
    # Shared again (a metadata change only): the whole log is folded again, the missed op included.
    sealing = sealed_meta.parse(log.meta, owner.public_key)
    assert sealing is not None
    for k, v in sealed_meta.share(sealing, me, {1: key1}, secrets.token_bytes).items():
        log.set_meta(k, v)
    log.commit()
    deliver(daemon, log)
    with daemon.client() as c:
        assert c.kv_list("", owner=log.owner.hex()) == {"a": b"changed while away", "b": b"two"}


def test_compacting_a_sealed_kv_log_keeps_the_ops_that_decide_a_key(daemon: InProcessDaemon) -> None:
    """Compaction judges ops by their plaintext: a sealed op that did not decode would look droppable."""
    engine = daemon.handle.engine
    with daemon.client() as c:
        if engine.kv_namespace(None) is None:
            c.kv_seal([])
        for i in range(30):
            c.kv_put(f"churn{i % 3}", b"v%d" % i)
        before = c.kv_list("")
    ns = engine.kv_namespace(None)
    assert ns is not None

    async def compact() -> int:
        dropped: int = await engine.outcome(engine.start_job(CompactKv(ns, step=100_000)))
        return dropped

    assert daemon.call(compact) > 0
    log = daemon.call(engine.read, ns, 0, 2**62, 10**6, 1 << 30)
    assert len(log) == len(before)  # one deciding op per key is left, each still sealed
    assert all(crypto.envelope_epoch(v) >= 0 for v in log.values)
    with daemon.client() as c:
        assert c.kv_list("") == before
