"""The local API's ``queue_repair`` against a real daemon whose store holds queues found corrupt at start:
a replica's copy is dropped (doctor forgets it, its name finds nothing, the other queues go on); our own
queue is refused without ``drop``, saying what would be lost, and nothing changes; a queue that is not
corrupt, or on core 1, is refused; an unknown one is not_found. Doctor advises the command by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.corrupt_daemon import make_corrupt
from support.inprocess import daemon_at

from latticed.errors import BehindPeersError, NotFoundError, StorageError


def _store_checks(client: object) -> dict[str, dict[str, object]]:
    checks = [c for c in client.doctor() if c["check"] == "store"]  # type: ignore[attr-defined]
    return {str(c["detail"]).split(": its stored")[0].rsplit(" ", 1)[-1]: c for c in checks}


def test_repair_drops_a_replica_copy_and_refuses_our_own_without_drop(tmp_path: Path) -> None:
    x = make_corrupt(tmp_path)
    with daemon_at(tmp_path) as d, d.client() as client:
        own = f"{d.handle.engine.public_key.hex()}/own"
        advice = _store_checks(client)
        assert sorted(advice) == sorted([x, own])
        assert f"`latticectl queue repair {x}`" in str(advice[x]["fix"])
        assert "`latticectl queue repair own --drop`" in str(advice[own]["fix"])

        refused = client.queue_repair("own")
        assert refused["repaired"] is False and refused["owned"] is True
        assert "--drop" in refused["message"] and "2 records (offsets 0..2" in refused["message"]
        assert "records no peer holds are lost" in refused["message"]
        with pytest.raises(StorageError):
            client.read("own", 0)  # still there, still corrupt: nothing changed
        assert len(_store_checks(client)) == 2

        done = client.queue_repair(x)
        assert done["repaired"] is True and done["owned"] is False and done["records"] == 3
        assert done["message"].startswith(f"dropped the corrupt copy of {x} (3 records")
        assert list(_store_checks(client)) == [own]
        with pytest.raises(NotFoundError):
            client.read(x, 0)

        not_corrupt = client.queue_repair("good")
        assert not_corrupt["repaired"] is False and "not corrupt" in not_corrupt["message"]
        assert client.read("good", 0).values == [b"g0"]
        client.queue_create("one", core=1)
        assert "fork core 1" in client.queue_repair("one")["message"]
        with pytest.raises(NotFoundError):
            client.queue_repair("nope")

        dropped = client.queue_repair("own", drop=True)
        assert dropped["repaired"] is True and dropped["records"] == 2
        assert _store_checks(client) == {}
        assert [q["name"] for q in client.queue_list()] == ["good", "one"]
        with pytest.raises(BehindPeersError, match="--release"):  # peers hold its records: a fork
            client.queue_create("own", core=2)
        released = client.queue_repair("own", release=True)
        assert released["repaired"] is True and released["records"] == 2
        client.queue_create("own", core=2)  # no peer holds it, says the operator: the name is free again
        assert client.offer("own", b"new") == 0
