"""The node's identity key file (``data_dir/identity.key``): a raw 32-byte Ed25519 seed, mode 0600.

Created once, atomically (temporary file, fsync, rename, fsync of the directory), so a crash never leaves
a half-written key that would give the node a new identity on the next start.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from latticed.crdt.signing import Identity
from latticed.errors import StorageError
from latticed.process.logs import get_logger, log_event

log = get_logger(__name__)

SEED_SIZE = 32


def load_or_create_identity(path: Path) -> Identity:
    """The identity stored at ``path``, or a new one written there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return _create(path)
    except OSError as exc:
        raise StorageError(f"cannot read the identity key {path}: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        seed = os.read(fd, SEED_SIZE + 1)
    finally:
        os.close(fd)
    if len(seed) != SEED_SIZE:
        raise StorageError(
            f"identity key {path} holds {len(seed)} bytes, not a {SEED_SIZE}-byte seed; restore it from a "
            "backup (deleting it gives this node a new identity)"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log_event(log, "identity.key_mode", level=30, path=str(path), mode=oct(stat.S_IMODE(mode)))
    return Identity.from_seed(seed)


def _create(path: Path) -> Identity:
    identity = Identity.generate()
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, identity.seed)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise StorageError(f"cannot create the identity key {path}: {exc.strerror or exc}") from exc
    log_event(log, "identity.created", path=str(path), identity=identity.public_hex)
    return identity


__all__ = ["load_or_create_identity"]
