"""Starting, waiting for and measuring ``latticed run`` processes: the part every bench that drives real
daemons shares (each bench keeps its own command line and its own notion of "ready").

The benches run as scripts, so bench/ is on ``sys.path`` and they import this as ``_daemons``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from latticed.api.client.blocking_client import Client
from latticed.errors import ConnectionClosedError

BIN = Path(sys.executable).parent
T = TypeVar("T")


def run_argv(*args: str) -> list[str]:
    """``latticed run ARGS`` through the installed script (the venv's scripts honour PYTHONPATH)."""
    return [str(BIN / "latticed"), "run", *args]


def listen_address(client: Client) -> str:
    """The peer address the daemon listens on (it was started with ``--listen 127.0.0.1:0``)."""
    return str(client.status()["listen"])


def start(
    argv: list[str],
    sock: Path,
    ready: Callable[[Client], T],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 30.0,
) -> tuple[subprocess.Popen[bytes], T]:
    """Start ``argv`` and wait until its API socket answers ``ready`` (returned with the process).

    There is nothing to wait on but the socket, so this polls it; a daemon that exits, or stays silent for
    ``timeout`` seconds, fails the bench rather than hanging it. ``cwd``: where it runs (an earlier
    release runs from its own source tree, which ``python -m`` puts first on the path)."""
    proc = subprocess.Popen(argv, env=None if env is None else dict(env), cwd=cwd)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                with Client(sock) as c:
                    return proc, ready(c)
            except ConnectionClosedError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
    except BaseException:
        stop(proc)
        raise


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Terminate the daemon (a clean shutdown) and reap it."""
    if proc.poll() is None:
        proc.terminate()
    proc.wait(timeout)


class Node(Protocol):
    """A bench's daemon: its API socket and a client on it."""

    @property
    def socket(self) -> Path: ...

    def client(self) -> Client: ...


class LoopbackDaemon:
    """A ``latticed run`` on 127.0.0.1 (port 0) with its own data directory under ``root``, mDNS off,
    dialling ``peers``; ``timeout``: its clients' (s)."""

    def __init__(self, root: Path, name: str, peers: Sequence[str] = (), *, timeout: float = 60) -> None:
        self.name = name
        self.socket = root / f"{name}.sock"
        self.timeout = timeout
        args = ["--data-dir", str(root / name), "--socket", str(self.socket)]
        args += ["--listen", "127.0.0.1:0", "--no-mdns", "--log-level", "WARNING"]
        for peer in peers:
            args += ["--peer", peer]
        self.proc, self.listen = start(run_argv(*args), self.socket, listen_address)

    def client(self) -> Client:
        return Client(self.socket, timeout=self.timeout)

    def stop(self) -> None:
        stop(self.proc)


def wait_end(node: Node, queue: str, end: int, timeout: float = 600) -> float:
    """When ``node`` serves the record at ``end - 1`` (so holds it durably): a tail from there is pushed
    the record as its commit lands. Polling the end offset every few ms instead would compete with the
    daemon for the CPU it is being measured on; it is only done until the queue exists there."""
    deadline = time.monotonic() + timeout
    with node.client() as c:
        while True:
            with contextlib.suppress(Exception):
                c.queue_info(queue)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{queue} never reached {node.socket}")
            time.sleep(0.005)
        for entry in c.tail(queue, from_offset=end - 1):
            if entry.offset >= end - 1:
                return time.perf_counter()
    raise TimeoutError(f"{queue} did not reach {end}")


class _Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=_Stoppable)


@contextlib.contextmanager
def scratch(prefix: str, *, remove: bool = False) -> Iterator[tuple[Path, list[S]]]:
    """A temporary root and a list the bench adds its nodes to: every node is stopped on the way out
    (one that fails to stop does not keep the others running); ``remove`` deletes the root too."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    nodes: list[S] = []
    try:
        yield root, nodes
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                node.stop()
        if remove:
            shutil.rmtree(root, ignore_errors=True)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux): robust to other load on a shared box,
    unlike wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ns_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, to the nanosecond (its CPU clock, Linux: another
    process's may be read), where ``cpu_s``'s ticks are 10 ms: a replica's bulk is a few of them."""
    return time.clock_gettime(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of process ``pid``


def thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of a process: its name and CPU seconds so far, to the nanosecond
    (``se.sum_exec_runtime`` of /proc/PID/task/TID/sched); empty where the kernel does not show it. What
    splits a daemon's CPU between its event loop, storage thread and readers (threads gone are not in it)."""
    threads: dict[int, tuple[str, float]] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                name = (task / "comm").read_text().strip()
                for line in (task / "sched").read_text().splitlines():
                    if line.startswith("se.sum_exec_runtime"):
                        threads[int(task.name)] = (name, float(line.split(":")[1]) / 1e3)
    return threads


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and every descendant alive now, each with its reaped
    children's (Linux): what a run costs the box in all (Spark's JVM, its Python workers, a daemon)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
                times[int(entry.name)] = sum(int(f) for f in fields[11:15]) / tick
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        total += times.get(current, 0.0)
        pending += [child for child, parent in parents.items() if parent == current]
    return total


