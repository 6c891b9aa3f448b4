"""Retention's pure parts: sizes and durations, the reserved metadata keys, replica caps, and the cut."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticed.errors import MalformedError
from latticed.host.config import load_config
from latticed.host.retention_policy import (
    KEEP_UNSETTLED_KEY,
    MAX_AGE_KEY,
    MAX_BYTES_KEY,
    MAX_RECORDS_KEY,
    NO_POLICY,
    UNCHANGED,
    Extent,
    ReplicaCaps,
    RetentionPolicy,
    check_meta,
    check_meta_entry,
    cut_for_bytes,
    cut_for_records,
    expired_prefix,
    format_duration,
    format_size,
    keep_target,
    meta_updates,
    parse_duration,
    parse_queue_cap,
    parse_size,
    policy_from_meta,
    policy_meta,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("50MB", 50_000_000),
        ("20MiB", 20 * 1024**2),
        ("20M", 20 * 1024**2),
        ("1.5GB", 1_500_000_000),
        ("1000", 1000),
        ("64 kB", 64_000),
        ("none", None),
        ("0", None),
    ],
)
def test_sizes(text: str, expected: int | None) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", 7 * 86_400_000),
        ("12h", 12 * 3_600_000),
        ("30m", 1_800_000),
        ("90s", 90_000),
        ("500ms", 500),
        ("3600", 3_600_000),  # bare: seconds
        ("2w", 14 * 86_400_000),
        ("off", None),
    ],
)
def test_durations(text: str, expected: int | None) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "-5MB", "5 parsecs", "1e9", "5MB5"])
def test_bad_sizes_say_what_they_expected(text: str) -> None:
    with pytest.raises(MalformedError, match="50MB"):
        parse_size(text, "--max-bytes")


def test_sizes_and_durations_print_back() -> None:
    assert format_size(50_000_000) == "47.68 MiB" and format_size(None) == "none"
    assert format_size(12) == "12 B"
    assert format_size(20 << 20) == "20 MiB" and format_size(2500) == "2.44 KiB"  # binary, as status prints
    assert format_duration(7 * 86_400_000) == "7d" and format_duration(1500) == "1500ms"
    assert parse_duration(format_duration(90_000)) == 90_000


def test_reserved_keys_are_checked_when_set() -> None:
    check_meta({MAX_BYTES_KEY: "1000", MAX_AGE_KEY: "60000", KEEP_UNSETTLED_KEY: "true", "team": "x"})
    check_meta_entry(MAX_RECORDS_KEY, None)  # deleting is always fine
    for key, value in [
        (MAX_BYTES_KEY, "50MB"),  # stored as a number of bytes, not a size with a unit
        (MAX_BYTES_KEY, "0"),
        (MAX_BYTES_KEY, "007"),
        (MAX_RECORDS_KEY, "-1"),
        (MAX_AGE_KEY, str(2**63)),
        (KEEP_UNSETTLED_KEY, "yes"),
        ("retention.max_bytez", "5"),  # a typo does not pass for a policy
    ]:
        with pytest.raises(MalformedError):
            check_meta_entry(key, value)


def test_policy_from_meta_reports_what_it_cannot_read() -> None:
    assert policy_from_meta({"team": "x"}) == (NO_POLICY, [])
    policy, problems = policy_from_meta(
        {MAX_BYTES_KEY: "1000", MAX_RECORDS_KEY: "lots", KEEP_UNSETTLED_KEY: "true", "retention.x": "1"}
    )
    assert policy == RetentionPolicy(max_bytes=1000, keep_unsettled=True)
    assert len(problems) == 2 and any("lots" in p for p in problems)


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(st.none(), st.integers(1, 2**63 - 1)),
    st.one_of(st.none(), st.integers(1, 2**63 - 1)),
    st.one_of(st.none(), st.integers(1, 2**63 - 1)),
    st.booleans(),
)
def test_a_policy_round_trips_through_metadata(
    age: int | None, size: int | None, records: int | None, keep: bool
) -> None:
    policy = RetentionPolicy(age, size, records, keep)
    meta = policy_meta(policy)
    check_meta(meta)
    assert policy_from_meta(meta) == (policy, [])


def test_meta_updates_leave_unchanged_parts_alone() -> None:
    assert meta_updates(max_bytes=5) == {MAX_BYTES_KEY: "5"}
    assert meta_updates(max_bytes=0, keep_unsettled=False) == {MAX_BYTES_KEY: None, KEEP_UNSETTLED_KEY: None}
    assert meta_updates(max_records=UNCHANGED) == {}
    for bad in (-1, True, 2**63, "5"):
        with pytest.raises(MalformedError):
            meta_updates(max_records=bad)  # type: ignore[arg-type]


def test_replica_caps_first_match_wins() -> None:
    caps = ReplicaCaps(20_000_000, (("*/logs-*", 100), ("abc*/audit", None)))
    assert caps.cap_for("ff/logs-web") == 100
    assert caps.cap_for("abcdef/audit") is None
    assert caps.cap_for("ff/orders") == 20_000_000
    assert not ReplicaCaps().any and caps.any
    assert parse_queue_cap("*/a=b=1MB") == ("*/a=b", 1_000_000)
    with pytest.raises(MalformedError):
        parse_queue_cap("=5MB")


def test_config_keys_and_errors(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text('replica_max_bytes = "20MB"\nreplica_queue_caps = ["*/logs-*=1MB", "*/x=none"]\n')
    config = load_config(file, {"retention_interval_s": 2})
    assert config.replica_max_bytes == 20_000_000
    assert config.replica_queue_caps == (("*/logs-*", 1_000_000), ("*/x", None))
    assert config.retention_interval_s == 2.0
    assert load_config(None, {"replica_max_bytes": 5000}).replica_max_bytes == 5000
    file.write_text('replica_queue_caps = ["*/logs-*=lots"]\n')
    with pytest.raises(MalformedError, match=r"replica_queue_caps\[0\]"):
        load_config(file, {})
    with pytest.raises(MalformedError, match="retention_interval_s"):
        load_config(None, {"retention_interval_s": 0})


# ------------------------------------------------------------------------------------------------ cuts


def extents(sizes: list[tuple[int, int]]) -> list[Extent]:
    """Extents from (count, bytes) pairs, oldest first from offset 0."""
    out, first = [], 0
    for count, nbytes in sizes:
        out.append(Extent(first, count, nbytes))
        first += count
    return out


def held_from(exts: list[Extent], cut: int) -> int:
    return sum(e.nbytes * (e.end - max(e.first, cut)) // e.count for e in exts if e.end > cut)


def test_bytes_under_the_limit_cut_nothing() -> None:
    exts = extents([(10, 1000), (10, 1000)])
    assert cut_for_bytes(reversed(exts), 0, 2000) == (None, 2000)


def test_bytes_cut_whole_segments_when_that_keeps_enough() -> None:
    exts = extents([(100, 10_000)] * 20)  # 200 kB
    cut, kept = cut_for_bytes(reversed(exts), 0, 100_000)
    assert cut is not None and cut % 100 == 0  # a segment boundary: nothing is rewritten
    assert 85_000 <= held_from(exts, cut) == kept <= keep_target(100_000)


def test_bytes_cut_inside_one_big_segment() -> None:
    exts = extents([(1000, 100_000)])
    cut, kept = cut_for_bytes(reversed(exts), 0, 10_000)
    assert cut == 1000 - 95 and kept == 9500


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(1, 5000)), min_size=1, max_size=30),
    st.integers(1, 60_000),
    st.integers(0, 100),
)
def test_a_bytes_cut_keeps_at_most_the_target_and_only_cuts_over_the_limit(
    sizes: list[tuple[int, int]], limit: int, start_skip: int
) -> None:
    exts = extents(sizes)
    start = min(start_skip, exts[-1].end)
    total = held_from(exts, start)
    cut, kept = cut_for_bytes(reversed(exts), start, limit)
    if total <= limit:
        assert cut is None and kept == total
    else:
        assert cut is not None and start <= cut <= exts[-1].end
        assert held_from(exts, cut) <= keep_target(limit) + max(e.nbytes // e.count for e in exts)


def test_records_cut_to_the_target_or_a_nearby_boundary() -> None:
    assert cut_for_records(0, 100, 100) is None
    assert cut_for_records(0, 101, 100) == 101 - 95
    assert cut_for_records(0, 200, 100, boundaries=[50, 110, 120]) == 110  # keeps 90 >= 85
    assert cut_for_records(0, 200, 100, boundaries=[50, 180]) == 105  # 180 would keep too few
    assert cut_for_records(5, 17, 10) == 17 - keep_target(10)


def test_expired_prefix_stops_at_the_first_young_record() -> None:
    assert expired_prefix(10, [1, 2, 3, 9, 4], 5) == 13  # a clock that stepped back keeps 4 too
    assert expired_prefix(10, [1, 2], 5) == 12
    assert expired_prefix(10, [], 5) == 10
