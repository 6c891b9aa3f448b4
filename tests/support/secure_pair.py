"""Both ends of an authenticated, encrypted peer stream over loopback TCP, for transport and relay tests."""

from __future__ import annotations

import trio

from latticed.net.transport import SecureStream, open_peer, secure_accept

#: The network key and the two ends' identity seeds the pair is made with.
K = bytes(range(32))
SEED_A, SEED_B = b"\x11" * 32, b"\x22" * 32


async def tcp_pair() -> tuple[SecureStream, SecureStream, trio.SocketListener]:
    """Both ends of a secure stream over loopback TCP (and the listener, to close)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    out: dict[str, SecureStream] = {}

    async def accept() -> None:
        out["server"] = await secure_accept(await listeners[0].accept(), seed=SEED_B, network_key=K)

    async def dial() -> None:
        out["client"] = await open_peer("127.0.0.1", port, seed=SEED_A, network_key=K)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        nursery.start_soon(dial)
    return out["client"], out["server"], listeners[0]


__all__ = ["K", "SEED_A", "SEED_B", "tcp_pair"]
