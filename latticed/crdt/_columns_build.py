"""Build script of the optional column passes in C, ``latticed.crdt._columns`` (a CPython extension).

Why it exists: the owner's bulk append makes several passes over each column of a batch in Python (type
and length checks, the columns packed for the compiled chain hasher, the signed slices' cuts), each
~20-30 ns a record; ``_columns.c`` does each in one C pass over the objects, which cffi cannot read. It
decides nothing: where the input is not the plain shape it handles, the pure-Python path, which stays
the fallback when this is not built, checks it. setup.py builds it as an optional extension; by hand:
``python latticed/crdt/_columns_build.py`` (writes the module next to this file).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

MODULE = "latticed.crdt._columns"
SOURCE = Path(__file__).with_name("_columns.c")


def extension() -> Any:
    """The extension as setup.py builds it (sources relative to the project's root; optional)."""
    from setuptools import Extension  # type: ignore[import-untyped]  # noqa: PLC0415 - setup.py has it

    return Extension(MODULE, sources=[str(SOURCE.relative_to(SOURCE.parents[2]))], optional=True)


if __name__ == "__main__":  # by hand: build in a scratch directory, keep only the module, next to this file
    import shutil
    import tempfile

    # Run as a script, this directory comes first on the path, and its queue/ package hides the
    # standard library's queue from setuptools.
    sys.path.remove(str(SOURCE.parent))
    from setuptools import Distribution, Extension

    with tempfile.TemporaryDirectory() as scratch:
        dist = Distribution({"ext_modules": [Extension(MODULE, sources=[str(SOURCE)])]})
        command = dist.get_command_obj("build_ext")
        command.build_lib, command.build_temp = scratch, scratch
        command.ensure_finalized()
        command.run()
        built = Path(command.get_ext_fullpath(MODULE))
        shutil.copy(built, SOURCE.with_name(built.name))
