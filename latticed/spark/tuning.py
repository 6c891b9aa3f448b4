"""Take ~90 ms of fixed cost out of every micro-batch whose checkpoint is on a local file system.

Each micro-batch writes two small files to the checkpoint (the offset log before it runs, the commit log
after). Spark's default checkpoint manager writes them through Hadoop's ``FileContext``, which always
passes a permission; without Hadoop's native library (a pip-installed pyspark has none) the local file
system applies it by forking ``chmod`` from the JVM, for the file and for its ``.crc``: ~55-60 ms per log
here, over a third of a small batch. The ``FileSystem``-based manager writes the same files the same way
(a temporary file renamed into place, atomic on a local file system) with one fork instead of four: each
log write falls to ~12-15 ms, and append-to-visible latency p50 from ~340 ms to ~230 ms.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"

#: The class, by Spark version: it moved to a ``checkpointing`` package in Spark 4.1.
FILE_SYSTEM_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)


def is_local_path(path: str) -> bool:
    """A checkpoint location on this host's file system (no scheme, or ``file:``)."""
    scheme = urlparse(path).scheme
    return scheme in ("", "file")


def _jvm_has_class(spark: Any, name: str) -> bool:
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(name)
    except Exception:  # py4j's error for a missing class, or no JVM at all (Spark Connect)
        return False
    return True


def use_local_checkpoint_manager(spark: Any) -> str | None:
    """Make this session write checkpoint logs with the ``FileSystem``-based manager, unless a manager is
    configured already. Returns the manager now in effect, or None if it is Spark's default."""
    configured = spark.conf.get(CHECKPOINT_MANAGER_KEY, None)
    if configured:
        return str(configured)
    for name in FILE_SYSTEM_MANAGERS:
        if _jvm_has_class(spark, name):
            spark.conf.set(CHECKPOINT_MANAGER_KEY, name)
            return name
    return None
