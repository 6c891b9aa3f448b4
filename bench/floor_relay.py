"""The floor under a live relay: the least a trio process of latticed's shape spends per relayed record.

A chain of bare processes (writer -> relay -> relay -> leaf over TCP on 127.0.0.1), each doing only what
any relay that keeps latticed's guarantees must do for one record: read the frame, (optionally) verify its
Ed25519 signature, pass it on downstream, make it durable (write + ``fdatasync`` on a worker thread, records
that arrive together sharing one flush) and acknowledge it upstream once durable. No decoding, no hash
chain, no encryption, no SQLite, no API. ``bench_replication.py --parts live`` runs this beside the real
daemons in the same minutes, so a relay's CPU per record reads as a ratio to what the host charges for the
wake-ups and syscalls alone.

    .venv/bin/python bench/floor_relay.py --samples 1000 --interval 0.005

Run as ``floor_relay.py node --upstream PORT [--durable DIR] [--verify-key HEX]``, a process prints its
port and serves; the writer is this process (``chain()``, ``measure()``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import trio
from _daemons import CpuSplit
from nacl.signing import SigningKey, VerifyKey

HEADER = struct.Struct(">I")
OFFSET = struct.Struct(">Q")
VALUE = b"v" * 100
LINGER_S = 0.02
LINGER_RECORDS = 4


class _Reader:
    """Length-prefixed frames off a stream, one ``receive_some`` per burst."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def frames(self) -> list[bytes]:
        while True:
            out: list[bytes] = []
            while len(self.buffer) >= 4:
                (size,) = HEADER.unpack_from(self.buffer)
                if len(self.buffer) < 4 + size:
                    break
                out.append(bytes(self.buffer[4 : 4 + size]))
                del self.buffer[: 4 + size]
            if out:
                return out
            data = await self.stream.receive_some(65536)
            if not data:
                return []
            self.buffer += data


def _frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def _open_log(durable: str | None) -> int:
    if durable is None:
        return -1
    return os.open(os.path.join(durable, f"log-{os.getpid()}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)


async def _node(upstream: int, durable: str | None, verify_key: bytes | None) -> None:
    verifier = VerifyKey(verify_key) if verify_key else None
    fd = _open_log(durable)
    downstream: list[trio.SocketStream] = []

    async def accept(stream: trio.SocketStream) -> None:
        downstream.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, accept, 0, host="127.0.0.1"))
        print(listeners[0].socket.getsockname()[1], flush=True)
        up = await trio.open_tcp_stream("127.0.0.1", upstream)
        reader = _Reader(up)
        pending_send, pending_receive = trio.open_memory_channel[list[bytes]](1024)

        def flush(blob: bytes) -> None:
            os.write(fd, blob)
            os.fdatasync(fd)

        async def store() -> None:
            async for batch in pending_receive:
                frames = list(batch)
                # As latticed's relay does (storage/writer.py MERGE_LINGER_*): records already passed on
                # wait up to 20 ms for 3 more, to share one flush; only the upstream ACK waits for it.
                with trio.move_on_after(LINGER_S):
                    while len(frames) < LINGER_RECORDS:
                        frames += await pending_receive.receive()
                if fd >= 0:
                    await trio.to_thread.run_sync(flush, b"".join(frames))
                await up.send_all(b"".join(_frame(f[64:72]) for f in frames))

        nursery.start_soon(store)
        while frames := await reader.frames():
            if verifier is not None:
                for f in frames:
                    verifier.verify(f[64:], f[:64])
            for stream in downstream:
                await stream.send_all(b"".join(_frame(f) for f in frames))
            pending_send.send_nowait(frames)
        nursery.cancel_scope.cancel()


