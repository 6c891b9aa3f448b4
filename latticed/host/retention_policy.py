"""Retention: how much of a queue is kept, and where to cut (pure: parsing, validation, the cut).

A queue's owner sets its policy; it travels in the queue's signed metadata under reserved keys, so every
replica sees it, and only the owner's daemon enforces it, with signed truncations (Kafka's
``retention.ms``/``retention.bytes``, NATS's ``MaxAge``/``MaxBytes``/``MaxMsgs``):

========================== ===================================================================
``retention.max_age_ms``   records older than this many milliseconds go (by record timestamp)
``retention.max_bytes``    at most this many bytes of records are kept, as stored (values, keys,
                           headers, timestamps, and the 32-byte chain value of each record)
``retention.max_records``  at most this many records are kept
``retention.keep_unsettled`` ``true``: never drop a record some consumer group on the enforcing
                           daemon has not settled (the cut stops at the groups' ack floor)
========================== ===================================================================

Values are text (as all metadata is): decimal integers above 0, and ``true``/``false``. Any other
``retention.*`` key is refused when set, so a typo cannot pass for a policy; a value this version cannot
read (set by hand, or by a newer version) is reported and that limit is not enforced.

A replica may keep less than the owner: its own byte cap per replicated queue (``replica_max_bytes``,
per queue by ``OWNER/NAME`` pattern in ``replica_queue_caps``) drops the oldest records there only
(:func:`latticed.crdt.queue.drop_local`); nothing is signed.

Cuts come in steps, not per commit: a byte or record limit is enforced once it is exceeded, down to
:data:`KEEP_SHARE` of it, and a cut that lands inside a stored segment moves to that segment's end when
that still keeps at least :data:`SNAP_SHARE` of the limit (whole segments are deleted, not rewritten).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from latticed.errors import MalformedError

PREFIX: Final = "retention."
MAX_AGE_KEY: Final = "retention.max_age_ms"
MAX_BYTES_KEY: Final = "retention.max_bytes"
MAX_RECORDS_KEY: Final = "retention.max_records"
KEEP_UNSETTLED_KEY: Final = "retention.keep_unsettled"
KEYS: Final = (MAX_AGE_KEY, MAX_BYTES_KEY, MAX_RECORDS_KEY, KEEP_UNSETTLED_KEY)
#: Limits are signed 64-bit, as offsets are.
MAX_LIMIT: Final = 2**63 - 1
#: A cut keeps at most this share of an exceeded byte or record limit (the step between cuts)...
KEEP_SHARE: Final = 0.95
#: ...and moves on to the end of the segment it lands in if that still keeps this share.
SNAP_SHARE: Final = 0.85

_SIZE_UNITS: Final = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_DURATION_UNITS: Final = {
    "": 1000,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 7 * 86_400_000,
}
_QUANTITY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")
_NONE = ("none", "off", "unlimited")


def _quantity(text: str, units: Mapping[str, int], what: str, example: str) -> int | None:
    if not isinstance(text, str):
        raise MalformedError(f"{what}: expected text like {example}, got {type(text).__name__}")
    if text.strip().lower() in _NONE:
        return None
    match = _QUANTITY.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in units:
        raise MalformedError(f"{what}: {text!r} is not a number with a unit like {example} (or 'none')")
    value = int(Decimal(match.group(1)) * units[unit])
    if value == 0:
        return None
    if value > MAX_LIMIT:
        raise MalformedError(f"{what}: {text!r} is too large")
    return value


def parse_size(text: str, what: str = "size") -> int | None:
    """Bytes from ``50MB`` (decimal units), ``20MiB``/``20M`` (binary), ``1000`` (bytes); None for ``none``
    or ``0`` (no limit)."""
    return _quantity(text, _SIZE_UNITS, what, "50MB, 20MiB or 1000000")


def parse_duration(text: str, what: str = "duration") -> int | None:
    """Milliseconds from ``500ms``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` or a bare number of seconds;
    None for ``none`` or ``0`` (no limit)."""
    return _quantity(text, _DURATION_UNITS, what, "7d, 12h, 30m, 90s or 500ms")


def format_size(nbytes: int | None) -> str:
    """Binary units, as ``status`` and ``doctor`` print sizes: ``20 MiB``, ``47.68 MiB`` (50MB), ``12 B``."""
    if nbytes is None:
        return "none"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            text = f"{nbytes / size:.2f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
    return f"{nbytes} B"


def format_duration(ms: int | None) -> str:
    if ms is None:
        return "none"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


# ------------------------------------------------------------------------------------------------ policy


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """A queue's retention, as its owner set it (None: no such limit)."""

    max_age_ms: int | None = None
    max_bytes: int | None = None
    max_records: int | None = None
    keep_unsettled: bool = False

    @property
    def limited(self) -> bool:
        """Whether anything is ever dropped under this policy."""
        return self.max_age_ms is not None or self.max_bytes is not None or self.max_records is not None

    def to_wire(self) -> dict[str, int | bool | None]:
        return {
            "max_age_ms": self.max_age_ms,
            "max_bytes": self.max_bytes,
            "max_records": self.max_records,
            "keep_unsettled": self.keep_unsettled,
        }


NO_POLICY: Final = RetentionPolicy()


def _limit_text(key: str, value: str) -> int:
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or value.startswith("0"):
        raise MalformedError(f"metadata {key!r}: {value!r} is not a whole number above 0")
    number = int(value)
    if number > MAX_LIMIT:
        raise MalformedError(f"metadata {key!r}: {value} is too large (at most {MAX_LIMIT})")
    return number


def check_meta_entry(key: str, value: str | None) -> None:
    """Refuse a metadata write under the reserved ``retention.`` prefix that is not a valid policy entry
    (None deletes a key, which is always allowed)."""
    if not isinstance(key, str) or not key.startswith(PREFIX) or value is None:
        return
    if key not in KEYS:
        raise MalformedError(f"unknown retention key {key!r}: the reserved keys are {', '.join(KEYS)}")
    if key == KEEP_UNSETTLED_KEY:
        if value not in ("true", "false"):
            raise MalformedError(f"metadata {key!r}: {value!r} is not 'true' or 'false'")
        return
    _limit_text(key, value)


def check_meta(meta: Mapping[str, str | None]) -> None:
    for key, value in meta.items():
        check_meta_entry(key, value)


def policy_from_meta(meta: Mapping[str, str]) -> tuple[RetentionPolicy, list[str]]:
    """The policy in a queue's metadata, and what in it could not be read (those limits are left out)."""
    problems: list[str] = []
    limits: dict[str, int | None] = {}
    for key in (MAX_AGE_KEY, MAX_BYTES_KEY, MAX_RECORDS_KEY):
        value = meta.get(key)
        limits[key] = None
        if value is not None:
            try:
                limits[key] = _limit_text(key, value)
            except MalformedError as exc:
                problems.append(str(exc))
    keep = meta.get(KEEP_UNSETTLED_KEY)
    if keep not in (None, "true", "false"):
        problems.append(f"metadata {KEEP_UNSETTLED_KEY!r}: {keep!r} is not 'true' or 'false'")
    problems += [f"unknown retention key {k!r}" for k in meta if k.startswith(PREFIX) and k not in KEYS]
    policy = RetentionPolicy(
        limits[MAX_AGE_KEY], limits[MAX_BYTES_KEY], limits[MAX_RECORDS_KEY], keep == "true"
    )
    return (NO_POLICY if policy == NO_POLICY else policy), problems


class Unchanged:
    """The "leave this limit as it is" marker of :func:`meta_updates`."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = Unchanged()


def meta_updates(
    *,
    max_age_ms: int | Unchanged | None = UNCHANGED,
    max_bytes: int | Unchanged | None = UNCHANGED,
    max_records: int | Unchanged | None = UNCHANGED,
    keep_unsettled: bool | Unchanged | None = UNCHANGED,
) -> dict[str, str | None]:
    """Metadata updates that set the given parts of a policy: a number sets a limit, None (or 0) removes
    it, :data:`UNCHANGED` leaves it; ``keep_unsettled`` False or None removes the key."""
    updates: dict[str, str | None] = {}
    for key, value in ((MAX_AGE_KEY, max_age_ms), (MAX_BYTES_KEY, max_bytes), (MAX_RECORDS_KEY, max_records)):
        if isinstance(value, Unchanged):
            continue
        if value is None or value == 0:
            updates[key] = None
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_LIMIT:
            raise MalformedError(f"{key.removeprefix(PREFIX)} must be a whole number from 1 to {MAX_LIMIT}")
        else:
            updates[key] = str(value)
    if not isinstance(keep_unsettled, Unchanged):
        if keep_unsettled not in (None, True, False):
            raise MalformedError("keep_unsettled must be true or false")
        updates[KEEP_UNSETTLED_KEY] = "true" if keep_unsettled else None
    return updates


def policy_meta(policy: RetentionPolicy) -> dict[str, str]:
    """The metadata entries of ``policy`` (for a new queue)."""
    updates = meta_updates(
        max_age_ms=policy.max_age_ms,
        max_bytes=policy.max_bytes,
        max_records=policy.max_records,
        keep_unsettled=policy.keep_unsettled,
    )
    return {key: value for key, value in updates.items() if value is not None}


# ------------------------------------------------------------------------------------------- replica caps


@dataclass(frozen=True, slots=True)
class ReplicaCaps:
    """How many bytes of each replicated queue this daemon keeps: the first ``OWNER/NAME`` glob in
    ``patterns`` that matches decides (its cap, or None: no cap), else ``default``."""

    default: int | None = None
    patterns: tuple[tuple[str, int | None], ...] = ()

    def cap_for(self, address: str) -> int | None:
        for pattern, cap in self.patterns:
            if fnmatch.fnmatchcase(address, pattern):
                return cap
        return self.default

    @property
    def any(self) -> bool:
        return self.default is not None or any(cap is not None for _, cap in self.patterns)


def parse_queue_cap(text: str) -> tuple[str, int | None]:
    """``PATTERN=SIZE`` (``SIZE`` as :func:`parse_size`, ``none`` for no cap)."""
    if not isinstance(text, str):
        raise MalformedError(f"expected 'OWNER/NAME=SIZE', got {type(text).__name__}")
    pattern, sep, size = text.rpartition("=")
    if not sep or not pattern.strip():
        raise MalformedError(f"{text!r}: expected OWNER/NAME=SIZE, e.g. '*/logs-*=100MB'")
    return pattern.strip(), parse_size(size, f"cap of {pattern.strip()!r}")


# ----------------------------------------------------------------------------------------------- the cut


@dataclass(frozen=True, slots=True)
class Extent:
    """A stored run of records ``[first, first + count)`` taking ``nbytes`` (a segment)."""

    first: int
    count: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.first + self.count


def keep_target(limit: int) -> int:
    return max(int(limit * KEEP_SHARE), 1) if limit > 1 else limit


def cut_for_bytes(newest_first: Iterable[Extent], start: int, limit: int) -> tuple[int | None, int]:
    """Where to cut so that at most :func:`keep_target` of ``limit`` bytes stay (None while ``limit``
    bytes or fewer are held), and the bytes held from there on. Reads extents from the newest back only
    until the limit is passed; ``start`` clips the oldest one (records below it are gone already)."""
    target, snap = keep_target(limit), int(limit * SNAP_SHARE)
    held = 0
    cut: int | None = None
    kept = 0
    for extent in newest_first:
        if extent.end <= start:
            break
        count = extent.end - max(extent.first, start)
        size = extent.nbytes * count // extent.count if extent.count else 0
        if cut is None and held + size > target:
            if held >= snap:
                cut, kept = extent.end, held  # the whole segment goes: nothing is rewritten
            else:
                per_record = max(size / count, 1.0)
                fits = min(int((target - held) // per_record), count)
                cut, kept = extent.end - fits, held + int(fits * per_record)
        held += size
        if held > limit and cut is not None:
            return cut, kept
    return None, held


def cut_for_records(start: int, end: int, limit: int, boundaries: Sequence[int] = ()) -> int | None:
    """Where to cut so that at most :func:`keep_target` of ``limit`` records stay (None while at most
    ``limit`` are held); moves on to a segment boundary in ``boundaries`` if that keeps enough."""
    if end - start <= limit:
        return None
    cut = end - keep_target(limit)
    latest = end - max(int(limit * SNAP_SHARE), 1)
    for boundary in boundaries:
        if cut <= boundary <= latest:
            return boundary
    return cut


def expired_prefix(first: int, timestamps: Sequence[int], cutoff_ms: int) -> int:
    """The end of the run of records from ``first`` whose timestamps are older than ``cutoff_ms`` (the
    first younger record stops it, so a clock that stepped back never makes a younger record go)."""
    for index, timestamp in enumerate(timestamps):
        if timestamp >= cutoff_ms:
            return first + index
    return first + len(timestamps)


__all__ = [
    "KEEP_UNSETTLED_KEY",
    "KEYS",
    "MAX_AGE_KEY",
    "MAX_BYTES_KEY",
    "MAX_RECORDS_KEY",
    "NO_POLICY",
    "PREFIX",
    "UNCHANGED",
    "Extent",
    "ReplicaCaps",
    "RetentionPolicy",
    "check_meta",
    "check_meta_entry",
    "cut_for_bytes",
    "cut_for_records",
    "expired_prefix",
    "format_duration",
    "format_size",
    "keep_target",
    "meta_updates",
    "parse_duration",
    "parse_queue_cap",
    "parse_size",
    "policy_from_meta",
    "policy_meta",
]
