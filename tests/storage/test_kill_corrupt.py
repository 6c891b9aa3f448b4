"""review23: a daemon's process killed (SIGKILL) in the middle of core-2 commits that change what the
start head signs (metadata, truncations) leaves no queue that fix23's load check finds corrupt, and
every acknowledged commit is there (the real store on disk, a real child process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from latticed.crdt.signing import Identity
from latticed.storage.engine import Engine

SEED = b"k" * 32
CHILD = """
import sys, trio
from pathlib import Path
from latticed.crdt.records import make_record
from latticed.crdt.signing import Identity
from latticed.storage.engine import Engine

async def main(path):
    async with Engine.open(path, Identity.from_seed(b"k" * 32)) as e:
        q = e.core2.lookup(e.public_key, "x")
        if q is None:
            q = await e.create_queue("x", {"n": "0"}, core=2)
        i = 0
        while True:
            i += 1
            first = await e.core2.commit(q, [make_record(b"r%d" % i, timestamp=i)], {"n": str(i)})
            if i % 7 == 0:
                await e.core2.truncate(q, first)
            print(first + 1, i, flush=True)  # acked: held up to first + 1, metadata n = i

trio.run(main, Path(sys.argv[1]))
"""


def _run_and_kill(path: Path, lines: int) -> tuple[int, int]:
    """Start the child, let it ack ``lines`` commits, SIGKILL it mid-stream; the last ack it printed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, env=env, text=True
    )
    assert child.stdout is not None
    last = (0, 0)
    for _ in range(lines):
        line = child.stdout.readline()
        assert line, "the child ended early"
        end, i = map(int, line.split())
        last = (end, i)
    child.send_signal(signal.SIGKILL)
    child.wait()
    return last


def test_kill_9_during_commits_leaves_no_false_corrupt_queue(tmp_path: Path) -> None:
    for round_ in range(4):
        end, i = _run_and_kill(tmp_path, 15 + 9 * round_)

        async def check() -> None:
            async with Engine.open(tmp_path, Identity.from_seed(SEED)) as e:
                await e.core2.load_all()
                assert e.core2.corrupt_entries() == []
                q = e.core2.lookup(e.public_key, "x")
                assert q is not None
                value = await e.core2.value(q)
                assert value.held[1] >= end  # every acked commit survived
                assert int(dict(value.meta)["n"]) >= i

        trio.run(check)
