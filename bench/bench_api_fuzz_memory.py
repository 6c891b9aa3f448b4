"""What a burst of fuzzed local-API frames leaves resident in a real daemon.

    .venv/bin/python bench/bench_api_fuzz_memory.py                       # 100k frames, 4 connections
    .venv/bin/python bench/bench_api_fuzz_memory.py --frames 20000 --idle 5

One ``latticed run`` (Unix socket only, no peers, mDNS off) with one queue of 100 records.
``--connections`` threads send ``--frames`` fuzzed frames in all, ``--batch`` per connection (which
sends its batch, shuts its write side and reads replies until the server closes it, as the fuzz test of
tests/test_api_server.py does): random bytes (framed or not), truncated msgpack, requests of wrong types
or versions, unknown ops, real ops with arguments of the wrong type or naming queues that do not exist,
1% of frames of up to ``--large-max`` bytes (random bytes, or msgpack of many tiny containers, whose
decoded form is many times its size), and now and then a batch that ends in unframed garbage, an
oversized length prefix or a frame cut short. No argument is a valid name where one would create
something; an offer to the bench's queue may append a record (a fuzzed value can be valid bytes).

Printed, never asserted: VmRSS idle before, the peak while fuzzing (sampled every 20 ms), right after the
daemon is idle again (it answers ``hello`` promptly, then a short settle), and after ``--idle`` seconds
more; with each, where the resident memory lies (/proc/PID/smaps): glibc's main heap (``[heap]``),
1 MiB anonymous mappings (pymalloc's arenas, mostly), other anonymous mappings (glibc's thread arenas,
thread stacks, large buffers), and the rest (code, files).
"""

from __future__ import annotations

import argparse
import random
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
from _daemons import rss_mb, scratch, start, stop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the fuzzers' shared names
from support.api_fuzz import FUZZ_ARG_NAMES

from latticed.api.client.blocking_client import Client
from latticed.api.server.op_table import build_op_table

QUEUE = "fuzz-target"
#: Ops that would reach beyond the daemon (other hosts, files) with arguments that happened to be valid,
#: or wait (streams): left out, so the bench measures the request path alone.
SKIPPED_OPS = frozenset(
    {"peers_add", "join", "invite", "bundle_want", "bundle_export", "bundle_import", "store_compact"}
)
#: A fuzzed ``follow`` would turn a tail into a wait, which this bench leaves out (as it does streams).
ARG_NAMES = tuple(name for name in FUZZ_ARG_NAMES if name != "follow")


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


