"""Bundles against the network: the same backlog carried to a fresh daemon by a file and by a peer link.

    .venv/bin/python bench/bench_bundle.py                    # 1,000,000 x 100 B records
    .venv/bin/python bench/bench_bundle.py --records 100000

``--records`` x 100 B records are written on A. Then, in the same run:

  network  a fresh B dials A: records/s until B holds them all (verified and durable), as
           bench_replication.py's catch-up measures it;
  bundle   ``latticectl bundle export`` on A to a file, then ``latticectl bundle import`` of it on a fresh
           C that has no listener and no mDNS: records/s over export + import (each also on its own),
           and the peak RSS of both daemons and of both ``latticectl`` processes, which should not grow
           with the backlog (everything streams).

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _daemons import BIN, cpu_s, listen_address, run_argv, scratch, start, stop, wait_end

from latticed.api.client.blocking_client import Client


def peak_mb(pid: int) -> float:
    """Peak resident memory of a live process so far (Linux VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Node:
    def __init__(self, root: Path, name: str, *, listen: bool, peers: tuple[str, ...] = ()) -> None:
        self.name = name
        self.socket = root / f"{name}.sock"
        args = ["--data-dir", str(root / name), "--socket", str(self.socket), "--no-mdns"]
        args += ["--log-level", "WARNING"]
        if listen:
            args += ["--listen", "127.0.0.1:0"]
        for peer in peers:
            args += ["--peer", peer]
        ready = listen_address if listen else (lambda c: c.identity())
        self.proc, self.listen = start(run_argv(*args), self.socket, ready)

    def client(self) -> Client:
        return Client(self.socket, timeout=60)

    def stop(self) -> None:
        stop(self.proc)


def ctl(node: Node, *args: str) -> tuple[float, float]:
    """Run ``latticectl ARGS`` on ``node``: (seconds, its peak RSS in MB)."""
    started = time.perf_counter()
    proc = subprocess.Popen([str(BIN / "latticectl"), "--socket", str(node.socket), *args])
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"latticectl {' '.join(args)} failed with exit {proc.returncode}")
    return time.perf_counter() - started, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    count, value = args.records, b"x" * 100
    with scratch("ld-bench-bundle-", remove=True) as (root, nodes):
        a = Node(root, "A", listen=True)
        nodes.append(a)
        with a.client() as c:
            queue = c.queue_create("backlog")
            for first in range(0, count, 1000):
                c.offer_batch("backlog", [(value, None, ())] * min(1000, count - first))
        a_base = peak_mb(a.proc.pid)

        started = time.perf_counter()
        b = Node(root, "B", listen=True, peers=(a.listen,))
        nodes.append(b)
        network_s = wait_end(b, queue, count) - started
        b.stop()
        nodes.remove(b)

        c_node = Node(root, "C", listen=False)
        nodes.append(c_node)
        c_base = peak_mb(c_node.proc.pid)
        path = root / "backlog.lat"
        a_cpu = cpu_s(a.proc.pid)
        export_s, export_rss = ctl(a, "bundle", "export", str(path), "backlog")
        a_cpu = cpu_s(a.proc.pid) - a_cpu
        c_cpu = cpu_s(c_node.proc.pid)
        import_s, import_rss = ctl(c_node, "bundle", "import", str(path))
        c_cpu = cpu_s(c_node.proc.pid) - c_cpu
        with c_node.client() as c:
            assert c.queue_info(queue)["end_offset"] == count
        size_mb = path.stat().st_size / 1e6
        bundle_s = export_s + import_s
        print(f"{count:,} x 100 B records; bundle file {size_mb:,.1f} MB")
        print(
            f"network catch-up to a fresh daemon:  {count / network_s:>10,.0f} records/s ({network_s:.1f} s)"
        )
        print(
            f"bundle export + import:               {count / bundle_s:>10,.0f} records/s ({bundle_s:.1f} s: "
            f"export {export_s:.1f} s, import {import_s:.1f} s) = {network_s / bundle_s:.2f}x the network"
        )
        print(f"CPU/record: exporter {a_cpu / count * 1e6:.2f} us, importer {c_cpu / count * 1e6:.2f} us")
        print(
            f"peak RSS: exporting daemon {a_base:.0f} -> {peak_mb(a.proc.pid):.0f} MB, importing daemon "
            f"{c_base:.0f} -> {peak_mb(c_node.proc.pid):.0f} MB; latticectl export {export_rss:.0f} MB, "
            f"import {import_rss:.0f} MB"
        )


if __name__ == "__main__":
    main()
