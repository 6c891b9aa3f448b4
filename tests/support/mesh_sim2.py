"""The daemons of ``bench/bench_mesh.py`` on fork core 2, simulated in time (:mod:`support.mesh_sim`'s
clock, graph, costs, event loops and storage threads; this module is what differs on core 2).

Each link is a real :class:`ReplicationSession` with a real :class:`Core2Link` attached, agreed on the
features two daemons of this build agree on (``heads-v2`` and ``compact`` among them), with the daemons'
HAVE linger and graft timer; the queue is a real ``QueueState2``. Each node does what the daemon's core-2
host does (``net/core2_engine_host.py``, ``net/core2_ahead.py``, ``net/gossip.py``):

* a received live push (1..64 records) that verifies against the value ahead (or the committed one) is
  joined on the event loop, told at once to every other link (``local_change2`` without its source) and
  passed on as it came to a peer holding what it was checked against (``Relay``); its merge lingers on
  the storage thread for company (``MERGE_LINGER_S``, up to ``MERGE_LINGER_JOBS``), only its ACK2 waits;
* any other delta is verified and joined on the storage thread;
* every commit that changed the queue is told to every link, the one the delta came from included (the
  store's change hook), before the commit's ACK2s go out;
* a delta is cut from memory when the value ahead, or the rows the last merges appended (``RecentRows``,
  with its arithmetic: see :meth:`MeshSim2._note_recent`) cover what the peer lacks and the row before it;
  otherwise the link's driver waits for a read on a reader thread (the owner's commits note no recent
  rows: the writer reads every delta; a relay of a bulk reads every chunk, as the daemon's does);
* the storage and reader threads' work holds the node's interpreter lock, as the event loop's does
  (``gil``): a relay busy committing a chunk of a bulk is late cutting the next, and sends two at once.
  A thread wanting the lock waits for the loop's ready tasks, at most the switch interval
  (:meth:`MeshSim2._interpreter`); the storage thread takes what waits once it holds it; reads take one
  of the daemon's two reader connections, so the writer's next API call goes before its third link's;
  with ``reader_threads`` (off by default), a read's worker thread (``trio.to_thread``) is woken and runs
  on the box of its own first: only once it has a core does it want the interpreter (taking it on that
  core if free), so a read waiting for a core leaves the interpreter to the node's loop and storage
  thread, as the daemons' reads did (bench/RESULTS.md sim21d);
* the interpreter passes between the storage thread and the loop as CPython 3.11 passes it
  (:meth:`MeshSim2._storage_work`): the holder runs on until a blocking call releases it (the writer's
  chain hash, signature, SQLite statements: ``WRITER_GIL_FREE``) or the other, after waiting a switch
  interval, asks it to drop it; so the loop runs in the storage thread's released stretches and at
  most a switch interval after it asked, and the storage thread's work is not cut while the loop is idle;
  a thread waiting behind the loop's ready tasks asks as late as any waiter (:meth:`MeshSim2._asks_at`),
  not at all if the storage thread took the interpreter meanwhile, and once it took it its wake-up is
  no longer a task of the loop's (:meth:`MeshSim2._interpreter`, bench/RESULTS.md sim22);
* on the box's full cores a thread woken waits for one, in the run queue, and once on a core keeps it
  for its burst (until it blocks or has run the kernel's base slice while others wait: ``BASE_SLICE_S``,
  :class:`Box` ``slice_s``; ``Costs.hop``'s even share and wait a wake-up are the processor-sharing
  box's, sim20): at each hand-off of the interpreter between a node's threads (the storage thread's
  released work keeps the core it held the interpreter on: ``Box.move``); the COMMIT releases the
  interpreter and runs its CPU on the box as the daemons' storage threads run it (a burst, then 3 runs
  each after a sleep, the fsync's, off the box: ``Costs.commit_runs``); the thread then takes the
  interpreter back and its next batch at once, and the commit's callback (the change hook, the ACK2s) is
  a task of the loop (``run_sync_soon``), as the daemons' was.
* a thread woken on the full box takes the core of another node's thread running there with the chance
  the daemons' recorded scheduler gave that thread's role (``wake_preempts``, ``WAKE_PREEMPT_CHANCE``,
  ``Box.preempt``); the thread taken off it queues behind the others (bench/RESULTS.md sim25).

Messages are counted under the daemons' names (``delta2``, ``ack2``, ``have2``...).

Why one module: the core-2 node's storage thread, link drivers and relay share one clock and one set of
per-node state, each step the daemon's counterpart read side by side with it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from latticed.crdt import queue2
from latticed.crdt.core_errors import GapError
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.daemon import GIL_SWITCH_INTERVAL_S
from latticed.errors import LatticedError
from latticed.host.config import DaemonConfig
from latticed.net.core2_ahead import Relay
from latticed.net.core2_recent import RECENT_RECORDS
from latticed.protocol.core2_session import Core2Link, Delta2Received, NeedDelta2
from latticed.protocol.core2_steps import Outgoing2, outgoing, unpack_steps
from latticed.protocol.core2_wire import Summary2, link_summary
from latticed.protocol.replication import QueueKey, ReplicationSession
from latticed.storage.ahead import AHEAD_DELTA_RECORDS
from latticed.storage.engine import Engine
from latticed.storage.writer import _RECENT_S as WRITERS_SEEN_S
from latticed.storage.writer import MERGE_LINGER_JOBS, MERGE_LINGER_S
from support.mesh_sim import Costs, CpuThread, MeshNode, MeshSim, PerCore, _Job

__all__ = ["CORE2_COSTS", "CORE2_LOOP_COSTS", "MeshNode2", "MeshSim2", "warm_up"]

#: ``group_commit_ms`` as a daemon has it unless configured (``storage/writer.py`` ``_collect``).
GROUP_COMMIT_S = {f.name: f.default for f in dataclasses.fields(DaemonConfig)}["group_commit_ms"] / 1000
#: How long a thread waiting for the interpreter lets the thread holding it run: the switch interval a
#: daemon sets for itself at start (``latticed.daemon``), not the test process's.
SWITCH_INTERVAL_S = GIL_SWITCH_INTERVAL_S
#: The reader threads a daemon's store reads on (``Engine.open``'s ``read_connections``, as the daemon
#: opens it; ``bridge.read`` holds one per read): a node's link drivers read two deltas at a time.
READ_CONNECTIONS: int = inspect.signature(Engine.open).parameters["read_connections"].default
#: The held work between two of the storage thread's releases of the interpreter when some of its work
#: releases it (``MeshSim2._storage_work``): the daemon's switch interval, as the py-spy samples give no
#: finer order of its calls (bench/RESULTS.md sim21). A thread wanting the interpreter asks for it after
#: waiting this long (``SWITCH_INTERVAL_S``, the same).
STORAGE_SLICE_S = GIL_SWITCH_INTERVAL_S
#: The part of the writer's storage CPU outside its COMMIT that runs with the interpreter released, beside
#: the event loop: the chain hash (``latticed_chain_extend``, 12 %), SQLite's statements (``sqlite3_step``,
#: 8 %) and the signature (``crypto_sign_ed25519``, 2 %). Measured, not fitted: py-spy ``--native`` on the
#: writer's bulk transaction alone (1,000 records of 100 B a ``Commit2``, as the API hands it over;
#: 0.221 and 0.196 of the samples outside ``Store.commit`` in two runs; bench/RESULTS.md sim20c). The
#: COMMIT releases it throughout (its CPU ``commit_cpu``, its sleep ``sync_record``).
WRITER_GIL_FREE = 0.21
#: The least held work the storage thread does between two hand-offs of the interpreter (an event's
#: length floor, not a cost: CPython checks for a drop request every few bytecodes).
_MIN_PIECE_S = 0.00001

#: Each daemon's CPU per operation as measured, not fitted to the outcome (bench/RESULTS.md, "per-message
#: CPU costs measured from the daemons"); the stalls and ``wake`` are core 1's fit as before.
#: ``bench/bench_sim_costs.py --draws 0,1,2,3 --daemons <bench_mesh logs>`` measures them (the means of
#: its output, 2026-11-30; measured again on main 5ff9f90 with sim24's eight bulk runs' logs, the costs
#: below since sim24b: the received byte 39 % cheaper, the signature check half, bench/RESULTS.md sim24
#: and sim24b; the COMMIT's, the writer's store and ``hop`` as before).
#: Sans IO, the real functions on the bulk's real messages (the simulator's bulk
#: at N = 8, each call's ``time.thread_time``, with the daemon's GC settings):
#: ``message``/``message_byte`` a received message's ``SecureChannel`` open and ``receive_message`` (a
#: small one's median; the rest per byte), ``cut``/``cut_record`` an outgoing one's ``_encode`` and
#: ``seal`` (per record at the bulk's 106 B of DELTA2 a record), ``verify``/``verify_record``
#: ``unpack_steps`` and ``queue2.verify_delta`` (the fixed part: one batch's signature), ``sign_record``
#: the writer's ``queue2.commit``. From the daemons' threads (bench_mesh ``--metrics``, CPU by thread,
#: four bulk runs on main's code): ``merge`` and ``commit_record`` the replicas' storage threads, their CPU
#: over the deltas and records they merged (least squares over the replicas), less the check above;
#: ``read_record`` the writer's reader threads per record read (every read a bulk chunk: no fixed part
#: separable). The COMMIT (bench/RESULTS.md sim21c; the daemons' storage threads' schedstat and
#: ``thread_time`` around ``Store.commit``, sim21's probe runs d1 (bulk) and d2 (mostly live records)):
#: ``commit_cpu``/``commit_cpu_record`` its CPU (0.24 ms a live record's, 0.42 ms the writer's 1,000),
#: ``commit_runs`` the runs it takes (3, the median of every node in both runs), ``commit``/``sync_record``
#: the rest of its wall less its run-queue wait (0.19 ms, 0.62 ms): the fsync's sleep, off the box (its
#: run-queue waits are the box's own). Until sim21c the whole COMMIT was a wait off the box (1 ms + 5.5 us a
#: record, the daemons' ``latticed_storage_fsync_seconds``, which hold those waits). The stalls (a
#: process descheduled) are the fit to the daemons'
#: live 100/s part of 2026-11-29 and ``wake`` core 1's, as before. Until this these per-operation costs
#: were core 1's fit (0.1 ms a message, 0.5 ms + 2 us a record to verify, 2 us a record to commit, 0.5 ms
#: + 0.5 us a record to read), and the codec timed without the daemon's GC settings: 50 us of CPU a bulk
#: record over the nodes against the daemons' 38, the storage threads' work 1.7 times theirs.
#: ``hop`` (:meth:`Box.wake`) from the daemons' schedstat (bench_mesh ``--metrics``, bulk at N = 8, three
#: runs: sim20's two and schedstat19's; bench/RESULTS.md sim20): each run's run-queue wait a run (all
#: threads' waits over their times run) over the box's mean of threads runnable beyond the 2 cores (all
#: waits and CPU over the part's window, less 2): 0.244, 0.327, 0.270 ms; their mean. At N = 4 the same
#: reads 0.16-0.20 ms (the wait grows faster than the runnable count): not the N = 8 figure's to use.
#: How long a thread on a core runs on while others wait for one (``Costs.core_slice``): the kernel's
#: base slice, ``sysctl_sched_base_slice`` (``sched_min_granularity`` before EEVDF), 0.75 ms scaled by
#: 1 + log2 of the cores (``sched_tunable_scaling`` logarithmic, its default) for bench_mesh's box of 2:
#: 1.5 ms. Not read from the box (debugfs is not mounted there), not fitted: the daemons' threads run
#: 0.26-0.35 ms a run (bench/RESULTS.md sim20), so nearly every run ends by blocking, not by the slice.
BASE_SLICE_S = 0.00075 * (1 + 1)
#: The writer's storage thread per record of an API call until its COMMIT, measured whole on the daemons:
#: ``Writer.process`` to ``Store.commit``, ``thread_time`` (the interpreter held or not), 1,000-record
#: calls of bench_mesh's bulk at N = 8, the mean of four probe runs' means: 1.24 and 1.13 ms (sim21's d1,
#: d2), 1.288 (sim21c), 1.117 (sim22) a transaction (bench/RESULTS.md sim22). Until sim22 the simulator
#: charged ``sign_record`` (``queue2.commit`` sans IO, 0.835 us) plus a replica's ``commit_record`` (0.81
#: us, a verified delta's join 0.41 us of it): 1.645 ms a chunk, 1.4x the daemons', past the kernel's
#: slice on a full box.
OFFER_STORE_RECORD_S = (0.00124 + 0.00113 + 0.001288 + 0.001117) / 4 / 1000
#: The loop's stalls per second of its CPU (``Costs.stall_per_cpu_s``): ``stall_chance``'s fitted 1.5 % a
#: step over the simulated loop steps' mean scaled CPU in the part it was fitted to, live 100/s (150
#: records after the warm-up, draws 0-7 on sim23b's model: 28,754 steps, 40.4 us a step; bench/RESULTS.md
#: sim23c). A rate a unit of core time, not a new fit: the live part's stalls stay as many, the warm-up's
#: few-us steps between one loop pass's sends rarely stall (the daemons' writer sent its first head on its
#: three links within 0.2 ms, sim23b).
STALL_PER_CPU_S = 0.015 / 0.0000404
#: A thread of a node woken by another of its threads that holds the node's interpreter, with the other
#: core busy, takes its waker's core (``MeshSim2.hand_offs``, :meth:`Box.hand_off`) with the chance
#: measured for that waker and wakee (sim24's two recorded bulks, sched_switch and sched_waking, pooled;
#: /tmp/sim24b/sw3own.py, sim24's ``sw3.py`` split by wakee: the loop waking its storage thread 212 of
#: 777 times, a reader 100 of 415, the storage thread waking its loop 258 of 788), times the part of
#: such takes (a loop's by its own storage thread or reader) in which the taker ran a short burst and
#: blocked (< 100 us, blocked: 246 of 343, 0.717; the rest ran ~1.2 ms of their own work, which the
#: node's thread runs here as before). bench/RESULTS.md sim24, sim24b.
HAND_OFF_SHORT = 246 / 343
HAND_OFF_CHANCE = {
    ("loop", "storage"): 212 / 777 * HAND_OFF_SHORT,
    ("loop", "reader"): 100 / 415 * HAND_OFF_SHORT,
    ("storage", "loop"): 258 / 788 * HAND_OFF_SHORT,
}
#: The taker's burst in those short takes (us, the 10 deciles' midpoints of 246: median 11.5, mean 14.4)
#: and its waker's wait for a core again from the take (20 ventiles' midpoints: median 16.5, mean 285),
#: both from the same takes (sim24's p1 and p2, /tmp/sim24b/sw4pair.py; bench/RESULTS.md sim24b).
HAND_OFF_BURST_US = (3.0, 4.0, 8.0, 10.0, 11.0, 13.0, 17.0, 19.0, 22.0, 27.0)
HAND_OFF_BACK_US = (
    *(3.0, 3.0, 4.0, 8.0, 10.0, 10.0, 10.0, 11.0, 12.0, 14.0),
    *(17.0, 19.0, 20.0, 23.0, 29.0, 45.0, 124.0, 595.0, 1200.0, 2373.0),
)
#: The storage thread's sleeps in the disk (``D``: the COMMIT's fsync) and its run-queue wait after each
#: (its wake-up to its switch-in), in us, 20 ventiles' midpoints of 4,320 such sleeps of the daemons'
#: storage threads in six recorded bulks at N = 8 (sim24's p1, p2 and sim25c's q11-q22, sched_switch and
#: sched_wakeup; /tmp/sim26/dvent.py; bench/RESULTS.md sim26): the sleep a median 51 us, mean 70 (the
#: COMMIT's modelled sleep ``sync`` over its runs: ~0.2 ms), the wait a median 76 us, mean 1.2 ms, p97.5
#: 8.3 ms (the box's one queue: ~0.4 ms a run). ``MeshSim2.fsync_waits`` draws both a COMMIT run.
FSYNC_SLEEP_US = (
    *(21.0, 22.0, 23.0, 26.0, 31.0, 35.0, 39.0, 43.0, 47.0, 51.0),
    *(56.0, 61.0, 68.0, 76.0, 85.0, 95.0, 106.0, 121.0, 144.0, 202.0),
)
FSYNC_WAIT_US = (
    *(2.0, 2.0, 3.0, 3.0, 4.0, 6.0, 8.0, 17.0, 28.0, 76.0),
    *(224.0, 436.0, 601.0, 809.0, 1146.0, 1598.0, 2184.0, 3038.0, 4491.0, 8311.0),
)
#: The chance that a thread woken while both cores run another's work takes the core of the thread running
#: there (the kernel's wake-up preemption, ``MeshSim2.wake_preempts``), by that thread's role: sim24's two
#: recorded bulks (sched_switch and sched_waking, pooled; /tmp/sim25/wk_pre2.py), every wake-up of a
#: daemon's thread with both cores busy whose target core ran another daemon's thread (or the client, an
#: outside process), and whether the wakee was switched in there at once, the other switched out runnable:
#: a storage thread 601 of 1,540 times, an event loop 381 of 1,415, a reader 73 of 221, an outside task
#: 17 of 117. A node's own threads are the hand-off's (``HAND_OFF_CHANCE``). bench/RESULTS.md sim25.
WAKE_PREEMPT_CHANCE = {
    "storage": 601 / 1540,
    "loop": 381 / 1415,
    "reader": 73 / 221,
    "outside": 17 / 117,
}
#: ``MeshSim2.per_core_queues`` (``Box.per_core``), from sim24's two recorded bulks (sched_waking and
#: sched_switch; /tmp/sim25b/place.py, bench/RESULTS.md sim25b): a daemon thread woken while a core was
#: idle (nothing running or queued there) was queued on it 161 of 242 times, else on its previous core
#: (81 of 81); with both cores busy on its previous core 5,197 of 5,201 times (the waker's 67 %).
WAKE_IDLE_CHANCE = 161 / 242
#: The idle balance: of 584 spells a core sat idle while a daemon thread waited queued on the other, 40
#: ended with that thread pulled over, the rest otherwise (a thread woken onto the idle core, the waiters
#: run on their own): the chance that no pull came by each delay (us), Kaplan-Meier with the other ends
#: censored; beyond the last, no pull in the spell (64 %).
PULL_SURVIVAL = (
    *((3, 0.998), (6, 0.997), (42, 0.994), (60, 0.992), (63, 0.989), (72, 0.987), (98, 0.984)),
    *((116, 0.981), (133, 0.977), (165, 0.973), (236, 0.969), (239, 0.964), (245, 0.96), (375, 0.955)),
    *((412, 0.95), (503, 0.944), (592, 0.937), (611, 0.93), (615, 0.923), (862, 0.914), (926, 0.906)),
    *((966, 0.897), (1136, 0.887), (1202, 0.877), (1227, 0.866), (1259, 0.855), (1344, 0.844)),
    *((1349, 0.833), (1530, 0.821), (1662, 0.809), (1667, 0.797), (1923, 0.784), (1987, 0.77)),
    *((1999, 0.757), (2025, 0.743), (2173, 0.729), (3199, 0.71), (3676, 0.69), (4280, 0.665), (4430, 0.64)),
)


def pull_delay(rng: random.Random) -> float | None:
    """An idle spell's pull (seconds), drawn from ``PULL_SURVIVAL``; None: no pull in it."""
    u = rng.random()
    return next((us * 1e-6 for us, survive in PULL_SURVIVAL if 1.0 - survive >= u), None)


