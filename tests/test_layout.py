"""The layout a newcomer reads: the top of ``latticed/`` holds the public surface and the composition root,
every other module sits in a package named for its job, one name means one module, every package says (in
its ``__init__`` docstring) and an import-linter contract checks what it may import, and no wiring happens
by import side effect."""

from __future__ import annotations

import ast
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

from support.paths import ROOT

TOP_LEVEL = {"__init__.py", "__main__.py", "errors.py", "version.py", "daemon.py"}


def modules(*packages: str) -> list[Path]:
    return [path for package in packages for path in sorted((ROOT / package).rglob("*.py"))]


def test_the_top_level_holds_the_public_surface_and_the_root() -> None:
    assert {path.name for path in (ROOT / "latticed").glob("*.py")} == TOP_LEVEL


def test_no_basename_is_shared_by_two_modules() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in modules("latticed", "cli"):
        if path.name != "__init__.py":
            by_name[path.name].append(path.relative_to(ROOT).as_posix())
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {}, "one name per concept; rename to say the job"


def test_no_test_module_name_is_used_twice() -> None:
    """pytest imports test files by basename (no packages): two files of one name cannot both run."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for folder in ("tests", "integration"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "__init__.py" and path.name != "conftest.py":
                by_name[path.name].append(path.relative_to(ROOT).as_posix())
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def test_no_test_folder_hides_a_package() -> None:
    """tests/ is on sys.path (pytest's pythonpath), so a folder tests/cli/ would be found as the namespace
    package ``cli`` before the installed one and break every ``import cli...``: the CLI's tests are in
    tests/command_line/."""
    ours = {path.name for path in ROOT.iterdir() if (path / "__init__.py").exists()}
    folders = {path.name for path in (ROOT / "tests").iterdir() if path.is_dir()}
    assert folders & (ours | set(sys.stdlib_module_names)) == set()


def test_every_package_says_its_job_and_has_a_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    governed = {m for c in contracts for m in c.get("source_modules", []) + c.get("modules", [])}
    packages = sorted(p.parent for p in (ROOT / "latticed").glob("*/__init__.py"))
    assert packages, "no package found: is ROOT right?"
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert doc, f"{package.name}/__init__.py does not say its job"
        dotted = f"latticed.{package.name}"
        assert dotted in governed or dotted == "latticed.demo", f"no import-linter contract for {dotted}"


def test_nothing_is_wired_by_import_side_effect() -> None:
    for path in modules("latticed", "cli"):
        text = path.read_text()
        assert "noqa: F401" not in text, f"{path}: an import kept for its side effect; list it explicitly"
        assert "sealer_of" not in text, f"{path}: the sealer is handed in by the composition root"
