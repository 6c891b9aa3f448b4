"""Work-queue leases, sans-IO: the lease manager (:mod:`.dispatch`: leases, ack/nack, retries with
backoff, dead letters, consumer caps), what it hands back (:mod:`.outcomes`) and the record filter
language (:mod:`.filters`).

Pure: time comes in as arguments and no module here does I/O, so the lease rules are tested without
sockets, threads or sleeps. The replicated half (progress lattice and ops, group definition, attempt
history and dead letters) is :mod:`latticed.crdt.group`, :mod:`~latticed.crdt.group_spec` and
:mod:`~latticed.crdt.attempts`; the trio service that runs groups on the engine is
:mod:`latticed.groups`. See docs/workqueues.md.
"""

from latticed.leases.dispatch import Dispatcher
from latticed.leases.filters import FilterSyntaxError, compile_filter, parse_filter
from latticed.leases.outcomes import Changes, DeadLetter, Done, Failure, Grant, GroupStats, TaskView

__all__ = [
    "Changes",
    "DeadLetter",
    "Dispatcher",
    "Done",
    "Failure",
    "FilterSyntaxError",
    "GroupStats",
    "Grant",
    "TaskView",
    "compile_filter",
    "parse_filter",
]
