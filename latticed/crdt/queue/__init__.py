"""The signed single-writer queue lattice (CAD040 + CAD038, single writer).

A :class:`QueueState` is an immutable value:

* ``head``: the newest owner-signed head we know; it vouches for ``start`` (truncation), metadata and
  the queue's true end.
* the entries we hold, ``[start, held_end)``, whose chain value at ``held_end`` is vouched by ``tip``
  (a signed head ending there). A replica that is mid-catch-up holds a verified prefix (``tip`` older than
  ``head``); an owner or a caught-up replica has ``tip == head``.
* ``checkpoints``: older signed heads inside the held range, kept so a backlog can be cut into chunks that
  each verify on their own.
* ``fork``: a proof that the owner signed two histories, once one is seen.
* ``floor``: a replica's own low-watermark (0: none). A replica that keeps less than the owner drops its
  oldest records locally (:func:`drop_local`); it then holds ``[floor, held_end)``, which still verifies
  on its own: the chain value at ``floor`` (``floor_hash``) folds through the kept records to the signed
  head at ``held_end``. The floor is this replica's choice, not the owner's: no head says it, no delta
  carries it, and a join never brings back records below it. A delta cut from such a replica never
  passes the kept suffix off as the whole queue: it starts at the floor, and a peer it cannot extend gets
  the head without records (it must find them where they are whole). Summaries say where the records
  start (``Summary.floor``).

The join takes the newest head (by version, signature as tie-break), the longest verified prefix, and the
union of checkpoints; it is commutative, associative and idempotent for every honest history (property
tested). When the owner equivocates, the queue stops where each replica stands: the join flags it forked,
keeps a :class:`ForkProof` anyone can check and merges nothing more, and reads stop at
:attr:`QueueState.visible_end` (its owner recovers it on fork core 2).

Every function here is pure: clocks come in as ``now_ms`` arguments. The package is split by job: the
value and what travels (:mod:`.state`), the holder's own changes (:mod:`.commit`), cutting and verifying
deltas (:mod:`.deltas`) and the join (:mod:`.lattice_join`); the record and chain primitives they build on
are :mod:`latticed.crdt.records`. Import the names from here.
"""

from __future__ import annotations

from latticed.crdt.queue.commit import CHECKPOINT_BYTES, commit, drop_local
from latticed.crdt.queue.deltas import RecordReader, VerifiedDelta, delta, payload_bytes, verify_delta
from latticed.crdt.queue.lattice_join import join_verified, merge
from latticed.crdt.queue.state import Entries, EntryView, Meta, QueueDelta, QueueState, Summary, empty_state

__all__ = [
    "CHECKPOINT_BYTES",
    "Entries",
    "EntryView",
    "Meta",
    "QueueDelta",
    "QueueState",
    "RecordReader",
    "Summary",
    "VerifiedDelta",
    "commit",
    "delta",
    "drop_local",
    "empty_state",
    "join_verified",
    "merge",
    "payload_bytes",
    "verify_delta",
]
