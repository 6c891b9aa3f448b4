"""Sealed queues across real daemon processes on loopback: A owns, R relays (it holds the network key but is
not a reader), B reads; A and B never connect (static peers A-R and R-B, no mDNS). Also: a relay's tampered
ciphertext caught at B, and kill -9 of the owner mid-batch without a nonce used twice."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from daemons import LatticedProcess
from polling import wait_until
from typer.testing import CliRunner

import cli.ctl
from cli.boundary import ExitCode
from latticed.api.client.blocking_client import Client
from latticed.errors import ConnectionClosedError, NotReaderError
from latticed.privacy import crypto

Factory = Callable[..., LatticedProcess]

pytestmark = pytest.mark.timeout(240)


def client(daemon: LatticedProcess) -> Client:
    return Client(daemon.socket, timeout=20)


def listen_port(daemon: LatticedProcess) -> int:
    with client(daemon) as c:
        listen = c.status()["listen"]
    assert listen is not None
    return int(listen.rsplit(":", 1)[1])


def start_peer(factory: Factory, *peers: LatticedProcess) -> LatticedProcess:
    args = ["--listen", "127.0.0.1:0", "--no-mdns"]
    for peer in peers:
        args += ["--peer", f"127.0.0.1:{listen_port(peer)}"]
    return factory(args=args)


def held_end(daemon: LatticedProcess, queue: str) -> int:
    with client(daemon) as c:
        try:
            return int(c.queue_info(queue)["end_offset"])
        except Exception:
            return -1


def identity(daemon: LatticedProcess) -> str:
    with client(daemon) as c:
        return c.identity()


def connected(daemon: LatticedProcess) -> set[str]:
    with client(daemon) as c:
        return {p["public_key"] for p in c.peers() if p.get("connected")}


def store_files(daemon: LatticedProcess) -> bytes:
    """Every file of the daemon's data directory (the SQLite file, its WAL and shm), as stored."""
    return b"".join(p.read_bytes() for p in sorted(Path(daemon.data_dir).rglob("*")) if p.is_file())


def stored_values(daemon: LatticedProcess, address: str) -> list[bytes]:
    """A stopped daemon's stored record values of one queue, straight from its SQLite file."""
    owner, name = address.split("/")
    with sqlite3.connect(Path(daemon.data_dir) / "latticed.db") as conn:
        (q,) = conn.execute(
            "SELECT q FROM queues WHERE owner = ? AND name = ?", (bytes.fromhex(owner), name)
        ).fetchone()
        values: list[bytes] = []
        for (data,) in conn.execute("SELECT data FROM segments WHERE q = ? ORDER BY first", (q,)):
            values += msgpack.unpackb(data, raw=False)[1]
    return values


def ctl(daemon: LatticedProcess, *args: str) -> Any:
    return CliRunner().invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def test_a_reader_reads_through_a_relay_that_cannot(latticed_process: Factory) -> None:
    relay = start_peer(latticed_process)
    owner = start_peer(latticed_process, relay)
    reader = start_peer(latticed_process, relay)
    b_id, r_id, a_id = identity(reader), identity(relay), identity(owner)
    secrets = [b"diary entry %d: the plaintext" % i for i in range(20)]
    kv_secret = b"kv value nobody else reads"
    with client(owner) as c:
        c.kv_seal([b_id])
        c.kv_put("password", kv_secret)
        c.kv_hset("profile", b"email", b"a@example.org")
        queue = c.queue_create("diary", readers=[b_id])
        c.offer("diary", b"with a key and a header", key=b"private-key-123", headers={"x-secret": b"hdr-456"})
        c.offer_batch("diary", [(s, None, ()) for s in secrets])
    wait_until(lambda: held_end(reader, queue) == 21, "the sealed records at B, through R")
    wait_until(lambda: held_end(relay, queue) == 21, "the sealed records at R")

    wait_until(lambda: _kv(reader, "password", a_id) == kv_secret, "A's sealed KV value at B")
    with client(reader) as c:
        assert c.kv_hget("profile", b"email", owner=a_id) == b"a@example.org"
    with client(relay) as c, pytest.raises(NotReaderError):
        c.kv_get("password", owner=a_id)
    with client(reader) as c:
        first = c.peek_entry(queue, 0)
        assert (
            first is not None
            and first.key == b"private-key-123"
            and first.headers == (("x-secret", b"hdr-456"),)
        )
        assert [e.value for e in c.range(queue, 1, 20)] == secrets
        assert c.queue_info(queue)["sealed"]["readable"]
    with client(relay) as c:
        with pytest.raises(NotReaderError, match=f"identity {r_id} is not a reader"):
            c.peek(queue, 1)
        info = c.queue_info(queue)  # what a relay sees: offsets, sizes, timestamps, who reads
        assert info["end_offset"] == 21 and not info["sealed"]["readable"]
        assert set(info["sealed"]["readers"]) == {a_id, b_id}
    result = ctl(relay, "range", queue, "0", "5")
    assert result.exit_code == ExitCode.NOT_READER, result.output
    assert result.stdout == "" and "not a reader" in result.stderr
    # A and B only ever met R.
    assert b_id not in connected(owner) and a_id not in connected(reader)
    on_relay = store_files(relay)
    assert on_relay
    for plain in (
        *secrets,
        b"private-key-123",
        b"hdr-456",
        b"the plaintext",
        b"with a key",
        kv_secret,
        b"a@example",
        b"password",  # a KV key: inside the sealed op too
    ):
        assert plain not in on_relay

    # B removed: a new key epoch from offset 21; B keeps the old records, not the new ones.
    with client(owner) as c:
        assert c.queue_unshare("diary", b_id) == {"removed": True, "epoch": 1, "start": 21}
        c.offer_batch("diary", [(b"after B left %d" % i, None, ()) for i in range(3)])
    wait_until(lambda: held_end(reader, queue) == 24, "the records after the unshare at B")
    with client(reader) as c:
        assert [e.value for e in c.range(queue, 1, 20)] == secrets
        with pytest.raises(NotReaderError, match="key epoch 1"):
            c.range(queue, 21, 23)
        batch = c.read(queue, 15)
        assert batch.values == secrets[14:] and batch.next_offset == 21
    # Shared again: the current epoch opens at B.
    with client(owner) as c:
        assert c.queue_share("diary", b_id) == [1]
    wait_until(lambda: _reads(reader, queue, 23), "the re-shared epoch at B")
    with client(reader) as c:
        assert [e.value for e in c.range(queue, 21, 23)] == [b"after B left %d" % i for i in range(3)]


