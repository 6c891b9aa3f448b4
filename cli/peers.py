"""``latticectl peers``: each peer's real state, and the operator's peer management.

``peers`` alone lists them. A peer's state is one of: connected; dialling (the next try and the failures so
far, and why the last try failed to connect); refused (the TCP connection worked but the handshake did
not, with the reason); blocked (by you); self (this daemon's own address). Only a connected peer can be in
sync: the lag of any other shows as ``-``. ``add``, ``remove``, ``block`` and ``unblock`` print nothing on
stdout (one line on stderr says what happened) unless ``--json`` is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import SOCKET_HELP, JsonFlag, client, note, settings
from cli.output import emit, table_lines
from latticed.protocol.addresses import parse_host_port
from latticed.protocol.peerstate import OTHER_NETWORKS_FIX, other_networks_text

peers_app = typer.Typer(
    help="List peers and their state; add, remove, block and unblock them.",
    invoke_without_command=True,
    no_args_is_help=False,
)

_PEER_COLUMNS = {
    "public_key": "IDENTITY",
    "address": "ADDRESS",
    "sources": "FOUND",
    "lag": "LAG",
    "deltas": "SENT/ACKED",
    "state_text": "STATE",
}

PeerArg = Annotated[
    str, typer.Argument(metavar="ID", help="The peer's identity: 64 hex digits, as `latticectl peers` shows.")
]


def lag_text(lags: dict[str, int]) -> str:
    """Summed over queues: records the peer lacks ("behind"), and records it holds that we lack ("ahead":
    this daemon is still catching up, e.g. after a restore). ``--json`` has them per queue."""
    behind = sum(lag for lag in lags.values() if lag > 0)
    ahead = -sum(lag for lag in lags.values() if lag < 0)
    parts = [f"{count} records {word}" for count, word in ((behind, "behind"), (ahead, "ahead")) if count]
    return ", ".join(parts) or "in sync"


def deltas_text(row: dict[str, Any]) -> str:
    """The SENT/ACKED column: deltas this daemon sent on the link since it came up / those the peer
    answered (merged or refused), equal once it answered every push; ``-`` without a link (or from a
    daemon too old to count)."""
    sent, acked = row.get("deltas_sent"), row.get("deltas_acked")
    if not isinstance(sent, int) or not isinstance(acked, int):
        return "-"
    return f"{sent}/{acked}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def state_text(row: dict[str, Any]) -> str:
    """The STATE column: the state, then in brackets why, and for one being dialled when it is next."""
    status = row.get("status")
    if not isinstance(status, str):  # an older daemon: only the book's state
        status = "connected" if row.get("connected") else str(row.get("state") or "unknown")
    reason = row.get("reason")
    details: list[str] = []
    if status in ("dialling", "refused"):
        next_try = row.get("next_try_s")
        if row.get("state") == "dialing":
            details.append("trying again now" if row.get("failures") else "trying now")
        elif isinstance(next_try, int | float):
            details.append(f"next try in {round(next_try)} s")
        failures = row.get("failures")
        if isinstance(failures, int) and failures:
            details.append(f"{_plural(failures, 'failure')} so far")
        refusals = row.get("refused_count")
        if isinstance(refusals, int):
            details.append(f"{_plural(refusals, 'time')} lately")
    withheld = row.get("withheld")
    if status == "connected" and isinstance(withheld, int) and withheld:
        details.append(f"{_plural(withheld, 'queue')} its version cannot express held back")
    pruned, lazy = row.get("queues_pruned_in"), row.get("queues_lazy_out")
    if status == "connected" and isinstance(pruned, int) and isinstance(lazy, int) and (pruned or lazy):
        # Plumtree's lazy links: announced (HAVE) rather than pushed, per queue, each way.
        eager = row.get("queues_eager_in") or 0
        details.append(f"{eager} of {_plural(eager + pruned, 'queue')} pushed to us, {lazy} announced to it")
    if status == "blocked":
        return "blocked"
    shown = ", ".join(details)
    if reason and shown:
        return f"{status} ({reason}; {shown})"
    if reason or shown:
        return f"{status} ({reason or shown})"
    return status


def _row_text(row: dict[str, Any]) -> dict[str, Any]:
    connected = row.get("status", "connected" if row.get("connected") else None) == "connected"
    return {
        **row,
        "lag": lag_text(row.get("lag") or {}) if connected else "-",
        "deltas": deltas_text(row),
        "state_text": state_text(row),
    }


@peers_app.callback()
def peers(
    ctx: typer.Context,
    socket: Annotated[Path | None, typer.Option("--socket", metavar="PATH", help=SOCKET_HELP)] = None,
    as_json: JsonFlag = False,
) -> None:
    """List known peers: identity, address, how found, lag, deltas sent/acked on the link, and state
    (connected, dialling, refused with the reason, blocked); on stderr, how many daemons of another
    network mDNS hears on this LAN, if any (`doctor --json` has the count)."""
    if socket is not None:
        settings(ctx).socket_path = socket
    if ctx.invoked_subcommand is not None:
        return
    report = client(ctx).peer_report()
    rows = report["peers"]
    shown = [_row_text(row) for row in rows]
    lines = table_lines(shown, _PEER_COLUMNS) if rows else ["no peers"]
    emit(rows, lines, as_json=as_json or settings(ctx).as_json)
    others = report["other_networks"]
    if others:  # not a peer: a note beside the result, which stays the list it always was
        note(f"{other_networks_text(others)}: {OTHER_NETWORKS_FIX}")


@peers_app.command("add")
def peers_add(
    ctx: typer.Context,
    address: Annotated[str, typer.Argument(metavar="HOST:PORT", help="Where the peer listens.")],
    as_json: JsonFlag = False,
) -> None:
    """Dial HOST:PORT now, and again after every restart, until removed."""
    parse_host_port(address)  # a usage error (exit 2) before the daemon is asked
    added = client(ctx).peers_add(address)
    if as_json:
        emit(added, None, as_json=True)
        return
    already = "" if added.get("new", True) else " (it was known already)"
    note(f"added peer {added['address']}{already}: dialling it; `latticectl peers` shows how it goes")


@peers_app.command("remove")
def peers_remove(
    ctx: typer.Context,
    peer: Annotated[
        str, typer.Argument(metavar="ID|HOST:PORT", help="An identity (all its addresses) or one address.")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Forget a peer: it is not dialled again and its connection is closed. It may still dial this daemon,
    or be found again by mDNS after a restart: block it to keep it out."""
    removed = client(ctx).peers_remove(peer)
    if as_json:
        emit(removed, None, as_json=True)
        return
    addresses = ", ".join(removed.get("removed") or []) or "no address"
    note(f"removed peer {peer} ({addresses}): it is not redialled")
    static = removed.get("static") or []
    if static:
        shown = ", ".join(static)
        note(f"{shown} is in the config's peers: it comes back at the next start unless removed there")


