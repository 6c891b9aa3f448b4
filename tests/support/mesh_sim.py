"""The daemons of ``bench/bench_mesh.py``, simulated in time: real sessions over a modelled network.

Each node drives real :class:`ReplicationSession` objects and real queue states the way ``net/gossip.py``
and the store do (the same graft timer, HAVE linger, window and depth; each link agreed on the features
two daemons of this build agree on, ``compact`` among them; a received live push relayed before its commit,
each as it came, as ``storage/ahead.py`` serves it; checkpoints thinned as the store keeps them; ACKs only
once the merge is durable; the dialler's keep-alive PINGs),
over the graph bench_mesh builds (:func:`mesh_topology`, same seed and shape). What it does not run it
models with a clock: each link has a one-way delay (drawn per link from the seed), and each node one
event loop (decoding, verifying, cutting deltas, the writer's API calls; woken from idle it pays a
wake-up first) whose tasks (a link's reader and driver, an API call) run one after another as trio runs
woken tasks, a storage thread (``storage/writer.py``'s group commit: what waits while a transaction is
under way goes into the next one together) and a reader thread (deltas the store must read), each taking
:class:`Costs`, on cores the nodes share as bench_mesh's daemons share its box. So the order in which
copies reach a node, which decides prunes, HAVEs and grafts, and how many chunks a relay behind its
sender takes into one commit and one delta, come from the same code as in the daemons; every message is
counted by type (``received_<type>``, ``received_<type>_bytes``) from its real encoding, as the daemons'
counters do.
Deterministic: no randomness but the seeded draws.

Why one module: the clock, the links and the node's host steps share one event queue and one set of
costs, and the parts (bulk, live) are bench_mesh's, read side by side with it.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from latticed.crdt import queue as core
from latticed.crdt.queue import QueueDelta, QueueState, Summary
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.net.gossip import GRAFT_TIMEOUT_MAX_S, GRAFT_TIMEOUT_S, HAVE_LINGER_S
from latticed.protocol.core2_wire import CORE2_NAMES
from latticed.protocol.graft import Arrivals
from latticed.protocol.replication import DeltaReceived, NeedDelta, QueueKey, ReplicationSession
from latticed.protocol.replication_messages import message_type_name
from latticed.protocol.versions import agree, ours
from latticed.storage.ahead import AHEAD_DELTA_RECORDS, AHEAD_MAX_RECORDS
from latticed.storage.batch import thin_checkpoints

__all__ = [
    "Box",
    "Costs",
    "CpuThread",
    "MeshNode",
    "MeshSim",
    "PartResult",
    "PerCore",
    "bulk",
    "counted_name",
    "farthest",
    "live",
    "mesh_topology",
    "warm_up",
]


#: Unix milliseconds at the simulation's time 0 (2026-11-29): records and heads carry such timestamps.
EPOCH_MS = 1_796_000_000_000


#: Work left on a thread below this many CPU seconds is done (the sum of float steps).
_DONE_S = 1e-12


@dataclass(eq=False)
class _Segment:
    """A stretch of a thread's time: ``work`` CPU seconds to run on a core, or a ``pause`` (seconds off
    the cores: the process descheduled), with what waits for its end."""

    work: float = 0.0
    pause: float | None = None
    waiters: list[Callable[[], None]] = field(default_factory=list)
    #: A machine per node: which of its planned ends counts (work added to it plans another).
    stamp: int = 0
    #: A pause begun: when it ends.
    ends: float = 0.0
    #: A run-queue wait (``Box.wake``): a pause whose length the box sets when it begins.
    wake: bool = False


@dataclass
class PerCore:
    """``Box.per_core``: a run queue per core, as Linux keeps them (bench/RESULTS.md sim25b, from sim24's
    sched records). A thread woken goes to a core idle (none running, none queued) with ``idle_chance``
    if there is one, else to the core it last ran on (the records: 100 % with both busy); one that loses
    its core (a slice's end, a wake-up preemption) queues on that core. A core runs only its own queue;
    a core left idle while another's queue waits pulls that queue's first thread after ``pull_delay()``
    seconds (None: not in this idle spell), drawn per spell: the kernel's idle balance."""

    idle_chance: float
    pull_delay: Callable[[], float | None]
    rng: random.Random


@dataclass(eq=False)
class CpuThread:
    """A thread of a node that needs a core: its event loop (with what holds its interpreter), or a
    storage or reader thread running on its own. Its work in order, and when it last ran out of it."""

    segments: deque[_Segment] = field(default_factory=deque)
    idle_since: float = 0.0
    #: Until when the progress of its current work was counted.
    since: float = 0.0
    #: A box of cores held for a burst (``Box.slice``): when it got its core, when it joined the run
    #: queue, and which of its planned ends and slice ends count.
    slice_from: float = 0.0
    queued_at: float = 0.0
    stamp: int = 0
    #: When it last gave its core up, and the thread queued that took it then (``Box.move``).
    left_at: float = -1.0
    successor: CpuThread | None = None
    #: With ``Box.per_core``: the core it runs on, is queued on, or last ran on (-1: none yet).
    core: int = -1

    @property
    def busy(self) -> bool:
        return bool(self.segments)


class Box:
    """The cores the nodes' threads share, as Linux's scheduler shares them between processes: at each
    moment every runnable thread (one with work: a thread waiting on its socket, its fsync or a timer
    is not) advances at ``min(1, cores / runnable)`` (processor sharing), recomputed whenever a thread
    starts or stops. So a thread alone runs at a full core, and an idle node takes nothing: an even
    split over every node stretched the bulk writer's storage work up to 4.5x (bench/RESULTS.md, sim19).
    ``cores`` None: each node has a machine of its own (every thread at a full core).

    A thread woken (``wake``: a hop from one thread to another, a wake after its fsync, a hand-off of the
    interpreter) first waits for a core, as the scheduler makes a woken thread wait behind those runnable:
    ``hop`` seconds per thread runnable (running or itself waiting so) beyond the cores when it wakes, so
    nothing while a core is free. Processor sharing alone started a woken thread at once, so a hop of
    little work was free, where the daemons' threads waited ~1.3 ms a wake-up on a full box (bench/
    RESULTS.md, sim19b). 0: no wait.
    ``slice_s`` set (and ``cores``): no processor sharing. A thread runnable takes a free core, or joins
    the run queue (first come first served) until one frees; once on a core it keeps it for its whole
    burst, at a full core, until it blocks (its work done, a pause, a wake-up of another of its node's
    threads: ``wake`` then gives the core up and queues again) or it has run ``slice_s`` while another
    waits (then it goes behind them). So a woken thread's run-queue wait is the queue's, not ``hop``:
    Linux's scheduler (EEVDF since 6.6; CFS before) lets the running task run to its slice
    (``RUN_TO_PARITY``) rather than share it evenly; bench/RESULTS.md sim21 found the daemons' writer's
    storage thread running its 1.2 ms before the COMMIT through, where the even share stretched it.
    Events go through ``at`` (the simulation's queue), time through ``clock``: a thread's waiters run as
    events of their own once what it had to do when they came is done."""

    def __init__(
        self,
        cores: int | None,
        clock: Callable[[], float],
        at: Callable[[float, Callable[[], None]], None],
        hop: float = 0.0,
        slice_s: float | None = None,
    ) -> None:
        self.cores = cores
        self._clock, self._at = clock, at
        #: Held for a burst (see :class:`Box`'s ``slice_s``): the run-queue wait is the queue's, no ``hop``.
        self.slice = slice_s if cores is not None else None
        self.hop = hop if cores is not None and self.slice is None else 0.0
        #: With ``slice``: the threads runnable without a core, first come first served.
        self.queue: deque[CpuThread] = deque()
        #: With ``slice``: times a thread got a core, as schedstat's "times run" counts them.
        self.runs = 0
        #: Threads whose current segment is work, in the order they became so (deterministic).
        self.running: dict[CpuThread, None] = {}
        #: Threads in a run-queue wait now (runnable, not running), and every such wait begun and summed.
        self.waking = 0
        self.wakes = 0
        self.waited = 0.0
        self._stamp = 0
        #: Interpreter hand-offs run as a thread of their own (:meth:`hand_off`): how many took a core.
        self.hand_offs = 0
        #: With ``slice``: given a thread just woken with no core free, the running thread it takes the
        #: core of (the kernel's wake-up preemption; the taken one queues behind the others), or None to
        #: queue as any. None: a woken thread always queues (bench/RESULTS.md sim25).
        self.preempt: Callable[[CpuThread], CpuThread | None] | None = None
        #: Threads taken off their core so (``preempt``).
        self.wake_preemptions = 0
        #: With ``slice``: a run queue per core (:class:`PerCore`); None: one queue the cores share. Per
        #: core, ``takes`` (not ``preempt``) decides a wake-up preemption: the woken thread, the thread
        #: running on its core. (:meth:`wait_now` still reads the queue as one: an estimate.)
        self.per_core: PerCore | None = None
        self.takes: Callable[[CpuThread, CpuThread], bool] | None = None
        #: Per core: an idle spell's pull drawn (a token; None: no spell drawn); threads pulled so.
        self._spell: dict[int, object] = {}
        self.pulls = 0
        #: With ``slice``: a thread woken while a core is free waits this (drawn) long before it queues
        #: for one: what its wake-up costs beyond the simulated threads (an idle core's wake-up, others'
        #: processes on the box). None: it runs at once.
        self.idle_wake: Callable[[], float] | None = None

    def runnable(self) -> int:
        """Threads that want a core now: running, or woken and waiting for one."""
        return len(self.running) + self.waking + len(self.queue)

    def wait_a_run(self) -> float:
        """The run-queue wait a run has had on this box so far (``waited`` over ``runs``, schedstat's
        measure); 0 before any run. Unlike :meth:`wait_now` it holds what a queued thread's burst grew
        by after it was queued (the loop's next tasks), which :meth:`wait_now` cannot see: at the bulk's
        wake-ups it reads about half the wait they then had (bench/RESULTS.md sim22b)."""
        return self.waited / self.runs if self.runs else 0.0

    def wait_now(self) -> float:
        """How long a thread woken now would wait for a core: ``wake_wait`` of the threads runnable; with
        ``slice``, until the queue ahead of it has had its turns (each thread's current work, at most a
        slice; a running thread's as planned now)."""
        if self.slice is None:
            return self.wake_wait(self.runnable())
        assert self.cores is not None
        now = self._clock()
        if len(self.running) < self.cores and not self.queue:
            return 0.0
        frees = [
            now + min(self._burst_left(t), max(0.0, t.slice_from + self.slice - now)) for t in self.running
        ]
        frees += [now] * (self.cores - len(frees))
        heapq.heapify(frees)
        for t in self.queue:
            heapq.heappush(frees, heapq.heappop(frees) + min(self._burst_left(t), self.slice))
        return frees[0] - now

    def _burst_left(self, thread: CpuThread) -> float:
        """The CPU ``thread`` has before it blocks, as far as it is known now."""
        left, now = 0.0, self._clock()
        for i, segment in enumerate(thread.segments):
            if segment.pause is not None or (segment.wake and i > 0):
                break
            done = now - thread.since if i == 0 and thread in self.running else 0.0
            left += max(0.0, segment.work - done)
        return left

    def wake_wait(self, runnable: int) -> float:
        """How long a thread woken with ``runnable`` others wanting a core waits for one."""
        return 0.0 if self.cores is None else self.hop * max(0, runnable + 1 - self.cores)

    def wake(self, thread: CpuThread) -> None:
        """``thread`` is woken after what it has: it waits for a core (``wake_wait`` of the threads
        runnable when it wakes) before its next work. Nothing without ``hop``. With ``slice``: it gives
        up its core if it has one and queues for one (its wait the queue's)."""
        if not self.hop and self.slice is None:
            return
        thread.segments.append(_Segment(wake=True))
        if len(thread.segments) == 1:
            self._begin(thread)

    def share(self) -> float:
        """The part of a core each runnable thread gets now."""
        n = len(self.running)
        return 1.0 if self.cores is None or n <= self.cores else self.cores / n

    def work(self, thread: CpuThread, seconds: float) -> None:
        """``thread`` has ``seconds`` of CPU work to do after what it has."""
        tail = thread.segments[-1] if thread.segments else None
        if tail is not None and tail.pause is None and not tail.wake and not tail.waiters:  # longer
            if tail is thread.segments[0] and self.slice is not None:
                if thread in self.running:
                    self._held_count(thread)
                    tail.work += seconds
                    self._held_plan(thread)
                else:
                    tail.work += seconds
            elif tail is thread.segments[0]:
                self._count(thread)
                tail.work += seconds
                self._plan(thread)
            else:
                tail.work += seconds
            return
        thread.segments.append(_Segment(work=seconds))
        if len(thread.segments) == 1:
            self._begin(thread)

    def pause(self, thread: CpuThread, seconds: float) -> None:
        """``thread`` is off the cores for ``seconds`` after what it has (it takes no share meanwhile)."""
        thread.segments.append(_Segment(pause=seconds))
        if len(thread.segments) == 1:
            self._begin(thread)

    def then(self, thread: CpuThread, action: Callable[[], None]) -> None:
        """Run ``action`` once ``thread`` has done what it has now (at once if nothing)."""
        if thread.segments:
            thread.segments[-1].waiters.append(action)
        else:
            self._at(self._clock(), action)

    def free_at(self, thread: CpuThread) -> float:
        """When ``thread`` would be done with what it has if the runnable set stayed as it is."""
        if self.slice is not None:
            return self._held_free_at(thread)
        now, share = self._clock(), self.share()
        free = now
        for i, segment in enumerate(thread.segments):
            if segment.wake and i > 0:  # not begun: as long as one begun now would wait
                free += self.wake_wait(self.runnable())
            elif segment.pause is not None:
                free = max(free, segment.ends) if i == 0 else free + segment.pause
            else:
                left = segment.work - ((now - thread.since) * share if i == 0 else 0.0)
                free += max(0.0, left) / (share if i == 0 else self._share_with(thread))
        return free

    def _share_with(self, thread: CpuThread) -> float:
        n = len(self.running) + (thread not in self.running)
        return 1.0 if self.cores is None or n <= self.cores else self.cores / n

    # the scheduler
    def _count(self, thread: CpuThread) -> None:
        """Count the progress made until now: every runnable thread's on a shared box (their share is
        about to change), ``thread``'s alone on a machine of its own."""
        now, share = self._clock(), self.share()
        for t in self.running if self.cores is not None else (thread,):
            if t in self.running:
                t.segments[0].work -= (now - t.since) * share
            t.since = now

    def _begin(self, thread: CpuThread) -> None:
        """``thread``'s first segment starts: a pause ends by the clock, work makes it runnable."""
        if self.slice is not None:
            self._held_begin(thread)
            return
        segment = thread.segments[0]
        if segment.wake:
            segment.pause = self.wake_wait(self.runnable())
            self.waking += 1
            self.wakes += 1
            self.waited += segment.pause
        if segment.pause is not None:
            segment.ends = self._clock() + segment.pause
            self._at(segment.ends, lambda: self._end(thread, segment))
            return
        self._count(thread)
        self.running[thread] = None
        thread.since = self._clock()
        self._plan(thread)

    def _plan(self, thread: CpuThread) -> None:
        """Plan the next end of work: ``thread``'s on a machine of its own, the first of all on a shared
        box (the earlier plan then no longer counts)."""
        if self.cores is not None:
            self._plan_shared()
            return
        segment = thread.segments[0]
        segment.stamp += 1
        stamp = segment.stamp
        self._at(thread.since + max(0.0, segment.work), lambda: self._due(thread, segment, stamp))

    def _plan_shared(self) -> None:
        self._stamp += 1
        stamp = self._stamp
        if self.running:
            first = min(t.segments[0].work for t in self.running)
            self._at(self._clock() + max(0.0, first) / self.share(), lambda: self._due_shared(stamp))

    def _due(self, thread: CpuThread, segment: _Segment, stamp: int) -> None:
        if segment.stamp == stamp:
            segment.work = 0.0
            self._end(thread, segment)

    def _due_shared(self, stamp: int) -> None:
        if stamp != self._stamp:
            return
        for thread in list(self.running):
            self._count(thread)
            if thread.segments[0].work <= _DONE_S:
                self._end(thread, thread.segments[0])
        self._plan_shared()

    def _end(self, thread: CpuThread, segment: _Segment) -> None:
        if segment.pause is None:
            self._count(thread)
            del self.running[thread]
        elif segment.wake:
            self.waking -= 1
        self._next(thread)
        if self.cores is not None and segment.pause is None:
            self._plan_shared()

    # the scheduler with ``slice``: a core held for a burst
    def _held_free_at(self, thread: CpuThread) -> float:
        now = self._clock()
        free = now if thread in self.running or not thread.busy else now + self.wait_now()
        for i, segment in enumerate(thread.segments):
            if segment.pause is not None:
                free = max(free, segment.ends) if i == 0 else free + segment.pause
            elif segment.wake and i > 0:
                free += self.wait_now()
            else:
                free += max(
                    0.0, segment.work - (now - thread.since if i == 0 and thread in self.running else 0.0)
                )
        return free

    def _held_count(self, thread: CpuThread) -> None:
        now = self._clock()
        thread.segments[0].work -= now - thread.since
        thread.since = now

    def _held_plan(self, thread: CpuThread) -> None:
        """Plan the end of the running ``thread``'s current work (a full core: its work from now)."""
        thread.stamp += 1
        stamp, segment = thread.stamp, thread.segments[0]
        self._at(thread.since + max(0.0, segment.work), lambda: self._held_due(thread, segment, stamp))

    def _held_begin(self, thread: CpuThread) -> None:
        """``thread``'s first segment starts: work runs on its core or queues for one; a wake-up gives
        the core up and queues; a pause gives it up until it ends."""
        segment = thread.segments[0]
        if segment.wake:
            self.wakes += 1
            if thread in self.running:
                self._leave(thread)
            free = self.cores is not None and len(self.running) + len(self.queue) < self.cores
            wait = self.idle_wake() if free and self.idle_wake is not None else 0.0
            if wait > 0:
                self._at(self._clock() + wait, lambda: self._woken(thread))
                return
            self._place(thread)
            self._enqueue(thread)
        elif segment.pause is not None:
            if thread in self.running:
                self._leave(thread)
            segment.ends = self._clock() + segment.pause
            self._at(segment.ends, lambda: self._next(thread))
        elif thread in self.running:
            thread.since = self._clock()
            self._held_plan(thread)
        else:
            self._place(thread)
            self._enqueue(thread)

    def _woken(self, thread: CpuThread) -> None:
        """A thread woken on a box with a core free, its ``idle_wake`` wait over: it queues for a core."""
        self._place(thread)
        self._enqueue(thread)

    def _place(self, thread: CpuThread) -> None:
        """A thread woken: which core's queue it joins (:class:`PerCore`); nothing with one queue."""
        pc = self.per_core
        if pc is None:
            return
        assert self.cores is not None
        if thread.core < 0:
            thread.core = pc.rng.randrange(self.cores)
        busy = {t.core for t in self.running} | {t.core for t in self.queue}
        idle = [c for c in range(self.cores) if c not in busy]
        if idle and thread.core not in idle and pc.rng.random() < pc.idle_chance:
            thread.core = idle[0]

    def _on_core(self, core: int) -> CpuThread | None:
        return next((t for t in self.running if t.core == core), None)

    def _enqueue(self, thread: CpuThread) -> None:
        thread.queued_at = self._clock()
        victim = self._victim(thread)
        if victim is not None:  # the woken thread has its core; the victim queues behind it
            self.wake_preemptions += 1
            self.queue.appendleft(thread)
            self._held_count(victim)
            self._leave(victim)
            victim.queued_at = self._clock()
            self.queue.append(victim)
            return
        self.queue.append(thread)
        self._dispatch()

    def _victim(self, thread: CpuThread) -> CpuThread | None:
        """The running thread a woken ``thread`` takes the core of, if any: with one queue, any thread
        ``preempt`` names once all cores are busy; with a queue per core (``per_core``), the one on its
        core if ``takes`` lets it. Only a thread running work is taken (:meth:`_preemptible`)."""
        if not (thread.segments and thread.segments[0].wake):
            return None
        if self.per_core is not None:
            victim = self._on_core(thread.core)
            if self.takes is None or victim is None or not self._preemptible(victim):
                return None
            return victim if self.takes(thread, victim) else None
        if self.preempt is None or len(self.running) < (self.cores or 0):
            return None
        victim = self.preempt(thread)
        return victim if victim is not None and self._preemptible(victim) else None

    def _preemptible(self, thread: CpuThread) -> bool:
        """Whether ``thread`` runs work on a core now (not a wake-up's or a pause's turn)."""
        head = thread.segments[0] if thread.segments else None
        return thread in self.running and head is not None and not head.wake and head.pause is None

    def _leave(self, thread: CpuThread) -> None:
        thread.stamp += 1  # its planned ends no longer count
        del self.running[thread]
        if self.per_core is None:
            queued = self.queue[0] if self.queue else None
        else:
            queued = next((t for t in self.queue if t.core == thread.core), None)
        self._dispatch()
        thread.left_at = self._clock()
        thread.successor = queued if queued is not None and queued in self.running else None

    def _dispatch(self) -> None:
        """Free cores to the threads queued longest; a woken thread's wake-up ends on its core."""
        assert self.cores is not None and self.slice is not None
        if self.per_core is not None:
            self._dispatch_per_core()
            return
        while self.queue and len(self.running) < self.cores:
            thread = self.queue.popleft()
            self._run(thread)

    def _dispatch_per_core(self) -> None:
        """:meth:`_dispatch` with a queue per core: each free core runs its own queue's first thread; a
        core left idle while another's queue waits draws its idle balance's pull for the spell."""
        assert self.cores is not None and self.per_core is not None
        busy = {t.core for t in self.running}
        for c in range(self.cores):
            if c in busy:
                self._spell.pop(c, None)
                continue
            thread = next((t for t in self.queue if t.core == c), None)
            if thread is not None:
                self.queue.remove(thread)
                self._spell.pop(c, None)
                self._run(thread)
                continue
            if not self.queue:
                self._spell.pop(c, None)  # no waiter: the spell is over
            elif c not in self._spell:
                token = self._spell[c] = object()
                delay = self.per_core.pull_delay()
                if delay is not None:
                    self._at(self._clock() + delay, lambda c=c, k=token: self._pull(c, k))  # type: ignore[misc]

    def _pull(self, c: int, token: object) -> None:
        """The idle balance: core ``c``, idle since the spell ``token`` began, takes the first thread queued
        on another core."""
        if self._spell.get(c) is not token or self._on_core(c) is not None or not self.queue:
            return
        del self._spell[c]
        self.pulls += 1
        self.queue[0].core = c
        self._dispatch()

    def _run(self, thread: CpuThread) -> None:
        """``thread``, taken off the queue, gets a core (with a queue per core, its own)."""
        assert self.slice is not None
        now = self._clock()
        self.runs += 1
        self.waited += now - thread.queued_at
        self.running[thread] = None
        thread.since = thread.slice_from = now
        self._at(now + self.slice, lambda t=thread: self._slice_end(t))  # type: ignore[misc]
        if thread.segments[0].wake:
            self._pop(thread)
        else:
            self._held_plan(thread)

    def _slice_end(self, thread: CpuThread) -> None:
        """``thread`` has run a slice: behind those waiting, if any; else on for another. (A run that
        ended since, or began later, has its own.)"""
        assert self.slice is not None
        if thread not in self.running or thread.slice_from + self.slice - self._clock() > _DONE_S:
            return
        head = thread.segments[0] if thread.segments else None
        waiting = self.queue if self.per_core is None else any(t.core == thread.core for t in self.queue)
        if waiting and head is not None and not head.wake and head.pause is None:
            self._held_count(thread)
            self._leave(thread)
            self._enqueue(thread)
            return
        thread.slice_from = self._clock()
        self._at(thread.slice_from + self.slice, lambda: self._slice_end(thread))

    def _held_due(self, thread: CpuThread, segment: _Segment, stamp: int) -> None:
        if (
            stamp == thread.stamp
            and thread in self.running
            and thread.segments
            and thread.segments[0] is segment
        ):
            segment.work = 0.0
            self._pop(thread)

    def _pop(self, thread: CpuThread) -> None:
        """The running ``thread``'s first segment is done: its waiters run, it goes on to the next."""
        if self._next(thread):  # idle, after its waiters: work they give it runs on
            self._at(self._clock(), lambda: self._idle(thread))

    def move(self, src: CpuThread, dst: CpuThread) -> None:
        """The thread that ran as ``src`` goes on as ``dst`` (the simulator's node thread stands for
        whichever of a daemon's threads holds its interpreter; its storage thread's released work runs
        on ``disk_cpu``): with ``slice``, ``dst`` keeps the core ``src`` has if it is done with its work,
        no new run and no queue. Nothing otherwise (processor sharing has no cores to keep)."""
        if self.slice is None or dst in self.running:
            return
        if dst.segments and dst.segments[0].pause is not None:  # off the cores (``hand_off``'s wait)
            return
        now = self._clock()
        if src in self.running and not src.segments:
            src.stamp += 1
            del self.running[src]
        elif src.left_at == now and (src.successor is None or src.successor.since == now):
            # it gave its core up at this moment (another of the node's threads queued for the
            # interpreter, or it went idle): it has it still, the thread that took it queues again
            taker = src.successor
            src.left_at = -1.0
            if taker is not None and taker in self.running and taker.segments:
                taker.stamp += 1
                del self.running[taker]
                self.runs -= 1
                self.waited -= now - taker.queued_at
                self.queue.appendleft(taker)
            elif len(self.running) >= (self.cores or 0):
                return
        else:
            return
        if dst in self.queue:
            self.queue.remove(dst)
            self.waited += self._clock() - dst.queued_at
        dst.core = src.core
        self.running[dst] = None
        dst.since, dst.slice_from = self._clock(), src.slice_from
        self._at(dst.slice_from + self.slice, lambda: self._slice_end(dst))
        if dst.segments:
            if dst.segments[0].wake:
                self._pop(dst)
            elif dst.segments[0].pause is None:
                self._held_plan(dst)

    def can_hand_off(self, waker: CpuThread) -> bool:
        """Whether :meth:`hand_off` would take ``waker``'s core now: on a full box with ``slice``, it on a
        core (its work may be done: it holds the core until it blocks, an event later), or having given
        it up at this very moment to a thread queued (the events' order, as in :meth:`move`), and its
        next segment no wake-up or pause."""
        if self.slice is None or self.cores is None or len(self.running) < self.cores:
            return False
        head = waker.segments[0] if waker.segments else None
        if head is not None and (head.wake or head.pause is not None):
            return False
        return waker in self.running or self._just_left(waker)

    def _just_left(self, thread: CpuThread) -> bool:
        successor = thread.successor
        return (
            not thread.segments
            and thread.left_at == self._clock()
            and successor is not None
            and successor in self.running
            and successor.since == thread.left_at
        )

    def hand_off(self, waker: CpuThread, burst: float, back: float) -> bool:
        """A thread ``waker`` has just woken takes ``waker``'s core (the kernel's wake-up preemption) for
        ``burst`` seconds of CPU and blocks (it wants the interpreter ``waker`` holds); ``waker`` is off
        the cores for ``back`` seconds, then first in the queue, and what it has (or is given meanwhile)
        waits for that. Why: the daemons' loops lost their core so to their own storage thread or reader
        three times in four of their preemptions, where the simulator's node thread, one thread whatever
        its role, had a wait and no run (bench/RESULTS.md sim24, sim24b). False, and nothing done, unless
        :meth:`can_hand_off`."""
        if not self.can_hand_off(waker):
            return False
        now = self._clock()
        successor = waker.successor
        if waker not in self.running and successor is not None:  # it had the core: the taker queues again
            successor.stamp += 1
            del self.running[successor]
            self.runs -= 1
            self.waited -= now - successor.queued_at
            self.queue.appendleft(successor)
            waker.core = successor.core
            self.running[waker] = None
            waker.since = now
        if waker.segments:
            self._held_count(waker)
        taker = CpuThread(core=waker.core)
        taker.segments.append(_Segment(work=burst))
        taker.queued_at = now
        self.queue.appendleft(taker)
        self._leave(waker)  # the taker has its core
        waker.left_at, waker.successor = -1.0, None  # not a core it keeps (``move``)
        pause = _Segment(pause=back, ends=now + back)
        waker.segments.appendleft(pause)
        self._at(pause.ends, lambda: self._handed_back(waker))
        self.hand_offs += 1
        return True

    def _handed_back(self, thread: CpuThread) -> None:
        """``thread``'s wait after a :meth:`hand_off` is over: first in the queue for a core for its work
        (a wake-up or a pause next begins as any does; nothing: it is idle)."""
        pause = thread.segments.popleft()
        now = self._clock()
        for action in pause.waiters:
            self._at(now, action)
        if not thread.segments:
            thread.idle_since = now
            return
        head = thread.segments[0]
        if head.wake or head.pause is not None:
            self._begin(thread)
            return
        thread.queued_at = now
        self.queue.appendleft(thread)
        self._dispatch()

    def _idle(self, thread: CpuThread) -> None:
        if thread in self.running and not thread.segments:
            self._leave(thread)

    def _next(self, thread: CpuThread) -> bool:
        """``thread``'s first segment is done: its waiters run now and it begins its next segment, or
        goes idle (True). One place for a segment's end, whichever scheduler ended it."""
        now = self._clock()
        segment = thread.segments.popleft()
        for action in segment.waiters:
            self._at(now, action)
        if thread.segments:
            self._begin(thread)
            return False
        thread.idle_since = now
        return True


def counted_name(message: bytes) -> str:
    """The type a daemon counts ``message`` under (``net/gossip.py`` ``_count``: core 2's by its code)."""
    name = message_type_name(message)
    if name == "other" and len(message) >= 2 and message[1] in CORE2_NAMES:
        return CORE2_NAMES[message[1]]
    return name


def mesh_topology(n: int, degree: int, seed: int) -> set[frozenset[int]]:
    """Each node dials ``degree`` random others; node i first dials one of 0..i-1, so the graph is
    connected whatever the draw (``bench/bench_mesh.py`` builds its mesh with this)."""
    rng = random.Random(seed)
    edges: set[frozenset[int]] = set()
    for i in range(1, n):
        edges.add(frozenset((i, rng.randrange(i))))
    count = Counter(x for e in edges for x in e)
    for i in range(n):
        others = [j for j in range(n) if j != i]
        rng.shuffle(others)
        for j in others:
            if count[i] >= min(degree, n - 1):
                break
            if frozenset((i, j)) not in edges:
                edges.add(frozenset((i, j)))
                count[i] += 1
                count[j] += 1
    return edges


def farthest(n: int, edges: set[frozenset[int]], source: int = 0) -> tuple[int, int]:
    """The node farthest from ``source`` in hops, and how many."""
    adjacent: dict[int, list[int]] = {i: [] for i in range(n)}
    for a, b in (tuple(e) for e in edges):
        adjacent[a].append(b)
        adjacent[b].append(a)
    dist = {source: 0}
    todo = deque([source])
    while todo:
        x = todo.popleft()
        for y in adjacent[x]:
            if y not in dist:
                dist[y] = dist[x] + 1
                todo.append(y)
    far = max(range(n), key=lambda i: dist[i])
    return far, dist[far]


@dataclass(frozen=True)
class Costs:
    """Seconds each step takes (a loopback mesh of daemons on a busy 2-core box, roughly)."""

    link_delay: tuple[float, float] = (0.0001, 0.0004)  # one way, drawn per link
    message: float = 0.0001  # decrypt, decode, run the session: per received message ...
    message_byte: float = 0.0  # ... and per byte of it (0: the core-1 calibration had none)
    verify: float = 0.0005  # check a delta's signatures: per delta ...
    verify_record: float = 0.000002  # ... and per record
    cut: float = 0.001  # read (the storage thread) and encode a delta: per delta ...
    cut_record: float = 0.000001  # ... and per record
    commit: float = 0.001  # a transaction on the storage thread: its fsync (waits on the disk) ...
    commit_record: float = 0.000002  # ... and per record (merged and written first: uses a core)
    #: The storage thread's work per delta it verifies and merges itself (one not checked ahead on the
    #: event loop), besides ``verify``: the store's reads of the rows the delta follows, its statements,
    #: the change hook. 0: none (core 1's had none).
    merge: float = 0.0
    #: The writer's storage thread per record of an API call on top of ``commit_record``: chaining and
    #: signing them (``queue2.commit``) where a replica's joins a verified delta. 0: none (core 1's).
    sign_record: float = 0.0
    #: The writer's storage thread per record of an API call from its transaction's start to its COMMIT,
    #: measured whole (the daemons' ``Writer.process`` to ``Store.commit``, ``thread_time``): set, it
    #: stands for ``commit_record`` + ``sign_record`` on an API call's records (``commit_record`` is a
    #: replica's, a verified delta's join in it). None: those two.
    offer_store_record: float | None = None
    #: The fsync's wait per record of the transaction on top of ``commit`` (a bulk chunk's WAL frames
    #: take longer to reach the disk than a live record's). 0: none (the core-1 calibration had none).
    sync_record: float = 0.0
    #: A delta the store must read (the peer lacks more than the last commit's records) is read on a
    #: reader thread (``storage/replica.py`` ``delta_for``: ``bridge.read``) while the link's driver waits
    #: for it; one of the last commit's records only is cut in memory (``storage/live.py`` ``pushed_delta``).
    read: float = 0.0005
    read_record: float = 0.0000005
    #: The event loop's own work per DELTA2 received, whatever its size, beyond ``message`` and ``verify``
    #: (the sans-IO parts timed in-process): trio's wake-up and task steps, the socket's read, the ahead
    #: check's and the completion's Python around them. 0: none (core 1's calibration had none).
    delta_loop: float = 0.0
    #: ... and per DELTA2 sent, beyond ``cut`` (the pass-on's ``local_change2``, the write).
    send_loop: float = 0.0
    #: Each CPU step takes its cost times a seeded draw from [1 - jitter, 1 + jitter]: N daemons share
    #: the box's cores, and the scheduler decides which relay's copy wins a race.
    jitter: float = 0.5
    #: A node whose CPU was idle for longer than ``warm_for`` pays ``wake`` on its next step (the event
    #: loop's and threads' wake-ups, cold caches): what a live record at 5/s costs each daemon on top of
    #: what the same record costs it inside a 100/s stream.
    wake: float = 0.0012
    warm_for: float = 0.02
    #: Cores the nodes share (bench_mesh runs every daemon on one box), as the scheduler shares them: the
    #: threads with work now each advance at ``min(1, cores / runnable)`` (:class:`Box`). None: each node
    #: has its own machine.
    cores: int | None = 2
    #: A woken thread's wait for a core per thread runnable beyond the cores (:meth:`Box.wake`): paid
    #: at each hop between a node's threads and each slice of its storage thread's work (``MeshSim2``).
    #: 0: a woken thread runs at once (core 1's calibration had no such wait).
    hop: float = 0.0
    #: How long a thread on a core keeps it while others wait (:class:`Box` ``slice_s``): set, a thread
    #: runs its burst at a full core once it has one and a woken thread waits in the run queue (``hop``
    #: unused); None: processor sharing with ``hop``'s wait a wake-up.
    core_slice: float | None = None
    #: The COMMIT's own CPU (its WAL frames written, the WAL index updated) per transaction and per record,
    #: run on the box by the storage thread in ``commit_runs`` runs after the one it is in (each after a
    #: sleep of ``commit`` + ``sync_record`` per record over ``commit_runs``, the fsync off the box).
    #: ``commit_runs`` 0: the COMMIT is all wait off the box (core 1's calibration, and sim21b's).
    commit_cpu: float = 0.0
    commit_cpu_record: float = 0.0
    commit_runs: int = 0
    #: The writer's event loop per API call of its client, and per record offered in it (``api/server``:
    #: the call decoded, records built); the rest of a call is its commit on the storage thread (chain
    #: hashed, batch signed, written: ``storage/writer.py``, ``commit`` and ``commit_record``). Together
    #: ~3.3 us per record, what bench_daemon part 1 measures of daemon CPU in 1,000-record calls (single
    #: durable offers ~100 us each). Steps like any other, so on a shared box a call takes longer while
    #: the relays work (bench_mesh's bulk calls take 10-19 ms each; ~4 ms on an idle box without peers).
    offer: float = 0.0001
    offer_record: float = 0.0000013
    #: The writer's client between two calls (bench_mesh's loop builds and encodes the next batch): a
    #: process of its own on the box's cores (``MeshSim.client``).
    client: float = 0.0005
    #: With this chance a step of an event loop is held up for a time drawn from [0, 2 x ``stall``]:
    #: the process descheduled (N daemons and the box's other work on its cores), a garbage collection.
    #: What puts a daemon's latency tail at tens of ms, and makes a relay that missed a push's turn send
    #: the next one with it. 0: never (the calibration of core 1 had none).
    stall_chance: float = 0.0
    stall: float = 0.0
    #: Set: an event loop's step is held up with a chance per second of its CPU instead (``1 - exp(-cpu x
    #: rate)``, ``stall_chance`` unused there): a process is descheduled per time on a core, so a step of a
    #: few us (one of a loop pass's sends) rarely has one where a step of ms often does. None: per step.
    stall_per_cpu_s: float | None = None
    graft_timeout: float = GRAFT_TIMEOUT_S
    graft_timeout_max: float | None = GRAFT_TIMEOUT_MAX_S
    #: How long HAVEs wait to go out together, as on daemon links (0: with the next send).
    have_linger: float = HAVE_LINGER_S
    ping_interval: float = 10.0  # process/ticks.py TICK_S
    ahead_records: int = AHEAD_DELTA_RECORDS
    ahead_max_records: int = AHEAD_MAX_RECORDS


@dataclass
class MeshNode:
    name: int
    sessions: dict[int, ReplicationSession] = field(default_factory=dict)
    durable: dict[QueueKey, QueueState] = field(default_factory=dict)
    #: What the node holds including verified live pushes not committed yet (served to peers, relayed).
    latest: dict[QueueKey, QueueState] = field(default_factory=dict)
    #: Those pushes as they came, in order (storage/ahead.py relays each as it came, never a batch of them).
    ahead: dict[QueueKey, list[QueueDelta]] = field(default_factory=dict)
    #: Its event loop's thread on the box's cores (with what holds its interpreter: ``MeshSim2.gil``).
    cpu: CpuThread = field(default_factory=CpuThread)
    #: Which of its threads queued the last work on ``cpu`` (``loop``, ``storage``, ``reader``): work of
    #: another is a hand-off of the interpreter, a wake-up (:meth:`Box.wake`).
    role: str = "loop"
    #: Until when its last transaction's fsync waits on the disk.
    disk_free: float = 0.0
    #: The reader thread's reads for link drivers, and the storage thread's per-record work of commits,
    #: when they run on cores of their own (not under the event loop's interpreter).
    reader: CpuThread = field(default_factory=CpuThread)
    disk_cpu: CpuThread = field(default_factory=CpuThread)
    #: Peers whose driver waits for a read from the store.
    reading: set[int] = field(default_factory=set)
    #: Where the last transaction's appended records start (the store's in-memory ``LiveCache``).
    last_first: int = 0
    received: Counter[str] = field(default_factory=Counter)
    #: CPU seconds its steps cost, before the jitter (bench_mesh's CPU/record).
    cpu_work: float = 0.0
    #: Per offset of the measured queue: hops of the copy that brought it first.
    hops: dict[int, int] = field(default_factory=dict)
    #: When each offset was first held (verified), for the time to reach the last node.
    reached: dict[int, float] = field(default_factory=dict)
    deadlines: dict[int, float] = field(default_factory=dict)
    #: The event loop's run queue: tasks woken (a link's reader or driver), run one after another, each
    #: once the CPU is done with the work of those before it (trio runs woken tasks in order).
    runq: deque[tuple[tuple[str, int], Callable[[], None]]] = field(default_factory=deque)
    queued: set[tuple[str, int]] = field(default_factory=set)
    turn_pending: bool = False
    #: Jobs handed to the storage thread while it commits: the next transaction takes all of them.
    waiting: list[_Job] = field(default_factory=list)
    committing: bool = False
    #: Transactions committed, and the merge or offer jobs they held (for deltas per commit).
    commits: int = 0
    committed_jobs: int = 0
    #: Deltas on their way into the store, shared by the node's sessions (as Gossip.arrivals).
    arrivals: Arrivals = field(default_factory=Arrivals)

    def held_end(self, key: QueueKey) -> int:
        state = self.durable.get(key)
        return 0 if state is None else state.held_end


@dataclass
class MeshSim:
    n: int
    degree: int = 3
    seed: int = 28
    costs: Costs = field(default_factory=Costs)
    window: int = 8
    depth: int = 4
    max_records: int = 4096
    max_bytes: int = (1 << 20) // 2
    #: Seed of the cost jitter (None: ``seed``); the graph is always drawn from ``seed``.
    draws: int | None = None
    #: Track hops and arrival per offset (off for a long bulk on a large mesh: memory).
    track: bool = True
    #: The optional protocol features every link agrees on: by default what two daemons of this build
    #: agree on (``compact``...); ``frozenset()`` for links as to a daemon that states none.
    features: frozenset[str] = field(default_factory=lambda: agree(ours(), ours()).features)
    now: float = 0.0
    nodes: list[MeshNode] = field(default_factory=list)
    edges: set[frozenset[int]] = field(default_factory=set)
    delays: dict[tuple[int, int], float] = field(default_factory=dict)
    _heap: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _seq: int = 0
    _calls: int = 0
    _arrival: dict[tuple[int, int], float] = field(default_factory=dict)
    _inbox: dict[tuple[int, int], deque[bytes]] = field(default_factory=dict)
    #: The writer's client (bench_mesh's process), a thread on the box's cores as the daemons' are.
    client: CpuThread = field(default_factory=CpuThread)
    #: DELTAs delivered per link (sender, receiver), since start.
    link_deltas: Counter[tuple[int, int]] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.box = Box(self.costs.cores, lambda: self.now, self._at, self.costs.hop, self.costs.core_slice)
        self.owner = Identity.from_seed(b"w" * 32)
        self.key: QueueKey = (self.owner.public_key, "mesh", 0)
        self.edges = mesh_topology(self.n, self.degree, self.seed)
        rng = random.Random(self.seed)
        self._rng = random.Random(self.seed if self.draws is None else self.draws)
        self.nodes = [self._new_node(i) for i in range(self.n)]
        lo, hi = self.costs.link_delay
        for a, b in sorted(tuple(sorted(e)) for e in self.edges):
            delay = rng.uniform(lo, hi)
            self.delays[(a, b)] = self.delays[(b, a)] = delay
            for x, y in ((a, b), (b, a)):
                self.nodes[x].sessions[y] = self._new_session(x)
            for x, y in ((a, b), (b, a)):
                self._start(x, y)
                self._flush(x, y)
            for x, y in ((a, b), (b, a)):  # the versions exchange answers after the HELLOs went out
                self.nodes[x].sessions[y].agree_features(self.features)
            self._at(self.costs.ping_interval, lambda a=a, b=b: self._ping(a, b))  # type: ignore[misc]

    def _new_node(self, name: int) -> MeshNode:
        return MeshNode(name)

    def _new_session(self, x: int) -> ReplicationSession:
        """Node ``x``'s end of a link, configured as a daemon's (``net/gossip.py`` ``run_peer``)."""
        return ReplicationSession(
            window=self.window,
            depth=self.depth,
            max_records=self.max_records,
            max_message_bytes=1 << 20,
            graft_timeout=self.costs.graft_timeout,
            graft_timeout_max=self.costs.graft_timeout_max,
            arrivals=self.nodes[x].arrivals,
            have_linger=self.costs.have_linger,
            incarnation=x.to_bytes(16, "big"),
        )

    def _start(self, x: int, y: int) -> None:
        """The link of ``x`` to ``y`` starts with what ``x`` holds (nothing: links come up first)."""
        self.nodes[x].sessions[y].start({})

    # ------------------------------------------------------------------ the clock
    def _at(self, when: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, action))

    def run_until(self, done: Callable[[], bool], limit: float = 3600.0) -> float:
        """Run events until ``done()`` (checked after each); returns the time then."""
        end = self.now + limit
        while self._heap and not done():
            when, _, action = heapq.heappop(self._heap)
            if when > end:
                raise RuntimeError("the mesh did not get there in time")
            self.now = max(self.now, when)
            action()
        return self.now

    def run_for(self, seconds: float) -> None:
        end = self.now + seconds
        while self._heap and self._heap[0][0] <= end:
            when, _, action = heapq.heappop(self._heap)
            self.now = max(self.now, when)
            action()
        self.now = end

    # ------------------------------------------------------------------ the writer (node 0)
    def wall_ms(self) -> int:
        """The writer's clock as records and heads carry it: Unix milliseconds (as the daemons' do, so
        they take as many bytes on the wire), from :data:`EPOCH_MS` at time 0."""
        return EPOCH_MS + int(self.now * 1000)

    def offer(self, count: int, payload: int, then: Callable[[], None] | None = None) -> None:
        """The writer's client offers ``count`` records in one call: the daemon's CPU takes the call, its
        storage thread commits it (with whatever else waits), then it is pushed and ``then`` runs (the
        reply reaches the client)."""
        node = self.nodes[0]

        def call() -> None:  # the API's task for the call, its turn come on the event loop
            self._busy(node, self.costs.offer + self.costs.offer_record * count)
            self.box.then(node.cpu, handled)

        def handled() -> None:
            records = [Record(value=bytes(payload), timestamp=self.wall_ms()) for _ in range(count)]
            stored: list[QueueState] = []

            def apply() -> None:  # in the transaction, after the jobs before it
                state = node.durable.get(self.key) or core.empty_state(self.owner.public_key, "mesh")
                state = _stored(core.commit(state, self.owner, now_ms=self.wall_ms(), records=records))
                node.durable[self.key] = node.latest[self.key] = state
                stored.append(state)

            def committed() -> None:
                (state,) = stored
                if self.track:
                    for offset in range(state.held_end - count, state.held_end):
                        node.hops[offset] = 0
                        node.reached[offset] = self.now
                self._changed(0, state.summary(), None)
                if then is not None:
                    then()

            self._store(0, _Job(count, apply, committed))

        self._calls += 1
        self._wake(0, ("call", self._calls), call)

    # ------------------------------------------------------------------ the storage thread
    def _store(self, y: int, job: _Job) -> None:
        """``storage/writer.py``'s group commit: a job handed over while a transaction is under way waits
        for the next one, which takes every job waiting then (one commit, one fsync); only after it are
        the jobs done (ACKs, relays). So a relay behind its sender stores several of its chunks at once
        and pushes them on as one delta."""
        node = self.nodes[y]
        node.waiting.append(job)
        if not node.committing:
            self._commit(y)

    def _commit(self, y: int) -> None:
        node = self.nodes[y]
        jobs, node.waiting = node.waiting, []
        node.committing = True
        records = sum(job.records for job in jobs)
        self.box.work(node.disk_cpu, self.costs.commit_record * records)

        def committed() -> None:
            node.commits += 1
            node.committed_jobs += len(jobs)
            before = node.held_end(self.key)
            for job in jobs:  # one transaction: every merge is in the store before any waiter runs
                job.apply()
            if node.held_end(self.key) > before:
                node.last_first = before
            for job in jobs:
                job.done()
            node.committing = False
            if node.waiting:
                self._commit(y)

        def synced() -> None:  # its records' work done, the COMMIT waits on the disk
            node.disk_free = self.now + self.costs.commit + self.costs.sync_record * records
            self._at(node.disk_free, committed)

        self.box.then(node.disk_cpu, synced)

    # ------------------------------------------------------------------ links
    def _send(self, x: int, y: int, messages: list[bytes], at: float) -> None:
        link = (x, y)
        for message in messages:
            arrival = max(at + self.delays[link], self._arrival.get(link, 0.0))  # TCP keeps order
            self._arrival[link] = arrival
            self._at(arrival, lambda m=message: self._arrive(x, y, m))  # type: ignore[misc]

    def _flush(self, x: int, y: int) -> None:
        messages = self.nodes[x].sessions[y].messages_to_send()
        if messages:
            self._send(x, y, messages, self.now)

    def _flush_after(self, x: int, y: int) -> None:
        """What the session queued goes out once ``x``'s event loop has done the work of producing it."""
        messages = self.nodes[x].sessions[y].messages_to_send()
        if messages:
            self.box.then(self.nodes[x].cpu, lambda: self._send(x, y, messages, self.now))

    def _arrive(self, x: int, y: int, message: bytes) -> None:
        """A message reaches ``y``'s socket for ``x``; read in order once ``y``'s CPU is free."""
        inbox = self._inbox.setdefault((x, y), deque())
        inbox.append(message)
        self._wake(y, ("read", x), lambda: self._read(x, y))

    def _wake(self, y: int, task: tuple[str, int], run: Callable[[], None]) -> None:
        """Wake a task of ``y``'s event loop (once: a task already woken waits for its turn)."""
        node = self.nodes[y]
        if task in node.queued:
            return
        node.queued.add(task)
        node.runq.append((task, run))
        if not node.turn_pending:
            node.turn_pending = True
            self.box.then(node.cpu, lambda: self._turn(y))

    def _turn(self, y: int) -> None:
        node = self.nodes[y]
        if node.cpu.busy:
            self.box.then(node.cpu, lambda: self._turn(y))
            return
        task, run = node.runq.popleft()
        node.queued.discard(task)
        run()
        if node.runq:
            self.box.then(node.cpu, lambda: self._turn(y))
        else:
            node.turn_pending = False

    def _read(self, x: int, y: int) -> None:
        """The link's reader task, its turn come on the event loop: it reads what the socket holds
        (``net/gossip.py`` ``_reader`` reads on while bytes are there)."""
        inbox = self._inbox[(x, y)]
        while inbox:
            self._deliver(x, y, inbox.popleft())

    def _deliver(self, x: int, y: int, message: bytes) -> None:
        node = self.nodes[y]
        name = counted_name(message)
        if name in ("delta", "delta2"):
            self.link_deltas[(x, y)] += 1
        node.received[name] += 1
        node.received[name + "_bytes"] += len(message)
        cost = self.costs.message + self.costs.message_byte * len(message)
        self._busy(node, cost + self.costs.delta_loop if name == "delta2" else cost)
        node.sessions[x].receive_message(message, self.now)
        self._drive(y, x)

    def _busy(self, node: MeshNode, cost: float, role: str = "loop") -> None:
        """``node``'s event loop (or ``role``, a thread holding its interpreter) works ``cost`` (times the
        jitter draw) after what it has to do now, on the box's cores; with ``stall_chance`` it is then
        descheduled a while. Woken (idle before now) or taking the interpreter from another of the node's
        threads, it first waits for a core (:meth:`Box.wake`)."""
        idle = not node.cpu.busy
        if (idle and node.cpu.idle_since < self.now) or node.role != role:
            self.box.wake(node.cpu)
        node.role = role
        if idle and node.cpu.idle_since < self.now - self.costs.warm_for:
            cost += self.costs.wake
        node.cpu_work += cost
        scaled = self._scaled(cost)
        self.box.work(node.cpu, scaled)
        chance = self._stall_chance(node, scaled)
        if chance and self._rng.random() < chance:
            self.box.pause(node.cpu, self._rng.uniform(0, 2 * self.costs.stall))

    def _stall_chance(self, node: MeshNode, scaled: float) -> float:
        """The chance that a loop step of ``scaled`` seconds on ``node`` is held up (``Costs.stall_chance``
        a step, or ``stall_per_cpu_s`` a second of its CPU)."""
        rate = self.costs.stall_per_cpu_s
        return self.costs.stall_chance if rate is None else -math.expm1(-scaled * rate)

    def _scaled(self, cost: float) -> float:
        """``cost`` times the jitter draw (how long a step takes on a core; the box shares the cores)."""
        jitter = self.costs.jitter
        if jitter:
            cost *= self._rng.uniform(1 - jitter, 1 + jitter)
        return cost

    def cpu_free(self, node: MeshNode) -> float:
        """When ``node``'s event loop would be done with its work if the box's runnable set stayed."""
        return self.box.free_at(node.cpu)

    def _ping(self, a: int, b: int) -> None:
        """The dialler's keep-alive: a PING unless the link carried messages both ways lately."""
        quiet = self.costs.ping_interval / 2
        sent, heard = self._arrival.get((a, b), 0.0), self._arrival.get((b, a), 0.0)
        if self.now - sent >= quiet or self.now - heard >= quiet:
            self.nodes[a].sessions[b].ping(self._seq)
            self._flush(a, b)
        self._at(self.now + self.costs.ping_interval, lambda: self._ping(a, b))

    # ------------------------------------------------------------------ a node as the daemon is one
    def _drive(self, y: int, x: int) -> None:
        """The link driver of ``y`` for peer ``x``: answer the session's events, send what it queued.

        A task on the node's event loop (``net/gossip.py`` ``_driver``): it runs when its turn comes, after
        the tasks woken before it, and the delta it then asks the store for (``delta_for``) holds what is
        durable by then, so a relay behind its sender cuts one delta over several commits."""
        self._wake(y, ("drive", x), lambda: self._run_driver(y, x))

    def _run_driver(self, y: int, x: int) -> None:
        node = self.nodes[y]
        if x in node.reading:  # the driver awaits a read; its events wait (the reader task reads on)
            return
        session = node.sessions[x]
        session.tick(self.now)
        costs = self.costs
        while (event := session.next_event()) is not None:
            if isinstance(event, NeedDelta):
                delta = self._delta_for(node, event)
                if delta is not None and self._from_store(node, event, delta):
                    self._read_then(y, x, event.key, delta)
                    break
                if delta is not None:
                    self._busy(node, costs.cut + costs.cut_record * len(delta.records))
                session.provide_delta(event.key, delta)
            elif isinstance(event, DeltaReceived):
                node.received["copies"] += len(event.delta.records)
                self._busy(node, costs.verify + costs.verify_record * len(event.delta.records))
                self._verified(y, x, event)
        self._flush_after(y, x)
        deadline = session.next_deadline()
        if deadline is not None and node.deadlines.get(x) != deadline:
            node.deadlines[x] = deadline
            self._at(deadline, lambda: self._drive(y, x))

    def _from_store(self, node: MeshNode, event: NeedDelta, delta: QueueDelta) -> bool:
        """Whether the daemon reads ``delta`` from the store: not a push served ahead, and the peer lacks
        more than the last commit's records (what ``pushed_delta`` cuts from memory)."""
        pushes = node.ahead.get(event.key) or ()
        return all(delta is not pushed for pushed in pushes) and (
            event.since is None or event.since.held_end < node.last_first
        )

    def _read_then(self, y: int, x: int, key: QueueKey, delta: QueueDelta) -> None:
        """The link's driver waits while a reader thread reads ``delta`` (what was durable when it asked),
        then encodes it and carries on with its events."""
        node = self.nodes[y]
        node.reading.add(x)
        self.box.work(
            node.reader, self._scaled(self.costs.read + self.costs.read_record * len(delta.records))
        )

        def encode() -> None:
            node.reading.discard(x)
            self._busy(node, self.costs.cut + self.costs.cut_record * len(delta.records))
            node.sessions[x].provide_delta(key, delta)
            self._run_driver(y, x)

        self.box.then(node.reader, lambda: self._wake(y, ("read done", x), encode))

    def _delta_for(self, node: MeshNode, event: NeedDelta) -> QueueDelta | None:
        durable = node.durable.get(event.key)
        ahead = node.ahead.get(event.key)
        since = event.since
        if ahead and since is not None and (durable is None or since.held_end >= durable.held_end):
            # Served ahead of the commit: the push that extends exactly what the peer holds, as it came;
            # none does: nothing now, the commit pushes again (net/replication_service.py delta_for).
            for pushed in ahead:
                if pushed.from_offset == since.held_end and pushed.from_hash == since.held_hash:
                    return pushed
            return None
        if durable is None:
            return None
        return core.delta(durable, since, event.max_records, self.max_bytes)

    def _verified(self, y: int, x: int, event: DeltaReceived) -> None:
        """A verified delta goes to the storage thread; a live push that extends what we hold is served
        and relayed at once (before its commit), the ACK waits for the commit."""
        node = self.nodes[y]
        key, delta = event.key, event.delta
        latest = node.latest.get(key)
        pushes = node.ahead.setdefault(key, [])
        if (
            len(delta.records) <= self.costs.ahead_records
            and delta.records
            and latest is not None
            and delta.from_offset == latest.held_end
            and sum(len(d.records) for d in pushes) + len(delta.records) <= self.costs.ahead_max_records
        ):
            ahead = core.merge(latest, delta)
            if ahead.summary() != latest.summary():
                node.latest[key] = ahead
                pushes.append(delta)

                def relay() -> None:
                    self._note_arrival(y, x, delta)
                    self._changed(y, ahead.summary(), x)

                self.box.then(node.cpu, relay)
        merged: list[tuple[QueueState, bool]] = []

        def apply() -> None:
            before = node.durable.get(key) or core.empty_state(*key)
            after = _stored(core.merge(before, delta))
            merged.append((after, after.summary() != before.summary()))
            node.durable[key] = after
            current = node.latest.get(key)
            if current is None or current.held_end <= after.held_end:
                node.latest[key] = after
            pushes = node.ahead.get(key)
            if pushes:  # a commit that reaches a push's end drops it
                pushes[:] = [d for d in pushes if d.from_offset + len(d.records) > after.held_end]

        def committed() -> None:
            # The acker (net/gossip.py): each delta acknowledged with what its own merge left, in order.
            after, changed = merged[0]
            if changed:
                self._note_arrival(y, x, delta)
            session = node.sessions[x]
            session.delta_applied(event.seq, after.summary(), changed, self.now)
            self._drive(y, x)
            if changed:
                self._changed(y, after.summary(), x)

        self.box.then(node.cpu, lambda: self._store(y, _Job(len(delta.records), apply, committed)))

    def _note_arrival(self, y: int, x: int, delta: QueueDelta) -> None:
        if not self.track:
            return
        node, sender = self.nodes[y], self.nodes[x]
        for offset in range(delta.from_offset, delta.from_offset + len(delta.records)):
            if offset not in node.hops:
                node.hops[offset] = sender.hops.get(offset, 0) + 1
                node.reached[offset] = self.now

    def _changed(self, y: int, summary: Summary, source: int | None) -> None:
        """Gossip.local_change: every other link hears of it, and its driver runs."""
        node = self.nodes[y]
        for peer, session in node.sessions.items():
            if peer != source:
                session.local_update(self.key, summary, self.now)
                self._drive(y, peer)

    # ------------------------------------------------------------------ what bench_mesh measures
    def all_hold(self, end: int) -> bool:
        return all(node.held_end(self.key) >= end for node in self.nodes)

    def counters(self) -> list[Counter[str]]:
        return [Counter(node.received) for node in self.nodes]


