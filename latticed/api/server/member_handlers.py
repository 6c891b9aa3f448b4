"""The network-membership ops of the local API: ``invite`` (a token holding the network key) and ``join``.

Whoever can reach the API socket can already write as this daemon; ``invite`` gives such a client the
network key too, which is why the socket is private to the daemon's user (and group, under the system
unit). The work is :class:`latticed.services.membership.Membership`'s; these only check arguments.
"""

from __future__ import annotations

from latticed.api.server.api_ports import MembershipView
from latticed.api.server.context import Context, Handler, Reply, Request
from latticed.errors import LatticedError, MalformedError
from latticed.host.invite import MAX_ADDRESSES, decode_invite
from latticed.protocol.addresses import HostPort, parse_host_port


def _membership(ctx: Context) -> MembershipView:
    if ctx.membership is None:
        raise LatticedError("network membership is not managed by this daemon")
    return ctx.membership


def _addresses(request: Request) -> list[HostPort]:
    raw = request.get("addresses") or []
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw) or len(raw) > MAX_ADDRESSES:
        raise MalformedError(f"argument 'addresses' must be a list of at most {MAX_ADDRESSES} 'HOST:PORT'")
    return [parse_host_port(a) for a in raw]


async def invite(ctx: Context, request: Request) -> Reply:
    return {"token": _membership(ctx).invite(_addresses(request))}


async def join(ctx: Context, request: Request) -> Reply:
    token = request.get("token")
    if not isinstance(token, str):
        raise MalformedError("argument 'token' must be an invite token")
    force = request.get("force", False)
    if not isinstance(force, bool):
        raise MalformedError("argument 'force' must be true or false")
    return {"joined": await _membership(ctx).join(decode_invite(token), force=force)}


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "invite": invite,
    "join": join,
}


__all__ = ["invite", "join"]
