"""Our own queues dropped by ``latticectl queue repair NAME --drop``, remembered in the data directory
until they are back: peers hold records we signed at offsets this store no longer has, so creating the
queue again or writing to it before a peer's copy merged back would sign a second history (a fork by the
owner itself). The owner fence (:class:`~latticed.storage.wiring.OwnerFence`) asks this first, whether or
not a peer is connected, and across restarts; a copy back as long as the one dropped lifts it, and so
does ``queue repair NAME --release`` (the operator says no peer holds it).

A file beside the store (not a store table: no schema change); an older release ignores it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from latticed.errors import MalformedError

__all__ = ["DROPPED_FILE", "DroppedOwn"]

#: The file in the data directory: ``{"NAME KIND": END}``, END the stored end offset when it was dropped.
DROPPED_FILE = "dropped-own-queues.json"


def _key(name: str, kind: int) -> str:
    return f"{name} {int(kind)}"


class DroppedOwn:
    """The dropped own queues and the end offset each held (see the module docstring); ``data_dir``
    None keeps them in memory only (an engine opened without one: tests)."""

    def __init__(self, data_dir: Path | None, ends: dict[str, int] | None = None) -> None:
        self._dir = data_dir
        self._ends: dict[str, int] = dict(ends or {})

    @classmethod
    def load(cls, data_dir: Path) -> DroppedOwn:
        """Read the file (none: nothing dropped); MalformedError, naming it, if it is not ours."""
        path = data_dir / DROPPED_FILE
        try:
            text = path.read_text("utf-8")
        except FileNotFoundError:
            return cls(data_dir)
        except OSError as exc:
            raise MalformedError(f"{path}: cannot read it ({exc.strerror})") from None
        try:
            raw = json.loads(text)
            ends = {str(k): int(v) for k, v in raw.items()}
        except (ValueError, TypeError, AttributeError):
            raise MalformedError(
                f"{path}: not a list of dropped queues; it keeps writes to your own queues dropped by "
                "`queue repair --drop` refused until peers send them back: fix it, do not delete it"
            ) from None
        return cls(data_dir, ends)

    def __bool__(self) -> bool:
        return bool(self._ends)

    def reason(self, name: str, kind: int, held_end: int | None) -> str | None:
        """Why our queue ``name`` must not be written (None: go ahead); ``held_end`` None: it is not
        here (a create), else how far we hold it now."""
        if not self._ends:  # every write passes here
            return None
        end = self._ends.get(_key(name, kind))
        if end is None or (held_end is not None and held_end >= end):
            return None
        have = "it is not here yet" if held_end is None else f"{held_end} of them are back"
        return (
            f"it was dropped by `queue repair --drop` and peers hold the {end} record(s) it had ({have}); "
            "writing now would sign a second history. Wait for a peer that holds it to connect, or run "
            f"`latticectl queue repair {name} --release` if no peer holds it"
        )

    def remember(self, name: str, kind: int, end: int) -> None:
        """Note ``name`` dropped at ``end`` (durably, before the drop: a crash between leaves the queue
        corrupt and still refused, never writable)."""
        self._ends[_key(name, kind)] = max(end, self._ends.get(_key(name, kind), 0))
        self._save()

    def forget(self, name: str, kind: int) -> int | None:
        """Writes to ``name`` allowed again; returns the end it was dropped at (None: it was not)."""
        end = self._ends.pop(_key(name, kind), None)
        if end is not None:
            self._save()
        return end

    def release(self, name: str) -> int | None:
        """``queue repair NAME --release``: every kind of ``name`` writable again; the largest end it was
        dropped at (None: it was not)."""
        ends = [self._ends.pop(k) for k in list(self._ends) if k.rpartition(" ")[0] == name]
        if ends:
            self._save()
        return max(ends) if ends else None

    def back(self, name: str, kind: int, held_end: int) -> None:
        """A committed value of ours holding ``held_end``: forget ``name`` once it is back whole."""
        if self._ends and self.reason(name, kind, held_end) is None and _key(name, kind) in self._ends:
            self.forget(name, kind)

    def _save(self) -> None:
        """Temporary file, fsync, rename, fsync of the directory (as the peer rules are written)."""
        if self._dir is None:
            return
        path = self._dir / DROPPED_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.write(fd, json.dumps(self._ends, sort_keys=True).encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
        dir_fd = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
