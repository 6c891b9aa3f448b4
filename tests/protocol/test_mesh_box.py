"""The box's cores as the simulator shares them (tests/support/mesh_sim.py ``Box``): processor sharing
among the threads runnable at each moment, as Linux's scheduler shares a box's cores between busy
threads; an even split over every node stretched a lone writer's storage work up to 4.5x."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import pytest
from support.mesh_sim import Box, Costs, CpuThread, PerCore
from support.mesh_sim2 import STORAGE_SLICE_S, WAKE_IDLE_CHANCE, WRITER_GIL_FREE, MeshSim2, pull_delay


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


def _woken_after(busy: int, hop: float = 0.001) -> float:
    """When a thread woken with 1 s of work is done, ``busy`` threads of 10 s each already running on
    two cores (its wait, then its share of the cores)."""
    clock, box = _box(2)
    box.hop = hop
    for _ in range(busy):
        box.work(CpuThread(), 10.0)
    woken, done = CpuThread(), []
    box.wake(woken)
    box.work(woken, 1.0)
    box.then(woken, lambda: done.append(clock.now))
    clock.run()
    return done[0]


def test_a_woken_thread_waits_longer_the_more_threads_are_runnable() -> None:
    """A thread woken waits for a core ``hop`` per thread runnable beyond the cores (the scheduler's
    run-queue wait, bench/RESULTS.md sim20), then takes its share: none with a core free, one hop
    with two running, four with five; processor sharing alone started it at once."""
    assert _woken_after(0) == pytest.approx(1.0)
    assert _woken_after(1) == pytest.approx(1.0)
    with_two, with_five = _woken_after(2), _woken_after(5)
    assert with_two == pytest.approx(0.001 + 1.5)  # one hop, then 2/3 of a core among three
    assert with_five == pytest.approx(0.004 + 3.0)  # four hops, then 1/3 of a core among six
    assert _woken_after(5, hop=0.0) == pytest.approx(3.0)


def test_threads_waiting_for_a_core_count_as_runnable_and_take_no_share() -> None:
    """Two running and one woken waiting: a second woken waits two hops, and the running two keep a
    full core each meanwhile (a thread waiting is runnable, not running)."""
    clock, box = _box(2)
    box.hop = 0.5
    running = [CpuThread(), CpuThread()]
    for thread in running:
        box.work(thread, 0.6)
    first, second = CpuThread(), CpuThread()
    box.wake(first)
    box.wake(second)
    assert box.runnable() == 4 and box.waking == 2
    assert box.waited == pytest.approx(0.5 + 1.0)
    assert box.free_at(running[0]) == pytest.approx(0.6)
    clock.run()
    assert box.waking == 0 and box.wakes == 2


def _storage_and_loop(
    work: float, woken_at: float | None, free: float = 0.0, hop: float = 0.0, others: int = 0
) -> tuple[dict[str, float], MeshSim2, int]:
    """Node 1's storage thread given ``work`` (``free`` of it released) at once, and a loop task of
    0.1 ms woken (as trio wakes one) ``woken_at`` later; with ``others`` nodes' loops busy meanwhile.
    When each was done, from the start, and the wake-ups (waits for a core) since. The loop's thread
    takes no runs of its own while it waits (``loop_thread_runs``: test_mesh_sim2 tests those): the
    hand-over alone."""
    costs = Costs(jitter=0.0, cores=2, wake=0.0, stall_chance=0.0, hop=hop)
    sim = MeshSim2(8, costs=costs, loop_thread_runs=False)
    sim.run_for(1.0)
    for y in range(2, 2 + others):
        sim._busy(sim.nodes[y], 1.0)
    node, start, ends, wakes = sim.node2(1), sim.now, {}, sim.box.wakes
    sim._storage_work(1, work, lambda: ends.__setitem__("storage", sim.now - start), free=free)

    def task() -> None:
        sim._busy(node, 0.0001)
        sim.box.then(node.cpu, lambda: ends.__setitem__("loop", sim.now - start))

    if woken_at is not None:
        sim._at(start + woken_at, lambda: sim._wake(1, ("test", 0), task))
    sim.run_for(0.5)
    return ends, sim, sim.box.wakes - wakes


def test_the_storage_thread_hands_the_interpreter_over_as_cpython_does() -> None:
    """One interpreter a daemon, handed over as CPython 3.11 does (``Python/ceval_gil.h``): the loop's
    task woken while the storage thread holds it waits a switch interval, asks, and runs once the
    storage thread dropped it; the storage thread then waits for the loop to be idle. Not a slice at a
    time behind whatever the loop queued meanwhile (bench/RESULTS.md sim21): the loop's task waited for
    the first slice's end, and on a full box each slice was a wake-up."""
    ends, sim, wakes = _storage_and_loop(4 * STORAGE_SLICE_S, STORAGE_SLICE_S / 5)
    assert ends["loop"] == pytest.approx(1.2 * STORAGE_SLICE_S + 0.0001)  # woken + a switch interval
    assert ends["storage"] == pytest.approx(4 * STORAGE_SLICE_S + 0.0001)  # one after the other
    assert sim.node2(1).storage_hand_offs == 1
    # the box full (three other loops running: a thread woken waits (3 + 1 - 2) hops): the storage
    # thread waits at its start and once back from the loop, not once a slice
    ends, sim, wakes = _storage_and_loop(4 * STORAGE_SLICE_S, STORAGE_SLICE_S / 5, hop=0.001, others=3)
    first = 0.002 + 2 * STORAGE_SLICE_S  # its wait, then a switch interval of work at half a core
    assert ends["loop"] == pytest.approx(first + 0.002 + 2 * 0.0001)
    assert ends["storage"] == pytest.approx(ends["loop"] + 0.002 + 2 * 3 * STORAGE_SLICE_S)
    assert wakes == 3  # the storage thread's two and the loop's one
    ends, sim, wakes = _storage_and_loop(4 * STORAGE_SLICE_S, None, hop=0.001, others=3)
    assert ends == {"storage": pytest.approx(0.002 + 2 * 4 * STORAGE_SLICE_S)}  # the loop idle: one wait
    assert wakes == 1 and sim.node2(1).storage_hand_offs == 0