CORE2_COSTS = Costs(
    stall_chance=0.015,  # the storage thread's draw a transaction (:meth:`MeshSim2._storage_work`)
    stall=0.01,
    stall_per_cpu_s=STALL_PER_CPU_S,
    message=0.0000189,  # receive_message + open: a small message's median, 18.9 us
    message_byte=0.00000000384,  # ... and the rest per byte: 3.84 ns
    cut=0.0000087,  # _encode + seal: 8.7 us ...
    cut_record=0.000000319,  # ... and 3.0 ns a byte, 0.319 us a bulk record
    verify=0.0000451,  # verify_delta's part independent of size: one batch's signature
    verify_record=0.000000527,  # unpack_steps + verify_delta, the rest per record
    merge=0.001081,  # the replicas' storage threads: 1.13 ms a delta, less ``verify``
    commit_record=0.000000739,  # ... 1.27 us a record, less ``verify_record``
    sign_record=0.000000835,  # queue2.commit per record of an API call (unused: offer_store_record)
    offer_store_record=OFFER_STORE_RECORD_S,  # the writer's storage thread until its COMMIT, measured whole
    read=0.0,
    read_record=0.00000033,  # the writer's reader threads per record read
    hop=0.00028,  # processor sharing's wait a wake-up per thread beyond the cores (unused with a slice)
    core_slice=BASE_SLICE_S,  # a core held for a burst: the run-queue wait is the queue's, not ``hop``
    commit=0.00019,  # the COMMIT off the box (its wall less its CPU and run-queue wait): 0.19 ms ...
    sync_record=0.00000043,  # ... and 0.43 us a record
    commit_cpu=0.00024,  # the COMMIT's CPU: 0.24 ms ...
    commit_cpu_record=0.00000018,  # ... and 0.18 us a record
    commit_runs=3,  # in 3 runs of the storage thread after the one it began in
)

