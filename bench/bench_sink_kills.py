"""A held-out check of the Spark sink's exactly once: a streaming query writes N rows (1,000,000 by default)
into a queue on a standalone cluster of two one-core workers while a worker is killed -9 mid-batch and,
later, the driver is killed -9 mid-batch and restarted from its checkpoint. Then every record is read back
through the owner's daemon: exactly N, each id once.

Usage: python bench/bench_sink_kills.py [--rows N] [--files F] [--files-per-trigger K] [--daemons 1|2]
                                        [--worker-kill-batch B] [--driver-kill-batch B] [--keep]

* Daemons (``--daemons 2``, the default): the owner O holds the queue and lists P as a producer; the
  driver and every executor write through P, which forwards each chunk to O as a remote offer (O signs,
  commits, answers; the records replicate back to P). ``--daemons 1``: the executors write into O directly.
* Source: F Parquet files of one ``id`` column (N/F ids each, ids 0..N-1 once), read K files per
  micro-batch (``Trigger.AvailableNow``), so batch b holds ids [b*N*K/F, (b+1)*N*K/F), one file per
  partition. Each row becomes a record: key = id, value = the id padded to 100 B, headers q, b, p (the
  query, micro-batch and partition that wrote it), see bench/sink_kills_driver.py.
* Kills: once part of micro-batch ``--worker-kill-batch`` is in the queue, the worker running one of its
  tasks is killed -9 with everything under it (executor JVM, Python workers), and a new worker is started
  (the machine comes back); once part of ``--driver-kill-batch`` is in, the driver and its JVM are killed
  -9 and a new driver is started from the checkpoint. Where each kill landed is printed (the batch, whether
  it had committed, records in the queue then).
* Verdict: records, distinct (query, batch, partition, row) identities, distinct ids, duplicates, missing,
  ids out of range, records without the producer's header, and whether P's replica holds the same
  records. Exit status 1 on any loss, duplicate or mismatch; 2 if a kill did not land mid-batch, or the
  worker's did not make Spark retry a task (the run proved less than it should); 0 otherwise.

Figures are printed (elapsed from the first driver's start to the last driver's end, rows/s); this is
not a test: CI-sized runs pass ``--rows 20000``.

Why one module: the kills, the timing and the verdict share the run's state (markers, checkpoint, the
queue's end) and are read top to bottom as one script; only the driver, a separate process, is apart.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
from _daemons import LoopbackDaemon
from spark_cluster import Cluster, Worker, standalone_cluster

from latticed.api.client.blocking_client import Client

DRIVER = Path(__file__).resolve().parent / "sink_kills_driver.py"
PRODUCER_HEADER = "lattice.producer"
POLL_S = 0.01


@dataclass
class Kill:
    what: str
    batch: int
    at_s: float = 0.0
    end: int = 0  # records in the queue when it was killed
    committed: bool | None = None  # had the batch committed when it was killed?
    detail: str = ""


@dataclass
class Run:
    rows: int
    batch_rows: int
    root: Path
    queue: str
    owner: LoopbackDaemon
    writer_socket: Path
    cluster: Cluster
    checkpoint: Path = field(init=False)
    markers: Path = field(init=False)
    files: Path = field(init=False)
    kills: list[Kill] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.checkpoint = self.root / "checkpoint"
        self.markers = self.root / "markers"
        self.files = self.root / "files"
        self.markers.mkdir()

    def end(self, client: Client) -> int:
        return int(client.queue_info(self.queue)["end_offset"])

    def committed(self, batch: int) -> bool:
        return (self.checkpoint / "commits" / str(batch)).exists()


def write_files(where: Path, rows: int, files: int) -> None:
    """``files`` Parquet files of consecutive ids; modification times one second apart, so the file source
    takes them in this order."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    where.mkdir()
    per = rows // files
    base = time.time() - files - 10
    for f in range(files):
        path = where / f"part-{f:05d}.parquet"
        pq.write_table(pa.table({"id": pa.array(range(f * per, (f + 1) * per), pa.int64())}), path)
        os.utime(path, (base + f, base + f))


def children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                tree[ppid].append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, out, todo = children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += tree.get(p, [])
    return out


def kill_machine(worker: Worker) -> int:
    """Kill -9 a worker and everything under it at once (its executor JVM, its Python workers): what a
    machine that dies does. Returns how many processes died."""
    victims = descendants(worker.proc.pid)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    worker.proc.wait()
    return len(victims)


