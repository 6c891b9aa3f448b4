"""A replica's CPU for a catch-up of single offers, fork core 1 against core 2, in one process.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_catchup_cpu.py --singles 5000 --rounds 5
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catchup_cpu.py --singles 5000 --profile 2
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catchup_cpu.py --records 50000 --batch 1000   # batches
    PYTHONPATH=$PWD valgrind --tool=callgrind --instr-atstart=no .venv/bin/python \
        bench/bench_catchup_cpu.py --singles 5000 --callgrind 2   # instructions of core 2's catch-up

Why it exists: ``bench_replication.py --parts cores`` measures the same between daemons, but reads a
daemon's CPU in 10 ms clock ticks, ±2 us a record at 5,000 records, and less a daemon's start: too coarse
to tell 5 %. Here an owner's engine writes ``--records`` single offers, one commit each (one signed head
each; ``--batch N``: N records an offer), on each core; a fresh replica engine then takes the catch-up as
a link sends it (chunks of 4,096 records or 512 KiB, core 2's bodies as steps, each message encoded and
decoded as on the wire) and its decode, verification, join and durable commit are timed with the
process's CPU clock (the storage thread's included), the owner's part left out. The start-up heap is
frozen first, as the daemon does. Cores are alternated (1, 2, 1, 2...); printed: the replica's CPU per
record of each, and the median (min, max) of each pair's ratio 2 ÷ 1. ``--profile 1|2``: one round of
that core under cProfile (the event loop's and the storage thread's calls), top entries by own time.

``--callgrind 1|2``: one round of that core with callgrind's instrumentation switched on for exactly the
timed part (every thread's, the storage thread's commits too; not the owner's writes), under
``valgrind --tool=callgrind --instr-atstart=no``. The clock on a shared 2-core box cannot tell 5 %; the
instruction count (``Ir`` in the callgrind.out file, or ``callgrind_annotate``) repeats within ~1 %.
The switch is callgrind.h's client requests, compiled here with cffi (needs a C compiler and
valgrind's headers); they are no-ops outside valgrind.

``--split``: callgrind counts no kernel time, so per core (medians over the rounds) the timed part is
split into the process's user and system time, each thread's CPU (``/proc/self/task/*/schedstat``, ns:
the event loop's, the storage thread's, the checkpointer's, by thread name), minor faults, bytes written
(``wchar``, ``write_bytes``), write and read syscalls, the commits with the rows they changed
(``total_changes``), and the garbage collector's passes by generation and their CPU (``gc_s``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import os
import pstats
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Protocol

import trio

from latticed.crdt import queue2, wire
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.net.core2_engine_host import MergeSteps2
from latticed.protocol import core2_wire
from latticed.protocol.core2_steps import outgoing
from latticed.storage import writer
from latticed.storage.batch import Batch
from latticed.storage.core2_engine import reading_through
from latticed.storage.engine import Engine

OWNER = Identity.from_seed(b"a" * 32)
REPLICA = Identity.from_seed(b"b" * 32)
MAX_RECORDS, MAX_BYTES = 4096, 512 * 1024  # a link's chunk bounds
#: The profile the storage thread's group commits run under while the replica's part is timed.
_ACTIVE: list[Switch | None] = [None]
#: ``--split``'s counters for the timed part, summed over a catch-up (None: not splitting).
_SPLIT: list[dict[str, float] | None] = [None]


class Switch(Protocol):
    """What :func:`catchup` switches on for the replica's timed part only (a cProfile profile, or
    callgrind's instrumentation)."""

    def enable(self) -> None: ...
    def disable(self) -> None: ...


