"""What the local API's server side needs from the rest of the daemon, as narrow Protocols.

The handlers see the store as an :class:`ApiStore` (the daemon passes its
:class:`~latticed.storage.engine.Engine`), replication as a :class:`ReplicationView` and network
membership as a :class:`MembershipView`; none of them imports the classes behind these. A name appears
here only if a handler uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from latticed.crdt import kv
from latticed.crdt.head import KIND_QUEUE
from latticed.crdt.kvplan import KvRequest
from latticed.crdt.queue import QueueState
from latticed.crdt.records import Record
from latticed.host.diskspace import DiskUsage
from latticed.host.invite import Invite
from latticed.protocol.addresses import HostPort
from latticed.protocol.why_verdict import PeerFacts
from latticed.storage.core2_view import Core2View
from latticed.storage.jobs import Job
from latticed.storage.reader import Columns, RawRow, StoreReader
from latticed.storage.sealer import SealableStore

T = TypeVar("T")


class TailStore(SealableStore, Protocol):
    """What a live ``tail`` reads: committed records, and on a replica those verified ahead of their
    commit (storage/ahead.py), waiting between batches for the queue to move."""

    def state(self, q: int) -> QueueState: ...

    def address(self, q: int) -> str: ...

    def visible_end(self, q: int) -> int: ...

    async def read_visible(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns: ...

    async def wait_past(self, q: int, end: int, *, ahead: bool = False) -> None: ...


class ApiStore(TailStore, Protocol):
    """The store as the request handlers use it: this node's queues and KV, read and written."""

    #: Its queues on fork core 2 (the calls below take their numbers too, except ``state``).
    core2: Core2View

    @property
    def public_key(self) -> bytes: ...

    @property
    def clock(self) -> Callable[[], int]:
        """Wall-clock milliseconds (record timestamps, TTLs)."""
        ...

    @property
    def transactions(self) -> int: ...

    def storage_bytes(self) -> int: ...

    def resolve(self, address: str, kind: int = KIND_QUEUE, *, writing: bool = False) -> int: ...

    def owned(self, q: int) -> bool: ...

    def created_ms(self, q: int) -> int: ...

    def queues(self, kind: int = KIND_QUEUE) -> list[int]: ...

    async def create_queue(
        self, name: str, meta: Mapping[str, str] | None = None, kind: int = KIND_QUEUE, *, core: int = 1
    ) -> int: ...

    def start_append(self, q: int, records: Sequence[Record], *, checked: bool = False) -> Job: ...

    async def outcome(self, job: Job) -> Any: ...

    async def truncate(self, q: int, new_start: int) -> None: ...

    async def set_meta(self, q: int, updates: Mapping[str, str | None]) -> None: ...

    async def read(self, q: int, lo: int, hi: int, max_records: int, max_bytes: int) -> Columns: ...

    async def row(self, q: int, offset: int) -> RawRow | None: ...

    async def bounds(self, q: int) -> tuple[int, int]: ...

    async def kv_write(self, request: KvRequest) -> Any: ...

    async def kv_entry(self, owner: bytes | None, key: str) -> kv.Entry | None: ...

    async def kv_scan(self, owner: bytes | None, prefix: str) -> list[tuple[str, kv.Entry]]: ...

    async def inspect(self, fn: Callable[[StoreReader], T]) -> T: ...

    async def verify(self, q: int) -> int: ...

    async def compact_store(self) -> dict[str, Any]: ...


class ReplicationView(Protocol):
    """What the API shows of replication (the service itself is
    :mod:`latticed.net.replication_service`), and its links restarted after ``queue repair``."""

    @property
    def listen(self) -> str | None: ...

    @property
    def listen_address(self) -> HostPort | None: ...

    def peers(self) -> list[dict[str, Any]]: ...

    def lag(self) -> dict[str, int]: ...

    def queue_peers(self, owner: bytes, name: str, kind: int) -> list[PeerFacts]: ...

    def counters(self) -> dict[str, int]: ...

    def cut_off_queues(self, limit: int = 20) -> list[str]: ...

    def clock_skew(self) -> list[dict[str, Any]]: ...

    def incompatible_peers(self) -> list[dict[str, Any]]: ...

    def other_networks(self) -> int | None: ...

    def identity_status(self) -> dict[str, Any]: ...

    async def wait_start_gate(self) -> bool: ...

    def restart_core2_links(self, reason: str) -> int: ...


class PeerControl(ReplicationView, Protocol):
    """The running replication service, as ``peers add|remove|block|unblock`` change it (saved in the
    data directory before the reply)."""

    def add_peer(self, address: HostPort) -> dict[str, Any]: ...

    def remove_peer(self, target: bytes | HostPort) -> dict[str, Any]: ...

    def claim_identity(self) -> dict[str, Any]: ...

    def set_blocked(self, public_key: bytes, blocked: bool) -> bool: ...


class MembershipView(Protocol):
    """Network membership (:class:`latticed.services.membership.Membership`): ``invite``, ``join``, and the
    replication service running under the current network key (None while there is none)."""

    @property
    def service(self) -> ReplicationView | None: ...

    @property
    def uses_public_key(self) -> bool: ...

    async def ensure_started(self) -> PeerControl: ...

    def invite(self, addresses: Sequence[HostPort] = ()) -> str: ...

    async def join(self, invite: Invite, *, force: bool = False) -> dict[str, Any]: ...


class HealthView(Protocol):
    """Daemon-wide faults (:class:`latticed.services.health.Health`): forks and the disk."""

    disk: DiskUsage | None
    disk_error: str | None

    async def refresh_disk(self) -> None: ...

    def disk_status(self) -> dict[str, Any] | None: ...

    def forked_queues(self) -> list[dict[str, Any]]: ...

    async def forks(self) -> list[dict[str, Any]]: ...


class RetentionView(Protocol):
    """What the API shows of retention (:mod:`latticed.services.retention_service`)."""

    def cap(self, q: int) -> int | None: ...

    def counters_dict(self) -> dict[str, int]: ...


class SelfCheck(Protocol):
    """The daemon's checklist of itself (:func:`latticed.host.checklist.daemon_checks` on its config),
    given what only the running services know; blocking (it stats files, lists interfaces)."""

    def __call__(
        self,
        facts: dict[str, Any],
        *,
        listen_address: HostPort | None,
        disk: DiskUsage | None,
        disk_error: str | None,
    ) -> list[dict[str, Any]]: ...


__all__ = [
    "ApiStore",
    "HealthView",
    "MembershipView",
    "PeerControl",
    "ReplicationView",
    "RetentionView",
    "SelfCheck",
    "TailStore",
]