def test_storage_work_with_the_interpreter_released_runs_beside_the_loop() -> None:
    """The writer's chain hash, signature and SQLite statements release the interpreter (a fifth of its
    storage CPU outside the COMMIT: ``WRITER_GIL_FREE``, py-spy --native; bench/RESULTS.md sim20c), a
    release after each switch interval of held work: a loop task waiting takes it there when it is
    scheduled before the call returns (a core free), and runs beside the released work; behind work
    that holds it, it waits for its request. The storage work is not slowed on two cores."""
    slice_ = STORAGE_SLICE_S
    ends, _, _ = _storage_and_loop(5 * slice_, 2.5 * slice_)  # all held: the loop asks at 3.5 slices
    assert ends == {
        "loop": pytest.approx(3.5 * slice_ + 0.0001),
        "storage": pytest.approx(5 * slice_ + 0.0001),
    }
    # 3 slices held, a release of 2/3 of a slice after each: the task woken at 2.5 slices takes the
    # second release, at 2 2/3 slices, and is done before it returns
    ends, sim, _ = _storage_and_loop(5 * slice_, 2.5 * slice_, free=2 * slice_)
    assert ends["loop"] == pytest.approx((2 + 2 / 3) * slice_ + 0.0001)
    assert ends["storage"] == pytest.approx(5 * slice_)
    assert sim.node2(1).storage_hand_offs == 1
    assert 0.15 < WRITER_GIL_FREE < 0.3  # as measured: 0.196-0.221 of the writer's storage samples


def _slot_box(slice_s: float = 0.0015) -> tuple[_Clock, Box]:
    clock = _Clock()
    return clock, Box(2, lambda: clock.now, clock.at, hop=0.001, slice_s=slice_s)


def _wake_at(
    clock: _Clock,
    box: Box,
    thread: CpuThread,
    at: float,
    burst: float,
    ends: dict[str, float],
    name: str = "woken",
) -> None:
    """At ``at``, ``thread`` wakes with ``burst`` seconds of work; when it is done, ``ends[name]`` is the
    time (the tests' one woken thread, beside those busy from the start)."""

    def wake() -> None:
        box.wake(thread)
        box.work(thread, burst)
        box.then(thread, lambda: ends.__setitem__(name, clock.now))

    clock.at(at, wake)


