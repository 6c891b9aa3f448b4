from collections.abc import Sequence
from typing import Any

def offered(
    raw: Any, max_records: int, max_value: int, max_key: int, /
) -> tuple[tuple[bytes, ...], tuple[bytes | None, ...], int] | None: ...
def packed(
    values: tuple[bytes, ...], keys: tuple[bytes | None, ...], /
) -> tuple[bytes, bytes, bytes, bytes] | None: ...
def pieces(data: bytes | bytearray | memoryview, width: int, /) -> list[bytes]: ...
def cuts(
    values: tuple[bytes, ...], keys: tuple[bytes | None, ...], checkpoint_bytes: int, /
) -> list[int] | None: ...
def widest(values: Sequence[bytes], keys: Sequence[bytes | None], /) -> tuple[int, int] | None: ...
def same_int(column: Sequence[object], /) -> bool: ...
def segment_data(
    keys: Sequence[bytes | None], values: Sequence[bytes], tail: bytes | bytearray | memoryview, /
) -> bytes | None: ...
def versions(
    head_type: type | None,
    blake2b: int,
    persons: bytes,
    namespace: bytes,
    prev: tuple[object, ...],
    log: bytes,
    raw: bytes,
    base: bytes,
    first: int,
    chain: list[bytes],
    leaves: list[Any] = ...,
    logs: list[bytes] = ...,
    /,
) -> list[Any] | bytes | None: ...
def are_leaves(items: Sequence[object], /) -> bool | None: ...
def fold(
    blake2b: int, person: bytes, log: bytes, leaves: Sequence[object], stride: int, /
) -> tuple[bytes, list[bytes]] | None: ...
def chain_run(
    blake2b: int,
    record_person: bytes,
    chain_person: bytes,
    base: bytes,
    first: int,
    values: object,
    keys: object,
    timestamps: object,
    tail: bytes,
    /,
) -> list[bytes] | None: ...
def appended_head(
    head_type: type,
    blake2b: int,
    sign_open: int,
    persons: bytes,
    namespace: bytes,
    head: object,
    owner: bytes,
    queue_id: bytes,
    epoch: int,
    base: int,
    base_fold: bytes,
    leaves: Sequence[Any],
    ours_end: int,
    /,
) -> tuple[bytes, int] | None: ...
def compact_rows(
    raw: Any, base: int, max_value: int, max_key: int, /
) -> tuple[tuple[bytes, ...], tuple[bytes | None, ...], tuple[int, ...]] | None: ...
def compact_delta(
    raw: Any, base: int, max_value: int, max_key: int, /
) -> (
    tuple[
        int,
        int,
        int,
        list[Any],
        bool,
        int | None,
        tuple[tuple[bytes, ...], tuple[bytes | None, ...], tuple[int, ...]],
        int | None,
        bytes | None,
    ]
    | None
): ...
def compact_head(
    head_type: type,
    blake2b: int,
    person_log: bytes,
    raw: Any,
    ref: object,
    queue_id: bytes,
    epoch: int,
    shared_fold: bytes | None,
    tail: Sequence[Any],
    chained: bytes | None,
    records_end: int,
    empty_meta: bytes | None,
    /,
) -> Any: ...

HEAD_SLOTS: tuple[str, ...]
HEAD_HASH_SLOTS: tuple[int, ...]
HEAD_COUNTER_SLOTS: tuple[int, ...]
REF_SLOTS: tuple[str, ...]
