"""A consumer group's definition (:class:`GroupSpec`) and its signed log: the definition lives in the log's
metadata (key ``"group"``, canonical JSON), the progress in its ops (:mod:`latticed.crdt.group`).

Apart from the progress lattice because it changes for another reason: settings and their checks (what
``group create``/``edit`` accept) rather than the join.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from latticed.crdt import queue as core
from latticed.crdt.core_errors import MalformedError
from latticed.crdt.group import (
    MAX_ATTEMPTS,
    GroupProgress,
    apply_progress_ops,
    dlq_name,
    ops_from_records,
    parse_source_id,
)
from latticed.crdt.head import KIND_GROUP, MAX_NAME_BYTES, check_name
from latticed.crdt.queue import QueueState
from latticed.crdt.signing import Identity

MAX_FILTER_CHARS = 4096
SPEC_META_KEY = "group"


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A group's definition, stored in its signed log's metadata.

    Durations are seconds. ``max_attempts`` 0 never dead-letters; ``max_consumers`` and ``max_in_flight``
    (per consumer) 0 mean no cap; ``retention_s`` 0 keeps no done records (they are kept in memory, for
    inspection, at most that long). ``filter`` "" takes every record (see :mod:`latticed.leases.filters`).
    """

    name: str
    sources: tuple[str, ...]
    filter: str = ""
    max_attempts: int = 5
    visibility_s: float = 30.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0
    retention_s: float = 60.0
    max_consumers: int = 0
    max_in_flight: int = 0
    description: str = ""

    def check(self) -> None:
        check_name(self.name)
        if len(dlq_name(self.name).encode()) > MAX_NAME_BYTES:
            raise MalformedError(f"a group name is at most {MAX_NAME_BYTES - len(dlq_name(''))} bytes")
        if type(self.sources) is not tuple or not self.sources:
            raise MalformedError("a group reads one or more source queues")
        for source in self.sources:
            parse_source_id(source)
        if len(set(self.sources)) != len(self.sources):
            raise MalformedError("a group lists each source queue once")
        if not isinstance(self.filter, str) or len(self.filter) > MAX_FILTER_CHARS:
            raise MalformedError(f"a filter is text of at most {MAX_FILTER_CHARS} characters")
        if not isinstance(self.description, str) or len(self.description) > 4096:
            raise MalformedError("a description is text of at most 4096 characters")
        for name in ("max_attempts", "max_consumers", "max_in_flight"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_ATTEMPTS:
                raise MalformedError(f"{name} is an integer in [0, {MAX_ATTEMPTS}]")
        for name in ("visibility_s", "backoff_base_s", "backoff_cap_s", "retention_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise MalformedError(f"{name} is a finite number of seconds")
            if value < 0 or (name == "visibility_s" and value <= 0):
                raise MalformedError(f"{name} must be {'positive' if name == 'visibility_s' else '>= 0'}")

    def backoff(self, failures: int) -> float:
        """Retry delay after the ``failures``-th failed attempt: base * 2**(failures-1), capped."""
        if failures <= 0 or self.backoff_base_s == 0:
            return 0.0
        exponent = min(failures - 1, 63)
        return float(min(self.backoff_cap_s, self.backoff_base_s * 2.0**exponent))


_SPEC_FIELDS = (
    "name",
    "sources",
    "filter",
    "max_attempts",
    "visibility_s",
    "backoff_base_s",
    "backoff_cap_s",
    "retention_s",
    "max_consumers",
    "max_in_flight",
    "description",
)


def spec_to_meta(spec: GroupSpec) -> dict[str, str]:
    """Metadata updates that store ``spec`` (canonical JSON: sorted keys, no spaces)."""
    spec.check()
    body: dict[str, Any] = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    body["sources"] = list(spec.sources)
    body["v"] = 1
    return {SPEC_META_KEY: json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)}


def spec_from_meta(meta: Mapping[str, str]) -> GroupSpec:
    text = meta.get(SPEC_META_KEY)
    if text is None:
        raise MalformedError("not a group: its log has no 'group' metadata")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise MalformedError("group definition is not JSON") from exc
    if type(body) is not dict or body.get("v") != 1 or set(body) != {*_SPEC_FIELDS, "v"}:
        raise MalformedError(f"group definition must have exactly the fields v=1, {', '.join(_SPEC_FIELDS)}")
    if type(body["sources"]) is not list:
        raise MalformedError("group sources are a list")
    fields = {name: body[name] for name in _SPEC_FIELDS}
    fields["sources"] = tuple(body["sources"])
    spec = GroupSpec(**fields)
    spec.check()
    return spec


def create_group(identity: Identity, spec: GroupSpec, now_ms: int) -> QueueState:
    """The group's signed log: an empty ``KIND_GROUP`` queue whose metadata is the definition."""
    state = core.empty_state(identity.public_key, spec.name, KIND_GROUP)
    return core.commit(state, identity, now_ms=now_ms, meta_updates=spec_to_meta(spec))


def read_group(state: QueueState) -> tuple[GroupSpec, dict[str, GroupProgress]]:
    """A replica's (or the owner's) view of a group: its definition and the fold of the ops it holds."""
    if state.kind != KIND_GROUP:
        raise MalformedError("not a group log (wrong kind)")
    spec = spec_from_meta(state.meta_dict)
    if spec.name != state.name:
        raise MalformedError("group definition names another group")
    return spec, apply_progress_ops({}, ops_from_records(state.entries.records()))
