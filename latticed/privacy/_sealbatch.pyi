# The compiled batch sealer built from _seal_build.py (cffi API mode); optional, so it may be absent.
from typing import Any

ffi: Any
lib: Any
