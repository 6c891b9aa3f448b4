"""Who is on the other end of an API connection: the identity work-queue consumers are known by.

The server sets :data:`CONSUMER` in each connection's task (a context variable, so handlers read it
without a new parameter): ``pid<PID>.c<N>`` with the client's process id from ``SO_PEERCRED`` where the
kernel tells it, so lease histories and dead letters name a process an operator can find.
"""

from __future__ import annotations

import contextvars
import itertools
import socket
import struct
from typing import Any

CONSUMER: contextvars.ContextVar[str] = contextvars.ContextVar("latticed_consumer", default="local")
_counter = itertools.count(1)
_UCRED = struct.Struct("3i")  # pid, uid, gid


def _peer_pid(stream: Any) -> int | None:
    sock = getattr(stream, "socket", None)
    option = getattr(socket, "SO_PEERCRED", None)
    if sock is None or option is None:
        return None
    try:
        pid, _, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size))
    except (OSError, struct.error):
        return None
    return pid if pid > 0 else None


def new_consumer_id(stream: Any) -> str:
    """A consumer id for a new connection, unique within this daemon process."""
    n = next(_counter)
    pid = _peer_pid(stream)
    return f"pid{pid}.c{n}" if pid is not None else f"c{n}"


def consumer_id() -> str:
    return CONSUMER.get()


__all__ = ["CONSUMER", "consumer_id", "new_consumer_id"]
