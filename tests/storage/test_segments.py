"""Cutting a run into stored segments (latticed/storage/segments.py): the cut bisects running sums of the
records' sizes computed a column at a time; it must be the cut a step per record makes, for records with
and without keys, with shared, differing or no headers, and records bigger than a segment alone."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from latticed.storage import segments
from latticed.storage.segments import SEGMENT_MAX_BYTES, SEGMENT_MAX_RECORDS, Segment


def reference_cut(segment: Segment) -> list[tuple[int, int]]:
    """The per-record cut: a segment ends before the record that makes it too long or too big."""
    out, start, size = [], 0, 0
    for i in range(len(segment)):
        key, value, headers = segment.keys[i], segment.values[i], segment.headers[i]
        record = len(value) + 16 + (len(key) if key else 0)
        record += sum(len(k) + len(v) for k, v in headers) if headers else 0
        size += record
        if i > start and (i - start >= SEGMENT_MAX_RECORDS or size > SEGMENT_MAX_BYTES):
            out.append((start, i))
            start, size = i, record
    out.append((start, len(segment)))
    return out


def make(n: int, rng: random.Random, *, keys: str, headers: str, big: bool, small: bool = False) -> Segment:
    """``small``: records too small for SEGMENT_MAX_RECORDS of them to fill SEGMENT_MAX_BYTES."""
    values = [b"v" * rng.choice([0, 10, 100, 300] if small else [0, 10, 100, 1000, 40_000]) for _ in range(n)]
    if big:
        values[n // 2] = b"x" * (SEGMENT_MAX_BYTES + 5)
    key_column: list[Any] = {
        "none": [None] * n,
        "all": [b"k%d" % i for i in range(n)],
        "some": [None if i % 3 else (b"" if i % 2 else b"key") for i in range(n)],
    }[keys]
    stamp = [["lattice.producer", b"ab" * 32]]
    header_column: list[Any] = {
        "none": [None] * n,
        "shared": [stamp] * n,
        "some": [stamp if i % 4 else None for i in range(n)],
    }[headers]
    return Segment(0, key_column, values, list(range(n)), header_column, bytes(32 * n))


@pytest.mark.parametrize("keys", ["none", "all", "some"])
@pytest.mark.parametrize("headers", ["none", "shared", "some"])
@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("small", [False, True])
def test_the_cut_is_the_per_record_cut(keys: str, headers: str, big: bool, small: bool) -> None:
    rng = random.Random(f"{keys}{headers}{big}{small}")
    for n in (1, 2, 2047, 2048, 2049, 5000, 9000):
        segment = make(n, rng, keys=keys, headers=headers, big=big, small=small)
        cut = [(part.first, part.end) for part in segments.split(segment)]
        assert cut == reference_cut(segment), (n, keys, headers, big)


@pytest.mark.parametrize("keys", ["none", "all", "some"])
@pytest.mark.parametrize("headers", ["none", "shared", "some"])
def test_a_segment_is_encoded_as_msgpack_of_its_columns(keys: str, headers: str) -> None:
    """Encoded a column at a time (a column of one repeated item packed once): the very bytes of msgpack
    of the four columns, the headers as schema 9 stores them (a record's equal to the one before as
    ``true``), which is what a stored row holds; it decodes to the very columns."""
    rng = random.Random(f"{keys}{headers}")
    for n in (0, 1, 15, 16, 300, 2048, 70_000):
        segment = make(n, rng, keys=keys, headers=headers, big=False, small=True)
        for stamps in (segment.timestamps, [1_700_000_000_000] * n, [True, *[1] * (n - 1)][:n], [5] * n):
            segment.timestamps = stamps
            stored = [
                True if h is not None and i and h == segment.headers[i - 1] else h
                for i, h in enumerate(segment.headers)
            ]
            columns = [segment.keys, segment.values, segment.timestamps, stored]
            data = segment.encode()[2]
            assert data == msgpack.packb(columns, use_bin_type=True), (n, stamps[:2])
            assert Segment.decode(0, n, segment.chains, data) == segment
