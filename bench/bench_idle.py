"""What an idle daemon costs: CPU and wake-ups of a daemon with three connected peers and nothing written.

    .venv/bin/python bench/bench_idle.py                        # both variants, 60 s each
    .venv/bin/python bench/bench_idle.py --variants static --seconds 30

Four daemons on loopback (a fresh random network key, so no other daemon on this host joins), fully
meshed, each with one queue of one record written before the measurement (so "caught up" means every
peer holds the others' queues). Once every daemon shows its three peers connected and in sync, nothing
is written for ``--seconds`` while this script reads, for each daemon, ``/proc/PID/stat`` (utime +
stime, every thread, dead ones included) and ``/proc/PID/task/*/schedstat`` (third field: how many times
a thread was put on a CPU, i.e. its wake-ups) with each thread's ``comm`` (the daemon names its threads).

Variants:
  static  peers from ``--peer`` only, mDNS off.
  mdns    no static peers: the daemons find each other with mDNS on 127.0.0.1 only (``--mdns-interface
          127.0.0.1``, as the tests do), so nothing goes out on a real interface.

Figures are printed, never asserted: CPU as % of one core, wake-ups per second in total and per thread
name, for the daemon measured (D, the last one started) and each daemon's totals.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import socket
import threading
import time
from pathlib import Path

from _daemons import cpu_s, listen_address, run_argv, scratch, start, stop
from zeroconf import DNSIncoming

from latticed.api.client.blocking_client import Client
from latticed.host.netkey import write_network_key
from latticed.protocol.announce import SERVICE_TYPE

NAMES = ("A", "B", "C", "D")
#: Threads are read this often, so one that ends during the window (trio's idle workers end after 10 s)
#: loses at most this much of its count.
SAMPLE_S = 0.5


class Node:
    """One ``latticed run`` on loopback; ``extra`` options come after the defaults (later ones win)."""

    def __init__(self, root: Path, name: str, peers: list[str], extra: list[str]) -> None:
        self.socket = root / f"{name}.sock"
        args = ["--data-dir", str(root / name), "--socket", str(self.socket)]
        args += ["--listen", "127.0.0.1:0", "--no-mdns", "--log-level", "WARNING"]
        for peer in peers:
            args += ["--peer", peer]
        self.proc, self.listen = start(run_argv(*args, *extra), self.socket, listen_address)

    def client(self) -> Client:
        return Client(self.socket, timeout=60)

    def stop(self) -> None:
        stop(self.proc)


def thread_counts(pid: int) -> dict[int, tuple[str, int, int]]:
    """Per thread id: its name, how many times it has been put on a CPU so far, and its CPU time (ns)."""
    out: dict[int, tuple[str, int, int]] = {}
    task_dir = Path(f"/proc/{pid}/task")
    for task in task_dir.iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            ran_ns, _, slices = (int(f) for f in (task / "schedstat").read_text().split()[:3])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue  # ended meanwhile
        name = "main (event loop)" if int(task.name) == pid else comm
        out[int(task.name)] = (name, slices, ran_ns)
    return out


class Sampler:
    """Wake-ups and CPU time per thread over a window: first and last counts seen of every thread id
    (``/proc/PID/stat`` has the whole process's CPU, dead threads included, but only in clock ticks)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.first: dict[int, tuple[str, int, int]] = thread_counts(pid)
        self.last: dict[int, tuple[str, int, int]] = dict(self.first)
        self.born: set[int] = set()
        self.cpu0 = cpu_s(pid)
        self.cpu = 0.0

    def sample(self) -> None:
        for tid, counts in thread_counts(self.pid).items():
            if tid not in self.first:
                self.first[tid] = (counts[0], 0, 0)
                self.born.add(tid)
            self.last[tid] = counts

    def finish(self) -> None:
        self.sample()
        self.cpu = cpu_s(self.pid) - self.cpu0

    def wakeups(self) -> dict[str, tuple[int, int, int]]:
        """Per thread name (trailing numbers folded): (threads, wake-ups, CPU ns in the window)."""
        totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
        for tid, (name, count, ran_ns) in self.last.items():
            row = totals[re.sub(r"\d+$", "N", name)]
            row[0] += 1
            row[1] += count - self.first[tid][1]
            row[2] += ran_ns - self.first[tid][2]
        return {name: (threads, woke, ran) for name, (threads, woke, ran) in totals.items()}

    def totals(self) -> tuple[int, int]:
        """Wake-ups and CPU ns of every thread seen in the window."""
        rows = self.wakeups().values()
        return sum(r[1] for r in rows), sum(r[2] for r in rows)


class MdnsTraffic:
    """Counts the mDNS packets multicast on loopback during the window, and the latticed instances they
    name: other daemons or tests on this host that announce on loopback (under other network keys) make
    ours resolve and reject them, which shows in the figures. Bound to the group address, so it never
    takes a unicast answer meant for a daemon."""

    def __init__(self) -> None:
        self.packets = 0
        self.instances: set[str] = set()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._sock.bind(("224.0.0.251", 5353))
        group = socket.inet_aton("224.0.0.251") + socket.inet_aton("127.0.0.1")
        self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, group)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(9000)
            except TimeoutError:
                continue
            self.packets += 1
            with contextlib.suppress(Exception):  # a packet it cannot parse still counts
                for record in DNSIncoming(data).answers():
                    if record.name.lower() == SERVICE_TYPE.lower() and hasattr(record, "alias"):
                        self.instances.add(record.alias.lower())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()


