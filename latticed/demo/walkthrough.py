"""The main job, ``make demo``: a real run of daemons, replication and the Spark tail on the defaults.

1. The lattice core in one process: a forgery and an equivocation caught.
2. Three ``latticed`` daemons on loopback in a scratch directory: A and B replicate; C is a laptop that
   was offline and joins late. Everything is driven through ``latticectl``, as a user would.
3. The Spark tail (when pyspark is installed) reads the demo's queues through the local daemon into
   Parquet and prints what landed.
4. Every daemon is stopped with SIGTERM and must exit 0.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from latticed import Identity, IntegrityError, LatticeQueue, Record

BIN = Path(sys.executable).parent


def banner(text: str) -> None:
    print(f"\n== {text}", flush=True)


def say(text: str) -> None:
    print(f"   {text}", flush=True)


def lattice_demo() -> None:
    banner("the lattice core: signed, verified, fork-evident")
    alice = Identity.generate()
    events = LatticeQueue.create(alice, "events")
    for i in range(3):
        events.offer(f"event {i}".encode())
    replica = LatticeQueue.empty_replica(alice.public_key, "events")
    delta = events.delta(replica.summary())
    forged = dataclasses.replace(delta, records=(Record(value=b"forged"), *delta.records[1:]))
    try:
        replica.merge(forged)
    except IntegrityError as exc:
        say(f"forged delta refused: {exc}")
    replica.merge(delta)
    say(f"genuine delta merged: {replica.range(0, 10)}")
    twin = LatticeQueue.create(alice, "events")  # the same key signing a second history
    twin.offer(b"another history")
    replica.merge(twin.state)
    proof = replica.equivocation
    assert proof is not None
    proof.verify()
    say(f"owner signed two histories: forked={replica.forked}, proof verifies with the public key alone")


class Daemon:
    """A ``latticed run`` process in the scratch directory."""

    def __init__(self, root: Path, name: str, args: list[str]) -> None:
        self.name = name
        self.socket = root / f"{name}.sock"
        self.data_dir = root / name
        self.log = root / f"{name}.log"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        argv = [str(BIN / "latticed"), "run", "--data-dir", str(self.data_dir), "--socket", str(self.socket)]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([*argv, *self.args], stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.ctl_quiet("id") is not None, f"daemon {self.name} to start", self)
        return self

    def ctl_quiet(self, *args: str) -> str | None:
        result = subprocess.run(
            [str(BIN / "latticectl"), "--socket", str(self.socket), *args],
            capture_output=True,
            text=True,
            check=False,
        )
        return result.stdout if result.returncode == 0 else None

    def ctl(self, *args: str, show: bool = True, expect_ok: bool = True) -> str:
        """Run latticectl against this daemon, printing the command and what it printed."""
        result = subprocess.run(
            [str(BIN / "latticectl"), "--socket", str(self.socket), *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if show:
            print(f"   [{self.name}] $ latticectl {' '.join(args)}", flush=True)
            for line in (result.stdout + result.stderr).rstrip().splitlines():
                print(f"       {line}", flush=True)
        if expect_ok and result.returncode != 0:
            raise SystemExit(f"demo: latticectl {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def listen(self) -> str:
        return str(json.loads(self.ctl("status", "--json", show=False))["listen"])

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


def wait_for(check: Callable[[], bool], what: str, daemon: Daemon | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if daemon is not None and daemon.proc is not None and daemon.proc.poll() is not None:
            raise SystemExit(
                f"demo: {daemon.name} exited while waiting for {what}:\n{daemon.log.read_text()}"
            )
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.05)


def end_offset(daemon: Daemon, queue: str) -> int:
    out = daemon.ctl_quiet("queue", "info", queue, "--json")
    return -1 if out is None else int(json.loads(out)["end_offset"])


def daemons_demo(root: Path) -> tuple[Daemon, list[str]]:
    banner("three daemons on loopback (A and B online, C a laptop that joins late)")
    a = Daemon(root, "A", ["--listen", "127.0.0.1:0", "--no-mdns"]).start()
    b = Daemon(root, "B", ["--listen", "127.0.0.1:0", "--no-mdns", "--peer", a.listen()]).start()
    daemons = [a, b]
    try:
        a.ctl("id")
        orders = a.ctl("queue", "create", "orders", "--meta", "team=shop").strip()
        a.ctl("offer", "orders", '{"item": "tea", "qty": 2}', "--key", "cust-1", "--header", "source=web")
        lines = "\n".join(json.dumps({"item": f"item-{i}", "qty": i}) for i in range(20)) + "\n"
        batch = root / "orders.jsonl"
        batch.write_text(lines)
        a.ctl("offer", "orders", "--file", str(batch))
        a.ctl("peek", "orders", "0", "--entry")
        a.ctl("range", "orders", "1", "3")
        a.ctl("tail", "orders", "--from", "18")
        a.ctl("kv", "put", "greeting", "hello")
        a.ctl("kv", "incr", "visits", "--by", "3")
        a.ctl("kv", "list")

        wait_for(lambda: end_offset(b, orders) == 21, "B to replicate A's orders", b)
        say("B holds A's queue, verified against A's signatures:")
        b.ctl("queue", "info", orders)
        b.ctl("offer", orders, "I am not the owner", expect_ok=False)

        c = Daemon(root, "C", ["--no-mdns"]).start()  # offline: writes on its own
        daemons.append(c)
        trip = c.ctl("queue", "create", "trip-notes").strip()
        c.ctl("offer", "trip-notes", "written offline")
        a.ctl("offer", "orders", '{"item": "late", "qty": 1}')
        if c.stop() != 0:
            raise SystemExit("demo: C did not stop cleanly")
        say("C comes back online, dialling B; both sides catch up")
        c.args = ["--listen", "127.0.0.1:0", "--no-mdns", "--peer", b.listen()]
        c.start()
        wait_for(lambda: end_offset(c, orders) == 22, "C to catch up with A's orders (through B)", c)
        wait_for(lambda: end_offset(a, trip) == 1, "A to receive C's offline notes (through B)", a)
        c.ctl("last", orders)
        a.ctl("peek", trip, "0")
        b.ctl("peers")
        return a, [orders, trip]
    except BaseException:
        for daemon in daemons:
            if daemon.proc is not None and daemon.proc.poll() is None:
                daemon.proc.kill()
        raise
    finally:
        _DAEMONS.extend(daemons)


_DAEMONS: list[Daemon] = []


def spark_demo(daemon: Daemon, queues: list[str], root: Path) -> None:
    banner("the Spark tail: local[2] reading the demo's queues through the local daemon")
    try:  # pyspark is an optional extra: import the job only when it is there
        tail_job = importlib.import_module("latticed.spark.tail_job")
    except ImportError as exc:
        say(f"skipped: {exc}; install the extra with `pip install -e '.[spark]'`")
        return
    tail_job.run_demo_tail(str(daemon.socket), queues, str(root / "spark"))


def main() -> None:
    lattice_demo()
    root = Path(tempfile.mkdtemp(prefix="latticed-demo-"))
    os.environ.setdefault("LATTICED_SOCKET", str(root / "A.sock"))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # keep Spark's own traffic on loopback too
    try:
        a, queues = daemons_demo(root)
        spark_demo(a, queues, root)
    finally:
        banner("stopping every daemon with SIGTERM")
        codes = []
        for daemon in _DAEMONS:
            if daemon.proc is not None and daemon.proc.poll() is None:
                codes.append(daemon.stop())
            elif daemon.proc is not None:
                codes.append(daemon.proc.returncode)
        say(f"exit codes: {codes}")
        shutil.rmtree(root, ignore_errors=True)
    if any(code != 0 for code in codes):
        raise SystemExit("demo: a daemon did not stop cleanly")
    print("\ndemo finished: every step above ran for real.")


if __name__ == "__main__":
    main()
