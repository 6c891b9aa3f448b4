"""The KV view a writer's store holds for a namespace, read as the daemon's readers see it."""

from __future__ import annotations

from latticed.crdt import kv
from latticed.storage.reader import StoreReader
from latticed.storage.writer import Writer


def view(w: Writer, ns: int) -> dict[str, kv.Entry]:
    reader = StoreReader(w.path)
    try:
        return dict(reader.kv_scan(ns, ""))
    finally:
        reader.close()