def node_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", type=int, required=True)
    parser.add_argument("--durable")
    parser.add_argument("--verify-key")
    args = parser.parse_args(argv)
    key = bytes.fromhex(args.verify_key) if args.verify_key else None
    # The parent ends the chain by killing it, upstream first: a reset then is the end, not a fault.
    with contextlib.suppress(trio.BrokenResourceError, BaseExceptionGroup):
        trio.run(_node, args.upstream, args.durable, key)


@contextlib.contextmanager
def chain(
    hops: int, durable: bool, verify: bool
) -> Iterator[tuple[socket.socket, list[subprocess.Popen[str]], SigningKey]]:
    """Start relays and a leaf behind a listening socket of the writer (this process); yields (that
    socket, processes [relays..., leaf], signing key). The first relay dials the writer."""
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory(prefix="ld-floor-", dir=os.environ.get("LATTICED_BENCH_DIR")) as root:
        procs: list[subprocess.Popen[str]] = []
        listener = socket.create_server(("127.0.0.1", 0))
        try:
            # The writer listens; each next process dials the previous one.
            upstream = int(listener.getsockname()[1])
            for _ in range(hops):
                argv = [sys.executable, __file__, "node", "--upstream", str(upstream)]
                if durable:
                    argv += ["--durable", root]
                if verify:
                    argv += ["--verify-key", key.verify_key.encode().hex()]
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
                procs.append(proc)
                assert proc.stdout is not None
                upstream = int(proc.stdout.readline())
            yield listener, procs, key
        finally:
            listener.close()
            for proc in procs:
                proc.kill()
                proc.wait()


WARM_UP = 50


def _send(conn: socket.socket, key: SigningKey, first: int, count: int, interval: float) -> None:
    """Sign and send records ``first`` .. ``first + count - 1``, one every ``interval`` s, then wait for
    the first relay's ACKs of all of them."""
    for offset in range(first, first + count):
        conn.sendall(_frame(key.sign(OFFSET.pack(offset) + VALUE)))
        time.sleep(interval)
    want, got = count * (4 + OFFSET.size), 0
    while got < want:
        data = conn.recv(want - got)
        if not data:
            raise RuntimeError("the first relay closed before acknowledging every record")
        got += len(data)


def measure(
    samples: int, interval: float, hops: int, durable: bool, verify: bool
) -> list[tuple[float, float]]:
    """(CPU µs, wake-ups) per record of each relay and the leaf, in chain order, after a warm-up (the
    daemons it is compared with have been running too: first calls, imports and caches are not counted)."""
    with chain(hops, durable, verify) as (listener, procs, key):
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(60)
            _send(conn, key, 1, WARM_UP, interval)
            splits = [CpuSplit(p.pid) for p in procs]
            _send(conn, key, WARM_UP + 1, samples, interval)
            # The first relay has acknowledged every record; the processes behind it may still be
            # flushing their last few (one linger's worth, within the noise of a thousand records).
            spent = [s.since() for s in splits]
    return [((loop + rest) / samples * 1e6, woke / samples) for loop, rest, woke in spent]


VARIANTS = (
    ("sockets only", False, False),
    ("+ Ed25519 verify", False, True),
    ("+ fdatasync", True, False),
    ("+ verify + fdatasync", True, True),
)


def report(samples: int, interval: float, hops: int = 3) -> dict[str, list[tuple[float, float]]]:
    figures: dict[str, list[tuple[float, float]]] = {}
    for label, durable, verify in VARIANTS:
        per = measure(samples, interval, hops, durable, verify)
        figures[label] = per
        shown = ", ".join(f"{us:,.0f}" for us, _ in per)
        woke = ", ".join(f"{w:.1f}" for _, w in per)
        print(
            f"floor, bare trio relays ({label}): CPU/record {shown} us, wake-ups/record {woke} "
            f"({hops} processes after the writer)"
        )
    return figures


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        node_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=0.005)
    parser.add_argument("--hops", type=int, default=3)
    args = parser.parse_args()
    report(args.samples, args.interval, args.hops)


if __name__ == "__main__":
    main()
