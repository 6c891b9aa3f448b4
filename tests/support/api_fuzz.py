"""Argument names the local API's fuzzers put into requests (tests/api/test_api_server.py and
bench/bench_api_fuzz_memory.py): every name some handler reads, so fuzzed values reach the handlers'
checks instead of stopping at a missing argument."""

from __future__ import annotations

FUZZ_ARG_NAMES: tuple[str, ...] = (
    "by",
    "field",
    "follow",
    "from",
    "group",
    "headers",
    "key",
    "max_bytes",
    "max_records",
    "member",
    "meta",
    "name",
    "new_start",
    "offset",
    "owner",
    "prefix",
    "queue",
    "records",
    "to",
    "ttl",
    "value",
)
