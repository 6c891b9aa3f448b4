"""Handshakes per second and secure-channel throughput; prints figures, asserts nothing.

    .venv/bin/python bench/bench_handshake.py [--quick]

* handshake, memory: both sides of the sans-IO handshake in one thread (one core does both halves' crypto);
* handshake, loopback TCP: sequential connect + handshake + close with trio (server in the same process);
* seal+open: one message sealed by one channel and opened by its peer, 1 KiB and 64 KiB, next to bare
  PyNaCl secretstream push+pull as the ceiling;
* TCP stream: 64 KiB messages one way over loopback with trio, sender and receiver in one process.
"""

from __future__ import annotations

import functools
import sys
import time

import nacl.bindings as sodium
import trio

from latticed.net.transport import open_peer, secure_accept
from latticed.protocol.handshake import Initiator, Responder
from latticed.protocol.secure import SecureChannel

K = bytes(range(32))
SEED_A, SEED_B = b"\x11" * 32, b"\x22" * 32
NOW = 1_700_000_000_000  # the sans-IO handshakes' clock (Unix ms)
QUICK = "--quick" in sys.argv


def handshake_memory(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        initiator = Initiator(seed=SEED_A, network_key=K, now_ms=NOW)
        responder = Responder(seed=SEED_B, network_key=K, now_ms=NOW)
        initiator.receive_data(
            responder.receive_data(initiator.receive_data(responder.receive_data(initiator.initiate())))
        )
        assert initiator.done
    return n / (time.perf_counter() - start)


async def handshake_tcp(n: int) -> float:
    async def handler(stream: trio.SocketStream) -> None:
        secure = await secure_accept(stream, seed=SEED_B, network_key=K)
        await secure.receive()
        await secure.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        start = time.perf_counter()
        for _ in range(n):
            peer = await open_peer("127.0.0.1", port, seed=SEED_A, network_key=K)
            await peer.aclose()
        rate = n / (time.perf_counter() - start)
        nursery.cancel_scope.cancel()
    return rate


def channel_pair() -> tuple[SecureChannel, SecureChannel]:
    initiator = Initiator(seed=SEED_A, network_key=K, now_ms=NOW)
    responder = Responder(seed=SEED_B, network_key=K, now_ms=NOW)
    initiator.receive_data(
        responder.receive_data(initiator.receive_data(responder.receive_data(initiator.initiate())))
    )
    return SecureChannel(initiator.result), SecureChannel(responder.result)


def seal_open(size: int, total: int) -> tuple[float, float]:
    """(MB/s, messages/s) for seal on one side + receive_data/next_message on the other."""
    sender, receiver = channel_pair()
    message = bytes(size)
    n = max(1, total // size)
    start = time.perf_counter()
    for _ in range(n):
        receiver.receive_data(sender.seal(message))
        assert receiver.next_message() is not None
    elapsed = time.perf_counter() - start
    return n * size / elapsed / 1e6, n / elapsed


def raw_secretstream(size: int, total: int) -> float:
    """MB/s of bare PyNaCl push + pull: the ceiling seal+open is measured against."""
    key = sodium.crypto_secretstream_xchacha20poly1305_keygen()
    tx = sodium.crypto_secretstream_xchacha20poly1305_state()
    header = sodium.crypto_secretstream_xchacha20poly1305_init_push(tx, key)
    rx = sodium.crypto_secretstream_xchacha20poly1305_state()
    sodium.crypto_secretstream_xchacha20poly1305_init_pull(rx, header, key)
    push, pull = (
        sodium.crypto_secretstream_xchacha20poly1305_push,
        sodium.crypto_secretstream_xchacha20poly1305_pull,
    )
    message = bytes(size)
    n = max(1, total // size)
    start = time.perf_counter()
    for _ in range(n):
        pull(rx, push(tx, message))
    return n * size / (time.perf_counter() - start) / 1e6


async def tcp_stream(size: int, total: int) -> float:
    n = max(1, total // size)
    done = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        secure = await secure_accept(stream, seed=SEED_B, network_key=K)
        while await secure.receive() is not None:
            pass
        await secure.aclose()
        done.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        peer = await open_peer("127.0.0.1", port, seed=SEED_A, network_key=K)
        message = bytes(size)
        start = time.perf_counter()
        for _ in range(n):
            await peer.send(message)
        await peer.send_eof()
        await done.wait()
        elapsed = time.perf_counter() - start
        await peer.aclose()
        nursery.cancel_scope.cancel()
    return n * size / elapsed / 1e6


def best(runs: int, fn: functools.partial[float]) -> float:
    return max(fn() for _ in range(runs))


def main() -> None:
    runs = 1 if QUICK else 3
    scale = 10 if QUICK else 1
    print(f"python {sys.version.split()[0]}, best of {runs}")
    rate = best(runs, functools.partial(handshake_memory, 2000 // scale))
    print(f"handshake, memory (both sides, one thread): {rate:8.0f} handshakes/s  ({1e6 / rate:.0f} us each)")
    rate = max(trio.run(handshake_tcp, 500 // scale) for _ in range(runs))
    print(
        f"handshake, loopback TCP + trio (sequential): {rate:7.0f} handshakes/s  ({1e6 / rate:.0f} us each)"
    )
    for size, total in ((1024, 64 << 20), (64 << 10, 512 << 20)):
        results = [seal_open(size, total // scale) for _ in range(runs)]
        mbps, per_s = max(results)
        raw = max(raw_secretstream(size, total // scale) for _ in range(runs))
        print(
            f"seal+open {size // 1024:>2} KiB: {mbps:8.0f} MB/s  ({per_s:9.0f} messages/s; "
            f"bare secretstream push+pull {raw:.0f} MB/s, ratio {mbps / raw:.2f})"
        )
    mbps = max(trio.run(tcp_stream, 64 << 10, (256 << 20) // scale) for _ in range(runs))
    print(f"loopback TCP one way, 64 KiB messages: {mbps:6.0f} MB/s")


if __name__ == "__main__":
    main()
