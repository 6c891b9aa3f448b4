"""Adds the optional compiled batch sealer (latticed/privacy/_seal_build.py) to the build; everything else
is in pyproject.toml. Optional: where it does not compile (no C compiler, no Python headers) the install
still succeeds and latticed seals with its pure-Python path, the same bytes more slowly (``latticectl
doctor`` says which one a daemon uses)."""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "latticed" / "privacy"))
from _seal_build import ffibuilder  # by path: importing the package would need its dependencies

sealer = ffibuilder.distutils_extension(tmpdir="build/cffi")
sealer.optional = True
setup(ext_modules=[sealer])
