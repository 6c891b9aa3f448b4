"""Pieces of the in-memory replica hosts the gossip tests build (tests/net/)."""

from __future__ import annotations

import dataclasses

from latticed.crdt.queue import Summary


@dataclasses.dataclass
class Applied:
    """A merge that already landed, as the gossip's host answers ``apply``: its summary and whether it
    changed anything (``ahead``: a verified live push kept ahead of the commit)."""

    summary: Summary
    changed: bool
    ahead: Summary | None = None

    async def result(self) -> tuple[Summary, bool]:
        return self.summary, self.changed

    def settled(self) -> tuple[Summary, bool] | None:
        return self.summary, self.changed
