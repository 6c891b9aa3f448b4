"""Arrow batches of (value, key) rows as a Spark task hands them to the sink, for the tests of the sink's
fast forms (packed bytes, columns) that must cut and carry them as the row-by-row records do."""

from __future__ import annotations

import pyarrow as pa

OWNER = "ab" * 32


def resolve(queue: str) -> str:
    """A queue name as the sink resolves it on a daemon whose identity is :data:`OWNER`."""
    return f"{OWNER}/{queue}"


def arrow_batches(
    data: list[tuple[bytes, bytes | None]], text: bool, keyed: bool, cut: int
) -> list[pa.RecordBatch]:
    """``data`` as binary or string columns (``key`` only if ``keyed``), sliced every ``cut`` rows."""
    values = [v.decode("latin-1") if text else v for v, _ in data]
    keys = [None if k is None else k.decode("latin-1") if text else k for _, k in data]
    kind = pa.string() if text else pa.binary()
    columns, names = [pa.array(values, kind)], ["value"]
    if keyed:
        columns.append(pa.array(keys, kind))
        names.append("key")
    batch = pa.RecordBatch.from_arrays(columns, names=names)
    return [batch.slice(i, cut) for i in range(0, len(data), cut)]