@dataclass(frozen=True)
class _Job:
    """A job on a node's storage thread: ``apply`` writes it in the transaction, ``done`` runs once that
    is durable."""

    records: int
    apply: Callable[[], None]
    done: Callable[[], None]


def _stored(state: QueueState) -> QueueState:
    """``state`` as the store keeps it: older checkpoints thinned (storage/batch.py), so a delta read
    from the store carries only those, as the daemons' do."""
    thinned = thin_checkpoints(state.checkpoints, len(state.entries))
    return state if thinned is state.checkpoints else dataclasses.replace(state, checkpoints=thinned)


@dataclass
class PartResult:
    """What one part of the bench cost each replica (the writer, node 0, excluded)."""

    records: int
    payload: int
    #: Per replica: messages and bytes received by type, as the daemons count them, and ``copies``: the
    #: records in the DELTAs it received (a record that arrives twice counts twice).
    received: list[Counter[str]]
    #: Seconds from the first offer until every replica held everything.
    elapsed: float
    #: Largest hop count of a first copy, over records and replicas (None: not tracked).
    max_hops: int | None
    #: Per record: seconds from its commit at the writer until the last replica verified it.
    last_latency: list[float]

    def per_record(self, name: str) -> float:
        """Mean per replica per record of counter ``name`` (``delta``, ``have_bytes``...)."""
        return sum(c[name] for c in self.received) / len(self.received) / self.records

    def total_bytes_ratio(self) -> float:
        """All replicas' received bytes / ((N - 1) x payload), per record."""
        total = sum(v for c in self.received for k, v in c.items() if k.endswith("_bytes"))
        return total / (len(self.received) * self.records * self.payload)

    def types(self) -> list[str]:
        return sorted({k for c in self.received for k in c if not k.endswith("_bytes") and k != "copies"})

    def bytes_per_record(self) -> float:
        """Mean per replica: bytes of every message type received, per record."""
        total = sum(v for c in self.received for k, v in c.items() if k.endswith("_bytes"))
        return total / len(self.received) / self.records


