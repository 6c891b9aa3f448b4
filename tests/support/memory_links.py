"""Memory links that can fail the way TCP links do: one end dies while the other hears nothing
(half-open), for the redial tests (tests/net/test_duplicate_identity.py) and bench/bench_redial.py.
It imports nothing of latticed, so the bench runs with any release's tree on its path."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import trio
import trio.testing


def cuttable_pair() -> tuple[
    trio.StapledStream[Any, Any], trio.StapledStream[Any, Any], Callable[[bool], None]
]:
    """A memory link whose second end can die alone: ``cut(False)`` ends what that end reads (it sees its
    link end, as after a reset that reached only its host) and from then on nothing passes either way, so
    the first end hears nothing and its link looks alive (half-open) until it is stale; ``cut(True)``
    ends both ends' links."""
    cut = [False]

    def one_way() -> tuple[trio.testing.MemorySendStream, trio.testing.MemoryReceiveStream]:
        send, receive = trio.testing.MemorySendStream(), trio.testing.MemoryReceiveStream()

        def pump() -> None:
            if cut[0]:
                with contextlib.suppress(trio.WouldBlock):
                    send.get_data_nowait()  # lost on the way
            else:
                trio.testing.memory_stream_pump(send, receive)

        async def pump_async() -> None:
            pump()

        send.send_all_hook, send.close_hook = pump_async, pump
        return send, receive

    to_second, second_reads = one_way()
    to_first, first_reads = one_way()

    def do_cut(both: bool) -> None:
        cut[0] = True
        second_reads.put_eof()
        if both:
            first_reads.put_eof()

    return trio.StapledStream(to_second, first_reads), trio.StapledStream(to_first, second_reads), do_cut
