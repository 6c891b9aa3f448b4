"""The PYSPARK_PYTHON wrapper: drops only the bundled pyspark zips from PYTHONPATH and runs this Python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from latticed.spark import python_workers as wp

SHOW_PATH = "import os, sys; print(os.environ.get('PYTHONPATH', '<unset>')); print(sys.argv[1:])"


def run_wrapper(tmp_path: Path, lib: Path, pythonpath: str | None) -> list[str]:
    script = tmp_path / "python"
    script.write_text(wp.wrapper_text(sys.executable, lib))
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [str(script), "-c", SHOW_PATH, "a b", "*"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.splitlines()


def test_drops_the_bundled_zips_and_keeps_everything_else(tmp_path: Path) -> None:
    lib = tmp_path / "site packages" / "pyspark" / "python" / "lib"
    other = tmp_path / "cluster-spark" / "python" / "lib" / "pyspark.zip"
    path = f"{lib}/py4j-0.10.9.9-src.zip:/x/y:{lib}/pyspark.zip:{other}:/z"
    pythonpath, argv = run_wrapper(tmp_path, lib, path)
    assert pythonpath == f"/x/y:{other}:/z"
    assert argv == "['a b', '*']"  # arguments pass through unchanged, unglobbed


def test_nothing_left_unsets_pythonpath(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    assert run_wrapper(tmp_path, lib, f"{lib}/pyspark.zip")[0] == "<unset>"
    assert run_wrapper(tmp_path, lib, None)[0] == "<unset>"


def test_a_lib_dir_that_is_only_a_prefix_is_not_matched(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    sibling = f"{tmp_path}/lib2/pyspark.zip"
    assert run_wrapper(tmp_path, lib, sibling)[0] == sibling


def test_worker_python_writes_the_wrapper_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "lib"
    monkeypatch.setattr(wp, "bundled_zip_dir", lambda: lib)
    first = wp.worker_python(tmp_path / "cache")
    assert Path(first).read_text() == wp.wrapper_text(sys.executable, lib)
    assert os.access(first, os.X_OK)
    mtime = Path(first).stat().st_mtime_ns
    assert wp.worker_python(tmp_path / "cache") == first
    assert Path(first).stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [Path(first).name]  # no scratch left


def test_falls_back_to_this_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setattr(wp, "bundled_zip_dir", lambda: tmp_path / "lib")
    assert wp.worker_python(blocker / "cache") == sys.executable  # cannot be written
    monkeypatch.setattr(wp, "bundled_zip_dir", lambda: None)
    assert wp.worker_python(tmp_path) == sys.executable  # no pip-installed pyspark


def test_use_worker_python_respects_a_configured_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python")
    assert wp.use_worker_python() == "/opt/python"
    monkeypatch.delenv("PYSPARK_PYTHON")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(wp, "bundled_zip_dir", lambda: tmp_path / "lib")
    chosen = wp.use_worker_python()
    assert os.environ["PYSPARK_PYTHON"] == chosen
    assert Path(chosen).parent == tmp_path / "latticed"
