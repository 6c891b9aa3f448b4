"""Progress bars on stderr for long commands (``offer --file``, a large ``range`` or ``tail``).

Only when stderr is a terminal, and for records only when stdout is not (a bar drawn between the lines it
reports would garble them): redirected or piped into a script, the commands print exactly what they did
before. click's bar (through typer): it is already loaded, where rich would add ~100 ms to every start.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO, Final, TypeVar

import typer

T = TypeVar("T")

#: Fewer records than this print too fast to need a bar.
MIN_RECORDS_FOR_BAR: Final = 20_000
#: Records between two updates of a bar over records (each update redraws it).
_UPDATE_EVERY: Final = 1000


def _noop(_n: int) -> None:
    return None


@contextlib.contextmanager
def bar(total: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``: a bar of ``total`` steps on stderr if it is a terminal, else a no-op."""
    if not total or not sys.stderr.isatty():
        yield _noop
        return
    with typer.progressbar(length=total, label=label, file=sys.stderr) as shown:
        yield shown.update


def input_size(stream: BinaryIO) -> int | None:
    """Bytes left to read in ``stream`` if it is a regular file (not a pipe or terminal)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        st = os.fstat(stream.fileno())
        if stat.S_ISREG(st.st_mode):
            return st.st_size - stream.tell()
    return None


def over_records(items: Iterable[T], total: int | None, label: str) -> Iterator[T]:
    """``items`` as they come, with a bar over ``total`` of them when it is worth one and stdout is not
    the terminal the bar would be drawn on."""
    if total is None or total < MIN_RECORDS_FOR_BAR or sys.stdout.isatty():
        yield from items
        return
    with bar(total, label) as advance:
        pending = 0
        for item in items:
            yield item
            pending += 1
            if pending == _UPDATE_EVERY:
                advance(pending)
                pending = 0
        advance(pending)


__all__ = ["MIN_RECORDS_FOR_BAR", "bar", "input_size", "over_records"]
