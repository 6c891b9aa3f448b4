"""``queue list`` with many queues: entries rebuilt only for queues that changed, the event loop given
back between chunks, and the same reply on the wire as a plain msgpack map."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import msgpack
import trio

from latticed.api.messages import Packed, PackedArray, pack, pack_array
from latticed.api.server.queue_listing import CHUNK, Listed, QueueListing
from latticed.crdt import queue as core
from latticed.crdt.queue import QueueState
from latticed.crdt.signing import Identity
from latticed.errors import NotFoundError

OWNER = Identity.from_seed(b"o" * 32)


def states(n: int) -> dict[int, QueueState]:
    base = core.empty_state(OWNER.public_key, "q")
    return {q: dataclasses.replace(base, name=f"q{q:06d}") for q in range(n)}


def info(q: int, state: QueueState) -> dict[str, Any]:
    return {"owner": state.owner.hex(), "name": state.name, "owned": q % 2 == 0, "end_offset": q}


def listed(listing: QueueListing, held: dict[int, QueueState]) -> list[dict[str, Any]]:
    async def main() -> PackedArray:
        return await listing.reply(list(held), held.__getitem__, info)

    body = pack({"queues": trio.run(main), "id": 7, "ok": True})
    reply = msgpack.unpackb(body)
    assert reply["id"] == 7 and reply["ok"] is True
    out: list[dict[str, Any]] = reply["queues"]
    return out


def test_the_reply_is_the_plain_msgpack_list_owned_first_then_by_owner_and_name() -> None:
    held = states(40)
    expected = sorted(
        (info(q, s) for q, s in held.items()), key=lambda i: (not i["owned"], i["owner"], i["name"])
    )
    assert listed(QueueListing(), held) == expected


def test_only_queues_whose_state_changed_are_built_again() -> None:
    held = states(3 * CHUNK)
    listing = QueueListing()
    listed(listing, held)
    assert listing.built == 3 * CHUNK
    listed(listing, held)
    assert listing.built == 3 * CHUNK  # nothing changed: nothing built
    held[5] = dataclasses.replace(held[5], name="renamed")
    entries = listed(listing, held)
    assert listing.built == 3 * CHUNK + 1
    assert any(e["name"] == "renamed" for e in entries)


def test_a_long_listing_lets_other_tasks_run_between_chunks() -> None:
    held = states(5 * CHUNK)  # four checkpoints inside the listing
    turns = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def other() -> None:
                while True:
                    turns.append(len(listing_done))
                    await trio.lowlevel.checkpoint()

            listing_done: list[bool] = []
            nursery.start_soon(other)
            await trio.lowlevel.checkpoint()
            await QueueListing().reply(list(held), held.__getitem__, info)
            listing_done.append(True)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert turns.count(0) >= 4  # it ran while the listing was under way, once per checkpoint


def test_queues_gone_meanwhile_are_left_out_and_forgotten() -> None:
    held = states(3 * CHUNK)
    listing = QueueListing()
    listed(listing, held)
    few = {q: held[q] for q in range(10)}
    assert len(listed(listing, few)) == 10
    assert listing.built == 3 * CHUNK  # the ten were not built again


def test_pack_splices_packed_values_into_maps_of_any_size() -> None:
    for n in (0, 1, 15, 16, 70_000):
        items = [pack(i) for i in range(n)]
        assert msgpack.unpackb(pack({"queues": pack_array(items), "x": None})) == {
            "queues": list(range(n)),
            "x": None,
        }
    big = {f"k{i}": i for i in range(20)} | {"p": Packed.of([1, 2])}
    assert msgpack.unpackb(pack(big)) == {f"k{i}": i for i in range(20)} | {"p": [1, 2]}


def test_queues_of_another_core_are_cached_per_value_loaded_once_and_sorted_in() -> None:
    held = states(CHUNK)
    others = {CHUNK + q: dataclasses.replace(s, name=f"r{q:06d}") for q, s in states(CHUNK).items()}
    loaded: dict[int, QueueState] = {q: s for q, s in others.items() if q % 3}
    loads: list[int] = []

    async def load(q: int) -> QueueState:
        loads.append(q)
        loaded[q] = others[q]
        return others[q]

    def more() -> Listed[QueueState]:
        return Listed(list(others), loaded.get, load, info)

    def listed_both(listing: QueueListing) -> list[dict[str, Any]]:
        async def main() -> PackedArray:
            return await listing.reply(list(held), held.__getitem__, info, more=(more(),))

        out: list[dict[str, Any]] = msgpack.unpackb(pack({"queues": trio.run(main)}))["queues"]
        return out

    listing = QueueListing()
    every = [info(q, s) for q, s in (held | others).items()]
    assert listed_both(listing) == sorted(every, key=lambda i: (not i["owned"], i["owner"], i["name"]))
    assert listing.built == 2 * CHUNK and len(loads) == len(range(CHUNK, 2 * CHUNK, 3))
    listed_both(listing)
    assert listing.built == 2 * CHUNK and len(loads) == len(range(CHUNK, 2 * CHUNK, 3))  # nothing again
    others[CHUNK + 1] = loaded[CHUNK + 1] = dataclasses.replace(others[CHUNK + 1], name="renamed")
    assert any(e["name"] == "renamed" for e in listed_both(listing))
    assert listing.built == 2 * CHUNK + 1  # only the queue whose value changed


def test_the_checkpoints_count_the_queues_of_every_core() -> None:
    held = states(CHUNK + 1)
    others = {2 * CHUNK + q: s for q, s in states(4 * CHUNK).items()}
    turns = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def other() -> None:
                while True:
                    turns.append(len(listing_done))
                    await trio.lowlevel.checkpoint()

            async def never(q: int) -> QueueState:
                raise AssertionError("every value is at hand")

            listing_done: list[bool] = []
            nursery.start_soon(other)
            await trio.lowlevel.checkpoint()
            more = Listed(list(others), others.get, never, info)
            await QueueListing().reply(list(held), held.__getitem__, info, more=(more,))
            listing_done.append(True)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert turns.count(0) >= 4  # 5 * CHUNK + 1 queues: four checkpoints, the most of them in ``more``


def test_queues_added_removed_and_numbers_used_again_keep_the_list_in_order() -> None:
    rng = random.Random(5)
    pool = states(600)
    held: dict[int, QueueState] = {}
    listing = QueueListing()
    for step in range(30):
        for q in rng.sample(sorted(pool), 40):
            held[q] = pool[q]
        for q in rng.sample(sorted(held), min(len(held), 15)):
            del held[q]
        if step % 7 == 3 and held:  # a number dropped and used again by a queue of another name
            q = rng.choice(sorted(held))
            held[q] = dataclasses.replace(held[q], name=f"again{step}")
        expected = sorted(
            (info(q, s) for q, s in held.items()), key=lambda i: (not i["owned"], i["owner"], i["name"])
        )
        assert listed(listing, held) == expected


def test_a_queue_gone_between_the_list_of_numbers_and_its_state_is_left_out() -> None:
    held = states(CHUNK + 10)
    listing = QueueListing()
    listed(listing, held)
    numbers = list(held)
    del held[3], held[CHUNK + 4]  # dropped after the numbers were taken: its state raises KeyError
    others = {10 * CHUNK + q: dataclasses.replace(s, name=f"r{q}") for q, s in states(5).items()}

    async def load(q: int) -> QueueState:
        raise KeyError(q)  # not loaded, and gone by the time it would be

    async def main() -> PackedArray:
        more = Listed([*others, 99 * CHUNK], others.get, load, info)
        return await listing.reply(numbers, held.__getitem__, info, more=(more,))

    names = [e["name"] for e in msgpack.unpackb(pack({"queues": trio.run(main)}))["queues"]]
    assert len(names) == CHUNK + 8 + 5 and "q000003" not in names and f"q{CHUNK + 4:06d}" not in names


def test_a_queue_whose_state_is_not_found_is_left_out() -> None:
    """The engine's ``state`` raises NotFoundError for a number on neither core (a queue dropped after
    the numbers were taken): left out, as a KeyError is, and the listing goes on."""
    held = states(CHUNK + 10)
    listing = QueueListing()
    listed(listing, held)
    numbers = list(held)
    del held[3], held[CHUNK + 4]

    def state(q: int) -> QueueState:
        if q not in held:
            raise NotFoundError(f"no queue #{q}")
        return held[q]

    async def main() -> PackedArray:
        return await listing.reply(numbers, state, info)

    names = [e["name"] for e in msgpack.unpackb(pack({"queues": trio.run(main)}))["queues"]]
    assert len(names) == CHUNK + 8 and "q000003" not in names and f"q{CHUNK + 4:06d}" not in names


class _Name(str):
    """A queue name that counts how often the listing's sort compares it."""

    compared = 0

    def __lt__(self, other: str) -> bool:
        _Name.compared += 1
        return str.__lt__(self, other)


