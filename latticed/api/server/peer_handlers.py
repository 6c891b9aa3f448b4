"""Peer management and the daemon's own checklist: ``peers_add``, ``peers_remove``, ``peers_block``,
``peers_unblock`` and ``doctor``.

Peer management works on the running replication service (started if this daemon had nothing to
replicate with yet, as ``join`` does); blocks and added peers are saved in the data directory before the
reply (``latticed/net/peer_faults.py``), so they survive a restart. The checklist is the daemon's
(:class:`~latticed.api.server.api_ports.SelfCheck`: :mod:`latticed.host.checklist` on its config), run in
a worker thread (it stats files and lists interfaces).
"""

from __future__ import annotations

from typing import Any

import trio

from latticed.api.server import core2_handlers
from latticed.api.server.api_ports import MembershipView, PeerControl
from latticed.api.server.context import Context, Handler, Reply, Request
from latticed.crdt.signing import parse_public_key
from latticed.errors import LatticedError, MalformedError
from latticed.privacy.crypto import accelerated
from latticed.protocol.addresses import HostPort, parse_host_port
from latticed.protocol.peerstate import format_host_port

__all__ = [
    "doctor",
    "identity_claim",
    "identity_runs",
    "peers_add",
    "peers_block",
    "peers_remove",
    "peers_unblock",
]


def _membership(ctx: Context) -> MembershipView:
    if ctx.membership is None:
        raise LatticedError("peers are not managed by this daemon")
    return ctx.membership


async def _service(ctx: Context) -> PeerControl:
    return await _membership(ctx).ensure_started()


def _identity(request: Request, ctx: Context) -> bytes:
    raw = request.get("peer")
    if not isinstance(raw, str):
        raise MalformedError(
            "argument 'peer' must be an identity (64 hex digits, as `latticectl peers` shows)"
        )
    key = parse_public_key(raw.strip().lower())
    if key == ctx.engine.public_key:
        raise MalformedError("that is this daemon's own identity")
    return key


def _target(request: Request) -> bytes | HostPort:
    """An identity (64 hex digits) or an address (HOST:PORT)."""
    raw = request.get("peer")
    if not isinstance(raw, str) or not raw.strip():
        raise MalformedError("argument 'peer' must be an identity (64 hex digits) or HOST:PORT")
    text = raw.strip()
    if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
        return bytes.fromhex(text)
    return parse_host_port(text)


async def peers_add(ctx: Context, request: Request) -> Reply:
    raw = request.get("address")
    if not isinstance(raw, str):
        raise MalformedError("argument 'address' must be HOST:PORT")
    address = parse_host_port(raw.strip())
    service = await _service(ctx)
    if service.listen_address is not None and address == service.listen_address:
        raise MalformedError(f"{format_host_port(address)} is this daemon's own listen address")
    return {"added": service.add_peer(address)}


async def peers_remove(ctx: Context, request: Request) -> Reply:
    return {"removed": (await _service(ctx)).remove_peer(_target(request))}


async def peers_block(ctx: Context, request: Request) -> Reply:
    key = _identity(request, ctx)
    changed = (await _service(ctx)).set_blocked(key, True)
    return {"peer": key.hex(), "blocked": True, "changed": changed}


async def peers_unblock(ctx: Context, request: Request) -> Reply:
    key = _identity(request, ctx)
    changed = (await _service(ctx)).set_blocked(key, False)
    return {"peer": key.hex(), "blocked": False, "changed": changed}


async def doctor(ctx: Context, request: Request) -> Reply:
    """The daemon's checks of itself (the client adds the socket and the Spark extra)."""
    membership = _membership(ctx)
    if ctx.self_check is None:
        raise LatticedError("this daemon has no checklist of itself")
    self_check = ctx.self_check
    service = ctx.replication
    listen_address = service.listen_address if service is not None else None
    disk = ctx.health.disk if ctx.health is not None else None
    disk_error = ctx.health.disk_error if ctx.health is not None else None
    others = service.other_networks() if service is not None else None
    facts: dict[str, Any] = {
        "public_key": membership.uses_public_key,
        "other_networks": others,
        "listen": service.listen if service is not None else None,
        "peers": service.peers() if service is not None else [],
        "forks": await core2_handlers.forks(ctx),  # loads every core-2 queue: the corrupt ones found
        "corrupt": core2_handlers.corrupt(ctx),
        "skew": service.clock_skew() if service is not None else [],
        "sealer_accelerated": accelerated(),
        "identity": service.identity_status() if service is not None else None,
        "core2_queues": core2_handlers.core2_count(ctx),
    }

    def run() -> list[dict[str, Any]]:
        return self_check(facts, listen_address=listen_address, disk=disk, disk_error=disk_error)

    return {"checks": await trio.to_thread.run_sync(run), "other_networks": others}


async def identity_runs(ctx: Context, request: Request) -> Reply:
    """Other runs of this identity (told of by peers, or seen in heads of our own queues), identities
    seen running twice on our links, and whether this daemon refuses its own writes."""
    service = ctx.replication
    return {"identity": service.identity_status() if service is not None else None}


async def identity_claim(ctx: Context, request: Request) -> Reply:
    """The operator says this daemon is the one to keep: it signs again."""
    return {"identity": (await _service(ctx)).claim_identity()}


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "identity_runs": identity_runs,
    "identity_claim": identity_claim,
    "peers_add": peers_add,
    "peers_remove": peers_remove,
    "peers_block": peers_block,
    "peers_unblock": peers_unblock,
    "doctor": doctor,
}
