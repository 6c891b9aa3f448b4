"""bench_mesh --metrics splits each daemon's run-queue wait by thread role from /proc's schedstat
(bench/_daemons.py): parsed and aggregated here on fixed text in a fake /proc, no daemons."""

from __future__ import annotations

import sys
from pathlib import Path

from support.paths import ROOT

sys.path.append(str(ROOT / "bench"))  # bench/ is no package (its benches are scripts); last: shadows nothing
import _daemons


def fake_proc(root: Path, pid: int, threads: dict[int, tuple[str, str]]) -> Path:
    """A /proc holding ``pid``'s threads: tid -> (comm, schedstat text)."""
    for tid, (comm, stat) in threads.items():
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True, exist_ok=True)
        (task / "comm").write_text(comm + "\n")
        (task / "schedstat").write_text(stat + "\n")
    return root


def test_schedstat_text_is_cpu_wait_and_times_run() -> None:
    assert _daemons.parse_schedstat("22697615 5048112 58\n") == (22697615, 5048112, 58)


def test_waits_are_split_by_role_over_the_part(tmp_path: Path) -> None:
    before_threads = {
        100: ("latticed", "1000000000 200000000 100"),
        101: ("ld-storage", "500000000 100000000 50"),
        102: ("Trio thread 0", "10000000 1000000 5"),
        103: ("checkpointer", "0 0 1"),
    }
    before = _daemons.thread_schedstat(100, fake_proc(tmp_path / "a", 100, before_threads))
    after_threads = {
        100: ("latticed", "1300000000 800000000 400"),  # +0.3 s CPU, +0.6 s waiting, +300 runs
        101: ("ld-storage", "620000000 600000000 300"),  # +0.12, +0.5, +250
        # 102 gone; 104 new: counted from zero
        104: ("Trio thread 1", "4000000 2000000 2"),
        103: ("checkpointer", "0 0 1"),
    }
    after = _daemons.thread_schedstat(100, fake_proc(tmp_path / "b", 100, after_threads))
    assert before is not None and after is not None
    assert after[101] == ("ld-storage", 620000000, 600000000, 300)
    roles = _daemons.sched_by_role(100, before, after)
    assert roles["loop"] == (0.3, 0.6, 300)
    assert roles["storage"][2] == 250 and abs(roles["storage"][1] - 0.5) < 1e-12
    assert roles["readers"] == (0.004, 0.002, 2)
    assert roles["other"] == (0.0, 0.0, 0)
    line = _daemons.sched_report("n1", roles, 1000)
    assert line.startswith("n1: loop 300/600 ms in 300 (2.00 ms a run; 300.00/600.00 us a record)")
    assert "storage 120/500 ms in 250" in line and "other" not in line  # a role that never ran is left out


def test_no_schedstat_is_none_so_the_bench_says_so(tmp_path: Path) -> None:
    assert _daemons.thread_schedstat(7, tmp_path) is None  # no such process / file
    zeros = fake_proc(tmp_path / "z", 7, {7: ("latticed", "0 0 0")})  # CONFIG_SCHED_INFO off: all zeros
    assert _daemons.thread_schedstat(7, zeros) is None