def test_queues_new_since_the_last_listing_are_sorted_in_without_sorting_the_others_again() -> None:
    rng = random.Random(7)
    numbers = list(range(6 * CHUNK))
    rng.shuffle(numbers)  # names in no order of their numbers
    base = core.empty_state(OWNER.public_key, "q")
    held = {q: dataclasses.replace(base, name=_Name(f"q{n:06d}")) for q, n in enumerate(numbers)}
    listing = QueueListing()
    first = dict(list(held.items())[: 5 * CHUNK])
    listed(listing, first)
    _Name.compared = 0
    entries = listed(listing, held)  # CHUNK new queues: sorted (~CHUNK log CHUNK), then merged in
    assert [e["name"] for e in entries] == sorted(e["name"] for e in entries if e["owned"]) + sorted(
        e["name"] for e in entries if not e["owned"]
    )
    n = len(held)
    assert _Name.compared < 2 * n + CHUNK * CHUNK.bit_length()  # sorting all anew: ~n log n (~136,000)


def test_queues_that_sort_after_the_listed_ones_join_without_comparing_the_others() -> None:
    # A catch-up's new queues mostly sort after the ones listed already, and ``queue list`` is called again
    # and again while it grows: merging them in by a sort compared every listed neighbour (~n here, 20,000
    # a call), O(queues^2) over a catch-up. Each owner group's new run now costs about one comparison a
    # queue, past sorting the new ones (k log k at most).
    base = core.empty_state(OWNER.public_key, "q")
    n, k = 10 * CHUNK, 200
    held = {q: dataclasses.replace(base, name=_Name(f"q{q:06d}")) for q in range(n + k)}
    listing = QueueListing()
    listed(listing, {q: held[q] for q in range(n)})
    for joining in (k - 3, 3):  # merged as runs, then inserted one by one
        _Name.compared = 0
        now = {q: held[q] for q in range(n + k - 3)} if joining > 3 else held
        entries = listed(listing, now)
        assert [e["name"] for e in entries] == [f"q{q:06d}" for q in range(0, len(now), 2)] + [
            f"q{q:06d}" for q in range(1, len(now), 2)
        ]
        assert _Name.compared < joining * joining.bit_length() + 2 * n.bit_length()