def start_driver(run: Run, number: int, files_per_trigger: int, per_offer: int) -> subprocess.Popen[bytes]:
    args = [str(run.files), str(run.writer_socket), run.queue, str(run.checkpoint), str(run.markers)]
    args += [str(number), str(files_per_trigger), str(per_offer)]
    return run.cluster.driver(DRIVER, *args, log=run.root / f"driver{number}.log")


def tasks_of(run: Run, driver: int, batch: int) -> list[tuple[bool, int, int, int]]:
    """(input done, partition, attempt, pid) of the tasks of ``batch`` started under driver run ``driver``,
    those still taking rows first."""
    out = []
    for marker in run.markers.glob(f"{driver}-{batch}-*-*"):
        if marker.suffix == ".done":
            continue
        _, _, part, attempt = marker.name.split("-")
        with contextlib.suppress(OSError, ValueError):
            done = marker.with_suffix(".done").exists()
            out.append((done, int(part), int(attempt), int(marker.read_text())))
    return sorted(out)


def wait_into(run: Run, client: Client, batch: int, driver: subprocess.Popen[bytes]) -> bool:
    """Until part of ``batch`` (a quarter of its rows past the batches before) is in the queue; False if
    the driver ended first."""
    target = batch * run.batch_rows + run.batch_rows // 4
    while run.end(client) < target:
        if driver.poll() is not None:
            return False
        time.sleep(POLL_S)
    return True


def kill_a_worker(run: Run, client: Client, batch: int, driver: subprocess.Popen[bytes], t0: float) -> Kill:
    kill = Kill("worker", batch)
    if not wait_into(run, client, batch, driver):
        kill.detail = "the driver ended first"
        return kill
    live = [w for w in run.cluster.workers if w.alive()]
    victim, task = live[0], None
    # The task that wrote last has chunks in the queue for its retry to send again: it goes first.
    last = client.read(run.queue, run.end(client) - 1, max_records=1)
    wrote = int(dict(last.headers[0]).get("p", b"-1")) if last.headers else -1
    for done, part, attempt, pid in sorted(tasks_of(run, 1, batch), key=lambda t: (t[1] != wrote, t)):
        owners = [w for w in live if pid in descendants(w.proc.pid)]
        if owners:
            victim, task = owners[0], (part, attempt, done)
            break
    kill.committed = run.committed(batch)
    kill.end = run.end(client)
    kill.at_s = time.perf_counter() - t0
    died = kill_machine(victim)
    kill.detail = f"worker {run.cluster.workers.index(victim)} ({died} processes)" + (
        f", which ran partition {task[0]} attempt {task[1]}"
        + (" (its input all handed on)" if task[2] else " (mid-input)")
        if task
        else ", no task of the batch found on it"
    )
    return kill


def kill_the_driver(run: Run, client: Client, batch: int, driver: subprocess.Popen[bytes], t0: float) -> Kill:
    kill = Kill("driver", batch)
    if not wait_into(run, client, batch, driver):
        kill.detail = "the driver ended first"
        return kill
    kill.committed = run.committed(batch)
    kill.end = run.end(client)
    kill.at_s = time.perf_counter() - t0
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and its JVM, at once
    driver.wait()
    kill.detail = f"driver pid {driver.pid} and its JVM"
    return kill


