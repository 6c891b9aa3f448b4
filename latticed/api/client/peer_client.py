"""Peer-management and checklist calls of the blocking client: :class:`PeerOps` is mixed into
:class:`~latticed.api.client.blocking_client.Client` (the daemon side is
:mod:`latticed.api.server.peer_handlers`)."""

from __future__ import annotations

from typing import Any

__all__ = ["PeerOps"]


class PeerOps:
    """``latticectl peers add/remove/block/unblock`` and ``doctor``, as client methods."""

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        raise NotImplementedError

    def peers_add(self, address: str) -> dict[str, Any]:
        """Dial ``HOST:PORT`` now and after every restart (until removed)."""
        added: dict[str, Any] = self.call("peers_add", address=address)["added"]
        return added

    def peers_remove(self, peer: str) -> dict[str, Any]:
        """Forget an identity (hex) or one address (``HOST:PORT``): no longer dialled, its link closed.
        ``static`` in the answer lists addresses from the config, which come back at the next start."""
        removed: dict[str, Any] = self.call("peers_remove", peer=peer)["removed"]
        return removed

    def peers_block(self, peer: str) -> dict[str, Any]:
        """Refuse identity ``peer`` at the handshake and never dial it (kept across restarts). Returns
        ``peer``, ``blocked`` and ``changed`` (False: it was blocked already)."""
        return _block_reply(self.call("peers_block", peer=peer))

    def peers_unblock(self, peer: str) -> dict[str, Any]:
        """Undo :meth:`peers_block` (``changed`` False: it was not blocked)."""
        return _block_reply(self.call("peers_unblock", peer=peer))

    def doctor(self) -> list[dict[str, Any]]:
        """The daemon's checks of itself: ``check``, ``ok`` (True, False, or None: not applicable),
        ``detail`` and ``fix``."""
        checks: list[dict[str, Any]] = self.call("doctor")["checks"]
        return checks

    def identity_runs(self) -> dict[str, Any] | None:
        """Other runs of this identity and whether this daemon refuses its own writes (None: replication
        is not running)."""
        found: dict[str, Any] | None = self.call("identity_runs")["identity"]
        return found

    def identity_claim(self) -> dict[str, Any]:
        """Say this daemon is the one to keep: it signs again; ``was_refusing`` says whether it refused."""
        claimed: dict[str, Any] = self.call("identity_claim")["identity"]
        return claimed

    def peer_report(self) -> dict[str, Any]:
        """``peers`` (as :meth:`~latticed.api.client.Client.peers`) and ``other_networks``: how many
        daemons mDNS hears on the LAN under another network key (None: mDNS is off, or a daemon too old
        to say)."""
        reply = self.call("peers")
        return {"peers": reply["peers"], "other_networks": _count(reply.get("other_networks"))}


def _count(value: object) -> int | None:
    """A count from the daemon, or None for anything else (an older daemon sends none)."""
    return value if type(value) is int and value >= 0 else None


def _block_reply(reply: dict[str, Any]) -> dict[str, Any]:
    return {key: reply[key] for key in ("peer", "blocked", "changed")}