async def catchup(root: Path, core: int, count: int, profile: Switch | None, per_offer: int = 1) -> float:
    """The replica's CPU seconds for catching up ``count`` records of a core-``core`` queue offered
    ``per_offer`` at a time (1: single offers)."""
    (root / "a").mkdir()
    (root / "b").mkdir()
    async with Engine.open(root / "a", OWNER) as a, Engine.open(root / "b", REPLICA) as b:
        q = await a.create_queue("backlog", core=core)
        for i in range(0, count, per_offer):
            batch = range(i, min(count, i + per_offer))
            await a.append(q, [make_record(b"x" * 100, timestamp=1_700_000_000_000 + j) for j in batch])
        gc.collect()
        gc.freeze()
        spent = 0.0
        since1 = None
        since2: queue2.Summary | None = None
        while True:
            if core == 1:
                d = await a.delta_for(OWNER.public_key, "backlog", since1, MAX_RECORDS, max_bytes=MAX_BYTES)
                raw = wire.encode_delta(d)
            else:
                state = await a.core2.value(q)
                out = await a.bridge.read(
                    lambda r, s=state, n=since2: outgoing(
                        reading_through(s, r.rows), n, MAX_RECORDS, MAX_BYTES
                    )
                )
                raw = wire.pack(core2_wire.delta_to_wire(out.delta, out.steps))
            split = _SPLIT[0]
            before = _snapshot() if split is not None else None
            started = time.process_time()
            if profile is not None:
                _ACTIVE[0] = profile
                profile.enable()
            if core == 1:
                await b.merge_delta(wire.decode_delta(raw))
            else:
                await b.bridge.run(MergeSteps2(*core2_wire.delta_from_wire(wire.unpack(raw))))
            if profile is not None:
                profile.disable()
                _ACTIVE[0] = None
            spent += time.process_time() - started
            if split is not None and before is not None:
                for key, value in _snapshot().items():
                    split[key] = split.get(key, 0.0) + value - before.get(key, 0.0)
            if core == 1:
                since1 = b.summary(OWNER.public_key, "backlog")
                held = 0 if since1 is None else since1.held_end
            else:
                rq = b.core2.lookup(OWNER.public_key, "backlog")
                assert rq is not None
                since2 = queue2.summary(await b.core2.value(rq))
                held = since2.held_end
            if held >= count:
                break
        gc.unfreeze()
        return spent


def _snapshot() -> dict[str, float]:
    """The counters ``--split`` reads: the process's rusage, its I/O counters, each thread's CPU by name,
    and the replica's commits (counted by :func:`_counted_commits`)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, float] = {
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "minflt": usage.ru_minflt,
        "majflt": usage.ru_majflt,
        "nvcsw": usage.ru_nvcsw,
        "nivcsw": usage.ru_nivcsw,
    }
    main = resource.getrusage(resource.RUSAGE_THREAD)  # called on the event loop's thread
    out["loop_user_s"], out["loop_sys_s"] = main.ru_utime, main.ru_stime
    for line in Path("/proc/self/io").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "wchar", "syscr", "syscw", "write_bytes"):
            out[key] = float(value)
    names = {t.native_id: t.name for t in threading.enumerate()}
    for task in os.listdir("/proc/self/task"):
        try:
            ns = int(Path(f"/proc/self/task/{task}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended
        name = names.get(int(task), "other")
        key = f"cpu[{name.split('-')[0] if name.startswith('Thread') else name}]_s"
        out[key] = out.get(key, 0.0) + ns / 1e9
    out.update(_COMMITS)
    return out


def _gc_timed(phase: str, info: dict[str, int]) -> None:
    """A ``gc.callbacks`` entry: count each generation's collections and their thread CPU time
    (``--split``)."""
    if phase == "start":
        _GC_STARTED[0] = time.thread_time()
        return
    _COMMITS[f"gc{info['generation']}"] += 1
    _COMMITS["gc_s"] += time.thread_time() - _GC_STARTED[0]


_GC_STARTED = [0.0]


#: The storage threads' transactions so far (the owner's and the replica's) and the rows they changed.
_COMMITS: dict[str, float] = {"commits": 0.0, "rows": 0.0, "gc0": 0.0, "gc1": 0.0, "gc2": 0.0, "gc_s": 0.0}


def _counted_commits() -> None:
    """Count the storage thread's transactions and the rows they change, for ``--split``."""
    write = writer.Writer._write

    def counted(self: writer.Writer, batch: Batch, started: float) -> list[writer.Change]:
        conn = self.store.connection
        changes = conn.total_changes
        try:
            return write(self, batch, started)
        finally:
            _COMMITS["commits"] += 1
            _COMMITS["rows"] += conn.total_changes - changes

    writer.Writer._write = counted  # type: ignore[method-assign]