def finish(driver: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    try:
        code = driver.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        code = None
    out = log.read_text(errors="replace")
    if code != 0 or "DRIVER DONE" not in out:
        raise SystemExit(f"the driver failed (exit {code}):\n{out[-4000:]}")


@dataclass
class Verdict:
    records: int = 0
    identities: int = 0
    ids: int = 0
    duplicates: int = 0
    missing: int = 0
    out_of_range: int = 0
    unstamped: int = 0
    queries: set[bytes] = field(default_factory=set)
    batches: collections.Counter[int] = field(default_factory=collections.Counter)
    #: (batch, partition) -> its records at offsets below the queue's end when that batch was killed into
    before_kill: collections.Counter[tuple[int, int]] = field(default_factory=collections.Counter)
    digest: str = ""

    def ok(self) -> bool:
        bad = self.duplicates or self.missing or self.out_of_range or self.unstamped
        return not bad and self.records == self.ids == self.identities


def read_back(
    client: Client, queue: str, rows: int, producer: str | None, kills: list[Kill] | None = None
) -> Verdict:
    """Every record of ``queue`` from ``client``'s daemon, checked against ids 0..rows-1; ``kills``: count
    what each killed batch's partitions had in the queue when the kill came."""
    ends = {k.batch: k.end for k in kills or [] if k.at_s}
    v = Verdict()
    seen = bytearray(rows)
    identities: set[tuple[int, int, int, int]] = set()
    queries: dict[bytes, int] = {}
    digest = hashlib.blake2b(digest_size=16)
    offset = 0
    while True:
        batch = client.read(queue, offset, max_records=20_000, max_bytes=4 << 20)
        if not batch.values:
            break
        rows_of = zip(batch.offsets, batch.keys, batch.values, batch.headers, strict=True)
        for at, key, value, headers in rows_of:
            digest.update(len(value).to_bytes(4, "big") + value)
            v.records += 1
            fields = dict(headers)
            if producer is not None and fields.get(PRODUCER_HEADER) != producer.encode():
                v.unstamped += 1
            i = int(value.lstrip(b"x"))
            if key != str(i).encode() or not 0 <= i < rows:
                v.out_of_range += 1
                continue
            if seen[i]:
                v.duplicates += 1
            else:
                seen[i] = 1
            q = fields.get("q", b"")
            b, p = int(fields.get("b", b"-1")), int(fields.get("p", b"-1"))
            v.queries.add(q)
            v.batches[b] += 1
            if at < ends.get(b, -1):
                v.before_kill[b, p] += 1
            identities.add((queries.setdefault(q, len(queries)), b, p, i))
        offset = batch.next_offset
    v.identities = len(identities)
    v.ids = sum(seen)
    v.missing = rows - v.ids
    v.digest = digest.hexdigest()
    return v


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--files-per-trigger", type=int, default=2)
    parser.add_argument("--daemons", type=int, choices=(1, 2), default=2)
    parser.add_argument("--records-per-offer", type=int, default=None, help="default: a partition's rows / 5")
    parser.add_argument("--worker-kill-batch", type=int, default=None, help="default: 30%% of the batches in")
    parser.add_argument("--driver-kill-batch", type=int, default=None, help="default: 60%% of the batches in")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoint)")
    args = parser.parse_args()
    if args.rows % args.files or args.files % args.files_per_trigger:
        parser.error("--rows must be a multiple of --files, --files of --files-per-trigger")
    batches = args.files // args.files_per_trigger
    batch_rows = args.rows // batches
    per_offer = args.records_per_offer or max(1, batch_rows // args.files_per_trigger // 5)
    worker_batch = args.worker_kill_batch if args.worker_kill_batch is not None else batches * 3 // 10
    driver_batch = args.driver_kill_batch if args.driver_kill_batch is not None else batches * 6 // 10
    if not 0 <= worker_batch < driver_batch < batches:
        parser.error("need 0 <= --worker-kill-batch < --driver-kill-batch < the number of batches")
    timeout = 600 + args.rows / 500

    root = Path(tempfile.mkdtemp(prefix="lsk-kills-", dir="/tmp"))
    print(f"work directory {root}; {args.rows:,} rows, {batches} micro-batches of {batch_rows:,}, ", end="")
    print(
        f"{args.files_per_trigger} partitions each, recordsPerOffer {per_offer:,}, {args.daemons} daemon(s)"
    )
    daemons: list[LoopbackDaemon] = []
    try:
        owner = LoopbackDaemon(root, "owner", timeout=120)
        daemons.append(owner)
        writer = owner
        if args.daemons == 2:
            writer = LoopbackDaemon(root, "producer", [str(owner.listen)], timeout=120)
            daemons.append(writer)
        with writer.client() as c:
            producer = c.identity()
        with owner.client() as c:
            queue = c.queue_create("sink", producers=[producer] if args.daemons == 2 else None)
        with standalone_cluster(root / "cluster", workers=2) as cluster:
            run = Run(args.rows, batch_rows, root, queue, owner, writer.socket, cluster)
            write_files(run.files, args.rows, args.files)
            code = drive(run, args.files_per_trigger, per_offer, worker_batch, driver_batch, timeout)
        with owner.client() as c:
            started = time.perf_counter()
            verdict = read_back(c, queue, args.rows, producer if args.daemons == 2 else None, run.kills)
            read_s = time.perf_counter() - started
        replica = None
        if args.daemons == 2:
            with writer.client() as c:
                deadline = time.monotonic() + 120
                while run.end(c) < verdict.records and time.monotonic() < deadline:
                    time.sleep(0.1)
                replica = read_back(c, queue, args.rows, producer)
        return report(verdict, replica, read_s, code)
    finally:
        for d in daemons:
            with contextlib.suppress(Exception):
                d.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def drive(
    run: Run, per_trigger: int, per_offer: int, worker_batch: int, driver_batch: int, timeout: float
) -> int:
    """The two drivers and the two kills; prints the timings and where the kills landed. Returns 2 if a
    kill missed its batch, else 0."""
    client = Client(run.owner.socket, timeout=60)
    t0 = time.perf_counter()
    first = start_driver(run, 1, per_trigger, per_offer)
    run.kills.append(kill_a_worker(run, client, worker_batch, first, t0))
    comeback = threading.Thread(target=run.cluster.add_worker, daemon=True)  # the machine comes back
    comeback.start()
    run.kills.append(kill_the_driver(run, client, driver_batch, first, t0))
    if first.poll() is None or run.kills[-1].at_s == 0.0:
        finish(first, run.root / "driver1.log", timeout)  # the kill missed: it ran to the end
    restarted = time.perf_counter()
    second = start_driver(run, 2, per_trigger, per_offer)
    finish(second, run.root / "driver2.log", timeout)
    elapsed = time.perf_counter() - t0
    comeback.join(timeout=120)
    end = run.end(client)
    client.close()

    after = time.perf_counter() - restarted
    print(f"\nwritten: {end:,} records in the queue; {elapsed:.1f} s from the first driver's start to the")
    print(f"  second's end, {run.rows / elapsed:,.0f} rows/s ({after:.1f} s of it after the restart)")
    missed = 0
    for kill in run.kills:
        mid = kill.committed is False and kill.end < (kill.batch + 1) * run.batch_rows
        missed += not mid
        where = "MID-BATCH" if mid else "NOT mid-batch"
        print(
            f"  {kill.what} killed -9 at {kill.at_s:.1f} s in micro-batch {kill.batch} ({where}: committed "
            f"{kill.committed}, {kill.end:,} records in the queue, the batch spans "
            f"{kill.batch * run.batch_rows:,}..{(kill.batch + 1) * run.batch_rows:,}); {kill.detail}"
        )
    retried = sorted(
        {(int(m.name.split("-")[1]), int(m.name.split("-")[2])) for m in run.markers.glob("1-*-*-[1-9]")}
    )
    rerun = sorted({int(m.name.split("-")[1]) for m in run.markers.glob("2-*")})
    print(f"  task attempts > 0 under the first driver (batch, partition): {retried or 'none'}")
    print(f"  batches the restarted driver ran: {rerun[0] if rerun else '-'}..{rerun[-1] if rerun else '-'}")
    if run.kills[0].at_s and not any(b == run.kills[0].batch for b, _ in retried):
        print("  the worker killed had finished its task: Spark retried nothing (likelier at a small --rows)")
        missed += 1
    return 2 if missed else 0


def report(verdict: Verdict, replica: Verdict | None, read_s: float, code: int) -> int:
    v = verdict
    rate = v.records / max(read_s, 1e-9)
    print(f"\nread back through the owner's daemon in {read_s:.1f} s ({rate:,.0f} records/s):")
    print(f"  records                                         {v.records:>10,}")
    print(f"  distinct (query, batch, partition, row)         {v.identities:>10,}")
    print(f"  distinct ids                                    {v.ids:>10,}")
    print(f"  duplicates (an id more than once)               {v.duplicates:>10,}")
    print(f"  missing ids                                     {v.missing:>10,}")
    print(f"  records with an id out of range or a wrong key  {v.out_of_range:>10,}")
    unstamped = f"{v.unstamped:>10,}" if replica is not None else "(one daemon: not checked)"
    print(f"  records without the producer's header           {unstamped}")
    print(f"  queries {len(v.queries)}, records per micro-batch {dict(sorted(v.batches.items()))}")
    before = {f"batch {b} partition {p}": n for (b, p), n in sorted(v.before_kill.items())}
    print(f"  records of the killed batches in the queue when the kill came: {before}")
    same = True
    if replica is not None:
        same = replica.digest == v.digest and replica.records == v.records
        print(f"  the producer's replica: {replica.records:,} records, identical: {same}")
    good = v.ok() and same and len(v.queries) == 1
    print(
        f"\nVERDICT: {'PASS' if good else 'FAIL'}: {v.records:,} records, {v.duplicates:,} duplicates, ",
        end="",
    )
    print(
        f"{v.missing:,} missing"
        + ("" if code == 0 else "; a kill did not land mid-batch or mid-task (exit 2)")
    )
    if not good:
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
