"""The box's cores as the simulator shares them (tests/support/mesh_sim.py ``Box``): processor sharing
among the threads runnable at each moment, as Linux's scheduler shares a box's cores between busy
threads; an even split over every node stretched a lone writer's storage work up to 4.5x."""

from __future__ import annotations

import heapq
from collections.abc import Callable

import pytest
from support.mesh_sim import Box, Costs, CpuThread
from support.mesh_sim2 import MeshSim2


class _Clock:
    """An event queue and its time, as the simulation's."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, action))

    def run(self) -> None:
        while self._heap:
            when, _, action = heapq.heappop(self._heap)
            self.now = max(self.now, when)
            action()


def _box(cores: int | None) -> tuple[_Clock, Box]:
    clock = _Clock()
    return clock, Box(cores, lambda: clock.now, clock.at)


def _ends(clock: _Clock, box: Box, works: list[float], starts: list[float] | None = None) -> list[float]:
    """When each of ``len(works)`` threads is done, each given its work at its start (0 unless told)."""
    threads = [CpuThread() for _ in works]
    ends = [0.0] * len(works)
    for i, (thread, work) in enumerate(zip(threads, works, strict=True)):

        def give(i: int = i, thread: CpuThread = thread, work: float = work) -> None:
            box.work(thread, work)
            box.then(thread, lambda: ends.__setitem__(i, clock.now))

        clock.at((starts or [0.0] * len(works))[i], give)
    clock.run()
    return ends


def test_a_busy_thread_alone_gets_a_full_core() -> None:
    clock, box = _box(2)
    assert _ends(clock, box, [1.0]) == [pytest.approx(1.0)]


def test_three_busy_threads_on_two_cores_each_get_two_thirds() -> None:
    clock, box = _box(2)
    assert _ends(clock, box, [1.0, 1.0, 1.0]) == [pytest.approx(1.5)] * 3


def test_an_idle_node_takes_nothing() -> None:
    """Two busy threads and one with nothing to do, or one off the cores (waiting on its fsync, a timer:
    a pause), run at a full core each."""
    clock, box = _box(2)
    idle, waiting = CpuThread(), CpuThread()
    box.pause(waiting, 5.0)
    assert _ends(clock, box, [1.0, 1.0]) == [pytest.approx(1.0)] * 2
    assert not idle.busy and clock.now == pytest.approx(5.0)


def test_shares_are_recomputed_when_the_runnable_set_changes() -> None:
    """Three threads from 0, 0 and 0.5 s: two at a full core until 0.5 s (0.5 s of work left each), then
    three at 2/3 until the first two are done at 1.25 s; the third has 0.5 left, alone: done at 1.75 s."""
    clock, box = _box(2)
    assert _ends(clock, box, [1.0, 1.0, 1.0], [0.0, 0.0, 0.5]) == [
        pytest.approx(1.25),
        pytest.approx(1.25),
        pytest.approx(1.75),
    ]


def test_a_machine_per_node_runs_every_thread_at_a_full_core() -> None:
    clock, box = _box(None)
    assert _ends(clock, box, [1.0, 1.0, 1.0, 2.0]) == [pytest.approx(t) for t in (1.0, 1.0, 1.0, 2.0)]


def test_work_given_later_runs_after_what_the_thread_had_and_its_waiters_in_order() -> None:
    clock, box = _box(2)
    thread, order = CpuThread(), []
    box.work(thread, 1.0)
    box.then(thread, lambda: order.append(("first", clock.now)))
    box.pause(thread, 0.5)  # descheduled: no core for half a second
    box.work(thread, 1.0)
    box.then(thread, lambda: order.append(("second", clock.now)))
    assert box.free_at(thread) == pytest.approx(2.5)
    clock.run()
    assert order == [("first", pytest.approx(1.0)), ("second", pytest.approx(2.5))]
    assert thread.idle_since == pytest.approx(2.5)


def test_a_nodes_work_in_the_simulator_takes_the_share_of_the_threads_runnable() -> None:
    """In the mesh simulator: three nodes' event loops given 0.3 s each at once on two cores are done
    after 0.45 s; one alone afterwards after its 0.3 s, the five idle nodes taking nothing (an even split
    over the nodes busy when a step began kept the first ones at 1.5x however the box emptied)."""
    sim = MeshSim2(8, costs=Costs(jitter=0.0, wake=0.0, stall_chance=0.0))
    sim.run_for(1.0)
    start, ends = sim.now, {}
    for y in (1, 2, 3):
        sim._busy(sim.nodes[y], 0.3)
        sim.box.then(sim.nodes[y].cpu, lambda y=y: ends.__setitem__(y, sim.now - start))  # type: ignore[misc]
    sim.run_for(1.0)
    assert ends == {y: pytest.approx(0.45) for y in (1, 2, 3)}
    start = sim.now
    sim._busy(sim.nodes[1], 0.3)
    sim.box.then(sim.nodes[1].cpu, lambda: ends.__setitem__(0, sim.now - start))
    sim.run_for(1.0)
    assert ends[0] == pytest.approx(0.3)
