"""``make demo`` and ``make test`` install the package only when what the install reads changed: a stamp
file, not a phony target, so a second run starts at once (a real install takes about a minute)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.paths import ROOT

INPUTS = [
    "pyproject.toml",
    "setup.py",
    "latticed/privacy/_seal_build.py",
    "latticed/crdt/_chain_build.py",
    "latticed/crdt/_columns_build.py",
    "latticed/crdt/_columns.c",
]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The Makefile and the files it depends on, with a venv whose pip only logs what it is asked."""
    if shutil.which("make") is None:
        pytest.fail("make is not installed (the README's `make demo` needs it)")
    for name in ["Makefile", *INPUTS]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text('#!/bin/sh\necho "python $*" >> "$(dirname "$0")/log"\n')
    (bin_dir / "pip").write_text('#!/bin/sh\necho "pip $*" >> "$(dirname "$0")/log"\n')
    for tool in ("python", "pip"):
        (bin_dir / tool).chmod(0o755)
    old = os.stat(tmp_path / "Makefile").st_mtime - 100
    for name in INPUTS:  # older than the venv, as in a clone made before `make demo`
        os.utime(tmp_path / name, (old, old))
    return tmp_path


def _installs(checkout: Path) -> int:
    subprocess.run(["make", "-s", "demo"], cwd=checkout, check=True, capture_output=True, timeout=60)
    log = (checkout / ".venv" / "bin" / "log").read_text().splitlines()
    return sum(1 for line in log if line.startswith("pip install") and "-e" in line.split())


@pytest.mark.parametrize("changed", INPUTS)
def test_demo_installs_once_then_again_only_after_a_change(checkout: Path, changed: str) -> None:
    assert _installs(checkout) == 1
    assert _installs(checkout) == 1  # the second run does not reinstall
    stamp = checkout / ".venv" / ".installed"
    earlier = stamp.stat().st_mtime - 50
    os.utime(stamp, (earlier, earlier))
    os.utime(checkout / changed, (earlier + 10, earlier + 10))  # edited after the install
    assert _installs(checkout) == 2
    assert _installs(checkout) == 2
