"""This build's release and the versions of everything it speaks: the one place they are written.

Importable without the daemon (no trio, libsodium or sqlite): ``latticed --version`` and
``latticectl --version`` print :func:`describe` in a few milliseconds, and ``pyproject.toml`` reads
:data:`RELEASE` from here. The modules that implement each format check against these constants
(tests/test_versions.py), and CHANGELOG.md must mention each of them.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "API_VERSIONS",
    "PROTOCOL_FEATURES",
    "PROTOCOL_VERSIONS",
    "RELEASE",
    "STORE_SCHEMA",
    "describe",
    "span",
]

#: This build's release (PEP 440; ``.devN`` between releases).
RELEASE = "0.3.0.dev0"
#: Replication protocol versions this build speaks on the peer link, lowest first (both ends use the
#: highest they share; the HELLO it opens a link with is in the lowest, which every peer still reads).
PROTOCOL_VERSIONS: Final = (1,)
#: Optional protocol features this build speaks (a queue or field that needs one is sent only to peers
#: that speak it too). ``produce``: it commits offers other daemons forward into its queues. ``compact``:
#: it reads DELTAs, ACKs and HAVEs that leave out what the link's memory rebuilds (protocol/compact.py;
#: with ``heads-v2`` too, core-2 messages so: protocol/core2_compact.py).
#: ``identity-notice``: it understands a peer's notice that another daemon runs its identity.
#: ``heads-v2``: it reads queues on the v2 fork core (protocol/core2_wire.py), which only such peers get.
#: ``window2-32``: with ``heads-v2``, it admits 32 unacknowledged core-2 deltas per link instead of 8, at
#: most 8 of them over 64 KiB (protocol/core2_session.py).
#: ``produce-columns``: with ``produce``, it takes a forwarded offer's records as columns (the local API's
#: ``packed`` layout of ``offer_batch``; produce/owner.py).
#: ``repeat-headers``: with ``compact`` and ``heads-v2``, it reads compact DELTA2 rows whose headers equal
#: the row's before as nil (protocol/core2_compact.py).
#: ``link-gone``: it reads a redial's word that names the link it replaces as gone on the peer's side
#: (protocol/link_gone.py), and sends it to peers whose lost link agreed on it.
PROTOCOL_FEATURES: Final[frozenset[str]] = frozenset(
    {
        "compact",
        "heads-v2",
        "identity-notice",
        "link-gone",
        "produce",
        "produce-columns",
        "repeat-headers",
        "window2-32",
    }
)
#: The store's schema version (PRAGMA user_version: migrations applied) this build writes.
STORE_SCHEMA: Final = 10
#: Local API versions the daemon answers (a request names its version in ``v``). 2: ``offer_batch``
#: takes its records as columns (``layout: "packed"``); everything of 1 stays as it was.
API_VERSIONS: Final = (1, 2)


def span(versions: tuple[int, ...]) -> str:
    """``1`` or ``1-3``: a version range as the changelog and ``--version`` write it."""
    low, high = min(versions), max(versions)
    return str(low) if low == high else f"{low}-{high}"


def describe(program: str) -> str:
    """What ``--version`` prints: the release, then one line per format this build speaks."""
    features = ", ".join(sorted(PROTOCOL_FEATURES)) or "none"
    return (
        f"{program} {RELEASE}\n"
        f"wire protocol {span(PROTOCOL_VERSIONS)} (features: {features})\n"
        f"store schema {STORE_SCHEMA}\n"
        f"local API {span(API_VERSIONS)}"
    )
