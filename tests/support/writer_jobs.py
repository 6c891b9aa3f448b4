"""Running storage jobs on a writer in a test, each expected to succeed."""

from __future__ import annotations

from latticed.storage.jobs import Job
from latticed.storage.writer import Writer


def ok(w: Writer, *jobs: Job) -> list[object]:
    """Process ``jobs`` in one commit and return their results; a job's error fails the test there."""
    w.process(list(jobs))
    for job in jobs:
        assert job.error is None, job.error
    return [job.result for job in jobs]