def _kv(daemon: LatticedProcess, key: str, owner: str) -> Any:
    with client(daemon) as c:
        try:
            return c.kv_get(key, owner=owner)
        except NotReaderError:
            return None


def _reads(daemon: LatticedProcess, queue: str, offset: int) -> bool:
    with client(daemon) as c:
        try:
            return c.peek(queue, offset) is not None
        except NotReaderError:
            return False


def test_a_ciphertext_tampered_on_the_relay_is_refused_at_the_reader(latticed_process: Factory) -> None:
    relay = start_peer(latticed_process)
    owner = start_peer(latticed_process, relay)
    reader = start_peer(latticed_process, relay)
    with client(owner) as c:
        queue = c.queue_create("ledger", readers=[identity(reader)])
        c.offer_batch("ledger", [(b"first %d" % i, None, ()) for i in range(5)])
    wait_until(lambda: held_end(reader, queue) == 5, "the first records at B")
    reader.stop()
    with client(owner) as c:
        c.offer_batch("ledger", [(b"second %d" % i, None, ()) for i in range(5)])
    wait_until(lambda: held_end(relay, queue) == 10, "the second records at R")
    port = listen_port(relay)
    relay.stop()
    relay.args = ["--listen", f"127.0.0.1:{port}", "--no-mdns"]  # where A and B dial it
    # Flip one ciphertext byte of offset 7 in R's store (its chain values and heads stay as signed).
    owner_hex, name = queue.split("/")
    with sqlite3.connect(Path(relay.data_dir) / "latticed.db") as conn:
        (q,) = conn.execute(
            "SELECT q FROM queues WHERE owner = ? AND name = ?", (bytes.fromhex(owner_hex), name)
        ).fetchone()
        first, data = conn.execute(
            "SELECT first, data FROM segments WHERE q = ? AND first <= 7 ORDER BY first DESC LIMIT 1", (q,)
        ).fetchone()
        columns = msgpack.unpackb(data, raw=False)
        envelope = bytearray(columns[1][7 - first])
        envelope[crypto.HEADER_SIZE] ^= 0x01
        columns[1][7 - first] = bytes(envelope)
        conn.execute(
            "UPDATE segments SET data = ? WHERE q = ? AND first = ?",
            (msgpack.packb(columns, use_bin_type=True), q, first),
        )
    relay.start()
    reader.start()
    wait_until(lambda: _rejected(reader) >= 1, "B refusing R's tampered delta", timeout=30)
    assert held_end(reader, queue) == 5  # nothing of the tampered delta was stored
    with client(reader) as c:
        assert [e.value for e in c.range(queue, 0, 4)] == [b"first %d" % i for i in range(5)]
    # B's log says why: the ciphertext no longer matches the owner's signed hash chain.
    assert "integrity: records do not hash to the signed head" in reader.log.read_text(errors="replace")


def _rejected(daemon: LatticedProcess) -> int:
    with client(daemon) as c:
        counters = c.status()["replication"] or {}
    return int(counters.get("rejected_deltas", 0))


def test_kill9_of_the_owner_mid_batch_never_reuses_a_nonce(latticed_process: Factory) -> None:
    owner = latticed_process(args=["--no-mdns"])
    with client(owner) as c:
        queue = c.queue_create("crash", readers=[])
    same = [(b"the same plaintext, every time", None, ())] * 200
    stop = threading.Event()

    def write() -> None:
        try:
            with client(owner) as c:
                while not stop.is_set():
                    c.offer_batch("crash", same)
        except ConnectionClosedError:
            pass  # killed under us: expected

    writer = threading.Thread(target=write)
    writer.start()
    wait_until(lambda: held_end(owner, queue) >= 2000, "records before the kill")
    owner.kill9()  # mid-batch: the writer is still sending
    stop.set()
    writer.join(30)
    owner.start()
    before = held_end(owner, queue)  # what was durable when it died
    with client(owner) as c:
        for _ in range(10):
            c.offer_batch("crash", same)
        end = int(c.queue_info(queue)["end_offset"])
        assert end == before + 2000
        assert {e.value for e in c.range(queue, 0, end - 1)} == {same[0][0]}
    owner.stop()
    values = stored_values(owner, queue)
    assert len(values) == end
    nonces = [crypto.envelope_nonce(v) for v in values]
    assert len(set(nonces)) == len(nonces)
