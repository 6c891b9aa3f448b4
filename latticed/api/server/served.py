"""Whether another daemon serves the API socket: a plain-socket probe, no trio, so ``latticed run`` can
refuse at once, before it imports the daemon or creates anything."""

from __future__ import annotations

import errno
import socket
import stat
from pathlib import Path
from typing import Final

from latticed.errors import AlreadyExistsError, StorageError

_PROBE_TIMEOUT_S: Final = 1.0


def refuse_if_served(path: Path) -> bool:
    """Raise AlreadyExistsError if a daemon answers on ``path``; returns whether a socket file is there.

    Changes nothing, so start-up runs it before it creates the data directory or the identity."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StorageError(f"cannot inspect socket path {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISSOCK(info.st_mode):
        raise StorageError(
            f"{path} exists and is not a socket; refusing to replace it (remove it if it is junk)"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(_PROBE_TIMEOUT_S)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        pass
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise StorageError(f"cannot check whether a daemon serves {path}: {exc.strerror or exc}") from exc
    else:
        raise AlreadyExistsError(f"another latticed is already serving {path}; stop it first")
    finally:
        probe.close()
    return True


__all__ = ["refuse_if_served"]
