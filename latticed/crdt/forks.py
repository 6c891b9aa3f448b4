"""Equivocation proofs: two heads signed by one owner that cannot both be true.

A single-writer log is only safe if the writer never signs two histories. When a replica sees that it
has happened, it keeps a proof anyone can check with nothing but the owner's public key, so the network
can flag the queue instead of silently picking a side (which is what CAD040's reference does).
"""

from __future__ import annotations

from dataclasses import dataclass

from latticed.crdt.core_errors import EquivocationError, IntegrityError, MalformedError
from latticed.crdt.head import SignedHead, check_name, genesis_hash, queue_id
from latticed.crdt.records import chain_fold
from latticed.crdt.signing import HASH_SIZE, blake2b

_PROOF_PERSON = b"latticed.fork.v1"


@dataclass(frozen=True, slots=True)
class Bridge:
    """Shows a head's chain value at an earlier offset: folding ``start_hash`` through ``digests`` reaches
    the head's signed ``head_hash``, so (BLAKE2b being collision resistant) the head's history passes
    through ``start_hash``."""

    start_hash: bytes
    digests: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ForkProof:
    """Heads ``a`` and ``b`` of one queue that contradict each other.

    Either the heads alone conflict (same version, non-monotone fields, different values at an offset
    both sign), or at ``offset`` their chains differ, shown by a :class:`Bridge` per head (or by the value
    the head signs at that offset directly, when its bridge is None).
    """

    owner: bytes
    name: str
    kind: int
    a: SignedHead
    b: SignedHead
    offset: int = -1
    bridge_a: Bridge | None = None
    bridge_b: Bridge | None = None

    def verify(self) -> None:
        """Raise :class:`EquivocationError` unless this really proves the owner signed two histories."""
        self._check_shape()
        qid = queue_id(self.owner, self.name, self.kind)
        try:
            self.a.verify(self.owner, qid)
            self.b.verify(self.owner, qid)
        except (IntegrityError, MalformedError) as exc:
            raise EquivocationError(f"fork proof carries a head that does not verify: {exc}") from exc
        if self.a == self.b:
            raise EquivocationError("fork proof names the same head twice")
        if self.offset < 0:
            if not heads_conflict(self.a, self.b):
                raise EquivocationError("the two heads are consistent: no fork")
            return
        value_a = _value_at(self.a, self.offset, self.bridge_a)
        value_b = _value_at(self.b, self.offset, self.bridge_b)
        if value_a == value_b:
            raise EquivocationError("both histories agree at the offset: no fork")

    def _check_shape(self) -> None:
        if not isinstance(self.owner, bytes) or len(self.owner) != 32:
            raise EquivocationError("fork proof names no valid owner key")
        try:
            check_name(self.name)
        except MalformedError as exc:
            raise EquivocationError("fork proof names no valid queue") from exc
        if not isinstance(self.kind, int) or not 0 <= self.kind < 256:
            raise EquivocationError("fork proof names no valid kind")
        if not isinstance(self.a, SignedHead) or not isinstance(self.b, SignedHead):
            raise EquivocationError("fork proof must carry two signed heads")
        if not isinstance(self.offset, int):
            raise EquivocationError("fork proof offset is not an integer")
        for bridge in (self.bridge_a, self.bridge_b):
            if bridge is None:
                continue
            # Every hash a bridge folds must be exactly HASH_SIZE bytes: H(c || d) over variable-length
            # pieces would let anyone re-split an honest chain value and "prove" a fork that never was.
            if (
                not isinstance(bridge, Bridge)
                or not isinstance(bridge.digests, tuple)
                or any(not _is_hash(h) for h in (bridge.start_hash, *bridge.digests))
            ):
                raise EquivocationError("fork proof bridge is malformed")

    def canonical(self) -> bytes:
        """Bytes that order proofs, so replicas holding different evidence keep the same one."""
        parts = [self.a.to_bytes(), self.b.to_bytes(), self.offset.to_bytes(8, "big", signed=True)]
        for bridge in (self.bridge_a, self.bridge_b):
            if bridge is not None:
                parts.append(bridge.start_hash)
                parts.extend(bridge.digests)
        return b"".join(parts)

    def digest(self) -> bytes:
        """A name for this proof in logs and status (BLAKE2b-256 of :meth:`canonical`): an operator can
        tell whether two daemons flagged a queue on the same evidence."""
        return blake2b(self.canonical(), _PROOF_PERSON)


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == HASH_SIZE


def _value_at(head: SignedHead, offset: int, bridge: Bridge | None) -> bytes:
    if bridge is None:
        value = signed_chain_values(head).get(offset)
        if value is None:
            raise EquivocationError("fork proof names an offset the head does not sign")
        return value
    if offset + len(bridge.digests) != head.end or offset < head.start:
        raise EquivocationError("bridge does not span its head")
    if chain_fold(bridge.start_hash, bridge.digests) != head.head_hash:
        raise EquivocationError("bridge does not lead to its head")
    return bridge.start_hash


def signed_chain_values(head: SignedHead) -> dict[int, bytes]:
    """The chain values a head vouches for directly: at its start and at its end."""
    return {head.start: head.base_hash, head.end: head.head_hash}


def heads_conflict(a: SignedHead, b: SignedHead) -> bool:
    """True when two heads of one queue contradict each other without looking at any entries."""
    if a == b:
        return False
    if a.version == b.version:
        return True
    lo, hi = (a, b) if a.version < b.version else (b, a)
    if lo.start > hi.start or lo.end > hi.end or lo.meta_version > hi.meta_version:
        return True
    if lo.meta_version == hi.meta_version and lo.meta_hash != hi.meta_hash:
        return True
    lo_values, hi_values = signed_chain_values(lo), signed_chain_values(hi)
    return any(hi_values.get(offset, value) != value for offset, value in lo_values.items())


def two_head_proof(owner: bytes, name: str, kind: int, x: SignedHead, y: SignedHead) -> ForkProof:
    a, b = (x, y) if x.to_bytes() <= y.to_bytes() else (y, x)
    return ForkProof(owner, name, kind, a, b)


def shared_points(proof: ForkProof) -> tuple[tuple[int, bytes], ...]:
    """Where a verified proof shows both histories holding one chain value, highest offset first: the
    offsets both sides sign (or bridge) alike, and offset 0 (every history starts from the genesis hash).
    Records below such an offset are the same in both histories; the proof's own ``offset`` shows only
    that they differ somewhere below it, so it is no such point."""
    a = _known_values(proof.a, proof.offset, proof.bridge_a)
    b = _known_values(proof.b, proof.offset, proof.bridge_b)
    points = {o: v for o, v in a.items() if b.get(o) == v}
    points.setdefault(0, genesis_hash(queue_id(proof.owner, proof.name, proof.kind)))
    return tuple(sorted(points.items(), reverse=True))


def fork_point(proof: ForkProof) -> int:
    """The highest offset below which ``proof`` shows both histories hold the same records."""
    return shared_points(proof)[0][0]


def _known_values(head: SignedHead, offset: int, bridge: Bridge | None) -> dict[int, bytes]:
    values = signed_chain_values(head)
    if bridge is not None and offset >= 0:
        values[offset] = bridge.start_hash
    return values


def better_proof(x: ForkProof | None, y: ForkProof | None) -> ForkProof | None:
    """Pick one proof deterministically, so replicas that saw different evidence still agree: the one
    with the lowest fork point (the most cautious about what both histories share), then by bytes."""
    if x is None:
        return y
    if y is None:
        return x
    return x if (fork_point(x), x.canonical()) <= (fork_point(y), y.canonical()) else y
