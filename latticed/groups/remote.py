"""Work queues across the mesh: a worker's daemon forwards lease operations to the group's owner.

The daemon that owns a group stays the only one that grants its leases. A worker on another daemon uses
the same calls as a local one (``dequeue``, ``subscribe``, ``ack``, ...); its daemon sends them to the
owner over the authenticated replication link (:mod:`latticed.net.leasing`, dialling the owner when no
link is up) and hands the owner's answers back.

* **Owner side** (:mod:`latticed.groups.lease_server`): answers those requests for the groups it runs,
  with a per-group allow-list of remote identities (metadata ``remote_consumers`` of the group's signed
  log: absent, any peer with the network key; a JSON list of identities, only those), checked against
  the link's authenticated identity.
* **Worker side**: :class:`RemoteGroups` forwards. A lease names queue and offset; the worker's daemon
  reads the record from its own replica (verified against the queue owner's signature) and the owner
  sends the payload only for records the worker's daemon said it does not hold yet (its held ends per
  source travel with each request). The owner never sends records of sealed queues: the worker's daemon
  must hold them and be a reader (it waits briefly for them to replicate).

Faults: no link and none can be dialled within the call's time: :class:`OwnerUnreachableError` (a
blocking ``dequeue`` waits its ``wait`` for the owner first). A link that drops while an ack or nack is
on its way: the call is sent again over the next link, flagged as a retry, and the owner answers a
retried settlement it already made with the answer it gave (so an ack is not reported stale because its
first answer was lost); a lease the owner no longer holds fails as stale (:class:`LeaseError`).

Why one module: :class:`RemoteGroups` is one object whose state (the links to owners, the leases forwarded
through them and who holds each) every forwarded op reads and updates; its helpers only convert the owner's
answers.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import trio

from latticed.crdt.group import dlq_name, parse_source_id, source_id
from latticed.crdt.group_spec import spec_from_meta
from latticed.crdt.head import KIND_GROUP, KIND_QUEUE
from latticed.crdt.signing import parse_public_key
from latticed.errors import (
    IntegrityError,
    LatticedError,
    MalformedError,
    NotReaderError,
)
from latticed.groups.group_ports import GroupStore
from latticed.groups.group_sources import find_source, held
from latticed.net.background import Background
from latticed.net.leasing import LeaseLinks, LinkLostError
from latticed.process.logs import get_logger, log_event
from latticed.storage.reader import Columns
from latticed.storage.sealer import Sealer

log = get_logger(__name__)

#: Metadata key of a group log holding its remote-consumer allow-list (JSON list of identities).
REMOTE_META_KEY: Final = "remote_consumers"
#: How long a call that does not wait for records waits for a link to the owner.
CONNECT_WITHIN_S: Final = 5.0
#: How long the owner may take to answer, on top of the time a call waits for records there.
ANSWER_WITHIN_S: Final = 5.0
#: An ack or nack whose link dropped is sent again until this long after it was first sent.
SETTLE_WITHIN_S: Final = 8.0
#: How long ``group stats``/``group list`` wait for the owner's live counts before showing the replica's.
STATS_WITHIN_S: Final = 2.0
#: A sealed record the worker's daemon does not hold yet: how long it waits for it to replicate.
REPLICA_WAIT_S: Final = 5.0
#: Leases one answer carries at most (a caller wanting more asks again).
MAX_TAKE: Final = 1000
#: Records read at once when a lease's record is read here (the next leases' usually follow it).
READ_AHEAD_RECORDS: Final = 1024
READ_AHEAD_BYTES: Final = 4 << 20


# ------------------------------------------------------------------------------------- the allow-list


def remote_policy(meta: Mapping[str, str]) -> frozenset[bytes] | None:
    """The identities a group takes remote consumers from (None: any peer with the network key)."""
    text = meta.get(REMOTE_META_KEY)
    if text is None:
        return None
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise MalformedError(f"{REMOTE_META_KEY} is not JSON") from exc
    if type(items) is not list:
        raise MalformedError(f"{REMOTE_META_KEY} is a list of identities")
    return frozenset(parse_public_key(item) for item in items)


def policy_meta(allowed: Iterable[str] | None) -> dict[str, str | None]:
    """The metadata update that stores an allow-list (None: any peer, the key removed)."""
    if allowed is None:
        return {REMOTE_META_KEY: None}
    keys = sorted({parse_public_key(a).hex() for a in allowed})
    return {REMOTE_META_KEY: json.dumps(keys, separators=(",", ":"))}


def describe_policy(policy: frozenset[bytes] | None) -> str | list[str]:
    return "any" if policy is None else sorted(k.hex() for k in policy)


def consumer_prefix(peer: bytes) -> str:
    return peer.hex()[:16] + "/"


def record_wire(
    key: bytes | None,
    value: bytes,
    timestamp: int,
    headers: Iterable[tuple[str, bytes]] | Iterable[list[Any]],
) -> list[Any]:
    return [key, value, timestamp, [[k, v] for k, v in headers] or None]


# ----------------------------------------------------------------------------------------- worker side


@dataclass(frozen=True, slots=True)
class RemoteGroup:
    """A group another daemon owns, as a worker names it."""

    owner: bytes
    name: str

    @property
    def address(self) -> str:
        return f"{self.owner.hex()}/{self.name}"


class RemoteGroups(Background):
    """Forwards lease operations on other daemons' groups to their owners (see the module docstring).
    Run :meth:`run` in a nursery: leases granted to callers that left are given back from there."""

    def __init__(self, engine: GroupStore, links: LeaseLinks, sealer: Sealer) -> None:
        self.engine = engine
        self.sealer = sealer
        self.links = links
        self._sources: dict[str, set[str]] = {}
        self._spec_versions: dict[str, int] = {}
        #: Per source, the last records read ahead: (first offset, records; None where unreadable).
        self._ahead: dict[str, tuple[int, list[list[Any] | None]]] = {}
        super().__init__("lease forwarding is not running")

    def target(self, address: str) -> RemoteGroup | None:
        """The group named ``address`` if another daemon owns it (None: ours)."""
        owner, name = self.engine.parse_address(address)
        return None if owner == self.engine.public_key else RemoteGroup(owner, name)

    def connected(self, group: RemoteGroup) -> bool:
        return self.links.connected(group.owner)

    async def call(
        self,
        group: RemoteGroup,
        op: str,
        body: Mapping[str, Any],
        *,
        wait: float = 0.0,
        connect_within: float = CONNECT_WITHIN_S,
        give_back: bool = False,
    ) -> dict[str, Any]:
        """One forwarded op (``wait``: how long the owner may hold it for records)."""
        return await self.links.call(
            group.owner,
            op,
            {**body, "group": group.name},
            timeout=wait + ANSWER_WITHIN_S,
            connect_within=connect_within,
            give_back=self._giver(group) if give_back else None,
        )

    # ------------------------------------------------------------------ leases
    async def take(
        self,
        group: RemoteGroup,
        consumer: str,
        n: int,
        visibility: float | None,
        wait: float | None,
        *,
        op: str = "take",
    ) -> list[dict[str, Any]]:
        """Lease up to ``n`` records (``op`` "dequeue": one, with the local dequeue's cap errors), waiting
        up to ``wait`` seconds for the owner and then for records; leases as the local API sends them."""
        deadline = trio.current_time() + (wait or 0.0)
        while True:
            remaining = max(0.0, deadline - trio.current_time())
            await self.links.wait_link(group.owner, remaining if wait else CONNECT_WITHIN_S)
            remaining = max(0.0, deadline - trio.current_time())
            body: dict[str, Any] = {
                "consumer": consumer,
                "visibility": visibility,
                "wait": remaining,
                "have": self._have(group),
            }
            if op == "take":
                body["n"] = n
            try:
                answer = await self.call(group, op, body, wait=remaining, connect_within=0, give_back=True)
            except LinkLostError:
                if trio.current_time() < deadline:
                    continue  # what the owner granted over the lost link expires there
                raise
            leases, failures = await self.materialize(group, answer.get("leases") or [])
            if failures and not leases and op == "dequeue":
                raise failures[0]
            return leases

    async def claim(
        self, group: RemoteGroup, consumer: str, min_idle: float, count: int, visibility: float | None
    ) -> list[dict[str, Any]]:
        """Take over idle leases of the group at its owner (see ``claim`` there)."""
        body = {
            "consumer": consumer,
            "min_idle": min_idle,
            "count": count,
            "visibility": visibility,
            "have": self._have(group),
        }
        answer = await self.call(group, "claim", body, give_back=True)
        leases, _ = await self.materialize(group, answer.get("leases") or [])
        return leases

    async def settle(self, group: RemoteGroup, op: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """An ack or nack (or any op safe to repeat): sent again over the next link when the link drops
        before the answer, for up to :data:`SETTLE_WITHIN_S`."""
        deadline = trio.current_time() + SETTLE_WITHIN_S
        retry = False
        while True:
            within = max(deadline - trio.current_time(), 0.001)
            try:
                return await self.call(group, op, {**body, "retry": retry}, connect_within=within)
            except LinkLostError:
                if trio.current_time() >= deadline:
                    raise
                retry = True

    async def ack_many(
        self, group: RemoteGroup, tokens: list[str], *, brief: bool = False
    ) -> list[dict[str, Any]]:
        """Ack several leases in one request; per lease ``{"ok": True, ...}`` or ``{"ok": False,
        "error": {...}}`` (``brief``: successes are only ``{"ok": True}``, the caller knows the rest)."""
        answer = await self.settle(group, "ack", {"leases": tokens, "brief": brief})
        if brief:
            out: list[dict[str, Any]] = [{"ok": True} for _ in tokens]
            failed = answer.get("failed")
            if type(failed) is not list:
                raise MalformedError("the owner's answer to ack is malformed")
            for item in failed:
                if type(item) is not list or len(item) != 3 or type(item[0]) is not int:
                    raise MalformedError("the owner's answer to ack is malformed")
                if 0 <= item[0] < len(tokens):
                    out[item[0]] = {"ok": False, "error": {"code": str(item[1]), "message": str(item[2])}}
            return out
        results = answer.get("results")
        if type(results) is not list or len(results) != len(tokens):
            raise MalformedError("the owner's answer to ack does not match the request")
        return results

    def give_back(self, group: RemoteGroup, tokens: list[str]) -> None:
        """Hand leases back to the owner in the background (their callers are gone)."""
        if tokens and self._nursery is not None:
            self._nursery.start_soon(self._give_back, group, tokens)

    async def _give_back(self, group: RemoteGroup, tokens: list[str]) -> None:
        try:
            await self.call(group, "give_back", {"leases": tokens}, connect_within=0)
        except LatticedError as exc:  # they expire at the owner instead
            log_event(log, "group.give_back_failed", level=logging.INFO, group=group.address, error=str(exc))

    def _giver(self, group: RemoteGroup) -> Callable[[dict[str, Any]], None]:
        def give(answer: dict[str, Any]) -> None:
            leases = answer.get("leases")
            if type(leases) is list:
                self.give_back(group, [g["lease"] for g in leases if isinstance(g, dict) and "lease" in g])

        return give

    # ------------------------------------------------------------------ payloads
    def _known_sources(self, group: RemoteGroup) -> set[str]:
        """The group's sources as far as this daemon knows: its replica of the group log's definition,
        and the queues of leases seen."""
        known = self._sources.setdefault(group.address, set())
        q = self.engine.find(group.owner, group.name, KIND_GROUP)
        if q is not None:
            state = self.engine.state(q)
            version = state.head.meta_version if state.head is not None else -1
            if self._spec_versions.get(group.address) != version:
                self._spec_versions[group.address] = version
                with contextlib.suppress(LatticedError):
                    known.update(spec_from_meta(state.meta_dict).sources)
                    known.add(source_id(group.owner, dlq_name(group.name)))
        return known

    def _have(self, group: RemoteGroup) -> dict[str, int]:
        """How far this daemon holds the group's sources (the owner sends the records past that)."""
        have = {}
        for sid in self._known_sources(group):
            owner, name = parse_source_id(sid)
            q = find_source(self.engine, owner, name)
            if q is not None:
                have[sid] = held(self.engine, q)[1]
        return have

    def _signed_sources(self, group: RemoteGroup) -> frozenset[str] | None:
        """The group's sources and DLQ as its signed definition (this daemon's replica of the group log)
        names them; None while that has not replicated here (or does not parse)."""
        q = self.engine.find(group.owner, group.name, KIND_GROUP)
        if q is None:
            return None
        try:
            sources = spec_from_meta(self.engine.state(q).meta_dict).sources
        except LatticedError:
            return None
        return frozenset((*sources, source_id(group.owner, dlq_name(group.name))))

    def _held(self, sid: str) -> tuple[int, int, int, bool] | None:
        """The stored queue behind ``sid`` here: (q, start, held end, sealed); None if not held."""
        owner, name = parse_source_id(sid)
        q = find_source(self.engine, owner, name)
        if q is None:
            return None
        start, end = held(self.engine, q)
        return q, start, end, self.sealer.sealing(q) is not None

    def _check_source(self, group: RemoteGroup, sid: str, signed: frozenset[str] | None) -> None:
        """A grant may name only a source of the group (the owner could otherwise have this daemon open
        a sealed queue it reads for some other group); without the definition here, never a sealed one."""
        if signed is not None:
            if sid not in signed:
                raise IntegrityError(
                    f"the owner of group {group.address} granted a lease on {sid}, which is not one of the "
                    "group's sources (its signed definition)"
                )
            return
        held = self._held(sid)
        if held is not None and held[3]:
            raise NotReaderError(
                f"the definition of group {group.address} has not replicated here: a lease on the sealed "
                f"queue {sid} is not opened before it shows that the group consumes it"
            )

    async def materialize(
        self, group: RemoteGroup, grants: list[Any]
    ) -> tuple[list[dict[str, Any]], list[LatticedError]]:
        """The owner's grants as client leases. The record is this daemon's verified copy whenever it
        holds it (a payload the owner sent for it is ignored); the owner's payload serves only records
        not held here, and never those of a sealed queue. A grant that fails its checks (malformed, or a
        queue that is not the group's) or whose record cannot be had is given back; its error is
        returned."""
        out: list[dict[str, Any] | None] = []
        needed: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        failures: list[LatticedError] = []
        signed = self._signed_sources(group)
        for grant in grants:
            try:
                _check_grant(group, grant)
                self._check_source(group, grant["queue"], signed)
            except LatticedError as exc:
                token = grant.get("lease") if isinstance(grant, dict) else None
                self._refused(group, grant if isinstance(token, str) else None, exc, failures)
                continue
            sid = grant["queue"]
            self._sources.setdefault(group.address, set()).add(sid)
            out.append(None)
            needed.setdefault(sid, []).append((len(out) - 1, grant))
        for sid, items in needed.items():
            held = self._held(sid)
            sealed = held is not None and held[3]
            here = [g["offset"] for _, g in items if held is not None and held[1] <= g["offset"] < held[2]]
            found = await self._read_local(sid, here) if here else {}
            for index, grant in items:
                record, source = found.get(grant["offset"]), "replica"
                try:
                    if record is None:
                        inline = grant.get("record")
                        if inline is not None and not sealed and not grant.get("sealed"):
                            record, source = inline, "owner"
                        else:
                            record, source = await self._missing(group, sid, grant, sealed)
                    out[index] = _client_lease(group, grant, record, source)
                except LatticedError as exc:
                    self._refused(group, grant, exc, failures)
        return [lease for lease in out if lease is not None], failures

    def _refused(
        self,
        group: RemoteGroup,
        grant: dict[str, Any] | None,
        exc: LatticedError,
        failures: list[LatticedError],
    ) -> None:
        """A grant that cannot be handed to the worker: give its lease back (if it names one), log."""
        failures.append(exc)
        if grant is not None:
            self.give_back(group, [grant["lease"]])
        log_event(
            log,
            "group.remote_grant_refused",
            level=logging.WARNING,
            group=group.address,
            queue=str(grant.get("queue"))[:300] if grant is not None else None,
            offset=grant.get("offset") if grant is not None else None,
            error=str(exc),
        )

    async def _read_local(self, sid: str, offsets: list[int]) -> dict[int, list[Any]]:
        """The records at ``offsets`` of ``sid`` this daemon holds (and can open), by offset.

        Reads run ahead (:data:`READ_AHEAD_RECORDS`) and the last run per source is kept: leases come in
        offset order a few at a time, and the store decodes a whole segment for each read."""
        owner, name = parse_source_id(sid)
        q = find_source(self.engine, owner, name)
        if q is None or not all(type(o) is int and o >= 0 for o in offsets):
            return {}
        found: dict[int, list[Any]] = {}
        for offset in sorted(set(offsets)):
            ahead = self._ahead.get(sid)
            if ahead is None or not ahead[0] <= offset < ahead[0] + len(ahead[1]):
                ahead = await self._read_ahead(q, sid, offset)
            record = ahead[1][offset - ahead[0]] if ahead[0] <= offset < ahead[0] + len(ahead[1]) else None
            if record is not None:
                found[offset] = record
        return found

    async def _read_ahead(self, q: int, sid: str, lo: int) -> tuple[int, list[list[Any] | None]]:
        columns: Columns = await self.engine.read(
            q, lo, lo + READ_AHEAD_RECORDS, READ_AHEAD_RECORDS, READ_AHEAD_BYTES
        )
        try:  # a sealed queue: what this identity can open, up to the first record it cannot
            columns = self.sealer.open_columns(q, columns, partial=True)
        except NotReaderError:
            columns = Columns()
        records: list[list[Any] | None] = [
            [key, value, ts, hdr or None]
            for key, value, ts, hdr in zip(
                columns.keys, columns.values, columns.timestamps, columns.headers, strict=True
            )
        ]
        first = columns.offsets[0] if columns.offsets else lo
        if columns.offsets and columns.offsets[-1] - first + 1 != len(records):  # not contiguous: by offset
            by_offset = dict(zip(columns.offsets, records, strict=True))
            records = [by_offset.get(o) for o in range(first, columns.offsets[-1] + 1)]
        ahead = self._ahead[sid] = (first, records)
        return ahead

    async def _missing(
        self, group: RemoteGroup, sid: str, grant: dict[str, Any], sealed_here: bool
    ) -> tuple[list[Any], str]:
        """A record this daemon lacks: the owner sends it, or (sealed, as the owner or this daemon's
        replica says) it must replicate here first."""
        offset = grant["offset"]
        if not grant.get("sealed") and not sealed_here:
            answer = await self.call(group, "fetch", {"lease": grant["lease"]})
            record = answer.get("record")
            if type(record) is not list or len(record) != 4:
                raise MalformedError("the owner's record is [key, value, timestamp, headers]")
            return record, "owner"
        owner, name = parse_source_id(sid)
        q = self.engine.find(owner, name, KIND_QUEUE)
        if q is not None:
            with trio.move_on_after(REPLICA_WAIT_S):
                await self.engine.wait_past(q, offset)
        found = await self._read_local(sid, [offset])
        if offset not in found:
            raise NotReaderError(
                f"record {offset} of the sealed queue {sid} is not here or this daemon is not a reader of it"
            )
        return found[offset], "replica"


_GRANT_FIELDS: Final = {
    "queue": str,
    "offset": int,
    "lease": str,
    "attempt": int,
    "consumer": str,
    "correlation_id": str,
    "leased_at": float,
    "expires_at": float,
}


#: Source ids already checked (grants name the same few over and over).
_CHECKED_SOURCES: set[str] = set()


def _check_grant(group: RemoteGroup, grant: Any) -> None:
    """An owner's grant has the fields a client lease needs, with the right types (IntegrityError: the
    owner sent something this daemon will not hand to a worker)."""
    if not isinstance(grant, dict):
        raise IntegrityError(f"the owner of group {group.address} sent a malformed grant (not a map)")
    for name, kind in _GRANT_FIELDS.items():
        value = grant.get(name)
        ok = (
            isinstance(value, int | float) and not isinstance(value, bool)
            if kind is float
            else type(value) is kind
        )
        if not ok:
            raise IntegrityError(f"the owner of group {group.address} sent a grant without a proper {name!r}")
    if grant["offset"] < 0 or len(grant["lease"]) > 1024 or len(grant["consumer"]) > 1024:
        raise IntegrityError(f"the owner of group {group.address} sent a grant out of bounds")
    queue = grant["queue"]
    if queue not in _CHECKED_SOURCES:
        try:
            parse_source_id(queue)
        except LatticedError as exc:
            raise IntegrityError(f"the owner of group {group.address} sent a grant naming no queue") from exc
        if len(_CHECKED_SOURCES) < 4096:
            _CHECKED_SOURCES.add(queue)


def _client_lease(group: RemoteGroup, grant: dict[str, Any], record: Any, source: str) -> dict[str, Any]:
    """A lease as the local API sends it; ``payload_from`` says where its record came from: "replica"
    (this daemon's copy, verified against its queue owner's signature) or "owner" (sent by the group's
    owner, which vouches for it)."""
    if type(record) is not list or len(record) != 4:
        raise IntegrityError(
            f"the owner of group {group.address} sent a record that is not [key, value, ts, headers]"
        )
    key, value, timestamp, headers = record
    if (
        not isinstance(value, bytes)
        or not (key is None or isinstance(key, bytes))
        or type(timestamp) is not int
    ):
        raise IntegrityError(f"the owner of group {group.address} sent a record of the wrong types")
    if headers is not None and not (
        type(headers) in (list, tuple)
        and all(
            type(h) in (list, tuple) and len(h) == 2 and isinstance(h[0], str) and isinstance(h[1], bytes)
            for h in headers
        )
    ):
        raise IntegrityError(
            f"the owner of group {group.address} sent a record whose headers are not [name, bytes] pairs"
        )
    return {
        "group": group.address,
        "queue": grant["queue"],
        "offset": grant["offset"],
        "lease": grant["lease"],
        "attempt": grant["attempt"],
        "consumer": grant["consumer"],
        "correlation_id": grant["correlation_id"],
        "key": key,
        "value": value,
        "timestamp": timestamp,
        "headers": headers or None,
        "leased_at": grant["leased_at"],
        "expires_at": grant["expires_at"],
        "payload_from": source,
    }


__all__ = [
    "ANSWER_WITHIN_S",
    "CONNECT_WITHIN_S",
    "REMOTE_META_KEY",
    "RemoteGroup",
    "RemoteGroups",
    "consumer_prefix",
    "record_wire",
    "describe_policy",
    "policy_meta",
    "remote_policy",
]