def test_a_thread_on_a_core_keeps_it_for_its_burst_until_its_slice_ends() -> None:
    """With a slice (the kernel's base slice, ``BASE_SLICE_S``; bench/RESULTS.md sim21b) a thread on a
    core runs its burst at a full core: a thread woken at 0.5 ms behind two 10 ms bursts waits in the
    run queue (no ``hop``) until the first's slice ends at 1.5 ms, then runs its 1 ms through, done at
    2.5 ms; processor sharing had it at a third of a core among three. The thread it took the core from
    goes behind the queue (the one still waiting then), not beside it."""
    clock, box = _slot_box()
    first, second, woken = CpuThread(), CpuThread(), CpuThread()
    ends: dict[str, float] = {}
    for name, thread in (("first", first), ("second", second)):
        box.work(thread, 0.010)
        box.then(thread, lambda name=name: ends.__setitem__(name, clock.now))  # type: ignore[misc]
    _wake_at(clock, box, woken, 0.0005, 0.001, ends)
    clock.run()
    assert ends["woken"] == pytest.approx(0.0025)
    assert sorted(ends.values())[1:] == [pytest.approx(0.010), pytest.approx(0.011)]
    assert box.wakes == 1 and box.runs == 5  # two, the woken one, the two taken off and back
    assert box.waited == pytest.approx(0.001 + 0.0 + 0.001)  # the woken 1 ms; one back at once, one 1 ms


def test_a_woken_thread_waits_until_a_thread_on_a_core_blocks() -> None:
    """Runs shorter than the slice end by blocking (the daemons' threads run 0.26-0.35 ms a run): a
    thread woken behind two 0.3 ms bursts (each then off the cores, waiting on a socket or its fsync)
    waits 0.3 ms, the queue's wait, and ``wait_now`` says so before; with a core free it waits none."""
    clock, box = _slot_box()
    for _ in range(2):
        thread = CpuThread()
        box.work(thread, 0.0003)
        box.pause(thread, 0.005)
    assert box.wait_now() == pytest.approx(0.0003)
    woken, done = CpuThread(), []
    box.wake(woken)
    box.work(woken, 0.001)
    box.then(woken, lambda: done.append(clock.now))
    assert box.runnable() == 3 and len(box.queue) == 1
    clock.run()
    assert done == [pytest.approx(0.0013)]
    assert box.waited == pytest.approx(0.0003) and box.runs == 3
    assert box.wait_now() == 0.0


def test_three_busy_threads_on_two_cores_take_turns_a_slice_at_a_time() -> None:
    """Three 1 s threads on two cores end together at ~1.5 s (as an even share would have them), but
    taking turns of a slice: ~2,000 runs, each waiting about half a slice on average."""
    clock, box = _slot_box()
    assert max(_ends(clock, box, [1.0, 1.0, 1.0])) == pytest.approx(1.5, abs=0.002)
    assert 1990 <= box.runs <= 2010
    assert box.waited / box.runs == pytest.approx(0.00075, rel=0.01)


def test_a_thread_given_work_as_it_ends_a_burst_keeps_its_core() -> None:
    """Work a thread's waiter gives it at the moment it is done runs on its core (no new run, no
    wait), though another thread waits for one; the thread done and given nothing gives its core up.
    (A slice longer than the runs: none is cut.)"""
    clock, box = _slot_box(slice_s=0.1)
    other, chained, waiting = CpuThread(), CpuThread(), CpuThread()
    box.work(other, 0.010)
    box.work(chained, 0.001)
    box.then(chained, lambda: box.work(chained, 0.001))
    box.work(waiting, 0.001)
    done: list[float] = []
    box.then(waiting, lambda: done.append(clock.now))
    clock.run()
    assert done == [pytest.approx(0.003)]  # after both of the chained thread's bursts, 2 ms together
    assert box.runs == 3 and box.waited == pytest.approx(0.002)


