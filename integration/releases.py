"""Earlier releases of latticed, built from git for the mixed-version tests.

``releases.toml`` names each release's commit, so this works in a clone without tags. A release's source
is ``git archive``d once into ``.cache/releases/VERSION`` (ignored by git) and its daemon runs with this
venv's interpreter and ``PYTHONPATH`` set to that tree (same dependencies; an earlier release without
its compiled sealer uses the pure-Python one). No git, or a clone that lacks the commit, fails the test:
a mixed-version test that does not run proves nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "releases"


def release(version: str) -> dict[str, Any]:
    """The entry of ``releases.toml`` for ``version``."""
    for entry in tomllib.loads((ROOT / "releases.toml").read_text())["release"]:
        if entry["version"] == version:
            return dict(entry)
    raise KeyError(f"releases.toml names no release {version}")


def previous_release() -> str:
    """The newest release before this build (the one every rolling upgrade starts from)."""
    return str(tomllib.loads((ROOT / "releases.toml").read_text())["release"][-1]["version"])


def release_source(version: str) -> Path:
    """The source tree of ``version``, materialised from git on first use."""
    target = CACHE / version
    if (target / ".complete").exists():
        return target
    commit = release(version)["commit"]
    git = shutil.which("git")
    if git is None:
        pytest.fail(
            f"git is needed to build latticed {version} (commit {commit}) for the mixed-version tests"
        )
    partial = CACHE / f".{version}.{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    archive = subprocess.run(
        [git, "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True, check=False
    )
    if archive.returncode != 0:
        pytest.fail(
            f"git cannot archive latticed {version} (commit {commit}): "
            f"{archive.stderr.decode(errors='replace').strip()} (a shallow clone? fetch that commit)"
        )
    subprocess.run(["tar", "-x", "-C", str(partial)], input=archive.stdout, check=True)
    (partial / ".complete").write_text(commit + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def run_as(daemon: Any, version: str | None) -> Any:
    """Make ``daemon`` (a conftest LatticedProcess, not running) start as ``version`` (None: this build)
    from its next start on; its data directory, socket and arguments stay."""
    if version is None:
        daemon.env.pop("PYTHONPATH", None)
        daemon.env.update({"PYTHONPATH": str(ROOT)})
        daemon.cwd = ROOT
    else:
        source = release_source(version)
        daemon.env["PYTHONPATH"] = str(source)
        daemon.cwd = source
    return daemon
