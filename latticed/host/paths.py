"""Creating and checking the daemon's directories, with errors that say what to fix.

Start-up calls :func:`ensure_data_dir` and :func:`ensure_socket_dir` before opening anything, so a
read-only or foreign-owned directory fails once, early, with a StorageError instead of deep in storage.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
from pathlib import Path

from latticed.errors import StorageError

log = logging.getLogger(__name__)

IDENTITY_KEY_NAME = "identity.key"
#: Where a daemon with no ``network_key_file`` keeps the key ``latticectl join`` gave it (also where
#: ``latticed init`` puts its key file).
NETWORK_KEY_NAME = "network.key"
#: ``sockaddr_un.sun_path`` is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


def identity_key_path(data_dir: Path) -> Path:
    """The node's private key; lives with the data so a restore brings the identity along."""
    return data_dir / IDENTITY_KEY_NAME


def data_dir_network_key_path(data_dir: Path) -> Path:
    """The network key kept in the data directory (by ``join`` on a daemon with no key file)."""
    return data_dir / NETWORK_KEY_NAME


def _explain(exc: OSError, what: str, path: Path) -> StorageError:
    if exc.errno == errno.EROFS:
        why = "the file system is read-only (under systemd, is it in StateDirectory= or ReadWritePaths=?)"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why = f"permission denied for uid {os.getuid()} (check the owner and mode of it and its parents)"
    elif exc.errno in (errno.ENOTDIR, errno.EEXIST):
        why = "a path component exists and is not a directory"
    elif exc.errno == errno.ENOSPC:
        why = "no space left on device"
    else:
        why = exc.strerror or str(exc)
    return StorageError(f"cannot {what} {path}: {why}")


def _make_private_dir(path: Path, what: str) -> Path:
    """Create ``path`` (and parents) if needed; a directory we create gets mode 0700."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=False)
    except FileExistsError:
        if not path.is_dir():
            raise StorageError(f"cannot use {path} as the {what}: it exists and is not a directory") from None
    except OSError as exc:
        raise _explain(exc, f"create the {what}", path) from exc
    else:
        # mkdir's mode is masked by the umask; make sure the result is exactly 0700.
        try:
            path.chmod(0o700)
        except OSError as exc:
            raise _explain(exc, f"set the mode of the {what}", path) from exc
    return path


def _probe_writable(path: Path, what: str) -> None:
    """Really create a file: access() misses read-only bind mounts and ACLs."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".latticed-probe-", dir=path)
    except OSError as exc:
        raise _explain(exc, f"write to the {what}", path) from exc
    os.close(fd)
    os.unlink(probe)


def ensure_data_dir(data_dir: Path) -> Path:
    """Create the data directory (0700) if missing and check we can write to it.

    An existing directory is used as it is; group or world access is logged as a warning (the identity
    key inside is a secret) but not changed, since the admin may have chosen it.
    """
    _make_private_dir(data_dir, "data directory")
    try:
        mode = data_dir.stat().st_mode
    except OSError as exc:
        raise _explain(exc, "inspect the data directory", data_dir) from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "data directory %s has mode %04o; 0700 keeps the identity key private",
            data_dir,
            stat.S_IMODE(mode),
            extra={"path": str(data_dir)},
        )
    _probe_writable(data_dir, "data directory")
    return data_dir


def ensure_socket_dir(socket_path: Path) -> Path:
    """Create the socket's parent directory (0700 when we create it) and check the path fits in sun_path.

    An existing parent (e.g. systemd's ``RuntimeDirectory=`` with mode 0750, so group members can reach
    the socket) keeps its mode. Returns the parent.
    """
    size = len(os.fsencode(socket_path))
    if size > MAX_SOCKET_PATH_BYTES:
        raise StorageError(
            f"socket path {socket_path} is {size} bytes; a unix socket address holds {MAX_SOCKET_PATH_BYTES}"
        )
    parent = socket_path.parent
    _make_private_dir(parent, "socket directory")
    _probe_writable(parent, "socket directory")
    return parent


__all__ = [
    "IDENTITY_KEY_NAME",
    "MAX_SOCKET_PATH_BYTES",
    "NETWORK_KEY_NAME",
    "data_dir_network_key_path",
    "ensure_data_dir",
    "ensure_socket_dir",
    "identity_key_path",
]
