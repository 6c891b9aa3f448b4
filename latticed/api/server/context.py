"""What every local-API handler is given: the :class:`Context` (the store, the sealer, the services, a few
facts about this daemon) and the :class:`OpTable` that names the handler of each op.

Handlers see the rest of the daemon only through the Protocols of :mod:`.api_ports`: the composition root
fills a Context with the real services, a test with whatever it needs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latticed.api.messages import FRAME_OVERHEAD, arg_str
from latticed.api.server.api_ports import (
    ApiStore,
    HealthView,
    MembershipView,
    ReplicationView,
    RetentionView,
    SelfCheck,
)
from latticed.api.server.queue_listing import QueueListing
from latticed.storage.jobs import Job
from latticed.storage.sealer import Sealer
from latticed.version import RELEASE

if TYPE_CHECKING:
    from latticed.api.server.connection import Connection
    from latticed.groups.remote import RemoteGroups
    from latticed.groups.service import GroupService
    from latticed.produce.forward import RemoteOffers

Request = dict[str, Any]
Reply = dict[str, Any]


def package_version() -> str:
    """This build's release (from the source, so a stale install's metadata cannot misreport it)."""
    return RELEASE


Handler = Callable[["Context", Request], Awaitable[Reply]]

#: Ops that talk to the connection themselves (push frames, watch for the client leaving): they send their
#: own replies and return False when the client went away.
StreamHandler = Callable[["Context", "Connection", Request], Awaitable[bool]]

#: Write ops a connection may pipeline. ``begin`` checks the request and starts its write job at once, so
#: jobs commit in request order; the server awaits the job later (while it reads the next requests) and
#: turns its result into the reply with the function ``begin`` returned.
Begun = tuple[Job, Callable[[Any], Reply]]
PipelinedHandler = Callable[["Context", Request], Begun]


@dataclass(frozen=True, slots=True)
class OpTable:
    """Every op the API answers, by name: request/reply ``handlers`` (pipelined ops among them, run one at
    a time), ``streams`` and the ``pipelined`` ops' ``begin`` halves. Built by :mod:`.op_table`."""

    handlers: Mapping[str, Handler] = field(default_factory=dict)
    streams: Mapping[str, StreamHandler] = field(default_factory=dict)
    pipelined: Mapping[str, PipelinedHandler] = field(default_factory=dict)

    def knows(self, op: str) -> bool:
        return op in self.handlers or op in self.streams


@dataclass(slots=True)
class Context:
    """What every handler may use: the store, the services and a few facts about this daemon; complete
    when built (the composition root makes the services first and starts them before the API)."""

    engine: ApiStore
    data_dir: Path
    socket_path: Path
    max_frame_bytes: int
    #: Seals and opens the records of sealed queues: the daemon's one sealer over ``engine``.
    sealer: Sealer = field(kw_only=True)
    #: The ops this API answers.
    ops: OpTable = field(kw_only=True)
    started: float = field(default_factory=time.monotonic)
    version: str = field(default_factory=package_version)
    groups: GroupService | None = None
    #: Forwards lease operations on groups other daemons own (latticed/groups/remote.py).
    remote_groups: RemoteGroups | None = None
    #: Idempotent offers, and offers into other daemons' queues (latticed/produce/).
    producers: RemoteOffers | None = None
    membership: MembershipView | None = None
    metrics_listen: str | None = None
    health: HealthView | None = None
    retention: RetentionView | None = None
    #: The daemon's checklist of itself (``doctor``), given the facts only the running services know.
    self_check: SelfCheck | None = None
    #: The fork core of a queue created without one (the daemon's ``default_queue_core``).
    default_queue_core: int = 2
    #: ``queue list``'s encoded entries, rebuilt only for queues that changed.
    listing: QueueListing = field(default_factory=QueueListing)

    @property
    def replication(self) -> ReplicationView | None:
        """The replication service running now (it is restarted under a new key on ``join``)."""
        return None if self.membership is None else self.membership.service

    @property
    def max_reply_bytes(self) -> int:
        return max(self.max_frame_bytes - FRAME_OVERHEAD, 1024)

    def queue(self, request: Request, *, writing: bool = False) -> int:
        """The request's ``queue``; ``writing``: the op writes to it, so our own queue dropped by
        ``queue repair --drop`` and not back yet is refused as the owner fence refuses it (exit 6 naming
        ``--release``), not as a queue that does not exist."""
        return self.engine.resolve(arg_str(request, "queue"), writing=writing)


__all__ = [
    "Begun",
    "Context",
    "Handler",
    "OpTable",
    "PipelinedHandler",
    "Reply",
    "Request",
    "StreamHandler",
    "package_version",
]
