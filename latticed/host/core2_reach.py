"""Which connected peers receive none of this daemon's core-2 queues: a link that did not agree on the
``heads-v2`` protocol feature (a 0.2.0 daemon) is sent nothing of them (docs/lattice.md), so ``status``,
``doctor`` and a metric name each such peer while this daemon holds core-2 queues. Pure: it reads the
``peers`` rows (their ``features`` and ``peer_release``) and a count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

#: The protocol feature a peer needs to receive core-2 queues.
HEADS_V2: Final = "heads-v2"

#: What to do about such a peer.
FIX: Final = (
    "upgrade that daemon (docs/operations.md, Upgrades), or keep new queues on core 1 while it runs: "
    "`queue create --core 1`, or default_queue_core = 1 in this daemon's config"
)


def core2_blind_peers(rows: Sequence[Mapping[str, Any]], core2_queues: int) -> list[dict[str, Any]]:
    """One entry per connected peer whose link did not agree on ``heads-v2`` (none while this daemon
    holds no core-2 queue, or before a link settled its features): ``peer``, ``address``, ``release``,
    ``core2_queues`` and the ``message`` status and doctor show."""
    if core2_queues <= 0:
        return []
    out = []
    seen: set[str] = set()
    for row in rows:
        features = row.get("features")
        key = row.get("public_key")
        if row.get("status") != "connected" or features is None or HEADS_V2 in features:
            continue
        if not isinstance(key, str) or key in seen:
            continue
        seen.add(key)
        release = row.get("peer_release") or "0.2.x"
        who = f"{key[:16]} at {row.get('address')}"
        noun = "queue" if core2_queues == 1 else "queues"
        out.append(
            {
                "peer": key,
                "address": row.get("address"),
                "release": release,
                "core2_queues": core2_queues,
                "message": f"peer {who} ({release}) receives none of {core2_queues} core-2 {noun}; "
                "upgrade it, or create queues with --core 1",
            }
        )
    return out


__all__ = ["FIX", "HEADS_V2", "core2_blind_peers"]
