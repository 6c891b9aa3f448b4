"""The API's Unix socket: created 0600, a stale file from a crashed daemon replaced, a live daemon respected.

A socket file outlives the process that bound it. At start-up we connect to an existing one: if someone
answers, another daemon is serving it and we refuse to start; if the connection is refused, the file is
stale and is removed. Anything that is not a socket is never deleted.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Final

import trio

from latticed.api.server.served import refuse_if_served
from latticed.errors import StorageError
from latticed.process.logs import get_logger, log_event

log = get_logger(__name__)

BACKLOG: Final = 128


def clear_stale_socket(path: Path) -> None:
    """Remove ``path`` if it is a socket nobody listens on; refuse if a daemon answers on it."""
    if not refuse_if_served(path):
        return
    log_event(log, "api.stale_socket_removed", path=str(path))
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def bind_unix_socket(path: Path) -> tuple[trio.socket.SocketType, int]:
    """A listening socket at ``path`` with mode 0600; returns it and the file's inode (to remove only
    our own file at shutdown)."""
    clear_stale_socket(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # The umask makes the file private from its creation; chmod then states the intent explicitly.
        old_umask = os.umask(0o177)
        try:
            await sock.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        sock.listen(BACKLOG)
        inode = path.stat().st_ino
    except OSError as exc:
        sock.close()
        raise StorageError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    return sock, inode


def remove_socket(path: Path, inode: int) -> None:
    """Unlink the socket file if it is still the one we created."""
    try:
        if path.lstat().st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log_event(log, "api.socket_remove_failed", path=str(path), error=str(exc))


__all__ = ["bind_unix_socket", "clear_stale_socket", "refuse_if_served", "remove_socket"]
