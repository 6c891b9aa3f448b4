"""A ``PYSPARK_PYTHON`` that starts Spark's Python processes ~1 s sooner.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python worker's path.
Python never caches bytecode for modules imported from a zip, so every fresh Python process Spark starts
compiles pyspark anew: ~1.1 s of CPU here. Each streaming query pays it at start (its source runs in a new
Python process per query), and so does the worker daemon. When Spark is the pip-installed pyspark that
this interpreter imports anyway, those zips hold the very same code: the wrapper written here drops them
from ``PYTHONPATH`` and execs this interpreter, which imports the installed, byte-compiled package
(~0.3 s). Zips of any other Spark installation (a cluster's ``SPARK_HOME``) are left alone.

With :func:`start_prefork` running (``use_worker_python`` starts it), the wrapper hands ``python -m``
starts to the warm prefork server (``prefork.py``) instead, which saves the ~0.4 s of imports too.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from latticed.spark import prefork_client

#: Where the wrapper finds the prefork server's socket (set by :func:`start_prefork`).
PREFORK_ENV: Final = "LATTICED_SPARK_PREFORK"

WRAPPER_TEMPLATE = """\
#!/bin/sh
# Written by latticed.spark.python_workers: runs {python} for Spark without the zips under
# {lib}, which hold the same pyspark as that interpreter's installed (byte-compiled) one.
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
  case "$entry" in
    {lib_pattern}) ;;
    *) kept="${{kept:+$kept:}}$entry" ;;
  esac
done
unset IFS
if [ -n "$kept" ]; then PYTHONPATH=$kept; export PYTHONPATH; else unset PYTHONPATH; fi
if [ "$1" = "-m" ] && [ -n "${{LATTICED_SPARK_PREFORK:-}}" ] && [ -S "$LATTICED_SPARK_PREFORK" ]; then
  # A fork of the warm prefork server if it serves this module, else this same exec.
  exec {python} -I -S {client} "$LATTICED_SPARK_PREFORK" {python} "$@"
fi
exec {python} "$@"
"""


def bundled_zip_dir() -> Path | None:
    """Where the pip-installed pyspark keeps the zips Spark puts on workers' paths, if it is installed."""
    try:
        import pyspark  # noqa: PLC0415 - optional extra
    except ImportError:
        return None
    lib = Path(pyspark.__file__).resolve().parent / "python" / "lib"
    return lib if (lib / "pyspark.zip").is_file() else None


def wrapper_text(python: str, lib: Path) -> str:
    """The shell wrapper for ``python``, dropping ``PYTHONPATH`` entries under ``lib``."""
    quoted_lib = shlex.quote(str(lib))
    return WRAPPER_TEMPLATE.format(
        python=shlex.quote(python),
        lib=lib,
        lib_pattern=f"{quoted_lib}/*",
        client=shlex.quote(prefork_client.__file__),
    )


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "latticed"


def worker_python(directory: Path | None = None) -> str:
    """The interpreter to give Spark as ``PYSPARK_PYTHON``: a wrapper around this one when pyspark is
    pip-installed here, else this interpreter itself (also when the wrapper cannot be written)."""
    lib = bundled_zip_dir()
    if lib is None:
        return sys.executable
    text = wrapper_text(sys.executable, lib)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    where = directory if directory is not None else cache_dir()
    path = where / f"spark-python-{digest}"
    try:
        if path.is_file() and path.read_text() == text and os.access(path, os.X_OK):
            return str(path)
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Write then rename: a concurrent job never runs a half-written script.
        fd, scratch = tempfile.mkstemp(dir=where, prefix=".spark-python-")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.chmod(scratch, 0o755)
            os.replace(scratch, path)
        except BaseException:
            os.unlink(scratch)
            raise
    except OSError:
        return sys.executable
    return str(path)


def use_worker_python(*, prefork: bool = True) -> str:
    """Set ``PYSPARK_PYTHON`` to :func:`worker_python` unless it is set already, and (``prefork``)
    start the prefork server for it; call it before the SparkSession (its SparkContext) is created.
    Returns the interpreter Spark will run."""
    if not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = worker_python()
        if prefork and os.environ["PYSPARK_PYTHON"] != sys.executable:
            start_prefork()
    return os.environ["PYSPARK_PYTHON"]


class _Prefork:
    process: subprocess.Popen[bytes] | None = None


def start_prefork(timeout: float = 60.0) -> str | None:
    """Start the prefork server (once per process) and point the wrapper at it through the environment
    Spark's JVM inherits: call it before the SparkContext starts. It lives until this process exits.
    Returns its socket path, or None if it could not start (Python processes then start cold)."""
    if _Prefork.process is not None and _Prefork.process.poll() is None:
        return os.environ.get(PREFORK_ENV)
    from latticed.spark.prefork import SINGLE_THREADED_ENV  # noqa: PLC0415 - the driver rarely needs it

    lib = bundled_zip_dir()
    directory = tempfile.mkdtemp(prefix="latticed-prefork-")  # mode 0700: ours alone
    path = os.path.join(directory, "prefork.sock")
    # The hash seed as pyspark's SparkContext gives it to every Python process it starts.
    env = {**os.environ, **SINGLE_THREADED_ENV, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    kept = [p for p in env.get("PYTHONPATH", "").split(":") if p and not (lib and p.startswith(f"{lib}/"))]
    if kept:
        env["PYTHONPATH"] = ":".join(kept)
    else:
        env.pop("PYTHONPATH", None)
    try:
        process = subprocess.Popen(
            [sys.executable, "-u", "-m", "latticed.spark.prefork", path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)
        return None
    assert process.stdout is not None
    ready = _read_line(process.stdout, timeout)
    process.stdout.close()
    if not ready.startswith(b"ready"):
        _stop(process, directory)
        return None
    _Prefork.process = process
    atexit.register(_stop, process, directory)
    os.environ[PREFORK_ENV] = path
    return path


def _read_line(stream: Any, timeout: float) -> bytes:
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else b""


def _stop(process: subprocess.Popen[bytes], directory: str) -> None:
    """Close the server's stdin (it exits on that) and remove its socket directory."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(directory, ignore_errors=True)
    if _Prefork.process is process:
        _Prefork.process = None
        os.environ.pop(PREFORK_ENV, None)
