"""The floor under single durable offers: a bare trio server that group-commits with ``fdatasync``.

``bench_daemon.py --parts 2`` measures 16 client processes each waiting for the ack of its single-record
offer, against the same clients sending a no-op request. This measures the same two rows against a server
that does nothing else: it reads a 100-byte request off a Unix socket and either answers at once (no-op)
or, for an offer, appends it to a file on a worker thread with every request that arrived meanwhile, one
``fdatasync`` for the lot (group commit), and answers each once that returns. No decoding, signing,
hashing or SQLite; raw fixed-size frames on both ends, so its clients are cheaper than ``Client`` too. So
its "durable ÷ no-op" rate is the most any server of latticed's shape can reach on this host, and its CPU
per offer the least it can spend.

``--library`` adds a row beside the floor (the floor itself unchanged): the same server and group commit,
but speaking latticed's frames to clients that are latticed's own ``Client`` (``offer``), so that the
clients' share of the gap between latticed and the floor is measured apart from the daemon's.

    .venv/bin/python bench/floor_offers.py --clients 16 --seconds 5 [--library]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import trio
from _daemons import cpu_s

from latticed.api.client.blocking_client import Client

REQUEST = b"o" * 100
REPLY = b"k" * 8


def _serve(path: str, durable: bool, log_dir: str, library: bool = False) -> None:
    fd = os.open(os.path.join(log_dir, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    waiting: list[tuple[trio.SocketStream, bytes, bytes]] = []  # (stream, logged, reply)
    wake = trio.Event()

    def flush(blob: bytes) -> None:
        os.write(fd, blob)
        os.fdatasync(fd)

    async def committer() -> None:
        nonlocal wake
        while True:
            await wake.wait()
            wake = trio.Event()
            batch = waiting[:]
            del waiting[:]
            await trio.to_thread.run_sync(flush, b"".join(request for _, request, _ in batch))
            for stream, _, reply in batch:
                await stream.send_all(reply)

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        with contextlib.suppress(trio.BrokenResourceError):
            while data := await stream.receive_some(4096):
                buffer += data
                while len(buffer) >= len(REQUEST):
                    request, buffer = buffer[: len(REQUEST)], buffer[len(REQUEST) :]
                    if durable:
                        waiting.append((stream, request, REPLY))
                        wake.set()
                    else:
                        await stream.send_all(REPLY)

    async def framed(stream: trio.SocketStream) -> None:
        """``handle`` for latticed's frames: each request a 4-byte length and a body, not decoded (a
        ``Client`` numbers its requests 1, 2, ... on a connection); each reply an offer's, framed."""
        buffer, rid = b"", 0
        with contextlib.suppress(trio.BrokenResourceError):
            while data := await stream.receive_some(4096):
                buffer += data
                while len(buffer) >= 4 and len(buffer) >= 4 + (size := int.from_bytes(buffer[:4], "big")):
                    request, buffer, rid = buffer[4 : 4 + size], buffer[4 + size :], rid + 1
                    body = msgpack.packb({"id": rid, "ok": True, "offset": rid})
                    reply = len(body).to_bytes(4, "big") + body
                    if durable:
                        waiting.append((stream, request, reply))
                        wake.set()
                    else:
                        await stream.send_all(reply)

    async def main() -> None:
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(path)
        listener.listen(64)
        async with trio.open_nursery() as nursery:
            if durable:
                nursery.start_soon(committer)
            await trio.serve_listeners(framed if library else handle, [trio.SocketListener(listener)])

    trio.run(main)


def _client(path: str, start: float, stop: float, out: mp.Queue[Any]) -> None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    done = 0
    while time.time() < start:
        time.sleep(0.001)
    cpu0 = time.process_time()
    while time.time() < stop:
        conn.sendall(REQUEST)
        got = 0
        while got < len(REPLY):
            got += len(conn.recv(64))
        done += 1
    cpu = time.process_time() - cpu0
    conn.close()
    out.put((done, cpu))


def _library_client(path: str, start: float, stop: float, out: mp.Queue[Any]) -> None:
    """``_client`` with latticed's ``Client`` (its framing, packing and reply checks)."""
    done = 0
    with Client(path) as client:
        while time.time() < start:
            time.sleep(0.001)
        cpu0 = time.process_time()
        while time.time() < stop:
            client.offer("single", REQUEST)
            done += 1
        cpu = time.process_time() - cpu0
    out.put((done, cpu))


def measure(clients: int, seconds: float, durable: bool, library: bool = False) -> tuple[float, float, float]:
    """(requests/s, server CPU µs per request, the clients' CPU µs per request: bench_daemon's rows
    print theirs, and on a box of two cores what the clients spend is taken from the server)."""
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ld-floor-", dir=os.environ.get("LATTICED_BENCH_DIR")) as root:
        path = str(Path(root) / "s.sock")
        server = context.Process(target=_serve, args=(path, durable, root, library), daemon=True)
        server.start()
        while not os.path.exists(path):
            time.sleep(0.01)
        results: mp.Queue[Any] = context.Queue()
        start = time.time() + 1.5
        procs = [
            context.Process(
                target=_library_client if library else _client, args=(path, start, start + seconds, results)
            )
            for _ in range(clients)
        ]
        for proc in procs:
            proc.start()
        while time.time() < start:
            time.sleep(0.001)
        assert server.pid is not None
        cpu0 = cpu_s(server.pid)
        reports = [results.get(timeout=seconds + 60) for _ in procs]  # a client that failed: raises
        cpu = cpu_s(server.pid) - cpu0
        done = sum(count for count, _ in reports)
        client_cpu = sum(used for _, used in reports)
        for proc in procs:
            proc.join()
        server.kill()
        server.join()
    return done / seconds, cpu / max(done, 1) * 1e6, client_cpu / max(done, 1) * 1e6


def report(clients: int, seconds: float) -> tuple[float, float]:
    """Prints both rows and returns (no-op rate, durable rate)."""
    noop, noop_cpu, noop_clients = measure(clients, seconds, durable=False)
    durable, durable_cpu, durable_clients = measure(clients, seconds, durable=True)
    print(f"floor, a bare trio server, {clients} clients each waiting for its reply:")
    print(
        f"    no-op: {noop:,.0f} req/s, server CPU {noop_cpu:.0f} us/req, clients' CPU "
        f"{noop_clients:.0f} us/req"
    )
    print(
        f"    durable (group commit, one fdatasync per batch): {durable:,.0f} offers/s, server CPU "
        f"{durable_cpu:.0f} us/offer, clients' CPU {durable_clients:.0f} us/offer; durable / no-op "
        f"{durable / noop:.2f}"
    )
    return noop, durable


def report_library(clients: int, seconds: float) -> float:
    """Prints the durable row with latticed's ``Client`` as the clients; returns its rate."""
    rate, cpu, client_cpu = measure(clients, seconds, durable=True, library=True)
    print(
        f"    durable, latticed's Client as the clients: {rate:,.0f} offers/s, server CPU {cpu:.0f} "
        f"us/offer, clients' CPU {client_cpu:.0f} us/offer"
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--library", action="store_true", help="also the row with latticed's Client")
    args = parser.parse_args()
    report(args.clients, args.seconds)
    if args.library:
        report_library(args.clients, args.seconds)


if __name__ == "__main__":
    main()
