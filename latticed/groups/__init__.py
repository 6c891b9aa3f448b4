"""Work queues (consumer groups): the local, sans-IO half.

The replicated half (progress lattice, ops, group definition, dead-letter records) is pure and lives in
:mod:`latticed.crdt.group`; this package holds what only the daemon running a group needs: the filter
language (:mod:`.filters`), the sans-IO lease manager (:mod:`.dispatch`), and the trio service that runs
groups on the engine (:mod:`.service`, with :mod:`.runtime` per group and :mod:`.committer` for group
commits). See docs/workqueues.md.
"""

from latticed.groups.dispatch import (
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
