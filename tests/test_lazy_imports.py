"""Processes that only talk to the daemon stay light: Spark starts a fresh Python process per streaming
query for the source's planner, and its imports are part of every query's start."""

from __future__ import annotations

import subprocess
import sys

import pytest

import latticed


def test_the_package_re_exports_load_on_first_use() -> None:
    assert latticed.Record.__module__ == "latticed.crdt.records"
    assert latticed.LatticeQueue.__module__ == "latticed.queue"
    assert set(latticed.__all__) <= set(dir(latticed))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = latticed.nope  # type: ignore[attr-defined]


def test_the_spark_planner_process_loads_neither_the_core_nor_compute() -> None:
    pytest.importorskip("pyspark")
    script = (
        "import sys\n"
        "import latticed.spark.source\n"
        "heavy = ['latticed.crdt.queue', 'latticed.crdt.forks', 'nacl', 'pyarrow.compute', 'trio']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    argv = [sys.executable, "-c", script]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