#: :data:`CORE2_COSTS` with the event loops' own work a DELTA2 (bench/RESULTS.md sim27c): a relay's live
#: turn in-process (``bench_relay_turn --wire --storage --pause 10``: decode 197, check 264, complete 90,
#: pass-on 87 and D's ACK 23 us a record, where ``message`` + ``verify`` and ``cut`` charge ~65 and ~9) and
#: the daemons' loops (bench_mesh ``--metrics``: 0.77-1.14 ms a live record at a relay at 100/s, 53-119
#: ms a 50k bulk where the model charged ~44): ``delta_loop`` 0.7 ms a DELTA2 received, ``send_loop`` 0.1 ms
#: one sent; with them sim27's storage fit of the twelve bulks (``merge`` 0.754 ms, ``commit_record``
#: 0.405 us), which the loops' CPU had stood in for. Not the default: with the old loop stalls (per CPU
#: second, fitted to sim23c's 37-81 ms tail) a 0.7-ms step stalls often and the live latency triples;
#: without them the bulk is 10 % short (sim27c's table).
CORE2_LOOP_COSTS = dataclasses.replace(
    CORE2_COSTS, delta_loop=0.0007, send_loop=0.0001, merge=0.000754, commit_record=0.000000405
)


@dataclass(frozen=True)
class _Recent:
    """A ``RecentRows`` run: it says it holds rows ``[lo, lo + count)``; they are rows ``[rows_lo, rows_lo
    + count)``."""

    lo: int
    count: int
    rows_lo: int

    @property
    def hi(self) -> int:
        return self.lo + self.count


@dataclass
class _Ahead:
    """The value after the newest live push verified here, until its merge commits (``AheadPushes``)."""

    value: QueueState2
    relay: Relay | None
    job: _Job
    done: bool = False


@dataclass(frozen=True)
class _Job2(_Job):
    #: A live push served ahead of its commit: its transaction may wait for company.
    may_linger: bool = False
    #: CPU the storage thread spends on it besides the commit's (verifying a delta not verified ahead).
    cpu: float = 0.0
    #: The peer whose delta it merges (``Job.origin``); None: an API call of the writer's.
    origin: int | None = None
    #: Of its storage CPU (``cpu`` and the commit's per record), what runs with the interpreter released.
    free: float = 0.0
    #: Whether ``cpu`` holds its records' writing too (an API call's, ``Costs.offer_store_record``): no
    #: ``commit_record`` for them.
    written: bool = False


@dataclass
class MeshNode2(MeshNode):
    durable2: dict[QueueKey, QueueState2] = field(default_factory=dict)
    ahead2: dict[QueueKey, _Ahead] = field(default_factory=dict)
    #: Per queue, the rows the latest merges appended (``RecentRows``): cut without a read.
    recent: dict[QueueKey, _Recent] = field(default_factory=dict)
    #: Whether a lingering transaction is waiting for company on the storage thread, and how many did.
    lingering: bool = False
    lingers: int = 0
    #: Seconds its transactions took from their jobs taken until the COMMIT returned holding the
    #: interpreter again, summed (the daemon's ``latticed_storage_commit_seconds``: a batch's apply, write
    #: and COMMIT; without ``gil``, until durable).
    commit_seconds: float = 0.0
    #: When its last transactions began, with how many writers (origins) each held (``_recent_sizes``),
    #: and whether a batch waits for as many writers as those held (``gathering``: which wait).
    batch_writers: deque[tuple[float, int]] = field(default_factory=deque)
    gathering: int = 0
    #: Reads under way (each holds one of :data:`READ_CONNECTIONS`), and the drivers waiting for one.
    readers: int = 0
    #: The interpreter between the storage thread and the loop (:meth:`MeshSim2._storage_work`): whether
    #: the storage thread holds it; when the loop, waiting for it, asks for it; since when the storage
    #: thread waits for it back, and what it then runs; how often it was handed over inside a transaction.
    storage_holds: bool = False
    loop_wants: float | None = None
    storage_wants: float = 0.0
    storage_resume: Callable[[], None] | None = None
    storage_hand_offs: int = 0
    #: The event loop's own thread while another holds the interpreter (``MeshSim2.loop_thread_runs``): its
    #: runs on the box (woken by epoll, then at its ``take_gil`` timeout), and how many it took.
    loop_thread: CpuThread = field(default_factory=CpuThread)
    loop_thread_waits: int = 0
    #: Its threads' wake-ups of another of its threads that took the waker's core (``MeshSim2._hand_off``).
    hand_offs: int = 0
    #: Seconds its transactions took from their jobs taken until their COMMIT began (its wait excluded).
    pre_commit_seconds: float = 0.0
    #: Its idle storage thread, woken by the loop's hand-over, waits for a core beside the loop
    #: (``MeshSim2.storage_wakes``); then whether it is on that core as it asks for the interpreter.
    storage_waking: bool = False
    storage_awake: bool = False
    read_queue: deque[tuple[int, Callable[[], None]]] = field(default_factory=deque)
    #: Reads in flight by their request (``EngineCore2Host.reads``, ``SharedReads``): the value read (held,
    #: so its id names it while the read runs) and the links awaiting that read's answer; and how many
    #: reads were issued and how many asks another's read answered (``SharedReads.issued``/``shared``).
    shared_reads: dict[tuple[int, object, int], tuple[QueueState2, list[int]]] = field(default_factory=dict)
    reads_issued: int = 0
    reads_shared: int = 0
    #: The reader threads free for a read (one a read connection: ``trio.to_thread``'s thread for
    #: ``bridge.read``): with ``gil`` each runs on the box of its own before it wants the interpreter.
    read_threads: list[CpuThread] = field(
        default_factory=lambda: [CpuThread() for _ in range(READ_CONNECTIONS)]
    )

    def held_end(self, key: QueueKey) -> int:
        state = self.durable2.get(key)
        return 0 if state is None else state.held[1]

    def ahead_value(self, key: QueueKey) -> _Ahead | None:
        entry = self.ahead2.get(key)
        loaded = self.durable2.get(key)
        if entry is None or entry.done:
            return None
        if loaded is not None and entry.value.held[1] <= loaded.held[1]:
            return None
        return entry


