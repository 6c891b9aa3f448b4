"""Work queues (consumer groups): the local, sans-IO half.

The replicated half (progress lattice, ops, group definition, dead-letter records) is pure and lives in
:mod:`latticed.crdt.group`; this package holds what only the daemon running a group needs: the filter
language (:mod:`.filters`) and the lease manager (:mod:`.dispatch`).
"""

from latticed.groups.dispatch import (
    CapacityError,
    Changes,
    DeadLetter,
    Dispatcher,
    Done,
    Failure,
    GroupStats,
    Lease,
    TaskView,
)
from latticed.groups.filters import FilterSyntaxError, compile_filter, parse_filter

__all__ = [
    "CapacityError",
    "Changes",
    "DeadLetter",
    "Dispatcher",
    "Done",
    "Failure",
    "FilterSyntaxError",
    "GroupStats",
    "Lease",
    "TaskView",
    "compile_filter",
    "parse_filter",
]
