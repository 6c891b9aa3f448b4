"""``latticectl``'s start-up cost and the speed of ``offer --file``, against a real daemon process.

    .venv/bin/python bench/bench_cli.py                                  # 20 runs of each command
    .venv/bin/python bench/bench_cli.py --runs 20 --lines 100000 --baseline /work/wt-cli17-base

Part 1: wall time (median, p90) and CPU (user + system, median) of ``latticectl id``, ``latticectl status``
and ``latticectl --help``, each started as the installed script is (``.venv/bin/latticectl``), beside a
bare ``python -c pass`` in the same run, interleaved round by round so the box's noise hits every row
alike; the ratio is each row's median wall over the bare interpreter's. One unmeasured run of each
first, so the page cache is warm. ``--baseline DIR`` adds the same commands run from another checkout
(``PYTHONPATH=DIR``: the venv's scripts honour it), e.g. a worktree of the unchanged main.

Part 2: ``latticectl offer QUEUE --file F`` (the whole process, start included) against a ``Producer`` in
this process offering the same lines one ``offer`` call each (the ``with`` block waits for every ack), into
fresh queues, alternating, ``--offer-runs`` times: records/s and the ratio CLI / Producer. One more CLI
row runs with stderr on a pseudo-terminal, so the progress bar is drawn.

Bytecode: every process here runs with a bytecode cache in a temporary ``PYTHONPYCACHEPREFIX`` (the warm-up
runs fill it), as an installed latticed has its ``.pyc`` files; ``--no-bytecode-cache`` runs them with
``PYTHONDONTWRITEBYTECODE=1`` and no prefix instead, so a checkout's own modules compile at every start.

Figures are printed, never asserted; the command lines are printed with them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pty
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from _daemons import BIN, run_argv, start, stop  # bench/ is on sys.path when this runs as a script
from bench_daemon import pct

from latticed.api.client.blocking_client import Client
from latticed.api.client.producer import Producer

VALUE_BYTES = 100


@contextlib.contextmanager
def daemon(root: Path, env: Mapping[str, str]) -> Iterator[Path]:
    """A ``latticed run`` on its own data directory and socket, without mDNS; yields the socket."""
    sock = root / "latticed.sock"
    config = root / "latticed.toml"
    config.write_text('log_level = "WARNING"\n')
    argv = run_argv(
        "--data-dir", str(root / "data"), "--socket", str(sock), "--no-mdns", "--config", str(config)
    )
    proc, _ = start(argv, sock, Client.identity, env=env)
    try:
        yield sock
    finally:
        stop(proc)


def timed(
    argv: list[str], env: Mapping[str, str], stderr: int | None = subprocess.DEVNULL
) -> tuple[float, float]:
    """(wall s, user + system CPU s) of one run of ``argv``, which must exit 0."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=dict(env), stdout=subprocess.DEVNULL, stderr=stderr)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def part_start(sock: Path, base_env: Mapping[str, str], runs: int, baseline: str | None) -> None:
    env = {**base_env, "LATTICED_SOCKET": str(sock)}
    ctl = str(BIN / "latticectl")
    rows: list[tuple[str, list[str], dict[str, str]]] = [
        ("python -c pass", [sys.executable, "-c", "pass"], env),
        ("latticectl id", [ctl, "id"], env),
        ("latticectl status", [ctl, "status"], env),
        ("latticectl --help", [ctl, "--help"], env),
    ]
    if baseline is not None:
        old = {**env, "PYTHONPATH": baseline}
        rows += [(f"{label} [baseline]", argv, old) for label, argv, _ in rows[1:]]
    walls: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    cpus: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    for _label, argv, row_env in rows:  # warm the page cache and the bytecode caches
        timed(argv, row_env)
    for _ in range(runs):
        for label, argv, row_env in rows:
            wall, cpu = timed(argv, row_env)
            walls[label].append(wall)
            cpus[label].append(cpu)
    bare = statistics.median(walls["python -c pass"])
    print(f"\n== start-up: {runs} runs each, interleaved; PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    if baseline is not None:
        print(f"   [baseline]: PYTHONPATH={baseline}")
    print(f"{'command':34s} {'wall p50':>9s} {'wall p90':>9s} {'cpu p50':>9s} {'x bare':>7s}")
    for label, _, _ in rows:
        p50 = statistics.median(walls[label])
        print(
            f"{label:34s} {p50 * 1000:7.1f}ms {pct(walls[label], 0.9) * 1000:7.1f}ms "
            f"{statistics.median(cpus[label]) * 1000:7.1f}ms {p50 / bare:6.2f}x"
        )


def _drain(fd: int) -> None:
    """Read a pseudo-terminal's output until it closes, so the writer never blocks."""
    with contextlib.suppress(OSError):
        while os.read(fd, 65536):
            pass


def cli_offer(sock: Path, queue: str, path: Path, env: Mapping[str, str], *, tty: bool) -> float:
    """Wall seconds of ``latticectl offer QUEUE --file PATH``, with stderr on a pseudo-terminal if ``tty``."""
    argv = [str(BIN / "latticectl"), "offer", queue, "--file", str(path), "--socket", str(sock)]
    if not tty:
        return timed(argv, env)[0]
    leader, follower = pty.openpty()
    reader = threading.Thread(target=_drain, args=(leader,))
    reader.start()
    try:
        return timed(argv, env, stderr=follower)[0]
    finally:
        os.close(follower)
        reader.join()
        os.close(leader)


def producer_offer(sock: Path, queue: str, path: Path) -> float:
    """Wall seconds for a Producer to offer every line of ``path``, one ``offer`` call each, until acked."""
    t0 = time.perf_counter()
    with path.open("rb") as lines, Client(sock, timeout=120) as c, Producer(c, queue) as producer:
        for line in lines:
            producer.offer(line.removesuffix(b"\n"))
    return time.perf_counter() - t0


def part_offer_file(
    sock: Path, root: Path, base_env: Mapping[str, str], lines: int, runs: int, baseline: str | None
) -> None:
    path = root / "lines.txt"
    with path.open("wb") as f:
        for i in range(lines):
            f.write(f"{i:08d}".encode().ljust(VALUE_BYTES, b"x") + b"\n")
    env = dict(base_env)
    kinds: list[tuple[str, Mapping[str, str] | None, bool]] = [
        ("Producer.offer per line", None, False),
        ("latticectl offer --file", env, False),
        ("latticectl offer --file, bar on a pty", env, True),
    ]
    if baseline is not None:
        kinds.append(("latticectl offer --file [baseline]", {**env, "PYTHONPATH": baseline}, False))
    rates: dict[str, list[float]] = {label: [] for label, _, _ in kinds}
    with Client(sock) as c:
        for run in range(runs):
            for n, (label, kind_env, tty) in enumerate(kinds):
                queue = f"offer-{run}-{n}"
                c.queue_create(queue)
                if kind_env is None:
                    elapsed = producer_offer(sock, queue, path)
                else:
                    elapsed = cli_offer(sock, queue, path, kind_env, tty=tty)
                assert c.queue_info(queue)["end_offset"] == lines, label
                rates[label].append(lines / elapsed)
    base = statistics.median(rates["Producer.offer per line"])
    print(f"\n== offer --file: {lines} lines of {VALUE_BYTES} bytes, {runs} runs each, alternating")
    for label, _, _ in kinds:
        rate = statistics.median(rates[label])
        each = " / ".join(f"{r:,.0f}" for r in rates[label])
        print(f"{label:38s} {rate:10,.0f} records/s  {rate / base:5.2f}x Producer   ({each})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--offer-runs", type=int, default=3)
    parser.add_argument("--parts", default="1,2")
    parser.add_argument("--baseline", metavar="DIR", help="also run the CLI from this checkout")
    parser.add_argument("--no-bytecode-cache", action="store_true", help="PYTHONDONTWRITEBYTECODE=1")
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp, daemon(Path(tmp), os.environ) as sock:
        env = {
            k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
        }
        if args.no_bytecode_cache:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        print(f"bytecode cache: {env.get('PYTHONPYCACHEPREFIX', 'none (PYTHONDONTWRITEBYTECODE=1)')}")
        if 1 in parts:
            part_start(sock, env, args.runs, args.baseline)
        if 2 in parts:
            part_offer_file(sock, Path(tmp), env, args.lines, args.offer_runs, args.baseline)
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