def wait_meshed(nodes: list[Node], timeout: float = 120) -> float:
    """Until every daemon has the three others connected and in sync (read from ``peers``); seconds."""
    started = time.monotonic()
    clients = [node.client() for node in nodes]
    try:
        while True:
            ready = 0
            for client in clients:
                rows = client.peers()
                ready += sum(1 for row in rows if row.get("in_sync")) >= len(nodes) - 1
            if ready == len(nodes):
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"only {ready} of {len(nodes)} daemons saw every peer in sync")
            time.sleep(0.1)
    finally:
        for client in clients:
            client.close()


def run(variant: str, seconds: float, settle: float) -> None:
    nodes: list[Node]
    with scratch("ld-bench-idle-", remove=True) as (root, nodes):
        key_file = root / "network.key"
        write_network_key(key_file)
        common = ["--network-key-file", str(key_file)]
        if variant == "mdns":
            common += ["--mdns", "--mdns-interface", "127.0.0.1"]
        for name in NAMES:
            peers = [n.listen for n in nodes] if variant == "static" else []
            node = Node(root, name, peers, extra=common)
            nodes.append(node)
            with node.client() as c:
                c.queue_create(f"q-{name}")
                c.offer(f"q-{name}", b"written before the window")
        meshed = wait_meshed(nodes)
        # The dials, handshakes and first digests are over; let the one-off work after them end too.
        time.sleep(settle)
        mdns = MdnsTraffic() if variant == "mdns" else None
        samplers = [Sampler(node.proc.pid) for node in nodes]
        started = time.monotonic()
        deadline = started + seconds
        while (now := time.monotonic()) < deadline:
            time.sleep(min(SAMPLE_S, deadline - now))
            for sampler in samplers:
                sampler.sample()
        for sampler in samplers:
            sampler.finish()
        elapsed = time.monotonic() - started
        if mdns is not None:
            mdns.stop()
        # Still meshed at the end: a window in which a link dropped measures something else.
        wait_meshed(nodes, timeout=10)
        print(
            f"idle, {variant} ({'mDNS on 127.0.0.1' if variant == 'mdns' else 'static peers, no mDNS'}):"
            f" meshed after {meshed:.1f} s, measured {elapsed:.0f} s after {settle:.0f} s to settle"
        )
        # CPU two ways: /proc/PID/stat (every thread, dead ones too, in 10 ms clock ticks: coarse over a
        # minute of idling) and the sum of the threads' schedstat run times (ns).
        for name, sampler in zip(NAMES, samplers, strict=True):
            woke, ran_ns = sampler.totals()
            print(
                f"    daemon {name}: CPU {ran_ns / 1e9 / elapsed * 100:.4f} % of a core (stat:"
                f" {sampler.cpu / elapsed * 100:.3f} %), {woke / elapsed:.2f} wake-ups/s"
            )
        print("    daemon D by thread (threads, wake-ups/s, CPU % of a core):")
        rows = sorted(samplers[-1].wakeups().items(), key=lambda kv: -kv[1][1])
        for name, (threads, woke, ran_ns) in rows:
            share = ran_ns / 1e9 / elapsed * 100
            print(f"        {name:<22} {threads:>3} {woke / elapsed:8.2f} {share:9.4f}")
        if mdns is not None:
            print(
                f"    mDNS multicast on loopback in the window: {mdns.packets} packets naming"
                f" {len(mdns.instances)} latticed instance(s) ({len(nodes)} are ours; more: other"
                " daemons on this host announce on loopback too)"
            )
        totals = [s.totals() for s in samplers]
        cpu = sum(ran for _, ran in totals) / 1e9 / elapsed * 100 / len(nodes)
        wakes = sum(woke for woke, _ in totals) / elapsed / len(nodes)
        print(
            f"    mean of the four: CPU {cpu:.4f} %, {wakes:.2f} wake-ups/s;"
            f" load average {os.getloadavg()[0]:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the measured window")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between meshed and measuring")
    parser.add_argument("--variants", default="static,mdns")
    args = parser.parse_args()
    for variant in args.variants.split(","):
        run(variant, args.seconds, args.settle)


if __name__ == "__main__":
    main()
