"""``latticectl doctor`` without a daemon: the store read as the daemon reads it at start, read-only
(:mod:`latticed.storage.store_check`), so a queue found corrupt is named, with its ``queue repair``,
before the daemon runs again.

Apart from the modules that reach the daemon only through its socket (pyproject's import contract lets
``cli.doctor`` import this one alone): the store is imported only when the daemon does not answer."""

from __future__ import annotations

import os
from pathlib import Path

from latticed.errors import LatticedError, NotFoundError
from latticed.host.checklist import Check, check_corrupt
from latticed.host.paths import identity_key_path

__all__ = ["store_checks"]

_SEED_SIZE = 32


def _own_key(data_dir: Path) -> bytes | None:
    """This daemon's public key from its identity key file (None if it cannot be read: each corrupt queue's
    advice then covers both cases)."""
    from latticed.crdt.signing import Identity  # noqa: PLC0415 - libsodium only for an offline doctor

    try:
        with open(identity_key_path(data_dir), "rb") as file:
            seed = file.read(_SEED_SIZE + 1)
    except OSError:
        return None
    return Identity.from_seed(seed).public_key if len(seed) == _SEED_SIZE else None


def store_checks(data_dir: Path) -> list[Check]:
    """The ``store`` lines of the offline checklist: a failing one for each core-2 queue found corrupt."""
    from latticed.storage.store import db_path  # noqa: PLC0415
    from latticed.storage.store_check import check_store  # noqa: PLC0415 - the store only offline

    path = db_path(data_dir)
    if path.exists() and not os.access(path, os.R_OK):
        return [Check("store", None, f"{path} is not readable by this user: run doctor as the daemon's user")]
    try:
        found = check_store(data_dir, _own_key(data_dir))
    except NotFoundError as exc:
        return [Check("store", None, str(exc))]
    except (LatticedError, OSError) as exc:
        return [Check("store", False, str(exc), "check the data directory's permissions and disk")]
    if found.newer:
        return [
            Check(
                "store",
                None,
                f"{found.path} is of schema {found.schema}, written by a newer release than this latticectl: "
                "run that release's doctor",
            )
        ]
    if not found.current:
        return [
            Check(
                "store",
                None,
                f"{found.path} is of schema {found.schema}: the daemon migrates it at its next start "
                "and checks its queues then",
            )
        ]
    if not found.corrupt:
        return [
            Check(
                "store",
                True,
                f"{found.path}: {found.checked} core-2 queue(s) read (read-only), each what its owner signed",
            )
        ]
    return check_corrupt(found.corrupt)
