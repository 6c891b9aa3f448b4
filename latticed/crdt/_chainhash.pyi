# The compiled chain hasher built from _chain_build.py (cffi API mode); optional, so it may be absent.
from typing import Any

ffi: Any
lib: Any
