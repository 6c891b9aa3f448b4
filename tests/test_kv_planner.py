"""One KV write planner, two paths: every case runs through the library (``KvNamespace``) and through the
daemon (the API handlers over a real storage engine), and both must answer alike. A rule about KV writes
lives in :mod:`latticed.crdt.kvplan` alone; these cases fail on whichever path does not use it.

The KV operation table (:mod:`latticed.api.server.kvops`) is checked here too: the handlers, the client, the
CLI and the library must offer exactly its operations, with its arguments."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
import trio
import typer
from support.inprocess import engine_context
from typer.core import TyperArgument, TyperGroup

import cli.ctl
from latticed.api.client.blocking_client import Client
from latticed.api.server.context import Context
from latticed.api.server.kvops import KV_OPERATIONS, KvOperation
from latticed.api.server.op_table import build_op_table
from latticed.crdt.kvplan import WRITE_OPS
from latticed.crdt.signing import Identity
from latticed.errors import MalformedError, WrongTypeError
from latticed.facades.kv_namespace import KvNamespace
from latticed.storage.engine import Engine

HANDLERS = build_op_table().handlers
ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000
INT64_MAX = 2**63 - 1


class Clock:
    """Epoch ms that move only when a test moves them (both paths read the same one)."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


class Kv(Protocol):
    """The KV writes and reads both paths offer, plus the namespace's signed op log."""

    clock: Clock

    def put(self, key: str, value: bytes, ttl_ms: int | None = None) -> None: ...
    def delete(self, key: str) -> None: ...
    def incr(self, key: str, by: int = 1) -> int: ...
    def hset(self, key: str, field: bytes, value: bytes) -> None: ...
    def hdel(self, key: str, field: bytes) -> None: ...
    def sadd(self, key: str, member: bytes) -> None: ...
    def srem(self, key: str, member: bytes) -> None: ...
    def get(self, key: str) -> Any: ...
    def log(self) -> list[bytes]: ...


class LibraryKv:
    def __init__(self) -> None:
        self.clock = Clock()
        self.ns = KvNamespace.create(ALICE, clock=self.clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ns, name)

    def log(self) -> list[bytes]:
        state = self.ns.state  # signs what is pending, as the daemon's commit does
        records = [state.record_at(offset) for offset in range(state.start, state.held_end)]
        return [r.value for r in records if r is not None]


class DaemonKv:
    """The daemon's KV path without the socket: its request handlers over a storage engine (on its own
    trio thread, as in the daemon) whose clock the test holds."""

    def __init__(self, data_dir: Path) -> None:
        self.clock = Clock()
        data_dir.mkdir()
        started = threading.Event()
        box: dict[str, Any] = {}

        async def main() -> None:
            async with Engine.open(data_dir, ALICE, clock=self.clock) as engine:
                box["ctx"] = engine_context(engine, data_dir)
                box["token"] = trio.lowlevel.current_trio_token()
                box["done"] = trio.Event()
                started.set()
                await box["done"].wait()

        def thread() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # surfaced by close()
                box["error"] = exc
            finally:
                started.set()

        self._thread = threading.Thread(target=thread, name="kv-engine", daemon=True)
        self._thread.start()
        assert started.wait(30)
        if "error" in box:
            raise box["error"]
        self._box = box
        self.ctx: Context = box["ctx"]

    def close(self) -> None:
        trio.from_thread.run_sync(self._box["done"].set, trio_token=self._box["token"])
        self._thread.join(30)
        assert "error" not in self._box, self._box.get("error")

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self._box["token"])

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        reply: dict[str, Any] = self._run(HANDLERS[op], self.ctx, {"op": op, **args})
        return reply

    def put(self, key: str, value: bytes, ttl_ms: int | None = None) -> None:
        self.call("kv_put", key=key, value=value, ttl=None if ttl_ms is None else ttl_ms / 1000)

    def delete(self, key: str) -> None:
        self.call("kv_del", key=key)

    def incr(self, key: str, by: int = 1) -> int:
        return int(self.call("kv_incr", key=key, by=by)["value"])

    def hset(self, key: str, field: bytes, value: bytes) -> None:
        self.call("kv_hset", key=key, field=field, value=value)

    def hdel(self, key: str, field: bytes) -> None:
        self.call("kv_hdel", key=key, field=field)

    def sadd(self, key: str, member: bytes) -> None:
        self.call("kv_sadd", key=key, member=member)

    def srem(self, key: str, member: bytes) -> None:
        self.call("kv_srem", key=key, member=member)

    def get(self, key: str) -> Any:
        reply = self.call("kv_get", key=key)
        return set(reply["value"]) if reply["kind"] == "set" else reply["value"]

    def log(self) -> list[bytes]:
        engine = self.ctx.engine
        ns = engine.kv_namespace(None)
        if ns is None:
            return []
        columns = self._run(engine.read, ns, 0, 2**62, 10**6, 1 << 30)
        return list(columns.values)


