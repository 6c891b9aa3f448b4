"""Bundles between in-process daemons that never connect: queues, KV namespaces and sealed queues both
ways through files (and through a relay that cannot read the sealed ones), damaged and truncated files
refused whole, a second import that changes nothing, and ``--want`` exports that carry only what is
missing. Plus the file format alone: every single flipped byte of a bundle is caught."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, start_in_process
from typer.testing import CliRunner, Result

import cli.ctl
from cli.boundary import ExitCode
from latticed.bundle.format import BundleEnd, BundleHeader, BundleWriter, decode_want, read_all
from latticed.crdt.core_errors import MalformedError, TamperedError
from latticed.crdt.queue import QueueDelta
from latticed.crdt.signing import Identity
from latticed.errors import IntegrityError, NotFoundError, NotReaderError
from latticed.facades.lattice_queue import LatticeQueue
from latticed.host.config import DaemonConfig

runner = CliRunner()


def _daemon(root: Path, name: str) -> InProcessDaemon:
    """A daemon with no listener and no mDNS: it meets the others only through files."""
    return start_in_process(
        DaemonConfig(data_dir=root / name, socket_path=root / f"{name}.sock", mdns=False), name
    )


@pytest.fixture(scope="module")
def trio_of_daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, InProcessDaemon]]:
    root = tmp_path_factory.mktemp("bundles")
    daemons = {name: _daemon(root, name) for name in ("a", "b", "relay")}
    yield daemons
    for d in daemons.values():
        d.stop()


@pytest.fixture
def a(trio_of_daemons: dict[str, InProcessDaemon]) -> InProcessDaemon:
    return trio_of_daemons["a"]


@pytest.fixture
def b(trio_of_daemons: dict[str, InProcessDaemon]) -> InProcessDaemon:
    return trio_of_daemons["b"]


@pytest.fixture
def relay(trio_of_daemons: dict[str, InProcessDaemon]) -> InProcessDaemon:
    return trio_of_daemons["relay"]


def ctl(daemon: InProcessDaemon, *args: str) -> Result:
    return runner.invoke(cli.ctl.app, ["--socket", str(daemon.socket), *args], prog_name="latticectl")


def qname() -> str:
    return f"q{secrets.token_hex(4)}"


def export(daemon: InProcessDaemon, path: Path, *select: str, want: Path | None = None) -> Result:
    args = ["bundle", "export", str(path), *select, *(["--want", str(want)] if want else []), "--json"]
    result = ctl(daemon, *args)
    assert result.exit_code == 0, result.output
    return result


def import_(daemon: InProcessDaemon, path: Path) -> dict[str, object]:
    with daemon.client(timeout=None) as c, path.open("rb") as f:
        return c.bundle_import(iter(lambda: f.read(1 << 16), b""))


def want(daemon: InProcessDaemon) -> bytes:
    with daemon.client() as c:
        return c.bundle_want()


def identity(daemon: InProcessDaemon) -> str:
    with daemon.client() as c:
        return c.identity()


def test_two_daemons_that_never_connect_exchange_queues_kv_and_sealed_queues_both_ways(
    a: InProcessDaemon, b: InProcessDaemon, relay: InProcessDaemon, tmp_path: Path
) -> None:
    qa, sa, qb, sb = qname(), qname(), qname(), qname()
    id_a, id_b = identity(a), identity(b)
    with a.client() as c:
        c.queue_create(qa, core=1)  # bundles carry core-1 queues only
        c.offer_batch(qa, [(b"a-%d" % i, None, ()) for i in range(50)])
        c.kv_put("from-a", b"hello b")
        c.queue_create(sa, readers=[id_b])
        c.offer_batch(sa, [(b"secret-for-b-%d" % i, None, ()) for i in range(5)])
    with b.client() as c:
        c.queue_create(qb, core=1)
        c.offer(qb, b"b-0")
        c.kv_put("from-b", b"hello a")
        c.queue_create(sb, readers=[id_a])
        c.offer(sb, b"secret-for-a")

    # a -> relay (not a reader of sa) -> b, by files only.
    first, second = tmp_path / "a.lat", tmp_path / "relay.lat"
    export(a, first, qa, sa, "kv")
    assert b"secret-for-b" not in first.read_bytes()  # sealed: envelopes only
    done = import_(relay, first)
    assert done["records"] == 50 + 5 + 1 and done["skipped"] == []
    address_sa = f"{id_a}/{sa}"
    with relay.client() as c:
        assert c.queue_info(address_sa)["end_offset"] == 5
        with pytest.raises(NotReaderError):
            c.range(address_sa, 0, 4)
        assert [e.value for e in c.range(f"{id_a}/{qa}", 0, 1)] == [b"a-0", b"a-1"]
    export(relay, second, f"{id_a}/*")
    import_(b, second)
    with b.client() as c:
        assert [e.value for e in c.range(f"{id_a}/{qa}", 0, 49)] == [b"a-%d" % i for i in range(50)]
        assert [e.value for e in c.range(address_sa, 0, 4)] == [b"secret-for-b-%d" % i for i in range(5)]
        assert c.kv_get("from-a", owner=id_a) == b"hello b"

    # b -> a, only what a lacks (a's want file), straight.
    want_file, back = tmp_path / "a.want", tmp_path / "b.lat"
    want_file.write_bytes(want(a))
    export(b, back, want=want_file)
    import_(a, back)
    with a.client() as c:
        assert [e.value for e in c.range(f"{id_b}/{qb}", 0, 0)] == [b"b-0"]
        assert [e.value for e in c.range(f"{id_b}/{sb}", 0, 0)] == [b"secret-for-a"]
        assert c.kv_get("from-b", owner=id_b) == b"hello a"


def _bundle_of(daemon: InProcessDaemon, tmp_path: Path, records: int) -> tuple[Path, str]:
    name = qname()
    with daemon.client() as c:
        c.queue_create(name, meta={"purpose": "flip"}, core=1)  # bundles: core 1 only
        c.offer_batch(name, [(b"v-%d" % i, b"k", ()) for i in range(records)])
    path = tmp_path / f"{name}.lat"
    export(daemon, path, name)
    return path, f"{identity(daemon)}/{name}"


def _refused(daemon: InProcessDaemon, data: bytes, path: Path, code: ExitCode) -> Result:
    path.write_bytes(data)
    before = want(daemon)
    result = ctl(daemon, "bundle", "import", str(path))
    assert result.exit_code == code, result.output
    assert result.stdout == "" and result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert want(daemon) == before  # nothing of it was stored
    return result


def test_a_bundle_with_one_flipped_byte_is_refused_whole(
    a: InProcessDaemon, b: InProcessDaemon, tmp_path: Path
) -> None:
    path, address = _bundle_of(a, tmp_path, 3000)
    data = path.read_bytes()
    # A byte in the header, in a record's value (the last delta: earlier ones verify), in the end section.
    last_value = data.rindex(b"v-2999")
    for where in (12, len(data) // 2, last_value + 2, len(data) - 3):
        flipped = bytearray(data)
        flipped[where] ^= 0x01
        result = _refused(b, bytes(flipped), tmp_path / "flipped.lat", ExitCode.INTEGRITY)
        assert "bundle" in result.stderr or "delta" in result.stderr
        with b.client() as c, pytest.raises(NotFoundError):
            c.queue_info(address)
    # Not a bundle at all: exit 2.
    result = _refused(b, b"NOTABUNDLE" + data[10:], tmp_path / "other.lat", ExitCode.USAGE)
    assert "not a latticed bundle" in result.stderr
    assert import_(b, path)["records"] == 3000  # the intact file imports


def test_a_truncated_bundle_is_refused_and_nothing_is_stored(
    a: InProcessDaemon, b: InProcessDaemon, tmp_path: Path
) -> None:
    path, address = _bundle_of(a, tmp_path, 20_000)
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) - 90, len(data) // 2, 40):
        result = _refused(b, data[:cut], tmp_path / "cut.lat", ExitCode.INTEGRITY)
        assert "truncated" in result.stderr
        with b.client() as c, pytest.raises(NotFoundError):
            c.queue_info(address)
    with b.client() as c, pytest.raises(IntegrityError, match="truncated"):
        c.bundle_import([data[: len(data) // 3]])
    # A client that leaves halfway: the daemon carries on, and no spool is left behind.
    with b.client() as c:
        conn = c.open_stream(10)
        conn.send({"v": 1, "id": 1, "op": "bundle_import"})
        conn.send({"data": data[: len(data) // 2]})
        conn.close()
        assert c.identity() == identity(b)
    assert not list(b.config.data_dir.glob(".bundle-import-*"))
    with b.client() as c, pytest.raises(NotFoundError):
        c.queue_info(address)


def test_importing_the_same_bundle_twice_changes_nothing(
    a: InProcessDaemon, b: InProcessDaemon, tmp_path: Path
) -> None:
    path, address = _bundle_of(a, tmp_path, 500)
    first = import_(b, path)
    assert first["records"] == 500 and first["changed"]
    held = want(b)
    with b.client() as c:
        info = c.queue_info(address)
    second = import_(b, path)
    assert second["changed"] == 0
    assert want(b) == held
    with b.client() as c:
        assert c.queue_info(address) == info
    result = ctl(b, "bundle", "import", str(path))
    assert result.exit_code == 0 and "0 chunks changed" in result.stderr


def test_an_export_with_a_want_file_carries_only_what_is_missing(
    a: InProcessDaemon, b: InProcessDaemon, tmp_path: Path
) -> None:
    name = qname()
    with a.client() as c:
        c.queue_create(name, core=1)  # bundles carry core-1 queues only
        c.offer_batch(name, [(b"old-%d" % i, None, ()) for i in range(100)])
    full = tmp_path / "full.lat"
    export(a, full, name)
    import_(b, full)
    with a.client() as c:
        c.offer_batch(name, [(b"new-%d" % i, None, ()) for i in range(10)])
    want_file = tmp_path / "b.want"
    result = ctl(b, "bundle", "want", "-o", str(want_file))
    assert result.exit_code == 0, result.output
    delta = tmp_path / "delta.lat"
    summary = json.loads(export(a, delta, name, want=want_file).stdout)
    # Only the ten new records of the log asked for.
    assert summary["records"] == 10 and summary["logs"] == 1
    deltas = [s for s in read_all([delta.read_bytes()]) if isinstance(s, QueueDelta)]
    assert {d.name for d in deltas} == {name} and sum(len(d.records) for d in deltas) == 10
    # Everything: no log b holds in full is in it, and every record b lacks is.
    everything = tmp_path / "everything.lat"
    export(a, everything, want=want_file)
    theirs = decode_want(want_file.read_bytes()).holds
    with a.client() as c:
        ours = decode_want(c.bundle_want()).holds
    lacking = {k for k, s in ours.items() if k not in theirs or s != theirs[k]}
    carried = [s for s in read_all([everything.read_bytes()]) if isinstance(s, QueueDelta)]
    assert {(d.owner, d.name, d.kind) for d in carried} == lacking
    assert delta.stat().st_size < full.stat().st_size
    import_(b, delta)
    with b.client() as c:
        assert c.queue_info(f"{identity(a)}/{name}")["end_offset"] == 110
    # Nothing missing: the bundle carries no log at all.
    want_file.write_bytes(want(b))
    empty = tmp_path / "empty.lat"
    assert json.loads(export(a, empty, name, want=want_file).stdout)["logs"] == 0
    assert import_(b, empty)["records"] == 0


# ------------------------------------------------------------------------------------------- format


def _small_bundle() -> bytes:
    owner = Identity.generate()
    queue = LatticeQueue.create(owner, "q")
    queue.set_meta("m", "1")
    for i in range(3):
        queue.offer(b"r%d" % i)
    queue.commit()
    writer = BundleWriter(Identity.generate(), 1, incremental=False)
    return writer.start() + writer.delta(queue.delta()) + writer.finish()


def test_every_flipped_byte_of_a_bundle_is_caught_by_the_reader_alone() -> None:
    data = _small_bundle()
    sections = list(read_all([data[i : i + 7] for i in range(0, len(data), 7)]))
    assert isinstance(sections[0], BundleHeader) and isinstance(sections[-1], BundleEnd)
    for where in range(len(data)):
        for bit in (0x01, 0x80):
            flipped = bytearray(data)
            flipped[where] ^= bit
            with pytest.raises((TamperedError, MalformedError)):
                list(read_all([bytes(flipped)]))
    for cut in range(len(data)):
        with pytest.raises((TamperedError, MalformedError)):
            list(read_all([data[:cut]]))
    with pytest.raises(TamperedError, match="follow the end"):
        list(read_all([data + b"\x00"]))


def test_a_fork_proof_travels_in_a_bundle(a: InProcessDaemon, b: InProcessDaemon, tmp_path: Path) -> None:
    owner, name = Identity.generate(), qname()
    one, two = LatticeQueue.create(owner, name), LatticeQueue.create(owner, name)
    one.offer(b"one")
    one.commit()
    two.offer(b"two")
    two.commit()
    a.call(a.handle.engine.merge_delta, one.delta())
    forked = a.call(a.handle.engine.merge_delta, two.delta())
    assert forked.forked and forked.fork is not None
    address = f"{owner.public_key.hex()}/{name}"
    path = tmp_path / "forked.lat"
    export(a, path, name)
    import_(b, path)
    with b.client() as c:
        info = c.queue_info(address)
    assert info["forked"] is True and info["fork_proof"]


def test_an_export_names_the_core2_queues_it_cannot_carry(a: InProcessDaemon, tmp_path: Path) -> None:
    name = qname()
    with a.client() as c:
        address = c.queue_create(name)  # fork core 2, the default
        c.offer(name, b"x")
    result = ctl(a, "bundle", "export", str(tmp_path / "out.lat"), name)
    assert result.exit_code == 0, result.output
    assert "not in the bundle: 1 queues on fork core 2" in result.stderr
    with a.client() as c:
        done = c.bundle_export(lambda _: None, select=[name])
    assert done["core2_left_out"] == [address] and done["records"] == 0