def _print_split(core: int, splits: list[dict[str, float]], records: int) -> None:
    """Medians over the rounds of each ``--split`` counter, per record where that reads better."""
    keys = sorted({k for split in splits for k in split})
    fields = []
    for key in keys:
        value = statistics.median(split.get(key, 0.0) for split in splits)
        if key.endswith("_s"):
            fields.append(f"{key} {value / records * 1e6:.3f} us/rec")
        elif key in ("minflt", "majflt", "nvcsw", "nivcsw", "commits", "syscr", "syscw", "gc0", "gc1", "gc2"):
            fields.append(f"{key} {value:.0f}")
        else:
            fields.append(f"{key} {value / records:.1f}/rec")
    print(f"split core {core}: " + "; ".join(fields))


def _profiled_writer() -> None:
    """Profile the storage thread's group commits of the replica's part too (cProfile follows one
    thread)."""
    process = writer.Writer._process_guarded

    def guarded(self: writer.Writer, jobs: list[writer.Job]) -> None:
        profile = _ACTIVE[0]
        if profile is None:
            process(self, jobs)
            return
        profile.enable()
        try:
            process(self, jobs)
        finally:
            profile.disable()

    writer.Writer._process_guarded = guarded  # type: ignore[method-assign]


class _Instrumented:
    """A ``profile`` for :func:`catchup` whose ``enable``/``disable`` switch callgrind's instrumentation
    (``CALLGRIND_START_INSTRUMENTATION`` / ``STOP``), built with cffi into ``scratch``."""

    def __init__(self, scratch: Path) -> None:
        from cffi import FFI  # noqa: PLC0415 (only this mode compiles)

        ffi = FFI()
        ffi.cdef("void cg_on(void); void cg_off(void);")
        ffi.set_source(
            "_cg_toggle",
            "#include <valgrind/callgrind.h>\n"
            "static void cg_on(void) { CALLGRIND_START_INSTRUMENTATION; }\n"
            "static void cg_off(void) { CALLGRIND_STOP_INSTRUMENTATION; }\n",
        )
        built = ffi.compile(tmpdir=str(scratch))
        spec = importlib.util.spec_from_file_location("_cg_toggle", built)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.enable, self.disable = module.lib.cg_on, module.lib.cg_off


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", "--singles", type=int, default=5000, help="records written on the owner")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, choices=(1, 2), default=None)
    parser.add_argument("--batch", type=int, default=1, help="records per offer (1: single offers)")
    parser.add_argument("--callgrind", type=int, choices=(1, 2), default=None)
    parser.add_argument("--split", action="store_true", help="user/system time, faults, bytes per core")
    args = parser.parse_args()
    if args.split:
        _counted_commits()
        gc.callbacks.append(_gc_timed)
    splits: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    if args.callgrind is not None:
        with tempfile.TemporaryDirectory() as scratch:
            toggle = _Instrumented(Path(scratch) / "cg")
            (Path(scratch) / "q").mkdir()
            spent = trio.run(catchup, Path(scratch) / "q", args.callgrind, args.records, toggle, args.batch)
        print(f"core {args.callgrind}: {spent / args.records * 1e6:.2f} us/record (instrumented part only)")
        return
    if args.profile is not None:
        profile = cProfile.Profile()
        _profiled_writer()
        with tempfile.TemporaryDirectory() as scratch:
            spent = trio.run(catchup, Path(scratch), args.profile, args.records, profile, args.batch)
        print(f"core {args.profile}: {spent / args.records * 1e6:.2f} us/record (profiled)")
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    runs: dict[int, list[float]] = {1: [], 2: []}
    for round_no in range(args.rounds):
        for core in (1, 2):
            _SPLIT[0] = {} if args.split else None
            with tempfile.TemporaryDirectory() as scratch:
                spent = trio.run(catchup, Path(scratch), core, args.records, None, args.batch)
            runs[core].append(spent)
            split = _SPLIT[0]
            if split is not None:
                splits[core].append(split)
            print(
                f"round {round_no + 1}, core {core}: replica CPU {spent / args.records * 1e6:.2f} us/record"
            )
    if args.split:
        for core in (1, 2):
            _print_split(core, splits[core], args.records)
    one, two = (statistics.median(runs[c]) / args.records * 1e6 for c in (1, 2))
    ratios = [b / a for a, b in zip(runs[1], runs[2], strict=True)]
    print(
        f"median: core 1 {one:.2f} us/record, core 2 {two:.2f} us/record; core 2 ÷ core 1 median "
        f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} pairs)"
    )


if __name__ == "__main__":
    main()