@pytest.fixture(params=["library", "daemon"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kv]:
    if request.param == "library":
        yield LibraryKv()
        return
    daemon = DaemonKv(tmp_path / "data")
    try:
        yield daemon
    finally:
        daemon.close()


def test_a_ttl_counts_from_the_next_millisecond(kv: Kv) -> None:
    """Clocks read whole ms, up to 1 ms behind the true time: a key must read for its whole TTL."""
    kv.put("session", b"tok", ttl_ms=500)
    kv.clock.now += 500
    assert kv.get("session") == b"tok"
    kv.clock.now += 1
    assert kv.get("session") is None


def test_writes_that_change_nothing_sign_nothing(kv: Kv) -> None:
    def signs(write: Callable[[], object], ops: int) -> None:
        before = kv.log()
        write()
        assert len(kv.log()) == len(before) + ops, write

    signs(lambda: kv.delete("missing"), 0)
    signs(lambda: kv.srem("missing", b"m"), 0)
    signs(lambda: kv.hdel("missing", b"f"), 0)
    signs(lambda: kv.sadd("s", b"m"), 1)
    signs(lambda: kv.sadd("s", b"m"), 0)  # already a member
    signs(lambda: kv.srem("s", b"other"), 0)
    signs(lambda: kv.srem("s", b"m"), 1)
    signs(lambda: kv.srem("s", b"m"), 0)  # removed already
    signs(lambda: kv.hset("h", b"f", b"v"), 1)
    signs(lambda: kv.hdel("h", b"g"), 0)
    signs(lambda: kv.hdel("s", b"m"), 0)  # not a hash
    signs(lambda: kv.put("t", b"v", ttl_ms=10), 1)
    kv.clock.now += 11
    signs(lambda: kv.delete("t"), 0)  # expired: nothing to delete
    signs(lambda: kv.delete("h"), 1)
    signs(lambda: kv.delete("h"), 0)
    assert kv.get("h") is None and kv.get("s") is None


def test_a_counter_stays_in_the_signed_64_bit_range(kv: Kv) -> None:
    assert kv.incr("n", INT64_MAX) == INT64_MAX
    assert kv.incr("low", -(2**63)) == -(2**63)
    before = kv.log()
    with pytest.raises(MalformedError, match="64-bit"):
        kv.incr("n")
    with pytest.raises(MalformedError, match="64-bit"):
        kv.incr("low", -1)
    assert kv.log() == before
    assert kv.get("n") == INT64_MAX and kv.get("low") == -(2**63)


@pytest.mark.parametrize(
    ("setup", "kind"),
    [
        (lambda kv: kv.put("n", b"5"), "plain"),
        (lambda kv: kv.hset("n", b"f", b"v"), "hash"),
        (lambda kv: kv.sadd("n", b"m"), "set"),
    ],
    ids=["plain", "hash", "set"],
)
def test_incr_on_another_kind_is_a_wrong_type_error(kv: Kv, setup: Callable[[Kv], None], kind: str) -> None:
    setup(kv)
    before, value = kv.log(), kv.get("n")
    with pytest.raises(WrongTypeError, match=f"holds a {kind} value"):
        kv.incr("n")
    assert kv.log() == before and kv.get("n") == value


def test_incr_counts_a_key_no_reader_sees_as_absent(kv: Kv) -> None:
    kv.put("expired", b"5", ttl_ms=10)
    kv.put("deleted", b"5")
    kv.delete("deleted")
    kv.hset("emptied", b"f", b"v")
    kv.hdel("emptied", b"f")
    kv.clock.now += 11
    assert [kv.incr(k) for k in ("expired", "deleted", "emptied")] == [1, 1, 1]
    assert kv.incr("expired", 2) == 3


def test_both_paths_sign_the_same_ops(tmp_path: Path) -> None:
    """Same clock, same writes: byte-identical op logs (same HLCs, same ``fresh`` flags, same totals)."""
    library, daemon = LibraryKv(), DaemonKv(tmp_path / "data")
    try:
        for kv in (library, daemon):
            kv.put("a", b"1", ttl_ms=1_000)
            kv.incr("n", 5)
            kv.incr("n", -2)
            kv.hset("k", b"f", b"v")
            kv.sadd("k", b"m")  # another kind: a fresh set
            kv.sadd("k", b"m")
            kv.delete("missing")
            kv.clock.now += 3
            kv.put("k", b"plain")
            kv.hset("k", b"f2", b"w")
            kv.srem("k", b"m")  # k is a hash now: nothing to remove
        assert library.log() == daemon.log() and len(library.log()) == 7
        for key in ("a", "n", "k", "missing"):
            assert library.get(key) == daemon.get(key)
    finally:
        daemon.close()


# ------------------------------------------------------------------ the KV operation table

#: A well-typed value for each request argument, and an ill-typed one the handler must refuse.
GOOD: dict[str, Any] = {
    "key": "table-key",
    "value": b"v",
    "field": b"f",
    "member": b"m",
    "ttl": 60.0,
    "by": 1,
    "owner": ALICE.public_key.hex(),
    "prefix": "table-",
    "readers": [Identity.from_seed(b"r" * 32).public_key.hex()],
    "reader": Identity.from_seed(b"s" * 32).public_key.hex(),
}
BAD: dict[str, Any] = {"key": 5, "value": "text", "field": 5, "member": 5, "ttl": "x", "by": "x", "owner": 5}
BAD["prefix"] = 5
BAD["readers"] = ["not hex"]
BAD["reader"] = "zz"
OPS = {op.name: op for op in KV_OPERATIONS}


def test_the_table_names_every_kv_handler_and_every_planner_write() -> None:
    assert {name for name in HANDLERS if name.startswith("kv_")} == {op.api_op for op in KV_OPERATIONS}
    assert sorted(op.write for op in KV_OPERATIONS if op.write) == sorted(WRITE_OPS)
    library = {"del": "delete"}
    for op in KV_OPERATIONS:
        if op.write:
            assert callable(getattr(KvNamespace, library.get(op.name, op.name))), op.name


@pytest.mark.parametrize("op", KV_OPERATIONS, ids=lambda op: op.name)
def test_the_client_takes_the_tables_arguments(op: KvOperation) -> None:
    params = list(inspect.signature(getattr(Client, op.api_op)).parameters.values())[1:]
    assert [p.name for p in params] == [*op.args, *op.options]
    assert [p.name for p in params if p.default is inspect.Parameter.empty] == list(op.args)


def test_the_cli_has_a_command_per_operation_with_its_arity() -> None:
    group = typer.main.get_command(cli.ctl.app)
    assert isinstance(group, TyperGroup)
    kv_group = group.commands["kv"]
    assert isinstance(kv_group, TyperGroup)
    assert set(kv_group.commands) == set(OPS)
    for name, command in kv_group.commands.items():
        required = [p for p in command.params if isinstance(p, TyperArgument) and p.required]
        assert len(required) == len(OPS[name].args), name


def test_the_handlers_read_the_tables_arguments(tmp_path: Path) -> None:
    daemon = DaemonKv(tmp_path / "data")
    try:
        for op in KV_OPERATIONS:
            names = (*op.args, *op.options)
            full = {name: GOOD[name] for name in names}
            full["key"] = f"table-{op.name}"
            daemon.call(op.api_op, **{k: v for k, v in full.items() if k in names})
            for name in names:
                args = {k: v for k, v in full.items() if k in names}
                if name in op.args:
                    del args[name]
                    with pytest.raises(MalformedError, match=f"argument {name!r}"):
                        daemon.call(op.api_op, **args)
                args[name] = BAD[name]
                with pytest.raises(MalformedError, match=f"argument {name!r}|hex public key"):
                    daemon.call(op.api_op, **args)
    finally:
        daemon.close()
