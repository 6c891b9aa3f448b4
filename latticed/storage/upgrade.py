"""What an upgrade of a store would do, read without writing: ``latticed migrate --dry-run``.

The store is opened read-only (SQLite's ``mode=ro``), so a dry run is safe beside a running daemon and on
a store this release refuses. Running the plan is :func:`latticed.storage.schema.migrate` (the daemon does
it at every start; ``latticed migrate`` does it alone).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from latticed.errors import NotFoundError, StorageError
from latticed.storage.precopy import copy_path
from latticed.storage.schema import (
    MIGRATIONS,
    Migration,
    describe,
    newer_store_message,
    upgrading_from,
    user_version,
    written_by,
)
from latticed.storage.sqlite import storage_error
from latticed.version import RELEASE


@dataclass(frozen=True, slots=True)
class UpgradePlan:
    """A store's schema, the one this release writes, and the steps between them."""

    path: Path
    schema: int
    target: int
    #: The release that last wrote the store (None: 0.2.0 or earlier, which did not record it).
    written_by: str | None
    #: (schema version the step goes to, what it does), in order.
    steps: tuple[tuple[int, str], ...]
    #: Bytes of the store file and its WAL: what the copy kept before migrating takes on disk.
    size: int
    #: The schema an interrupted upgrade started from, whose copy it keeps (None: none interrupted).
    resumes_from: int | None = None

    @property
    def copy(self) -> Path | None:
        """Where the copy kept before migrating goes (None: nothing to migrate, or an empty file)."""
        if not self.steps or self.schema == 0:
            return None
        return copy_path(self.path, self.schema if self.resumes_from is None else self.resumes_from)


def plan_upgrade(path: Path, migrations: Sequence[Migration] = MIGRATIONS) -> UpgradePlan:
    """Read the store at ``path`` and say what opening it would change; refuses (StorageError) a store of
    a newer schema as the daemon would, and a missing store (NotFoundError): a dry run creates nothing."""
    if not path.is_file():
        raise NotFoundError(f"no store at {path} (wrong --data-dir or --config?)")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise storage_error(exc, "open the store", path) from exc
    try:
        schema = user_version(conn)
        writer = written_by(conn)
        started = upgrading_from(conn)
    except sqlite3.Error as exc:
        raise storage_error(exc, "read the schema version of", path) from exc
    finally:
        conn.close()
    target = len(migrations)
    if schema > target:
        raise StorageError(newer_store_message(path, schema, writer, target))
    wal = path.with_name(path.name + "-wal")
    size = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    steps = tuple((v + 1, describe(migrations[v])) for v in range(schema, target))
    resumed = (
        started if started is not None and started < schema and copy_path(path, started).exists() else None
    )
    return UpgradePlan(path, schema, target, writer, steps, size, resumed)


def describe_plan(plan: UpgradePlan) -> str:
    """What ``latticed migrate --dry-run`` prints."""
    writer = f"latticed {plan.written_by}" if plan.written_by else "latticed 0.2.0 or earlier"
    head = f"store {plan.path}: schema {plan.schema} (last written by {writer})"
    if not plan.steps:
        return f"{head}\nlatticed {RELEASE} writes schema {plan.target}: nothing to migrate"
    lines = [head, f"latticed {RELEASE} would migrate it from schema {plan.schema} to {plan.target}:"]
    if plan.resumes_from is not None:
        lines.append(
            f"  resume the upgrade from schema {plan.resumes_from}, interrupted: keep its copy {plan.copy}"
        )
    elif plan.copy is not None:
        lines.append(f"  first keep a copy: {plan.copy} ({_mib(plan.size)}; older releases can open it)")
    lines += [f"  {to - 1} -> {to}: {what}" for to, what in plan.steps]
    lines.append(
        "each step is its own transaction: a crash leaves the last completed step, and the next start "
        "resumes; nothing was written (run `latticed migrate`, or start the daemon, to migrate)"
    )
    return "\n".join(lines)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


__all__ = ["UpgradePlan", "describe_plan", "plan_upgrade"]
