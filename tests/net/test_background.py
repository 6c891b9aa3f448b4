"""A forwarding service's background tasks (:class:`latticed.net.background.Background`, the nursery of
remote offers and remote groups): refused in the service's own words before it runs, run beyond the
caller once it does, and cancelled with the service."""

from __future__ import annotations

import pytest
import trio

from latticed.errors import LatticedError
from latticed.net.background import Background


async def test_a_task_is_refused_before_the_service_runs_then_outlives_its_caller() -> None:
    service = Background("remote things are not running")
    seen: list[str] = []

    async def work(name: str, started: trio.Event) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            seen.append(f"{name} cancelled")

    async def caller(started: trio.Event) -> None:
        service.spawn(work, "late", started)
        seen.append("caller returned")

    with pytest.raises(LatticedError, match=r"^remote things are not running$"):
        service.spawn(work, "early", trio.Event())
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        started = trio.Event()
        await caller(started)
        await started.wait()  # the task runs after its caller returned
        assert seen == ["caller returned"]
        nursery.cancel_scope.cancel()
    assert seen == ["caller returned", "late cancelled"]
