"""What the owner may write now: the checks of :class:`~latticed.storage.engine.Engine`'s writes.

A layer between the replica view (states and addressing) and the engine (the writes themselves): every
owner's write asks it first, and a name that finds nothing asks it what to answer, so the owner fence's
refusals (:class:`~latticed.storage.wiring.OwnerFence`) are decided in this one place.
"""

from __future__ import annotations

from latticed.crdt import queue as core
from latticed.errors import BehindPeersError, LatticedError, NotFoundError, NotOwnerError
from latticed.storage.replica import ReplicaView
from latticed.storage.wiring import OwnerFence


class OwnerView(ReplicaView):
    """A replica view that knows which of its queues the owner may write to now."""

    _fence: OwnerFence

    def require_owner(self, q: int, what: str) -> None:
        """NotOwnerError unless we own ``q``; BehindPeersError while the owner fence holds it."""
        if not self.owned(q):
            raise NotOwnerError(f"cannot {what}: not the owner of {self.address(q)}")
        self.check_fence(q, what)

    def _check_new(self, name: str, kind: int, what: str) -> None:
        """The fence for one of our queues that does not exist here (yet)."""
        if (reason := self._fence.reason(core.empty_state(self.public_key, name, kind))) is not None:
            raise BehindPeersError(f"cannot {what} {self.public_key.hex()}/{name} yet: {reason}")

    def not_held(self, owner: bytes, name: str, kind: int, *, writing: bool = False) -> LatticedError:
        """A queue we hold none of. Ours dropped by ``queue repair --drop`` and not back yet: a write is
        the owner fence's BehindPeersError (as creating it is: peers hold its records, a write would
        fork it), a read NotFoundError saying it comes back. Asked only when the name finds nothing."""
        address = f"{owner.hex()}/{name}"
        if owner == self.public_key and (gone := self._fence.creating(name, kind)) is not None:
            if writing:
                return BehindPeersError(f"cannot write to {address} yet: {gone}")
            return NotFoundError(
                f"no queue {address} here: it was dropped by `queue repair --drop` and is fetched back "
                "from a peer that holds it"
            )
        return NotFoundError(f"no queue {address}")

    def check_fence(self, q: int, what: str) -> None:
        """BehindPeersError while the owner fence holds our queue ``q`` back (see :class:`OwnerFence`)."""
        if (reason := self._fence.reason(self.state(q))) is not None:
            raise BehindPeersError(f"cannot {what} {self.address(q)} yet: {reason}")


__all__ = ["OwnerView"]