@dataclass
class MeshSim2(MeshSim):
    """:class:`MeshSim` with the queue on fork core 2 (see the module docstring)."""

    costs: Costs = field(default_factory=lambda: CORE2_COSTS)
    merge_linger: float = MERGE_LINGER_S
    #: Whether a node's storage and reader threads share one interpreter lock with its event loop (a
    #: Python daemon's do: their record work runs one at a time with the loop's); False: each its own core.
    gil: bool = True
    #: Whether a read's worker thread runs on the box of its own before it wants the interpreter (with
    #: ``gil``; :meth:`_read2_then`). Off by default: at N = 8 it moved the writer's reads into its next
    #: transaction's held work and the bulk's counts away from the daemons' (bench/RESULTS.md sim21d; again
    #: with sim22's writer: DELTA2 +18 %, ACK2 +32 % against +10 % and +16 % without).
    reader_threads: bool = False
    #: How long a batch waits for as many writers as the last ones held (``group_commit_ms``).
    group_linger: float = GROUP_COMMIT_S
    #: Whether the loop's thread, woken (epoll returned) while the storage thread holds the interpreter,
    #: takes runs of its own on the box before the hand-off (:meth:`_loop_waits`): the daemons' leaf relays'
    #: loops ran 1.1 times a chunk to find the interpreter held (bench/RESULTS.md sim23b, sim23c). False:
    #: the wait is a wait only (sim23b's model).
    loop_thread_runs: bool = True
    #: Whether a thread woken by another of its node's threads holding the interpreter may take its
    #: waker's core for a short burst before it blocks (:meth:`_hand_off`, ``HAND_OFF_CHANCE``): the
    #: daemons' loops' preemptions were mostly those (bench/RESULTS.md sim24). False: sim24's model.
    hand_offs: bool = True
    #: Whether the idle storage thread the loop hands a job to wakes on a core of its own before it takes
    #: the batch (``Writer._collect`` drains the queue once its ``get`` returned, running), the loop
    #: reading on meanwhile: the daemons' relays took a chunk handed to an idle storage thread a median
    #: 0.9-2.4 ms later, with what came meanwhile (bench/RESULTS.md sim24c). Off by default: at N = 8 it
    #: moved the bulk's DELTA2s and ACK2s toward the daemons' (+37/+48 % -> +20/+27 %) but the live parts
    #: away (5/s PRUNE2s and WANT2s, 100/s DELTA2s -10.6 %) and the 20k bulk's copies (1.06 -> 1.36).
    storage_wakes: bool = False
    #: Whether each of the COMMIT's sleeps (``Costs.commit_runs``) is the daemons' as their sched records
    #: give it, the fsync's sleep and the run-queue wait after it drawn (``FSYNC_SLEEP_US``,
    #: ``FSYNC_WAIT_US``), off the box (the run after it then queues as any), in place of ``Costs.commit``
    #: and ``sync_record`` spread over the runs and the box's wake-up (bench/RESULTS.md sim26). On by
    #: default since sim27, with ``stalls_on_full_box`` off: together at N = 8 they bring the relays'
    #: COMMIT from 0.30 to 0.84 of the daemons', the writer's transaction from 0.64 to 1.05 and the bulk
    #: from 1.08 to 0.93, the message counts within 6 % (bench/RESULTS.md sim27). Alone (sim26) it
    #: lengthened the bulk: the loops' stalls on a full box then held the writer's calls up as well.
    #: With a machine per node (``Costs.cores`` None) there is no run queue to wait in: bench_gossip's
    #: N = 1,000 turns it off.
    fsync_waits: bool = True
    #: Whether a thread woken with both cores busy may take the core of another node's thread running
    #: there, with ``WAKE_PREEMPT_CHANCE`` by that thread's role (:meth:`_wake_victim`, ``Box.preempt``):
    #: the daemons' relays' storage threads lost their core 4.25 times a transaction before its COMMIT,
    #: and waited for a core 20 ms of its 26 (bench/RESULTS.md sim25).
    wake_preempts: bool = True
    #: Whether the box keeps a run queue per core (``Box.per_core``: ``WAKE_IDLE_CHANCE``,
    #: ``PULL_SURVIVAL``): the daemons' threads waited 0.64-3.66 ms a run where the one shared queue gave
    #: ~0.4, and a core sat idle while a daemon thread waited 10-18 % of the recorded bulks (bench/
    #: RESULTS.md sim25, sim25b). A woken thread then may take only its own core's thread's. Off by
    #: default: at N = 8 it idles a core while a thread waits 8-12 % of the bulk (the daemons' 10-18 %) but
    #: lengthens a run's wait only 0.41 -> 0.49 ms (theirs 1.2), and in 2 of 8 draws the mesh never prunes
    #: (bytes +20 %; the 20k bulk 1.24-1.85 copies in 3 of 12), which the daemons' sixteen runs never did;
    #: without those two draws every count moved less than 0.06.
    per_core_queues: bool = False
    #: Whether a node's loop step (or storage transaction) is held up by a stall (``Costs.stall_per_cpu_s``,
    #: ``stall_chance``: the process descheduled) while the box's other threads alone fill its cores.
    #: False (the default since sim27): on such a full box the node's thread waits in the box's run queue,
    #: which models its descheduling (wake-up preemptions, slices: sim25), and no stall is drawn; the
    #: stalls, fitted to the live 100/s part before the box modelled those (sim23c), act where a core is
    #: free for it (the live parts: their counts and latencies move < 3 %). On a full box they were a
    #: double count: the writer's calls 17 ms against the daemons' 15-16, the bulk +8 %, and one draw's
    #: bulk past the HAVE linger (its lazy links' two HAVE2 rounds: HAVE2 +17 %). bench/RESULTS.md sim27.
    stalls_on_full_box: bool = False
    #: With ``fsync_waits``, whether the run-queue wait drawn after each fsync sleep (``FSYNC_WAIT_US``,
    #: recorded in bulks, on a full box) is waited on any box. False: only while the box's other threads
    #: fill its cores as the sleep ends; with a core free the storage thread wakes on the box as any
    #: thread (the live parts: the daemons' box mostly idle, a drawn wait's mean 1.2 ms three times a
    #: COMMIT on the writer's path to every replica). bench/RESULTS.md sim27b.
    fsync_waits_on_full_box: bool = True
    #: Whether a record's latency (``PartResult.last_latency``) runs from the writer's API call, as
    #: bench_mesh times it (the client's ``offer`` to the last daemon's tail), not from its commit there.
    latency_from_call: bool = False
    #: The mean run-queue wait of a thread woken while the box has a core free (seconds, drawn
    #: exponentially a wake-up; ``Box.idle_wake``): the daemons' threads waited 0.33 ms a run in the live
    #: 5/s part, their box mostly idle of them (bench_mesh ``--metrics``; bench/RESULTS.md sim27b), where
    #: the simulated box runs such a thread at once. 0: none.
    idle_wake_wait: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        # its own stream: the jitter and stall draws stay as they were
        self._hand_rng = random.Random(f"hand-off {self.seed if self.draws is None else self.draws}")
        self._preempt_rng = random.Random(f"wake-preempt {self.seed if self.draws is None else self.draws}")
        self._core_rng = random.Random(f"per-core {self.seed if self.draws is None else self.draws}")
        self._fsync_rng = random.Random(f"fsync {self.seed if self.draws is None else self.draws}")
        if self.idle_wake_wait > 0 and self.box.slice is not None:
            idle_rng = random.Random(f"idle wake {self.seed if self.draws is None else self.draws}")
            mean = self.idle_wake_wait
            self.box.idle_wake = lambda: idle_rng.expovariate(1.0 / mean)
        if self.per_core_queues and self.box.slice is not None:
            rng = self._core_rng
            self.box.per_core = PerCore(WAKE_IDLE_CHANCE, lambda: pull_delay(rng), rng)
            if self.wake_preempts:
                self.box.takes = self._takes
        elif self.wake_preempts and self.box.slice is not None:
            self.box.preempt = self._wake_victim

    def _box_full_without(self, thread: CpuThread) -> bool:
        """Whether the box's threads other than ``thread`` fill its cores (running or queued for one)."""
        box = self.box
        if box.cores is None or box.slice is None:
            return False
        others = sum(1 for t in box.running if t is not thread) + sum(1 for t in box.queue if t is not thread)
        return others >= box.cores

    def _stall_chance(self, node: MeshNode, scaled: float) -> float:
        if not self.stalls_on_full_box and self._box_full_without(node.cpu):
            return 0.0
        return super()._stall_chance(node, scaled)

    def _thread_of(self, thread: CpuThread) -> tuple[int, str] | None:
        """``thread``'s node and role now (-1: the client, an outside process); None: a hand-off's burst."""
        if thread is self.client:
            return -1, "outside"
        for y, node in enumerate(self.nodes):
            assert isinstance(node, MeshNode2)
            if thread is node.cpu:
                return y, "storage" if node.role == "storage" else "loop"
            if thread is node.disk_cpu:
                return y, "storage"
            if thread is node.loop_thread:
                return y, "loop"
            if any(thread is t for t in node.read_threads):
                return y, "reader"
        return None

    def _wake_victim(self, woken: CpuThread) -> CpuThread | None:
        """``Box.preempt``: the woken thread's target core is either running one (a draw); its thread,
        of another node (or the client), loses it with ``WAKE_PREEMPT_CHANCE`` for its role."""
        running = list(self.box.running)
        victim = running[int(self._preempt_rng.random() * len(running))]
        return victim if self._takes(woken, victim) else None

    def _takes(self, woken: CpuThread, victim: CpuThread) -> bool:
        """``Box.takes``: ``woken`` takes ``victim``'s core if that is another node's (or the client's)
        with ``WAKE_PREEMPT_CHANCE`` for its role."""
        mine, theirs = self._thread_of(woken), self._thread_of(victim)
        if mine is None or theirs is None or (mine[0] == theirs[0] and mine[0] >= 0):
            return False
        return self._preempt_rng.random() < WAKE_PREEMPT_CHANCE[theirs[1]]

    def _hand_off(self, y: int, role: str, wakee: str, thread: CpuThread | None = None) -> float:
        """Node ``y``'s thread in ``role`` (``thread``, or the node's thread in that role), holding the
        interpreter on a core, has just woken its ``wakee`` thread: with both cores busy the wakee takes
        its core with ``HAND_OFF_CHANCE``, runs a measured burst and blocks on the interpreter; the waker
        waits a measured while for its core back, and what it has (or is given meanwhile) after it
        (:meth:`Box.hand_off`). Returns that wait (0: no take)."""
        box = self.box
        node = self.node2(y)
        if not (self.gil and self.hand_offs):
            return 0.0
        if thread is None and node.role != role:
            return 0.0
        waker = node.cpu if thread is None else thread
        if not box.can_hand_off(waker) or self._hand_rng.random() >= HAND_OFF_CHANCE[(role, wakee)]:
            return 0.0
        burst = self._hand_rng.choice(HAND_OFF_BURST_US) * 1e-6
        back = self._hand_rng.choice(HAND_OFF_BACK_US) * 1e-6
        if not box.hand_off(waker, burst, back):
            return 0.0
        node.cpu_work += burst
        node.hand_offs += 1
        return back

    def _new_node(self, name: int) -> MeshNode:
        return MeshNode2(name)

    def _new_session(self, x: int) -> ReplicationSession:
        session = super()._new_session(x)
        session.attach_core2(Core2Link())
        return session

    def _start(self, x: int, y: int) -> None:
        super()._start(x, y)
        core2 = self.nodes[x].sessions[y].core2
        assert core2 is not None
        core2.start({})

    def node2(self, name: int) -> MeshNode2:
        node = self.nodes[name]
        assert isinstance(node, MeshNode2)
        return node

    # ------------------------------------------------------------------ the writer (node 0)
    def offer(self, count: int, payload: int, then: Callable[[], None] | None = None) -> None:
        """The writer's API call (``Commit2``; no records: ``CreateQueue2``, the first head): committed
        with what waits, then told to every link by the store's change hook."""
        node = self.node2(0)

        called = self.now

        def call() -> None:
            self._busy(node, self.costs.offer + self.costs.offer_record * count)
            self.box.then(node.cpu, handled)

        def handled() -> None:
            records = [Record(value=bytes(payload), timestamp=self.wall_ms()) for _ in range(count)]
            stored: list[QueueState2] = []

            def apply() -> None:
                state = node.durable2.get(self.key) or queue2.empty_state(*self.key)
                state = queue2.commit(state, self.owner, now_ms=self.wall_ms(), records=records)
                node.durable2[self.key] = state
                stored.append(state)

            def committed() -> None:
                (state,) = stored
                if self.track:
                    for offset in range(state.held[1] - count, state.held[1]):
                        node.hops[offset] = 0
                        node.reached[offset] = called if self.latency_from_call else self.now
                if then is not None:
                    then()

            whole = self.costs.offer_store_record
            cpu = self.costs.sign_record * count if whole is None else whole * count
            free = WRITER_GIL_FREE * (cpu + (self.costs.commit_record * count if whole is None else 0.0))
            job = _Job2(count, apply, committed, cpu=cpu, free=free, written=whole is not None)
            self._store(0, job)

        self._calls += 1
        self._wake(0, ("call", self._calls), call)

    # ------------------------------------------------------------------ the storage thread
    def _store(self, y: int, job: _Job) -> None:
        """Group commit, and a batch of live pushes served ahead lingers for company (``storage/
        writer.py`` ``_linger_merges``): up to ``merge_linger`` or ``MERGE_LINGER_JOBS`` of them. Any
        other batch holding fewer writers (peers) than a transaction of the last ``WRITERS_SEEN_S`` did
        waits up to ``group_linger`` for as many (``_collect``): a relay fed a bulk by two peers stores
        their chunks together, and acknowledges them with one ACK2 run."""
        node = self.node2(y)
        took = 0.0
        if not node.committing and not node.storage_waking:  # it waits for jobs: the hand-over wakes it
            took = self._hand_off(y, "loop", "storage")
        node.waiting.append(job)
        if node.gathering and self._writers(node.waiting) >= self._writers_seen(node):
            node.gathering = 0
            self._commit(y)
        elif not node.committing and not node.gathering and not node.storage_waking:
            if self.storage_wakes and self.gil and not took and not node.lingering:  # (a take: woken)
                self._storage_wake(y)
            else:
                self._next_commit(y)

    def _storage_wake(self, y: int) -> None:
        """The idle storage thread, woken by a hand-over, waits for a core of its own (``storage_wakes``)
        while the loop goes on; then it collects what was handed over meanwhile too."""
        node = self.node2(y)
        node.storage_waking = True
        thread = node.disk_cpu

        def woke() -> None:
            node.storage_waking = False
            if node.waiting and not node.committing and not node.gathering:
                node.storage_awake = True
                self._next_commit(y)
                node.storage_awake = False

        node.cpu_work += _MIN_PIECE_S  # its run until it asks for the interpreter: an event's floor
        self.box.wake(thread)
        self.box.work(thread, _MIN_PIECE_S)
        self.box.then(thread, woke)

    @staticmethod
    def _writers(jobs: list[_Job]) -> int:
        """``storage/writer.py`` ``_writers``: a peer's deltas count once, each API call once."""
        return len({id(j) if not isinstance(j, _Job2) or j.origin is None else j.origin for j in jobs})

    def _writers_seen(self, node: MeshNode2) -> int:
        """The most writers a transaction begun within ``WRITERS_SEEN_S`` held (1: none)."""
        seen = node.batch_writers
        while seen and seen[0][0] < self.now - WRITERS_SEEN_S:
            seen.popleft()
        return max((n for _, n in seen), default=1)

    def _next_commit(self, y: int, held: bool = False) -> None:
        """The storage thread's next batch (``_collect``); ``held``: it runs on from the last COMMIT,
        holding the interpreter (no wake-up), as ``Writer._main`` loops straight into ``_collect``."""
        node = self.node2(y)
        lingers = all(isinstance(j, _Job2) and j.may_linger for j in node.waiting)
        if not lingers or self.merge_linger <= 0 or len(node.waiting) >= MERGE_LINGER_JOBS:
            node.lingering = False
            target = self._writers_seen(node)
            if lingers or self.group_linger <= 0 or self._writers(node.waiting) >= target:
                self._commit(y, held)
                return
            node.gathering = turn = node.commits + 1  # writers seen together: wait a while for as many

            def gathered() -> None:
                if node.gathering == turn:
                    node.gathering = 0
                    self._commit(y)

            self._at(self.now + self.group_linger, gathered)
        elif not node.lingering:
            node.lingering = True
            node.lingers += 1
            turn = node.lingers

            def due() -> None:  # this linger's end, unless its jobs were committed meanwhile
                if node.lingering and node.lingers == turn and not node.committing:
                    node.lingering = False
                    self._commit(y)

            self._at(max(self.now, node.disk_free) + self.merge_linger, due)

    def _commit(self, y: int, held: bool = False) -> None:
        """The storage thread takes what waits once it holds the interpreter (``_collect`` drains the
        queue running Python): jobs handed over meanwhile go into this transaction. ``held``: it holds
        the interpreter already (it ran on from its last COMMIT)."""
        node = self.node2(y)
        node.committing = True
        if self.gil and not held:
            awake, asked = node.storage_awake, self.now

            def take() -> None:  # on its own core still if the interpreter was free at once
                if awake and self.now == asked and not node.cpu.busy:
                    self.box.move(node.disk_cpu, node.cpu)
                    node.role = "storage"
                    self._transaction(y, True)
                else:
                    self._transaction(y)

            self._interpreter(y, "storage", take)
        else:
            self._transaction(y, held)

    def _transaction(self, y: int, held: bool = False) -> None:
        node = self.node2(y)
        jobs, node.waiting = node.waiting, []
        # The daemon's commit seconds count from ``Writer._attempt``, its probe's from ``Writer.process``:
        # the storage thread holds the interpreter on a core by then (``_storage_work``'s ``started``).
        began = [self.now]
        if not all(isinstance(j, _Job2) and j.may_linger for j in jobs):  # a merge linger's are not kept
            node.batch_writers.append((self.now, self._writers(jobs)))
        records = sum(job.records for job in jobs)
        written = sum(job.records for job in jobs if not (isinstance(job, _Job2) and job.written))
        work = self.costs.commit_record * written + sum(job.cpu for job in jobs if isinstance(job, _Job2))
        sync = self.costs.commit + self.costs.sync_record * records  # the COMMIT's wait on the disk
        if self.gil:  # the storage thread's Python work holds the interpreter the event loop needs
            thread = node.cpu
        else:
            node.cpu_work += work
            thread = node.disk_cpu
            self.box.wake(thread)
            self.box.work(thread, self._scaled(work))

        def completed() -> None:  # ``StorageBridge._complete``: the commit's callback on the loop
            before = node.durable2.get(self.key)
            for job in jobs:
                job.apply()
            after = node.durable2.get(self.key)
            for entry in node.ahead2.values():  # the pushes this transaction held are no longer ahead
                entry.done = entry.done or any(entry.job is job for job in jobs)
            if after is not None and after is not before:  # the store's change hook: every link
                self._changed2(y, link_summary(after), None)
            for job in jobs:
                job.done()

        def committed() -> None:  # without ``gil``: the storage thread's own core, then the next batch
            completed()
            node.committing = False
            if node.waiting:
                self._next_commit(y)

        def durable() -> None:
            node.commits += 1
            node.committed_jobs += len(jobs)
            if not self.gil:  # the fsync returned: the storage thread wakes
                node.commit_seconds += self.now - began[0]
                self.box.wake(thread)
                self.box.then(thread, committed)
                return
            # ``Writer._main``: the COMMIT returned holding the interpreter again (its measured wait,
            # ``sync``, ends there: the wake after the fsync is in it); ``process`` hands the completion
            # to the loop (``run_sync_soon``: a task woken) and the thread takes its next batch at once.
            # So the loop's callback waits for the interpreter, a slice (bench/RESULTS.md, sim20b).
            if self.costs.commit_runs <= 0:
                resumed()
                return
            # The COMMIT's runs on the box: it returns once the storage thread holds the interpreter again
            # (it waits for the loop's ready tasks if the loop holds it, as any thread of the node does).
            if not node.runq and not node.storage_holds and not node.cpu.busy:
                resumed()
            else:
                self._interpreter(y, "storage", resumed)

        def resumed() -> None:  # holding the interpreter after the COMMIT
            # the daemon's commit seconds end here (``Writer._attempt``'s ``done``: ``store.commit()``
            # returned, which needs the interpreter back), not at the fsync's end (bench/RESULTS.md sim26)
            node.commit_seconds += self.now - began[0]
            # ``process`` wakes the loop (``run_sync_soon``) on the core the COMMIT's last run had: the
            # loop may take that core (``_hand_off``), and the storage thread, holding the interpreter
            # off the cores, then goes on (its callback handed over, its next batch) once it is back
            task = ("commit", self._seq)
            back = self._hand_off(y, "storage", "loop", node.disk_cpu)

            def go_on() -> None:
                self._wake(y, task, completed)
                node.committing = False
                if node.waiting:
                    self._next_commit(y, held=True)

            if back:
                self._at(self.now + back, go_on)
            else:
                go_on()

        def synced() -> None:  # its records' work done, the COMMIT waits on the disk
            node.pre_commit_seconds += self.now - began[0]
            runs = self.costs.commit_runs
            if not self.gil or runs <= 0:
                node.disk_free = max(self.now, node.disk_free) + sync
                self._at(node.disk_free, durable)
                return
            # The COMMIT releases the interpreter: its CPU runs on the storage thread's own core, a burst
            # in the run it is in and one in each of ``runs`` runs after a sleep (the fsync), the box's.
            cpu = self._scaled(self.costs.commit_cpu + self.costs.commit_cpu_record * records)
            node.cpu_work += cpu
            if not (work > 0 and free > 0):  # it held the interpreter to its end: the same thread goes on
                self.box.move(node.cpu, node.disk_cpu)
            burst, sleep = cpu / (runs + 1), sync / runs
            self.box.work(node.disk_cpu, burst)
            if self.fsync_waits and not self.fsync_waits_on_full_box:
                self._fsync_runs(node, runs, burst, durable)
                return
            for _ in range(runs):
                if self.fsync_waits:  # the daemons' sleep and wait after it, drawn: off the box
                    drawn = self._fsync_rng.choice(FSYNC_SLEEP_US) + self._fsync_rng.choice(FSYNC_WAIT_US)
                    self.box.pause(node.disk_cpu, drawn * 1e-6)
                else:
                    self.box.pause(node.disk_cpu, sleep)
                    self.box.wake(node.disk_cpu)
                self.box.work(node.disk_cpu, burst)
            self.box.then(node.disk_cpu, durable)

        free = sum(job.free for job in jobs if isinstance(job, _Job2))

        def started() -> None:
            began[0] = self.now

        if self.gil:
            self._storage_work(y, work, synced, held, free, started)
        else:
            self.box.then(thread, synced)

    def _fsync_runs(self, node: MeshNode2, runs: int, burst: float, durable: Callable[[], None]) -> None:
        """The COMMIT's ``runs`` runs after a drawn fsync sleep each (``fsync_waits``), with
        ``fsync_waits_on_full_box`` off: the drawn run-queue wait after the sleep only where the box's
        other threads fill its cores as the sleep ends (the bulks those waits were recorded in); with a
        core free the thread wakes on the box as any. Both draws are made as before (the streams stay)."""
        thread = node.disk_cpu
        rng = self._fsync_rng
        drawn = [(rng.choice(FSYNC_SLEEP_US), rng.choice(FSYNC_WAIT_US)) for _ in range(runs)]

        def run(i: int) -> None:
            if i == len(drawn):
                durable()
                return
            sleep_us, wait_us = drawn[i]
            self.box.pause(thread, sleep_us * 1e-6)

            def woke() -> None:
                if self._box_full_without(thread):
                    self.box.pause(thread, wait_us * 1e-6)
                else:
                    self.box.wake(thread)
                self.box.work(thread, burst)
                self.box.then(thread, lambda: run(i + 1))

            self.box.then(thread, woke)

        run(0)

    def _storage_work(
        self,
        y: int,
        work: float,
        then: Callable[[], None],
        held: bool = False,
        free: float = 0.0,
        started: Callable[[], None] | None = None,
    ) -> None:
        """The storage thread's ``work`` (times one jitter draw) under the node's interpreter, handed over
        as CPython 3.11 hands it (``Python/ceval_gil.h``; bench/RESULTS.md sim21): the thread holding it
        runs on until it releases it at a blocking call, or until a thread that has waited a switch
        interval for it asks it to drop it (``gil_drop_request``: the holder drops it and waits until the
        asker took it). So the loop's tasks woken meanwhile wait at most a switch interval, then run (a
        wake-up first) while the storage thread waits in turn: it takes the interpreter back once the
        loop is idle, or at the end of the loop's task during which it has waited a switch interval. A
        loop with nothing ready leaves the storage work unsliced: no wake-up between its parts.

        ``free`` of ``work`` runs with the interpreter released (``WRITER_GIL_FREE``: the chain hash,
        SQLite's statements, the signature), spread over it: a release after each switch interval of
        held work, as long as its share. A loop waiting then takes the interpreter if it asked already,
        or if it is scheduled before the call returns (its wake-up on the box, :meth:`Box.wait_now`,
        shorter than the release); the released work runs on the storage thread's own core beside it,
        and the storage thread then waits for the interpreter as above. Otherwise the holder takes it
        back at once. ``held``: the thread ran on from its COMMIT holding the interpreter (the COMMIT's
        measured wait ends once it holds it again): no wake-up first. One stall draw a transaction.
        ``started`` runs once its first held work is on a core (its wake-up done)."""
        node = self.node2(y)
        node.cpu_work += work
        scaled = self._scaled(work)
        beside = scaled * free / work if work > 0 else 0.0
        held_left = [scaled - beside]
        releases = max(1, math.ceil(held_left[0] / STORAGE_SLICE_S - 1e-9))
        release = beside / releases
        run = [0.0]  # held work since the last release
        woken = [not held]
        beside_core = [False]  # back from a release run on its own core, not asleep meanwhile
        first = [] if started is None else [lambda: self.box.then(node.cpu, started)]

        def piece() -> None:  # the storage thread holds the interpreter
            if beside_core[0] and not woken[0] and self.box.slice is not None:
                self.box.move(node.disk_cpu, node.cpu)  # the same thread: it keeps its core
                node.role = "storage"
            beside_core[0] = False
            if woken[0] or node.role != "storage":
                self.box.wake(node.cpu)
            if first:
                first.pop()()
            woken[0] = False
            node.role = "storage"
            node.storage_holds = True
            if node.runq and node.loop_wants is None:
                node.loop_wants = self._asks_at()
            size = min(held_left[0], STORAGE_SLICE_S - run[0])
            if node.loop_wants is not None:  # it asks for the interpreter then
                size = min(size, max(_MIN_PIECE_S, node.loop_wants - self.now))
            held_left[0] -= size
            run[0] += size
            self.box.work(node.cpu, size)
            self.box.then(node.cpu, after)

        def after() -> None:
            if held_left[0] <= _MIN_PIECE_S / 10:
                held_left[0] = 0.0
                node.storage_holds = False
                node.loop_wants = None
                stalls = self.stalls_on_full_box or not self._box_full_without(node.cpu)
                if stalls and self.costs.stall_chance and self._rng.random() < self.costs.stall_chance:
                    self.box.pause(node.cpu, self._rng.uniform(0, 2 * self.costs.stall))
                self.box.then(node.cpu, last if beside > 0 else then)
                return
            if run[0] >= STORAGE_SLICE_S - 1e-12:  # a switch interval of held work: a release
                run[0] = 0.0
                if release > 0:
                    released()
                    return
            if node.loop_wants is not None and not node.runq:  # what asked took it meanwhile
                node.loop_wants = None
            if node.loop_wants is not None and self.now >= node.loop_wants - 1e-12:
                node.storage_holds = False  # dropped at the loop's request: it waits for it to take it
                node.loop_wants = None
                node.storage_hand_offs += 1
                wait_back(self.now + self.box.wait_now())
            else:
                piece()

        def last() -> None:  # the last release, beside the loop; the COMMIT's own follows (``then``)
            self.box.move(node.cpu, node.disk_cpu)  # on the storage thread's core, not a new run
            self.box.work(node.disk_cpu, release)
            self.box.then(node.disk_cpu, then)

        def released() -> None:  # a blocking call: the interpreter is free until it returns
            asked = node.loop_wants is not None and self.now >= node.loop_wants - 1e-12
            if node.runq and (asked or self.box.wait_now() < release):
                node.storage_holds = False
                node.loop_wants = None
                node.storage_hand_offs += 1
                self.box.move(node.cpu, node.disk_cpu)
                self.box.work(node.disk_cpu, release)
                self.box.then(node.disk_cpu, lambda: wait_back(self.now, asleep=False))
                return
            self.box.work(node.cpu, release)  # returned before anyone took it: held on
            self.box.then(node.cpu, piece)

        def wait_back(since: float, asleep: bool = True) -> None:  # it wants the interpreter again
            if not node.cpu.busy and not node.runq and node.storage_resume is None:
                woken[0] = asleep  # free: a thread back from its call takes it running
                beside_core[0] = not asleep
                piece()
                return
            woken[0] = True
            node.storage_wants = since
            node.storage_resume = piece
            if not node.turn_pending:
                node.turn_pending = True
                self.box.then(node.cpu, lambda: self._turn(y))

        piece()

    def _wake(self, y: int, task: tuple[str, int], run: Callable[[], None]) -> None:
        """A task of the loop woken while the storage thread holds the interpreter: the loop waits for
        it from now (it asks a switch interval later: :meth:`_storage_work`)."""
        node = self.node2(y)
        # the loop is in epoll (no task ready) and another of the node's threads holds the interpreter
        held = node.storage_holds or (node.cpu.busy and node.role != "loop")
        waits = held and not node.runq and task not in node.queued
        if node.storage_holds and node.loop_wants is None:
            node.loop_wants = self._asks_at()
        super()._wake(y, task, run)
        if waits and self.loop_thread_runs and task[0] not in ("storage", "reader"):
            self._loop_waits(node)

    def _loop_waits(self, node: MeshNode2) -> None:
        """The loop's thread, woken from epoll while the storage thread holds the interpreter, runs to find
        it held and blocks in ``take_gil`` (a run of its own on the box: a dispatch, its wait for a core),
        and runs again at its timeout to ask for it (``loop_wants``) if it is held still; the hand-off
        that follows is the node's thread's (:meth:`_storage_work`). Each run is ``_MIN_PIECE_S`` of CPU,
        an event's floor (the switch and ``take_gil``'s check), not a measured cost. Tasks of the node's
        other threads (``storage``, ``reader``) are not the loop's: they do not wake it."""
        asks = node.loop_wants if node.storage_holds else None

        def run() -> None:
            node.loop_thread_waits += 1
            node.cpu_work += _MIN_PIECE_S
            self.box.wake(node.loop_thread)
            self.box.work(node.loop_thread, _MIN_PIECE_S)

        def ask() -> None:
            if node.storage_holds and node.loop_wants == asks:
                run()

        run()
        if asks is not None:
            self._at(asks, ask)

    def _asks_at(self) -> float:
        """When a thread of the node woken now, wanting the interpreter another of its threads holds, asks
        for it (``take_gil``, ``Python/ceval_gil.h``): it must run to begin its timed wait, a switch
        interval, and run again at its timeout to set the drop request. On a box whose threads keep
        their core for a burst both runs wait in the run queue, each as long as a run waits on this box
        (:meth:`Box.wait_a_run`), or as the queue now says if longer (:meth:`Box.wait_now`): on a full box
        a thread waiting for the interpreter rarely asks before a short holder's burst ends (the daemons'
        writer's storage thread is not descheduled before its COMMIT in its median transaction while
        its readers wait, bench/RESULTS.md sim21c). Until sim22b the queue now alone, twice: it reads
        half the wait a woken thread then has (a queued burst grows once it runs), so waiters asked
        inside the writer's held work before its COMMIT 2.0-3.2 times a transaction and its reads ended
        there twice as often as the daemons' (bench/RESULTS.md sim22b)."""
        box = self.box
        queue = 2 * max(box.wait_now(), box.wait_a_run()) if box.slice is not None else 0.0
        return self.now + queue + SWITCH_INTERVAL_S

    def _turn(self, y: int) -> None:
        """The loop's next task, unless the storage thread waits for the interpreter and the loop is
        idle, or it has waited a switch interval (it asked: the loop drops it after this task)."""
        node = self.node2(y)
        if node.cpu.busy:
            self.box.then(node.cpu, lambda: self._turn(y))
            return
        resume = node.storage_resume
        if resume is not None and (
            not node.runq or self.now >= node.storage_wants + SWITCH_INTERVAL_S - 1e-12
        ):
            node.storage_resume = None
            resume()
            if node.runq:
                self.box.then(node.cpu, lambda: self._turn(y))
            else:
                node.turn_pending = False
            return
        if not node.runq:
            node.turn_pending = False
            return
        super()._turn(y)
        if node.storage_resume is not None and not node.turn_pending:
            node.turn_pending = True
            self.box.then(node.cpu, lambda: self._turn(y))

    # ------------------------------------------------------------------ a node as the daemon is one
    def _run_driver(self, y: int, x: int) -> None:
        node = self.node2(y)
        if x in node.reading:
            return
        session = node.sessions[x]
        core2 = session.core2
        assert core2 is not None
        session.tick(self.now)
        costs = self.costs
        while (event := session.next_event()) is not None:
            if isinstance(event, NeedDelta2):
                out, read = self._delta2_for(node, event)
                if out is not None and read:
                    loaded = node.durable2[event.key]  # the value ``_delta2_for`` read from
                    self._read2_then(y, x, event.key, out, (loaded, event.since, event.max_records))
                    break
                if out is not None:
                    self._busy(node, costs.cut + costs.send_loop + costs.cut_record * len(out.delta.records))
                core2.provide_delta(event.key, out)
            elif isinstance(event, Delta2Received):
                node.received["copies"] += len(event.delta.records)
                self._submit2(y, x, event)
        self._flush_after(y, x)
        deadline = session.next_deadline()
        if deadline is not None and node.deadlines.get(x) != deadline:
            node.deadlines[x] = deadline
            self._at(deadline, lambda: self._drive(y, x))

    def _delta2_for(self, node: MeshNode2, event: NeedDelta2) -> tuple[Outgoing2 | None, bool]:
        """``EngineCore2Host.delta2_for``: (the delta, whether it needs a read from the store)."""
        key, since, most = event.key, event.since, event.max_records
        loaded = node.durable2.get(key)
        if loaded is None:
            return None, False
        entry = node.ahead_value(key)
        if entry is not None and entry.relay is not None and since is not None:
            relayed = entry.relay.answer(since, most, self.max_bytes)
            if relayed is not None:
                return relayed, False  # the newest push, as it came
        recent = since is not None and self._recent_covers(node, key, loaded, since.held_end)
        if entry is not None and since is not None and (since.held_end >= loaded.held[1] or recent):
            return outgoing(entry.value, since, most, self.max_bytes), False  # the value ahead
        if recent:
            return outgoing(loaded, since, most, self.max_bytes), False  # the last merges' rows
        return outgoing(loaded, since, most, self.max_bytes), True

    @staticmethod
    def _recent_covers(node: MeshNode2, key: QueueKey, loaded: QueueState2, since_end: int) -> bool:
        """``EngineCore2Host._from_recent``: ``RecentRows.matches`` (the rows a peer holding up to
        ``since_end`` lacks are in memory, and are the held value's: its chain at its end is the run's
        there, so only if the run's rows are where it says they are), and the delta built from them
        without a ``Miss``: it needs the chain at ``since_end`` too, row ``since_end - 1``'s. So a relay
        merging a bulk chunk by chunk reads each (measured on the daemon's host, bench/RESULTS.md)."""
        run = node.recent.get(key)
        lo, hi = loaded.held
        if run is None or lo >= hi or not run.lo <= since_end or not run.lo < hi <= run.hi:
            return False
        return run.rows_lo == run.lo and (run.lo < since_end or since_end == lo)

    def _read2_then(
        self,
        y: int,
        x: int,
        key: QueueKey,
        out: Outgoing2,
        request: tuple[QueueState2, object, int] | None = None,
    ) -> None:
        """The link's driver waits while a reader thread reads the delta, then carries on. Reads take one
        of :data:`READ_CONNECTIONS` (``bridge.read``'s limiter): a driver finding none free waits until a
        read ends and hands its connection on, which wakes that driver as a task of the event loop, behind
        the tasks woken before it (the writer's next API call, say).

        With ``request`` (the value, the peer's summary, the records asked for: ``EngineCore2Host._read2``'s
        key, ``max_bytes`` being the mesh's), an ask of a request already being read awaits that read
        (``SharedReads``, reads22): no connection, no reader run; woken as a task of the loop once the
        read's own asker runs again (its ``done.set()``, before it passes its delta on), it cuts its
        link's message from the shared answer. Without ``request`` (a test's direct call) every ask reads."""
        node = self.node2(y)
        node.reading.add(x)
        count = len(out.delta.records)
        shared_key = None if request is None else (id(request[0]), request[1], request[2])
        if shared_key is not None:
            pending = node.shared_reads.get(shared_key)
            if pending is not None:
                pending[1].append(x)
                return
            node.shared_reads[shared_key] = (request[0], [])  # type: ignore[index]
        node.reads_issued += 1
        work = self.costs.read + self.costs.read_record * count

        thread: list[CpuThread] = []

        def start() -> None:
            if self.gil and self.reader_threads:  # woken, it runs on the box before it wants the interpreter
                thread.append(node.read_threads.pop())
                self.box.wake(thread[0])
                self.box.then(thread[0], scheduled)
            elif self.gil:  # the reader thread waits for the interpreter with the loop's runnable tasks
                self._hand_off(y, "loop", "reader")
                self._interpreter(y, "reader", read)
            else:
                node.cpu_work += work
                self.box.wake(node.reader)
                self.box.work(node.reader, self._scaled(work))
                self.box.then(node.reader, ended)

        def scheduled() -> None:  # on a core: it takes the interpreter if free, or waits for it
            free = not node.cpu.busy and not node.runq and not node.storage_holds
            if free and node.storage_resume is None:
                self.box.move(thread[0], node.cpu)  # the same thread: it keeps its core, no new run
                node.role = "reader"
                node.cpu_work += work
                self.box.work(node.cpu, self._scaled(work))
                self.box.then(node.cpu, ended)
                return
            if node.storage_holds and node.loop_wants is None:  # it ran once: it asks at its timeout
                node.loop_wants = self.now + self.box.wait_now() + SWITCH_INTERVAL_S
            self._interpreter(y, "reader", read)

        def read() -> None:  # a reader thread builds the records holding the interpreter
            self._busy(node, work, role="reader")
            self.box.then(node.cpu, ended)

        def ended() -> None:  # trio's to_thread: the limiter released (its next waiter woken) first
            if thread:
                node.read_threads.append(thread.pop())
            if node.read_queue:
                waiter, begin = node.read_queue.popleft()
                self._wake(y, ("read start", waiter), begin)
            else:
                node.readers -= 1
            self._wake(y, ("read done", x), encode)

        def encode() -> None:
            if shared_key is not None:  # SharedReads.read's finally: the entry dropped, its waiters woken
                _, waiters = node.shared_reads.pop(shared_key)
                for waiter in waiters:
                    node.reads_shared += 1
                    self._wake(y, ("read shared", waiter), functools.partial(provide, waiter))
            provide(x)

        def provide(link: int) -> None:
            node.reading.discard(link)
            self._busy(node, self.costs.cut + self.costs.send_loop + self.costs.cut_record * count)
            core2 = node.sessions[link].core2
            assert core2 is not None
            core2.provide_delta(key, out)
            self._run_driver(y, link)

        if node.readers < READ_CONNECTIONS:
            node.readers += 1
            start()
        else:
            node.read_queue.append((x, start))

    def _interpreter(self, y: int, thread: str, run: Callable[[], None]) -> None:
        """A thread of node ``y`` (a reader, the storage thread) wants the interpreter (``gil``) for
        ``run``. The event loop holds it while it runs the tasks ready now (a trio batch, no blocking
        call in it), so the thread waits for them, but only until it asks for it as any waiter asks
        (:meth:`_asks_at`: the daemon's switch interval and, on a full box, its two runs' waits for a
        core; until sim22 the switch interval alone, so the storage thread took the interpreter ahead of
        the loop's ready tasks, which then cut its held work). Not if the storage thread took it
        meanwhile: ``take_gil`` asks only after an interval with no switch of holder, so the waiter stays
        behind the loop's tasks, which ask the storage thread for it and run it once it is handed over.
        Taken at its timeout, it is no longer a task of the loop's: nobody is left to ask the storage
        thread for the interpreter on its behalf (sim22: the simulator kept the task, a no-op the
        storage thread later dropped the interpreter for)."""
        node = self.node2(y)
        if not node.runq and not node.storage_holds:
            run()
            return
        done: list[bool] = []
        task = (thread, self._seq)

        def once() -> None:
            if not done:
                done.append(True)
                run()

        def timed_out() -> None:
            if node.storage_holds or done:
                return
            if task in node.queued:
                node.queued.discard(task)
                node.runq = deque(entry for entry in node.runq if entry[0] != task)
            once()

        self._wake(y, task, once)
        self._at(self._asks_at(), timed_out)

    def _submit2(self, y: int, x: int, event: Delta2Received) -> None:
        """``Gossip._submit2`` and ``EngineCore2Host.submit_merge2``: a live push checked here goes on at
        once; every delta is merged on the storage thread, and ACKed once its transaction committed."""
        node = self.node2(y)
        key, delta, steps = event.key, event.delta, event.steps
        costs = self.costs
        count = len(delta.records)
        ahead = self._check_ahead(node, key, event)
        outcome: list[bool] = []

        def apply() -> None:
            before = node.durable2.get(key) or queue2.empty_state(*key)
            try:
                whole = unpack_steps(before, delta, steps)
                after = queue2.join_verified(before, queue2.verify_delta(before, whole)).state
            except GapError:
                after = before
            changed = after != before
            if changed:
                node.durable2[key] = after
                if after.held[1] > before.held[1]:
                    self._note_recent(node, key, before.held[1], after.held[1])
            outcome.append(changed)

        def committed() -> None:
            (changed,) = outcome
            if changed:
                self._note_arrival(y, x, delta)
            core2 = node.sessions[x].core2
            assert core2 is not None
            state = node.durable2.get(key)
            core2.delta_applied(event.seq, None if state is None else link_summary(state), changed)
            self._drive(y, x)

        if ahead is None:  # verified and joined on the storage thread
            cpu = costs.merge + costs.verify + costs.verify_record * count
            job = _Job2(count, apply, committed, cpu=cpu, origin=x)
            self.box.then(node.cpu, lambda: self._store(y, job))
            return
        self._busy(node, costs.verify + costs.verify_record * count)
        against, value = ahead
        after = link_summary(value)
        job = _Job2(count, apply, committed, may_linger=True, origin=x)
        node.ahead2[key] = _Ahead(value, Relay(link_summary(against).core, delta, steps, after), job)

        def relayed() -> None:  # Gossip._submit2: local_change2 of the value ahead, but to its source
            self._note_arrival(y, x, delta)
            self._store(y, job)
            self._changed2(y, after, x)

        self.box.then(node.cpu, relayed)

    @staticmethod
    def _note_recent(node: MeshNode2, key: QueueKey, lo: int, hi: int) -> None:
        """``RecentRows.note`` of a merge that appended rows ``[lo, hi)``: a run that ends where they
        start is extended and cut to its last :data:`RECENT_RECORDS` from its older part. Its ``lo``
        moves by what was cut, even when that is more than the older part held (a merge of more than
        ``RECENT_RECORDS`` after another): the run then says its rows start later than they do, and
        ``matches`` finds its chain at the value's end is not the value's, so that delta is read."""
        old = node.recent.get(key)
        count = hi - lo
        if old is not None and old.hi == lo and old.rows_lo + old.count == lo:
            keep = max(0, old.count + count - RECENT_RECORDS)
            kept = max(0, old.count - keep)
            node.recent[key] = _Recent(old.lo + keep, kept + count, lo - kept)
        else:
            node.recent[key] = _Recent(lo, count, lo)

    @staticmethod
    def _check_ahead(
        node: MeshNode2, key: QueueKey, event: Delta2Received
    ) -> tuple[QueueState2, QueueState2] | None:
        """``AheadPushes.check``: (what it was checked against, the two joined), or None: the storage
        thread's to verify."""
        delta = event.delta
        loaded = node.durable2.get(key)
        if loaded is None or not 0 < len(delta.records) <= AHEAD_DELTA_RECORDS:
            return None
        entry = node.ahead_value(key)
        against = loaded if entry is None else entry.value
        try:
            verified = queue2.verify_delta(against, unpack_steps(against, delta, event.steps))
            chains = verified.chains
            if not verified.records or chains.forked or chains.epoch != against.chains.epoch:
                return None
            merged = queue2.join_verified(against, verified)
        except LatticedError:
            return None
        if merged.evidence:
            return None
        return against, merged.state

    def _changed2(self, y: int, summary: Summary2, source: int | None) -> None:
        """``Gossip.local_change2``: every link hears of it but ``source`` (a push relayed ahead)."""
        node = self.nodes[y]
        for peer, session in node.sessions.items():
            if peer != source and session.core2 is not None:
                session.core2.local_update(self.key, summary)
                self._drive(y, peer)


def warm_up(sim: MeshSim2) -> None:
    """bench_mesh before any part, once the links are up: the queue created (its first head) and, as
    that call returns, one record offered; until every replica holds it."""
    sim.run_for(0.5)
    sim.offer(0, 0, then=lambda: sim.offer(1, 7))
    sim.run_until(lambda: sim.all_hold(1))