def test_a_followed_part_is_scanned_once_then_only_its_changed_queues_are_read() -> None:
    # A catch-up commits thousands of core-2 queues while ``queue list`` is called every few hundred ms:
    # reading every queue's value per call made the calls, and the loop they share, cost O(queues^2).
    others = {q: dataclasses.replace(s, name=f"r{q:06d}") for q, s in states(3 * CHUNK).items()}
    listing = QueueListing()

    async def never(q: int) -> QueueState:
        raise KeyError(q)  # every value is at hand; a dropped one is gone

    def listed_followed() -> list[dict[str, Any]]:
        async def main() -> PackedArray:
            more = Listed(lambda: list(others), others.get, never, info, followed=True)
            return await listing.reply([], {}.__getitem__, info, more=(more,))

        out: list[dict[str, Any]] = msgpack.unpackb(pack({"queues": trio.run(main)}))["queues"]
        return out

    def expected() -> list[dict[str, Any]]:
        every = [info(q, s) for q, s in others.items()]
        return sorted(every, key=lambda i: (not i["owned"], i["owner"], i["name"]))

    with listing.following():
        assert listed_followed() == expected() and listing.read == 3 * CHUNK  # the first call scans
        assert listed_followed() == expected() and listing.read == 3 * CHUNK  # nothing committed
        others[7] = dataclasses.replace(others[7], name="renamed")  # a new value, a new queue, a drop
        others[5 * CHUNK] = dataclasses.replace(others[8], name="new")
        del others[9]
        for q in (7, 5 * CHUNK, 9):
            listing.changed(q, others.get(q))
        assert listed_followed() == expected()
        assert listing.read == 3 * CHUNK + 3 and listing.built == 3 * CHUNK + 2  # the three only
    assert listed_followed() == expected() and listing.read == 6 * CHUNK + 3  # not following: scanned