def test_the_storage_thread_keeps_its_core_from_its_held_work_to_its_released_work() -> None:
    """``Box.move``: the node's thread done with the storage thread's held work, its released part
    (``disk_cpu``) runs on the same core at once, though threads wait; a thread that took that core at
    the same moment (the node's loop woken for the interpreter, say) is put back at the queue's head.
    (A slice longer than the runs: none is cut.)"""
    clock, box = _slot_box(slice_s=0.1)
    node, disk, other, loop = CpuThread(), CpuThread(), CpuThread(), CpuThread()
    box.work(other, 0.010)
    box.work(node, 0.001)
    box.work(loop, 0.001)  # queued behind the two
    ends: dict[str, float] = {}

    def released() -> None:
        box.move(node, disk)
        box.work(disk, 0.002)
        box.then(disk, lambda: ends.__setitem__("disk", clock.now))

    box.then(node, released)
    box.then(loop, lambda: ends.__setitem__("loop", clock.now))
    clock.run()
    assert ends == {"disk": pytest.approx(0.003), "loop": pytest.approx(0.004)}
    # the node's thread gave its core to another of the node's threads queued (a wake-up) as it ended
    clock, box = _slot_box(slice_s=0.1)
    node, disk, other, waiting = CpuThread(), CpuThread(), CpuThread(), CpuThread()
    box.work(other, 0.010)
    box.work(node, 0.001)
    box.work(waiting, 0.001)

    def released_late() -> None:  # the node's thread had queued for the loop when this ran
        box.move(node, disk)
        box.work(disk, 0.002)
        box.then(disk, lambda: ends.__setitem__("disk2", clock.now))

    box.then(node, released_late)
    box.wake(node)  # the loop, after the storage thread: queues behind ``waiting``
    box.work(node, 0.001)
    box.then(waiting, lambda: ends.__setitem__("waiting", clock.now))
    clock.run()
    assert ends["disk2"] == pytest.approx(0.003)
    assert ends["waiting"] == pytest.approx(0.004)  # it took the core at 1 ms, gave it back, then next


def test_a_wakee_takes_its_wakers_core_for_a_burst_and_the_waker_waits_its_while_then_first() -> None:
    """``Box.hand_off`` (bench/RESULTS.md sim24b): on a full box the wakee runs its burst on its waker's
    core at once and blocks; the waker is off the cores its wait, then first in the queue, its work
    (and work given meanwhile) after. A thread queued before takes the core the burst frees, so the
    waker waits for it too (the daemons' long waits). With a core free there is no take."""
    clock, box = _slot_box(slice_s=0.1)
    other, waker = CpuThread(), CpuThread()
    box.work(other, 0.010)
    box.work(waker, 0.001)
    ends: dict[str, float] = {}
    box.then(waker, lambda: ends.__setitem__("waker", clock.now))
    clock.at(0.0002, lambda: ends.__setitem__("took", float(box.hand_off(waker, 0.00002, 0.00005))))
    clock.run()
    assert ends == {"took": 1.0, "waker": pytest.approx(0.00025 + 0.0008)}
    assert box.hand_offs == 1 and box.runs == 4  # the two, the burst, the waker back

    clock, box = _slot_box(slice_s=0.1)
    other, waker, queued = CpuThread(), CpuThread(), CpuThread()
    box.work(other, 0.010)
    box.work(waker, 0.001)
    box.work(queued, 0.001)  # waits for a core from 0
    box.then(waker, lambda: ends.__setitem__("waker2", clock.now))
    box.then(queued, lambda: ends.__setitem__("queued", clock.now))
    clock.at(0.0002, lambda: box.hand_off(waker, 0.00002, 0.00005))
    clock.run()
    assert ends["queued"] == pytest.approx(0.00022 + 0.001)  # on the core the burst freed
    assert ends["waker2"] == pytest.approx(0.00122 + 0.0008)  # first in the queue once back, behind it

    clock, box = _slot_box(slice_s=0.1)
    alone = CpuThread()
    box.work(alone, 0.001)
    assert not box.can_hand_off(alone) and not box.hand_off(alone, 0.00002, 0.00005)
    clock.run()
    assert box.hand_offs == 0 and box.runs == 1