def rss_mb(pid: int) -> float:
    """Resident memory of a process (Linux), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class CpuSplit:
    """CPU and wake-ups of a process between two points, split into its main thread (the daemon's event
    loop) and all other threads (the storage thread, worker threads): read from /proc (Linux)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._start = self._read()

    def _read(self) -> tuple[float, float, int]:
        tick = os.sysconf("SC_CLK_TCK")
        loop = rest = 0.0
        wakeups = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                seconds = (int(fields[11]) + int(fields[12])) / tick
                wakeups += int((task / "schedstat").read_text().split()[2])
                if task.name == str(self.pid):
                    loop += seconds
                else:
                    rest += seconds
        return loop, rest, wakeups

    def since(self) -> tuple[float, float, int]:
        """(event-loop CPU s, other threads' CPU s, wake-ups) since this was made."""
        loop, rest, wakeups = self._read()
        return loop - self._start[0], rest - self._start[1], wakeups - self._start[2]


#: A daemon thread's role, by its name: the event loop is the main thread, the storage thread names itself
#: ``ld-storage``, store reads run on trio's worker threads; anything else (the checkpointer) is "other".
ROLES = ("loop", "storage", "readers", "other")


def thread_role(pid: int, tid: int, name: str) -> str:
    """Which of :data:`ROLES` thread ``tid`` (named ``name``) of daemon ``pid`` plays."""
    if tid == pid:
        return "loop"
    if name == "ld-storage":
        return "storage"
    return "readers" if name.startswith("Trio thread") else "other"


def parse_schedstat(text: str) -> tuple[int, int, int]:
    """/proc/.../schedstat's three fields: ns on a CPU, ns runnable but waiting for one, times run."""
    cpu, wait, slices = (int(field) for field in text.split()[:3])
    return cpu, wait, slices


def thread_schedstat(pid: int, proc: Path = Path("/proc")) -> dict[int, tuple[str, int, int, int]] | None:
    """Each live thread of ``pid``: (name, CPU ns, run-queue wait ns, times run), or None where the kernel
    keeps no schedstat (no CONFIG_SCHED_INFO: no file, or all zeros). The wait is what a thread hop costs
    on a busy box (bench/RESULTS.md, sim19b's diagnosis), which CPU alone does not show."""
    threads: dict[int, tuple[str, int, int, int]] = {}
    with contextlib.suppress(OSError):
        for task in (proc / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                stat = parse_schedstat((task / "schedstat").read_text())
                threads[int(task.name)] = ((task / "comm").read_text().strip(), *stat)
    if not any(cpu or slices for _, cpu, _, slices in threads.values()):
        return None
    return threads


def sched_by_role(
    pid: int, before: Mapping[int, tuple[str, int, int, int]], after: Mapping[int, tuple[str, int, int, int]]
) -> dict[str, tuple[float, float, int]]:
    """(CPU s, run-queue wait s, times run) per role between two :func:`thread_schedstat` reads: threads
    started since count from zero; threads gone since are not in it (their CPU is by_thread's "gone")."""
    roles = {role: (0.0, 0.0, 0) for role in ROLES}
    for tid, (name, cpu, wait, slices) in after.items():
        _, cpu0, wait0, slices0 = before.get(tid, (name, 0, 0, 0))
        role = thread_role(pid, tid, name)
        c, w, s = roles[role]
        roles[role] = (c + (cpu - cpu0) / 1e9, w + (wait - wait0) / 1e9, s + slices - slices0)
    return roles


def sched_report(name: str, roles: Mapping[str, tuple[float, float, int]], records: int) -> str:
    """One daemon's roles as ``role CPU/wait ms in N runs (wait a run ms; CPU/wait us a record)``."""
    parts = []
    for role, (cpu, wait, slices) in roles.items():
        if slices:
            parts.append(
                f"{role} {cpu * 1e3:.0f}/{wait * 1e3:.0f} ms in {slices} "
                f"({wait / slices * 1e3:.2f} ms a run; "
                f"{cpu / records * 1e6:.2f}/{wait / records * 1e6:.2f} us a record)"
            )
    return f"{name}: {', '.join(parts) or 'no thread ran'}"