@peers_app.command("block")
def peers_block(ctx: typer.Context, peer: PeerArg, as_json: JsonFlag = False) -> None:
    """Refuse this identity at the handshake and never dial it, also after restarts (its connection, if
    any, is closed). Composes with allowed_peers: a peer must be allowed and not blocked."""
    result = client(ctx).peers_block(peer)
    if as_json:
        emit(result, None, as_json=True)
        return
    suffix = "" if result.get("changed") else " (it was already)"
    note(f"blocked {result['peer']}{suffix}: refused at the handshake and never dialled")


@peers_app.command("unblock")
def peers_unblock(ctx: typer.Context, peer: PeerArg, as_json: JsonFlag = False) -> None:
    """Let a blocked identity connect again (and dial its known addresses)."""
    result = client(ctx).peers_unblock(peer)
    if as_json:
        emit(result, None, as_json=True)
        return
    suffix = "" if result.get("changed") else " (it was not blocked)"
    note(f"unblocked {result['peer']}{suffix}")


identity_app = typer.Typer(
    help="Whether another daemon runs this identity; `claim` says this one is the one to keep.",
    invoke_without_command=True,
    no_args_is_help=False,
)


def identity_text(facts: dict[str, Any] | None) -> list[str]:
    """Lines of ``identity`` and ``status``: the refusal, other runs, identities seen twice, catch-up."""
    if not facts:
        return ["replication is not running"]
    lines = []
    if facts.get("refusing"):
        lines.append(f"writes refused: {facts['refusing']}")
    for run in facts.get("other_runs") or []:
        lines.append(
            f"another run at {run.get('address')} (incarnation {str(run.get('incarnation'))[:8]}, told by "
            f"{str(run.get('via'))[:16]}): this daemon is the {run.get('this_daemon_is')} one"
        )
    for head in facts.get("foreign_heads") or []:
        lines.append(
            f"{head.get('queue')} came back from {str(head.get('peer'))[:16]} with {head.get('reason')}"
        )
    for seen in facts.get("seen_twice") or []:
        earlier, later = seen.get("earlier") or {}, seen.get("later") or {}
        lines.append(
            f"peer {str(seen.get('identity'))[:16]} runs twice: at {earlier.get('address')} (earlier) and "
            f"{later.get('address')} (later)"
        )
    if facts.get("claimed_at") is not None:
        lines.append("claimed: this daemon is the one to keep")
    if facts.get("catching_up"):
        lines.append(str(facts["catching_up"]))
    return lines or ["no other daemon runs this identity, as far as its peers tell"]


@identity_app.callback()
def identity(
    ctx: typer.Context,
    socket: Annotated[Path | None, typer.Option("--socket", metavar="PATH", help=SOCKET_HELP)] = None,
    as_json: JsonFlag = False,
) -> None:
    """Whether another daemon runs this identity (a copied data directory): what peers told this daemon,
    heads of its own queues another run signed, and identities it sees running twice on its links."""
    if socket is not None:
        settings(ctx).socket_path = socket
    if ctx.invoked_subcommand is not None:
        return
    facts = client(ctx).identity_runs()
    emit(facts, identity_text(facts), as_json=as_json or settings(ctx).as_json)


@identity_app.command("claim")
def identity_claim(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Say this daemon is the one to keep: it signs again (until it restarts). Stop the other daemon
    first, or its writes and this one's fork the queues both write."""
    facts = client(ctx).identity_claim()
    if as_json:
        emit(facts, None, as_json=True)
        return
    was = "it refused its own writes until now" if facts.get("was_refusing") else "it was not refusing writes"
    note(f"claimed this identity for this daemon ({was}): it signs again")


def register(app: typer.Typer) -> None:
    """Add the ``peers`` and ``identity`` groups to ``latticectl``."""
    app.add_typer(peers_app, name="peers")
    app.add_typer(identity_app, name="identity")


__all__ = ["identity_text", "lag_text", "register", "state_text"]
