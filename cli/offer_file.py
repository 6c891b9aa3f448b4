"""``latticectl offer --file``: one record per line, a thousand lines per request, and a clear account of
what was committed when it stops early.

Ctrl-C does not cut a request in half: the first one lets the request in flight finish, then stops and
says on stderr which lines were offered (and their offsets) and how to go on (``--skip N``), exit 130. A
second Ctrl-C stops at once; the lines of the request in flight may then be committed or not, and the
message says so. A failure half-way (a full disk: exit 7) says the same before its error.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, BinaryIO

from cli.common import note
from cli.progress import bar, input_size
from latticed.api.client.blocking_client import Client


def read_batches(stream: BinaryIO, lines_per_batch: int, skip: int = 0) -> Iterator[tuple[list[bytes], int]]:
    """Lines (without ``\\n`` or ``\\r\\n``) in batches, each with the number of bytes it consumed; the
    first ``skip`` lines are read past (their bytes count in the first batch)."""
    batch: list[bytes] = []
    consumed = 0
    for line in stream:
        consumed += len(line)
        if skip:
            skip -= 1
            continue
        batch.append(line.removesuffix(b"\n").removesuffix(b"\r"))
        if len(batch) == lines_per_batch:
            yield batch, consumed
            batch, consumed = [], 0
    if batch:
        yield batch, consumed


@dataclass
class Offered:
    """What an ``offer --file`` committed so far: lines ``skip+1 .. skip+count`` at ``first .. last``."""

    skip: int
    count: int = 0
    first: int | None = None
    last: int | None = None

    def add(self, offsets: Sequence[int]) -> None:
        if offsets:
            self.first = offsets[0] if self.first is None else self.first
            self.last = offsets[-1]
        self.count += len(offsets)

    def account(self, queue: str, file: str, *, in_flight: int = 0) -> str:
        """One line: the lines offered, their offsets, and the command that goes on from there."""
        done = self.skip + self.count
        if self.count:
            what = f"lines {self.skip + 1}..{done} of {file} were offered (offsets {self.first}..{self.last})"
        else:
            what = f"no line of {file} was offered"
        if in_flight:
            what += (
                f"; lines {done + 1}..{done + in_flight} were being sent and may or may not be committed "
                f"(check with: latticectl last {shlex.quote(queue)})"
            )
        resume = f"latticectl offer {shlex.quote(queue)} --file {shlex.quote(file)} --skip {done}"
        return f"{what}. To go on from there: {resume}"


class _Interrupts:
    """The first Ctrl-C is remembered (checked between requests), the second one interrupts."""

    def __init__(self) -> None:
        self.asked = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True

    def __enter__(self) -> _Interrupts:
        with contextlib.suppress(ValueError):  # not the main thread: Ctrl-C then interrupts at once
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def offer_lines(
    client: Client,
    queue: str,
    stream: BinaryIO,
    file: str,
    records: tuple[bytes | None, list[tuple[str, bytes]]],
    *,
    lines_per_batch: int,
    skip: int = 0,
) -> Offered:
    """Offer every line of ``stream`` (after the first ``skip``) as a record with ``records``'s key and
    headers; stops early on Ctrl-C or an error, having said on stderr what was committed."""
    key, headers = records
    offered = Offered(skip)
    in_flight = 0
    try:
        with _Interrupts() as interrupts, bar(input_size(stream), "offering") as advance:
            for lines, consumed in read_batches(stream, lines_per_batch, skip):
                in_flight = len(lines)
                offered.add(client.offer_batch(queue, [(line, key, headers) for line in lines]))
                in_flight = 0
                advance(consumed)
                if interrupts.asked:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        note(f"interrupted: {offered.account(queue, file, in_flight=in_flight)}")
        sys.stderr.flush()
        raise
    except Exception:
        if offered.count or skip:
            note(f"stopped: {offered.account(queue, file)}")
        raise
    return offered


__all__ = ["Offered", "offer_lines", "read_batches"]
