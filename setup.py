"""Adds the optional compiled batch sealer (latticed/privacy/_seal_build.py), chain hasher
(latticed/crdt/_chain_build.py) and column passes (latticed/crdt/_columns_build.py) to the build;
everything else is in pyproject.toml. Optional: where they do not compile (no C compiler, no Python
headers) the install still succeeds and latticed seals and hashes with its pure-Python paths, the same
bytes more slowly (``latticectl doctor`` says which sealer a daemon uses)."""

import sys
from pathlib import Path

from setuptools import setup

# By path: importing the package would need its dependencies.
sys.path.insert(0, str(Path(__file__).resolve().parent / "latticed" / "privacy"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "latticed" / "crdt"))
from _chain_build import ffibuilder as chain_builder
from _columns_build import extension as columns_extension
from _seal_build import ffibuilder as seal_builder

extensions = [
    seal_builder.distutils_extension(tmpdir="build/cffi"),
    chain_builder.distutils_extension(tmpdir="build/cffi"),
    columns_extension(),
]
for extension in extensions:
    extension.optional = True
setup(ext_modules=extensions)