def test_a_waker_that_gave_its_core_up_at_this_moment_still_had_it_for_a_hand_off() -> None:
    """A thread done at this instant, whose core went to a thread queued (the events' order: it blocks
    an event later in the daemon), is taken as still on it: the queued thread goes back to the queue's
    front behind the burst, and the waker's wait holds up nothing of its own (it has no work)."""
    clock, box = _slot_box(slice_s=0.1)
    other, waker, queued = CpuThread(), CpuThread(), CpuThread()
    box.work(other, 0.010)
    box.work(waker, 0.001)
    box.work(queued, 0.0005)
    done: dict[str, float] = {}
    box.then(queued, lambda: done.__setitem__("queued", clock.now))

    def woke() -> None:  # after the waker's ``_idle``: it left its core to ``queued`` at this moment
        assert waker not in box.running and queued in box.running
        done["took"] = float(box.hand_off(waker, 0.00002, 0.00005))

    box.then(waker, lambda: clock.at(clock.now, woke))
    clock.run()
    assert done == {"took": 1.0, "queued": pytest.approx(0.001 + 0.00002 + 0.0005)}
    assert box.runs == 4 and box.hand_offs == 1 and not waker.busy


def test_a_woken_thread_may_take_a_running_threads_core_which_queues_behind() -> None:
    """``Box.preempt`` (the kernel's wake-up preemption; bench/RESULTS.md sim25): a thread woken on a full
    box that ``preempt`` gives a running thread for runs on that thread's core at once, and the thread
    taken off it queues behind the others with the work it had left. Without it (or given None) the
    woken thread waits in the run queue for a core."""
    ends: dict[str, float] = {}
    for take in (True, False):
        clock, box = _slot_box(slice_s=0.1)
        long, short, woken = CpuThread(), CpuThread(), CpuThread()
        box.preempt = lambda thread, short=short, take=take: short if take else None
        box.work(long, 0.010)
        box.work(short, 0.001)
        box.then(short, lambda take=take: ends.__setitem__(f"short {take}", clock.now))
        _wake_at(clock, box, woken, 0.0002, 0.0001, ends, f"woken {take}")
        clock.run()
        assert box.wake_preemptions == (1 if take else 0)
    assert ends["woken True"] == pytest.approx(0.0003)  # at once, on the short one's core
    assert ends["short True"] == pytest.approx(0.0011)  # its 0.8 ms left once the core is free again
    assert ends["woken False"] == pytest.approx(0.0011)  # behind the short one's burst
    assert ends["short False"] == pytest.approx(0.001)


def _per_core_box(idle_chance: float, pull: float | None) -> tuple[_Clock, Box]:
    clock, box = _slot_box(slice_s=0.1)
    box.per_core = PerCore(idle_chance, lambda: pull, random.Random(0))
    return clock, box


def test_a_woken_thread_queues_on_its_last_core_until_an_idle_core_pulls_it_or_takes_it_idle() -> None:
    """``Box.per_core`` (bench/RESULTS.md sim25b): a thread woken joins the queue of the core it last ran
    on, though the other core is idle, and waits there until the idle core's balance pulls it
    (``pull_delay``) or its own core frees; with ``idle_chance`` it goes to the idle core at once. The
    one shared queue never left a core idle while a thread waited."""
    ends: dict[str, float] = {}
    for name, chance, pull in (("pulled", 0.0, 0.002), ("own", 0.0, None), ("idle", 1.0, None)):
        clock, box = _per_core_box(chance, pull)
        busy, woken = CpuThread(core=0), CpuThread(core=0)
        box.work(busy, 0.010)

        def wake(box: Box = box, woken: CpuThread = woken, clock: _Clock = clock, name: str = name) -> None:
            box.work(woken, 0.001)
            box.then(woken, lambda: ends.__setitem__(name, clock.now))

        clock.at(0.0005, wake)
        clock.run()
        assert box.pulls == (1 if name == "pulled" else 0)
        assert woken.core == (0 if name == "own" else 1)
    assert ends["pulled"] == pytest.approx(0.0035)  # queued at 0.5 ms, pulled 2 ms later, 1 ms of work
    assert ends["own"] == pytest.approx(0.011)  # behind the busy thread's 10 ms on core 0
    assert ends["idle"] == pytest.approx(0.0015)  # on core 1 at once