def test_a_followed_part_stays_in_order_through_new_changed_dropped_and_reused_queues() -> None:
    rng = random.Random(11)
    pool = {1000 + q: dataclasses.replace(s, name=f"r{q:06d}") for q, s in states(900).items()}
    held = states(30)  # a scanned part beside it (queue numbers are one daemon's: none in both)
    others: dict[int, QueueState] = {}
    values: dict[int, int] = {}  # each queue's value number: an entry that changes in place
    listing = QueueListing()

    def info2(q: int, state: QueueState) -> dict[str, Any]:
        return info(q, state) | {"value": values.get(q, 0)}

    async def never(q: int) -> QueueState:
        raise KeyError(q)

    def listed_both() -> list[dict[str, Any]]:
        async def main() -> PackedArray:
            more = Listed(lambda: list(others), others.get, never, info2, followed=True)
            return await listing.reply(list(held), held.__getitem__, info2, more=(more,))

        out: list[dict[str, Any]] = msgpack.unpackb(pack({"queues": trio.run(main)}))["queues"]
        return out

    with listing.following():
        for step in range(60):
            touched = rng.sample(sorted(pool), rng.choice((3, 40, 200)))  # few: one by one; many: merged
            drops = step % 3 == 0  # other steps keep the encoded entries: changed in place
            for q in touched:
                if q in others and drops and rng.random() < 0.3:
                    del others[q]
                elif q in others and drops and rng.random() < 0.1:  # the number used again
                    others[q] = dataclasses.replace(pool[q], name=f"again{step}-{q}")
                else:
                    others[q] = dataclasses.replace(pool[q])  # a new value
                values[q] = values.get(q, 0) + 1
                listing.changed(q, others.get(q))
            if step % 9 == 4:  # a scanned queue moves to the followed part
                q = rng.choice(sorted(held))
                others[3000 + q] = dataclasses.replace(held.pop(q), name=f"moved{q}")
                listing.changed(3000 + q, others[3000 + q])
            every = [info2(q, s) for q, s in (held | others).items()]
            expected = sorted(every, key=lambda i: (not i["owned"], i["owner"], i["name"]))
            assert listed_both() == expected
    assert listing.read < 60 * 30 + 60 * 200  # the followed part was read only where it changed


def test_a_followed_listing_cancelled_midway_leaves_its_changes_to_the_next() -> None:
    others = {q: dataclasses.replace(s, name=f"r{q:06d}") for q, s in states(10).items()}
    loaded = dict(others)
    listing = QueueListing()

    loading = trio.Event()

    async def load(q: int) -> QueueState:
        loading.set()
        await trio.sleep_forever()  # the client left while this loaded
        raise AssertionError

    async def main() -> list[dict[str, Any]]:
        def more() -> Listed[QueueState]:
            return Listed(lambda: list(others), loaded.get, load, info, followed=True)

        await listing.reply([], {}.__getitem__, info, more=(more(),))
        others[3] = dataclasses.replace(others[3], name="renamed")
        others[20] = dataclasses.replace(others[3], name="new")
        del loaded[3]  # not loaded yet: the listing loads it
        loaded[20] = others[20]
        for q in (3, 20):
            listing.changed(q, others[q])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listing.reply, [], {}.__getitem__, info, (more(),))
            await loading.wait()
            nursery.cancel_scope.cancel()
        loaded[3] = others[3]  # loaded meanwhile
        out: list[dict[str, Any]] = msgpack.unpackb(
            pack({"queues": await listing.reply([], {}.__getitem__, info, more=(more(),))})
        )["queues"]
        return out

    with listing.following():
        entries = trio.run(main)
    every = [info(q, s) for q, s in others.items()]
    assert entries == sorted(every, key=lambda i: (not i["owned"], i["owner"], i["name"]))