class Fuzzer:
    """Seeded frame generator (no hypothesis: this is a load, not a search)."""

    def __init__(self, seed: int, large: float, large_max: int) -> None:
        self.rng = random.Random(seed)
        self.large = large
        self.large_max = large_max
        table = build_op_table()
        self.ops = sorted((set(table.handlers) | {"tail", "dequeue"}) - SKIPPED_OPS)

    def wrong(self, depth: int = 0) -> Any:
        """A value of a type no argument takes where it would create something (never a plain string)."""
        r = self.rng
        pick = r.randrange(9 if depth < 2 else 6)
        if pick == 0:
            return None
        if pick == 1:
            return r.random() < 0.5
        if pick == 2:
            return r.randint(-(2**63), 2**64 - 1)
        if pick == 3:
            return r.uniform(-1e9, 1e9)
        if pick == 4:
            return r.randbytes(r.randrange(24))
        if pick == 5:
            return r.randint(-5, 5)
        if pick == 6:
            return [self.wrong(depth + 1) for _ in range(r.randrange(4))]
        if pick == 7:
            return {r.randbytes(3).hex(): self.wrong(depth + 1) for _ in range(r.randrange(3))}
        return [[self.wrong(depth + 2)] for _ in range(r.randrange(3))]

    def request(self) -> dict[str, Any]:
        r = self.rng
        kind = r.randrange(10)
        op: Any = r.choice(self.ops)
        if kind == 0:
            op = r.randbytes(r.randrange(1, 12)).hex()  # unknown op
        elif kind == 1:
            op = self.wrong()  # op of the wrong type
        version: Any = 1 if r.random() < 0.85 else r.choice([None, 0, 2, "1", [1]])
        req: dict[str, Any] = {"v": version, "id": r.choice([r.randint(-5, 10**6), None, "x", [1]]), "op": op}
        for name in r.sample(ARG_NAMES, r.randrange(5)):
            req[name] = self.wrong()
        if kind >= 7:
            # An existing or missing queue with wrong-typed rest: errors deeper in the handlers.
            req["queue"] = r.choice([QUEUE, f"missing-{r.randrange(1000)}"])
            req.pop("name", None)
        return req

    def frame(self) -> bytes:
        """One frame that keeps the connection open."""
        r = self.rng
        kind = r.randrange(8)
        if r.random() < self.large:
            return self.large_frame()
        if kind == 0:
            return frame(r.randbytes(r.randrange(64)))  # not msgpack
        if kind == 1:
            body = msgpack.packb(self.request(), use_bin_type=True)
            return frame(body[: r.randrange(1, len(body))])  # truncated msgpack
        if kind == 2:
            return frame(msgpack.packb(self.wrong(), use_bin_type=True))  # not a map
        return frame(msgpack.packb(self.request(), use_bin_type=True))

    def large_frame(self) -> bytes:
        """A frame of up to ``large_max`` bytes: random bytes, or a request whose argument is a long list
        of tiny containers (its decoded form is many times its size), or a value that is not a map."""
        r = self.rng
        size = r.randrange(self.large_max // 16, self.large_max)
        kind = r.randrange(3)
        if kind == 0:
            return frame(r.randbytes(size))
        tiny: Any = [[i & 127] for i in range(size // 3)] if r.random() < 0.5 else [{}] * (size - 8)
        if kind == 1:
            req = {"v": 1, "id": 1, "op": r.choice(self.ops), r.choice(ARG_NAMES): tiny}
            return frame(msgpack.packb(req, use_bin_type=True))
        return frame(msgpack.packb(tiny, use_bin_type=True))

    def ending(self) -> bytes:
        """What a batch ends with: usually nothing; else unframed garbage, an oversized prefix or a frame
        cut short (each ends the connection)."""
        r = self.rng
        pick = r.random()
        if pick < 0.05:
            return r.randbytes(r.randrange(1, 64))  # the framing goes astray
        if pick < 0.10:
            return struct.pack(">I", r.randrange(1 << 25, 1 << 32)) + r.randbytes(8)  # over the limit
        if pick < 0.15:
            return struct.pack(">I", r.randrange(100, 1 << 20)) + r.randbytes(r.randrange(64))  # cut short
        return b""


def fuzz_connection(path: Path, data: bytes) -> int:
    """Send one batch and shut the write side, reading replies meanwhile until the server closes; how many
    replies came."""
    replies = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(path))

        def send() -> None:  # beside the reads: a server that answers as it reads must not stall us
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server hung up on a frame it refused

        sender = threading.Thread(target=send)
        sender.start()
        buf = b""
        while True:
            try:
                chunk = s.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + (n := struct.unpack(">I", buf[:4])[0]):
                buf = buf[4 + n :]
                replies += 1
        sender.join()
    return replies


def fuzz(
    sock: Path, frames: int, connections: int, batch: int, seed: int, large: float, large_max: int
) -> tuple[int, int]:
    """Send ``frames`` fuzzed frames from ``connections`` threads, ``batch`` per connection; (frames sent,
    replies read)."""
    per = frames // connections
    replies = [0] * connections
    failures: list[BaseException] = []

    def worker(i: int) -> None:
        fuzzer = Fuzzer(seed * 1000 + i, large, large_max)
        try:
            sent = 0
            while sent < per:
                n = min(batch, per - sent)
                data = b"".join(fuzzer.frame() for _ in range(n)) + fuzzer.ending()
                replies[i] += fuzz_connection(sock, data)
                sent += n
        except BaseException as exc:
            failures.append(exc)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(connections)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if failures:
        raise failures[0]
    return per * connections, sum(replies)


def smaps(pid: int) -> dict[str, float]:
    """Resident MiB by kind of mapping (see the module docstring)."""
    out = {"heap": 0.0, "anon_1mib": 0.0, "anon_other": 0.0, "rest": 0.0}
    name = "rest"
    size_kb = 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            size_kb = (end - start) >> 10
            path = fields[5] if len(fields) > 5 else ""
            if path == "[heap]":
                name = "heap"
            elif path == "":
                name = "anon_1mib" if size_kb == 1024 else "anon_other"
            else:
                name = "rest"
        elif fields and fields[0] == "Rss:":
            out[name] += int(fields[1]) / 1024
    return out


def show(label: str, pid: int) -> None:
    parts = smaps(pid)
    print(
        f"  {label:<28} RSS {rss_mb(pid):7.1f} MiB   [heap] {parts['heap']:6.1f}  1 MiB anon "
        f"{parts['anon_1mib']:6.1f}  other anon {parts['anon_other']:6.1f}  files/code {parts['rest']:6.1f}"
    )


def wait_idle(path: Path, prompt_s: float = 0.005, times: int = 3, timeout: float = 120) -> float:
    """Poll with ``hello`` until it is answered within ``prompt_s`` ``times`` in a row; seconds taken."""
    t0 = time.monotonic()
    with Client(path) as c:
        streak = 0
        while streak < times:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError("the daemon never went idle")
            t = time.perf_counter()
            c.call("hello")
            streak = streak + 1 if time.perf_counter() - t < prompt_s else 0
            time.sleep(0.02)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--connections", type=int, default=4, help="concurrent connections")
    ap.add_argument("--batch", type=int, default=500, help="frames per connection before it hangs up")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds idle before the last reading")
    ap.add_argument("--large", type=float, default=0.01, help="share of frames of up to --large-max bytes")
    ap.add_argument("--large-max", type=int, default=1 << 20, help="(default: the server's 1 MiB threshold)")
    ap.add_argument("--seed", type=int, default=25)
    args = ap.parse_args()

    with scratch("latticed-fuzzmem-", remove=True) as (root, _nodes):
        sock = root / "api.sock"
        argv = [
            sys.executable,
            "-m",
            "latticed",
            "run",
            "--data-dir",
            str(root / "data"),
            "--socket",
            str(sock),
        ]
        argv += ["--listen", "127.0.0.1:0", "--no-mdns", "--log-level", "ERROR"]
        proc, _ = start(argv, sock, Client.identity)
        try:
            pid = proc.pid
            with Client(sock) as c:
                c.queue_create(QUEUE)
                c.offer_batch(QUEUE, [(b"v" * 100, None, ())] * 100)
            wait_idle(sock)
            print(
                f"daemon pid {pid}; {args.frames:,} fuzzed frames, {args.connections} connections at a time"
            )
            show("idle before", pid)

            peak = [rss_mb(pid)]
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.02):
                    peak[0] = max(peak[0], rss_mb(pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            t0 = time.perf_counter()
            sent, replies = fuzz(
                sock, args.frames, args.connections, args.batch, args.seed, args.large, args.large_max
            )
            elapsed = time.perf_counter() - t0
            idle_s = wait_idle(sock)
            done.set()
            sampler.join()
            print(
                f"  sent {sent:,} frames in {elapsed:.1f} s, {replies:,} replies; "
                f"idle again {idle_s:.2f} s later"
            )
            print(f"  {'peak while fuzzing':<28} RSS {peak[0]:7.1f} MiB")
            time.sleep(0.5)  # settle: the connections' tasks end
            show("after, once idle", pid)
            time.sleep(args.idle)
            show(f"after {args.idle:g} s more idle", pid)
            with Client(sock) as c:
                status, end = c.status(), c.queue_info(QUEUE)["end_offset"]
                print(
                    f"  queues {status['queues']} (the bench's own), its records {end} (100 before the fuzz)"
                )
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