def test_per_core_a_slice_ends_only_for_a_thread_queued_on_that_core() -> None:
    """With a queue per core a thread's slice ends only if a thread waits on its own core: the one on
    core 0 runs its 3 ms through, the one on core 1 lets the thread queued there run after its slice."""
    clock = _Clock()
    box = Box(2, lambda: clock.now, clock.at, slice_s=0.001)
    box.per_core = PerCore(0.0, lambda: None, random.Random(0))
    first, second, queued = CpuThread(core=0), CpuThread(core=1), CpuThread(core=1)
    ends: dict[str, float] = {}
    for name, thread in (("first", first), ("second", second), ("queued", queued)):
        box.work(thread, 0.003 if thread is not queued else 0.0005)
        box.then(thread, lambda name=name: ends.__setitem__(name, clock.now))  # type: ignore[misc]
    clock.run()
    assert ends["first"] == pytest.approx(0.003)
    assert ends["queued"] == pytest.approx(0.0015)  # after the second's 1 ms slice
    assert ends["second"] == pytest.approx(0.0035)


def test_per_core_a_woken_thread_may_take_only_its_own_cores_thread() -> None:
    """With a queue per core the wake-up preemption (``Box.takes``) is asked about the thread on the
    woken thread's core, and a yes runs it there at once, the thread taken off queued on that core."""
    clock = _Clock()
    box = Box(2, lambda: clock.now, clock.at, slice_s=0.1)
    box.per_core = PerCore(0.0, lambda: None, random.Random(0))
    asked: list[CpuThread] = []
    box.takes = lambda woken, victim: asked.append(victim) is None
    on0, on1, woken = CpuThread(core=0), CpuThread(core=1), CpuThread(core=1)
    box.work(on0, 0.010)
    box.work(on1, 0.010)
    ends: dict[str, float] = {}
    box.then(on1, lambda: ends.__setitem__("on1", clock.now))
    _wake_at(clock, box, woken, 0.002, 0.001, ends)
    clock.run()
    assert asked == [on1] and box.wake_preemptions == 1
    assert ends["woken"] == pytest.approx(0.003)
    assert ends["on1"] == pytest.approx(0.011) and on1.core == 1


def test_the_idle_balance_pull_is_drawn_from_the_measured_survival() -> None:
    """``pull_delay`` draws from ``PULL_SURVIVAL`` (sim24's records): 64 % of spells have no pull, about
    10 % one within 1 ms; ``MeshSim2.per_core_queues`` gives the box those rules."""
    rng = random.Random(1)
    draws = [pull_delay(rng) for _ in range(20000)]
    assert sum(d is None for d in draws) / len(draws) == pytest.approx(0.64, abs=0.015)
    assert sum(d is not None and d <= 0.001 for d in draws) / len(draws) == pytest.approx(0.103, abs=0.01)
    sim = MeshSim2(8, draws=0, per_core_queues=True)
    assert sim.box.per_core is not None and sim.box.per_core.idle_chance == WAKE_IDLE_CHANCE
    assert sim.box.takes is not None and sim.box.preempt is None
    assert MeshSim2(8, draws=0).box.per_core is None


def test_a_thread_woken_with_a_core_free_waits_its_idle_wake_first_and_not_on_a_full_box() -> None:
    """``Box.idle_wake`` (``MeshSim2.idle_wake_wait``): a wake-up that finds a core free waits the drawn
    time off the cores before it runs; one that finds both cores taken queues as before, no extra wait."""
    clock, box = _slot_box(slice_s=0.1)
    box.idle_wake = lambda: 0.002
    woken = CpuThread()
    box.wake(woken)
    box.work(woken, 0.001)
    done: list[float] = []
    box.then(woken, lambda: done.append(clock.now))
    clock.run()
    assert done == [pytest.approx(0.003)]  # the 2-ms wait, then its 1 ms on a core

    clock, box = _slot_box(slice_s=0.1)
    box.idle_wake = lambda: 0.005  # (were it waited here: done at 7 ms)
    first, second, late = CpuThread(), CpuThread(), CpuThread()
    box.work(first, 0.004)
    box.work(second, 0.004)
    clock.at(0.001, lambda: (box.wake(late), box.work(late, 0.001)))
    clock.at(0.001, lambda: box.then(late, lambda: done.append(clock.now)))
    clock.run()
    assert done[1:] == [pytest.approx(0.005)]  # queued behind the 4-ms runs, no idle wait on top