def _part(sim: MeshSim, records: int, payload: int, schedule: Callable[[int], None]) -> PartResult:
    sim.run_for(1.0)  # what the last part left in flight settles (the bench waits and sleeps too)
    before = sim.counters()
    base = sim.nodes[0].held_end(sim.key)
    started = sim.now
    schedule(base)
    sim.run_until(lambda: sim.all_hold(base + records))
    elapsed = sim.now - started
    received = [after - b for after, b in zip(sim.counters()[1:], before[1:], strict=True)]
    max_hops = None
    latency: list[float] = []
    if sim.track:
        offsets = range(base, base + records)
        max_hops = max(node.hops[o] for node in sim.nodes for o in offsets)
        writer = sim.nodes[0]
        latency = [max(node.reached[o] for node in sim.nodes) - writer.reached[o] for o in offsets]
    return PartResult(records, payload, received, elapsed, max_hops, latency)


def bulk(sim: MeshSim, records: int, payload: int, batch: int = 1000) -> PartResult:
    """bench_mesh's bulk: the client offers ``batch`` records per call, each call once the last returned."""
    client = sim.costs.client

    def schedule(base: int) -> None:
        left = [records]

        def call() -> None:
            size = min(batch, left[0])
            left[0] -= size
            sim.offer(size, payload, then=replied if left[0] > 0 else None)

        def replied() -> None:  # the client, woken, builds the next batch on the box's cores
            sim.box.wake(sim.client)
            sim.box.work(sim.client, client)
            sim.box.then(sim.client, call)

        call()

    return _part(sim, records, payload, schedule)


def live(sim: MeshSim, rate: float, records: int, payload: int = 100) -> PartResult:
    """bench_mesh's live part: single offers at ``rate`` per second."""

    def schedule(base: int) -> None:
        start = sim.now
        for i in range(records):
            sim._at(start + i / rate, lambda: sim.offer(1, payload))

    return _part(sim, records, payload, schedule)


def warm_up(sim: MeshSim) -> None:
    """The bench's first record (the queue is created and one record offered before any part), once
    the links are up (bench_mesh waits until every daemon has its links)."""
    sim.run_for(0.5)
    sim.offer(1, 7)
    sim.run_until(lambda: sim.all_hold(1))
