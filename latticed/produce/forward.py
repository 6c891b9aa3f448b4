"""A producer's daemon: offers into a queue another daemon owns go to that owner.

The records travel as one ``produce`` request over the authenticated replication link (the
lease-forwarding sub-protocol, :mod:`latticed.net.leasing`), dialling the owner when no link is up; the
owner signs and commits them (:mod:`.owner`) and answers with their offsets once durable; they come back
here by replication like any record of that queue.

Each request names a producer id and a sequence number. The same pair sent again (after a link dropped
before the answer, or an answer that did not come in time) gets the first answer and writes nothing more,
so this side retries until ``wait`` runs out. Without one given by the client, an offer goes under this
daemon's own producer id (random, one per run) and the next sequence of it: the owner then remembers one
row for this daemon per queue and run, not one per offer, and a retry is still the same pair.

Versions: an owner whose link did not agree on the :data:`PRODUCE_FEATURE` feature does not know the op:
the offer fails at once with a clear error (an owner still settling its versions is asked anyway; one
that refuses the op as unknown gets the same error). Records a client sent as columns (the local API's
``packed`` layout) go on as those columns where the link agreed on :data:`PRODUCE_COLUMNS_FEATURE`: the
owner cuts them as it cuts a local columnar offer, instead of decoding and packing a list row by row
(the owner's CPU of a forwarded bulk offer was nearly twice a local one's). Elsewhere, and for records
with headers (whose map by record index the link's msgpack does not carry), the list form, as before.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Any, Final

import trio

from latticed.errors import IncompatiblePeerError, MalformedError, OwnerUnreachableError
from latticed.net.background import Background
from latticed.net.leasing import LeaseLinks
from latticed.produce.offered_columns import LINK_FIELDS, PACKED_LAYOUT, OfferedColumns
from latticed.produce.owner import PRODUCE_OP, OfferServer

#: The protocol feature a daemon names when it takes remote offers (latticed/version.py).
PRODUCE_FEATURE: Final = "produce"
#: The feature of an owner that also takes a ``produce`` request's records as columns (``layout:
#: "packed"`` and the local API's column fields, :data:`~.offered_columns.LINK_FIELDS`).
PRODUCE_COLUMNS_FEATURE: Final = "produce-columns"
#: How long the owner may take to answer one request (it commits with its next group commit).
ANSWER_WITHIN_S: Final = 10.0
#: What an offer waits for the owner when the caller does not say.
DEFAULT_WAIT_S: Final = 10.0


def too_old(owner: bytes) -> IncompatiblePeerError:
    return IncompatiblePeerError(
        f"the owner {owner.hex()} runs a release that does not take remote offers (it does not speak the "
        f"{PRODUCE_FEATURE!r} feature): upgrade it, or offer on the owner's daemon"
    )


def new_producer_id() -> str:
    """A random producer id (an offer whose client named none)."""
    return os.urandom(12).hex()


class RemoteOffers(Background):
    """Forwards offers to the owners of other daemons' queues (see the module docstring). Run
    :meth:`run` in a nursery: forwarded offers of pipelining clients run there."""

    def __init__(
        self, links: LeaseLinks, local: OfferServer, *, answer_within: float = ANSWER_WITHIN_S
    ) -> None:
        self.links = links
        self.answer_within = answer_within
        #: Offers with a producer id into this daemon's own queues are committed here.
        self.local = local
        super().__init__("remote offers are not running")
        self.counters = {"offers": 0, "retries": 0}
        self._own_producer = new_producer_id()
        self._own_sequences = itertools.count()

    def next_own(self) -> tuple[str, int]:
        """This daemon's producer id and its next sequence, for an offer whose client named no producer."""
        return self._own_producer, next(self._own_sequences)

    async def offer(
        self,
        owner: bytes,
        name: str,
        records: list[list[Any]] | OfferedColumns,
        *,
        columns: Mapping[str, Any] | None = None,
        producer: str,
        seq: int,
        wait: float = DEFAULT_WAIT_S,
        shared: bool = False,
    ) -> dict[str, Any]:
        """Offer ``records`` into ``owner``'s queue ``name``; the owner's answer ``{"first", "count",
        "duplicate"}``. OwnerUnreachableError when it could not be reached and answer within ``wait``.
        ``shared``: ``producer`` is one of the queue's (:func:`~latticed.produce.dedup.producer_scope`).
        ``records`` as :class:`OfferedColumns` (checked already) come with ``columns``, the request fields
        they were cut from: sent as they came where the link agreed on :data:`PRODUCE_COLUMNS_FEATURE`
        (decided each attempt: a retry may go over a new link), else as the list."""
        body: dict[str, Any] = {"queue": name, "producer": producer, "seq": seq}
        if shared:
            body["shared"] = True
        deadline = trio.current_time() + wait
        self.counters["offers"] += 1
        while True:
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise OwnerUnreachableError(
                    f"the owner {owner.hex()} of queue {name} could not be reached within {wait:g}s"
                )
            features = self.links.features(owner)
            if features is not None and PRODUCE_FEATURE not in features:
                raise too_old(owner)
            _records_in(body, records, columns, features)
            try:
                return await self.links.call(
                    owner,
                    PRODUCE_OP,
                    body,
                    timeout=min(self.answer_within, max(remaining, 0.5)),
                    connect_within=remaining,
                )
            except MalformedError as exc:
                if str(exc).startswith("unknown lease op"):
                    raise too_old(owner) from exc
                raise
            except OwnerUnreachableError:  # no link in time, it dropped, or no answer in time
                if trio.current_time() >= deadline:
                    raise
                self.counters["retries"] += 1  # the same producer and sequence: written once at most


def _records_in(
    body: dict[str, Any],
    records: list[list[Any]] | OfferedColumns,
    columns: Mapping[str, Any] | None,
    features: frozenset[str] | None,
) -> None:
    """Put ``records`` into a ``produce`` request's ``body``: as the columns they came in where the
    owner's link agreed on :data:`PRODUCE_COLUMNS_FEATURE` and no record has headers, else as the list."""
    if type(records) is not OfferedColumns:
        body["records"] = records
        return
    if columns is not None and records.headers is None and features and PRODUCE_COLUMNS_FEATURE in features:
        body.pop("records", None)
        body["layout"] = PACKED_LAYOUT
        body.update((f, columns[f]) for f in LINK_FIELDS if columns.get(f) is not None)
        return
    for f in ("layout", *LINK_FIELDS):
        body.pop(f, None)
    if "records" not in body:
        body["records"] = records.rows()


__all__ = [
    "DEFAULT_WAIT_S",
    "PRODUCE_COLUMNS_FEATURE",
    "PRODUCE_FEATURE",
    "RemoteOffers",
    "new_producer_id",
    "too_old",
]
