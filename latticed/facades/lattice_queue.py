"""``LatticeQueue``: CAD040's API over the pure signed queue lattice.

The facade owns two things the pure core must not: a clock (``clock`` returns epoch ms; inject one in
tests) and a buffer of offered-but-unsigned records, so a burst of ``offer`` calls costs one signature
when the state is next observed (``state``, ``commit()``, ``sync()``) instead of one per record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Self

from latticed.crdt import queue as core
from latticed.crdt.core_errors import GapError, MalformedError, NotOwnerError
from latticed.crdt.forks import ForkProof
from latticed.crdt.queue import QueueDelta, QueueState, Summary
from latticed.crdt.records import MAX_OFFSET, Record, RecordRun, check_records, make_record
from latticed.crdt.signing import Identity
from latticed.process.clock import Clock, wall_ms

HeadersArg = Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]] | None


class LatticeQueue:
    """A queue you own (``create``) or a read-and-merge replica of someone else's (``replica``)."""

    def __init__(self, state: QueueState, identity: Identity | None = None, clock: Clock = wall_ms):
        self._state = state
        self._identity = identity if identity is not None and identity.public_key == state.owner else None
        self._clock = clock
        self._pending: list[Record] = []
        self._parent: LatticeQueue | None = None
        #: The parent's state when this fork was made (or last synced): what "the parent moved" is against.
        self._base: QueueState | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, identity: Identity, name: str, clock: Clock = wall_ms) -> Self:
        return cls(core.empty_state(identity.public_key, name), identity, clock)

    @classmethod
    def replica(cls, state: QueueState, clock: Clock = wall_ms) -> Self:
        """A read-and-merge view of a queue whose key we do not hold.

        ``state`` is foreign, so it is verified (merged into an empty replica), like any other merge."""
        if not isinstance(state, QueueState):
            raise MalformedError(f"not a queue state: {type(state).__name__}")
        empty = core.empty_state(state.owner, state.name, state.kind)
        return cls(core.merge(empty, state), None, clock)

    @classmethod
    def empty_replica(cls, owner: bytes, name: str, clock: Clock = wall_ms) -> Self:
        return cls(core.empty_state(owner, name), None, clock)

    # ------------------------------------------------------------------ identity
    @property
    def owner(self) -> bytes:
        return self._state.owner

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def is_owner(self) -> bool:
        return self._identity is not None

    def _require_owner(self, what: str) -> Identity:
        if self._identity is None:
            raise NotOwnerError(
                f"cannot {what}: not the owner of {self._state.owner.hex()}/{self._state.name}"
            )
        return self._identity

    # ------------------------------------------------------------------ producer
    def offer(self, value: bytes | str, key: bytes | str | None = None, headers: HeadersArg = None) -> int:
        """Append a record (CAD040's three forms by keyword) and return its absolute offset."""
        self._require_owner("offer")
        if not self._state.complete:
            # Buffering would hand out offsets the owner already assigned, and the commit would then fail
            # and lose the record: refuse now, before anything is promised.
            raise GapError("owner state is missing records (merge the rest first); it cannot offer")
        record = make_record(value, key=key, headers=headers, timestamp=self._clock())
        self._check_room(1)
        self._pending.append(record)
        return self._state.held_end + len(self._pending) - 1

    def offer_many(self, records: Iterable[Record]) -> range:
        """Append already-built records in one signed batch; returns their offsets.

        The batch is checked whole before anything is signed (a bad record raises
        :class:`MalformedError` and changes nothing); an empty batch is a no-op, not a new head."""
        identity = self._require_owner("offer")
        if type(records) is RecordRun:
            batch: Sequence[Record] = records
        else:
            try:
                batch = list(records)
            except TypeError as exc:
                raise MalformedError(
                    f"records must be an iterable of Record, not {type(records).__name__}"
                ) from exc
        check_records(batch)
        if not batch:
            return range(self.end_offset, self.end_offset)
        self._check_room(len(batch))
        self.commit()
        first = self._state.held_end
        self._state = core.commit(self._state, identity, now_ms=self._clock(), records=batch)
        return range(first, first + len(batch))

    def _check_room(self, count: int) -> None:
        """Refuse records that would pass the last offset before promising them an offset: a buffered
        offer the commit then refused would be lost after it was acknowledged."""
        if self.end_offset + count > MAX_OFFSET:
            raise MalformedError(
                f"queue {self._state.owner.hex()}/{self._state.name} is full: offsets stop at {MAX_OFFSET} "
                f"and it ends at {self.end_offset}; {count} more record(s) do not fit"
            )

    def commit(self) -> QueueState:
        """Sign a head over everything offered since the last commit (a no-op if nothing is pending).

        The pending records are dropped only once signed: a commit that raises keeps them, so an offset
        :meth:`offer` returned still holds its record."""
        if self._pending:
            identity = self._require_owner("offer")
            self._state = core.commit(self._state, identity, now_ms=self._clock(), records=self._pending)
            self._pending = []
        return self._state

    def truncate(self, new_start: int) -> None:
        """Advance the start offset (monotone; ``<= start`` is a no-op; may jump past the end)."""
        identity = self._require_owner("truncate")
        if type(new_start) is not int:
            raise MalformedError(f"an offset is an integer, not {type(new_start).__name__}")
        self.commit()
        if new_start > self._state.start:
            self._state = core.commit(self._state, identity, now_ms=self._clock(), new_start=new_start)

    def set_meta(self, key: str, value: str | None) -> None:
        """Set a metadata value; values are strings (anything else is a MalformedError, never converted),
        None deletes the key."""
        identity = self._require_owner("set metadata")
        self.commit()
        self._state = core.commit(self._state, identity, now_ms=self._clock(), meta_updates={key: value})

    def del_meta(self, key: str) -> bool:
        """Delete a metadata key; returns whether it was set (a key that is not set signs nothing)."""
        self._require_owner("set metadata")
        if key not in self._state.meta_dict:
            return False
        self.set_meta(key, None)
        return True

    def get_meta(self, key: str) -> str | None:
        return self._state.meta_dict.get(key)

    @property
    def meta(self) -> dict[str, str]:
        """All metadata, as a new dict (changing it changes nothing: use set_meta and del_meta)."""
        return self._state.meta_dict

    # ------------------------------------------------------------------ consumer
    def peek_entry(self, offset: int) -> Record | None:
        if self._state.forked and offset >= self._state.visible_end:
            return None  # a forked queue stops where this replica stands: nothing past it is read
        record = self._state.record_at(offset)
        if record is None and self._pending:
            index = offset - self._state.held_end
            if 0 <= index < len(self._pending):
                return self._pending[index]
        return record

    def peek(self, offset: int) -> bytes | None:
        record = self.peek_entry(offset)
        return None if record is None else record.value

    def peek_first_entry(self) -> Record | None:
        return self.peek_entry(self.start_offset)

    def peek_last_entry(self) -> Record | None:
        return self.peek_entry(self.end_offset - 1) if not self.is_empty else None

    def peek_first(self) -> bytes | None:
        return self.peek(self.start_offset)

    def peek_last(self) -> bytes | None:
        return self.peek(self.end_offset - 1) if not self.is_empty else None

    def range_entries(self, from_offset: int, to_offset: int) -> list[Record]:
        """Records in ``[from, to]`` (inclusive both ends), clamped to what is present."""
        lo = max(from_offset, self.start_offset)
        hi = min(to_offset, self.end_offset - 1)
        out: list[Record] = []
        for offset in range(lo, hi + 1):
            record = self.peek_entry(offset)
            if record is not None:
                out.append(record)
        return out

    def range(self, from_offset: int, to_offset: int) -> list[bytes]:
        return [r.value for r in self.range_entries(from_offset, to_offset)]

    @property
    def start_offset(self) -> int:
        return self._state.start

    @property
    def end_offset(self) -> int:
        if self._state.forked:
            return self._state.visible_end
        return self._state.held_end + len(self._pending)

    @property
    def size(self) -> int:
        return self.end_offset - self.start_offset

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    # ------------------------------------------------------------------ lattice
    @property
    def state(self) -> QueueState:
        """The current immutable, signed value (signs pending offers first)."""
        return self.commit()

    def summary(self) -> Summary:
        return self.state.summary()

    def delta(self, since: Summary | None = None, max_records: int | None = None) -> QueueDelta:
        return core.delta(self.state, since, max_records)

    def merge(self, incoming: QueueState | QueueDelta) -> None:
        """Verify then join a received state or delta; forged input raises and changes nothing."""
        self.commit()
        self._state = core.merge(self._state, incoming)

    @property
    def forked(self) -> bool:
        return self._state.forked

    @property
    def equivocation(self) -> ForkProof | None:
        return self._state.fork

    def fork(self) -> LatticeQueue:
        """An independent working copy; ``sync()`` brings its changes back (CAD035 cursor semantics)."""
        state = self.commit()
        child = LatticeQueue(state, self._identity, self._clock)
        child._parent = self
        child._base = state
        return child

    def sync(self) -> None:
        """Merge this fork back into its parent.

        If the parent's value did not change since the fork, it adopts the fork's state wholesale.
        Otherwise: for a replica the two states join; for an owned queue the fork's changes since the fork
        are re-applied on the parent, because signing two histories with one key would be an
        equivocation: its new records are re-offered (new offsets), its truncation is applied to the
        records it shared with the parent (a skip past the end is not replayed: the parent has assigned
        those offsets), and the metadata keys it set or deleted are set or deleted.
        """
        parent, base = self._parent, self._base
        if parent is None or base is None:
            raise NotOwnerError("sync() is for queues made by fork()")
        state = self.commit()
        parent_state = parent.commit()
        if parent_state == base:
            parent._state = state
        elif self._identity is None:
            parent._state = core.merge(parent_state, state)
        else:
            shared_end = base.held_end
            new_records = state.entries.records(max(shared_end - state.start, 0))
            new_start = min(state.start, shared_end)
            before, after = base.meta_dict, state.meta_dict
            updates = {k: after.get(k) for k in before.keys() | after.keys() if after.get(k) != before.get(k)}
            if new_records or new_start > parent_state.start or updates:
                parent._state = core.commit(
                    parent_state,
                    self._identity,
                    now_ms=self._clock(),
                    records=new_records,
                    new_start=new_start,
                    meta_updates=updates,
                )
        self._base = self._state = parent._state
