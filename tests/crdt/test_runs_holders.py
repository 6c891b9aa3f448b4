"""Adversarial review of ``lazy_bodies.Runs`` sharing one append-only list of parts with the values that
extend it (relay22): many holders of values of one queue extend, fork, join again, cut, drop refused or
rolled-back extensions and reload, and every holder's bodies must stay those of a plain-list model at every
step (a later value's parts never seen by an earlier one, two extensions of one value never overwriting each
other's), as must every reader the store and the relay use (``extends``, ``start_of``, the store's diff).

Examples: ``RUNS_EXAMPLES`` (200 by default, fast under the CI profile); the review ran 20,000+."""

from __future__ import annotations

import itertools
import operator
import os
import pickle
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.single_offers import chunk, single_offers

from latticed.crdt import queue2
from latticed.crdt.head2 import HeadV2
from latticed.crdt.lazy_bodies import LazyDecoded, Runs, StepRun, appended, extends
from latticed.crdt.queue2 import empty_state
from latticed.crdt.shared_prefix import Grown, grown
from latticed.crdt.signing import Identity
from latticed.storage.core2_store import _changed_bodies

_salt = itertools.count(1)


def _first() -> HeadV2:
    state = empty_state(b"k" * 32, "q")
    return HeadV2(state.queue_id, 1, 0, b"\0" * 32, 0, 0, b"b" * 32, b"h" * 32, 0, b"m" * 32, 0)


FIRST = _first()


def run_after(prev: HeadV2, n: int) -> StepRun:
    """``n`` bodies after ``prev`` (one record each), leaves and logs unique to this run: two runs after
    one value (a fork) never read as each other."""
    salt = next(_salt).to_bytes(8, "big")
    leaves = tuple((salt + bytes([i]) * 24, prev.end + i + 1) for i in range(n))
    logs = [salt + bytes([i]) * 24 for i in range(n)]
    chain = [salt + bytes([i, n]) * 12 for i in range(n)]
    stamps = b"".join((prev.timestamp + i + 1).to_bytes(8, sys.byteorder) for i in range(n))
    return StepRun(prev, leaves, logs, stamps, (prev.end, prev.head_hash, chain))


def more_after(prev: HeadV2, kind: int, sizes: list[int]) -> Sequence[HeadV2]:
    """What a join appends after ``prev``, in each shape a caller hands :func:`appended`."""
    runs: list[StepRun] = []
    for n in sizes:
        runs.append(run_after(runs[-1][-1] if runs else prev, n))
    if kind == 0:
        return runs[0]
    if kind == 1:
        return tuple(runs[0])
    if kind == 2:
        return grown((), tuple(runs[0]))
    if kind == 3:  # a decode's run, the body it follows carried alone in front
        head, run = runs[0][:1], runs[1] if len(runs) > 1 else run_after(runs[0][0], 1)
        return LazyDecoded(head, run, run.leaves, first=0, base=b"", records=())
    # kind 4: another value's bodies, parts plain and runs mixed
    return Runs(p if i % 2 else tuple(p) for i, p in enumerate(runs))


def key(b: HeadV2) -> tuple[int, int, bytes]:
    return b.end, b.version, b.leaf()[0]


class Holders(RuleBasedStateMachine):
    """Values of one queue held at once (a replica's state, the store's last written one, a relay's copy
    for serving, a join in flight), each beside its model: the tuple of its bodies."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[Sequence[HeadV2]] = [()]
        self.models: list[tuple[HeadV2, ...]] = [()]
        self.joins: list[list[Sequence[HeadV2]]] = [[]]  # what each value was extended with (a rejoin)

    def _hold(self, value: Sequence[HeadV2], model: tuple[HeadV2, ...]) -> None:
        assert tuple(value) == model  # at once, before any other holder moves
        self.values.append(value)
        self.models.append(model)
        self.joins.append([])

    def _extend(self, i: int, more: Sequence[HeadV2]) -> tuple[Sequence[HeadV2], tuple[HeadV2, ...]]:
        base, model = self.values[i], self.models[i]
        new = appended(base, more)
        expected = (*model, *more)
        assert tuple(new) == expected and len(new) == len(expected)
        if type(base) is Runs and type(new) is Runs and new._parts is base._parts:
            assert extends(base, new)  # (the store's fast path; False elsewhere only costs a diff)
        self.joins[i].append(more)
        return new, expected

    def _pick(self, data: st.DataObject) -> int:
        return data.draw(st.integers(min_value=0, max_value=len(self.values) - 1))

    @rule(data=st.data(), kind=st.integers(0, 4), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3))
    def extend(self, data: st.DataObject, kind: int, sizes: list[int]) -> None:
        """A join or a commit: any held value (the newest, or one already extended: a fork, a second join)."""
        i = self._pick(data)
        prev = self.models[i][-1] if self.models[i] else FIRST
        self._hold(*self._extend(i, more_after(prev, kind, sizes)))

    @precondition(lambda self: any(self.joins))
    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        """The very delta joined a second time into one value (the event loop and the storage thread
        each joining one push; a retry): the same part objects now in two values."""
        i = data.draw(st.sampled_from([k for k, j in enumerate(self.joins) if j]))
        self._hold(*self._extend(i, data.draw(st.sampled_from(self.joins[i]))))

    @rule(data=st.data(), kind=st.integers(0, 4), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3))
    def refused(self, data: st.DataObject, kind: int, sizes: list[int]) -> None:
        """An extension made then dropped (a merge refused half-way, a commit rolled back): what it added
        stays in the shared list, past every held value."""
        i = self._pick(data)
        prev = self.models[i][-1] if self.models[i] else FIRST
        self._extend(i, more_after(prev, kind, sizes))

    @rule(data=st.data())
    def cut(self, data: st.DataObject) -> None:
        """A truncation or a fork point: a slice of a value, then extended like any other."""
        i = self._pick(data)
        n = len(self.models[i])
        lo = data.draw(st.integers(0, n))
        hi = data.draw(st.integers(lo, n))
        self._hold(self.values[i][lo:hi], self.models[i][lo:hi])

    @rule(data=st.data())
    def reload(self, data: st.DataObject) -> None:
        """A restart: the value as pickled (or as the store loads it, a tuple)."""
        i = self._pick(data)
        loaded = pickle.loads(pickle.dumps(self.values[i]))
        assert loaded == self.models[i]
        self._hold(loaded, tuple(loaded))

    @rule(data=st.data())
    def race(self, data: st.DataObject) -> None:
        """Two threads extending one value at once: one appends to the list, the other copies."""
        i = self._pick(data)
        prev = self.models[i][-1] if self.models[i] else FIRST
        mores = [run_after(prev, 2), more_after(prev, data.draw(st.integers(0, 4)), [1, 2])]
        out: list[Sequence[HeadV2]] = [(), ()]
        gate = threading.Barrier(2)

        def go(k: int) -> None:
            gate.wait()
            out[k] = appended(self.values[i], mores[k])

        threads = [threading.Thread(target=go, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in range(2):
            self.joins[i].append(mores[k])
            self._hold(out[k], (*self.models[i], *mores[k]))

    @invariant()
    def every_holder_reads_its_own_bodies(self) -> None:
        for value, model in zip(self.values, self.models, strict=True):
            n = len(model)
            assert len(value) == n and tuple(value) == model and operator.eq(value, model)
            assert tuple(reversed(value)) == model[::-1]
            for i in {0, n // 2, n - 1, -1} if n else ():
                assert value[i] is model[i]
            assert tuple(value[1:-1]) == model[1:-1] and tuple(value[n // 3 :]) == model[n // 3 :]
            if type(value) is Runs:
                at = 0
                for part in value.parts:
                    assert len(part) and tuple(part) == model[at : at + len(part)]
                    assert value.start_of(part) in {at, -1} or model.count(part[0]) > 1
                    if type(part) is StepRun:  # the store finds a run of steps by it
                        assert value.start_of(part) == at
                    at += len(part)
                assert at == n

    @invariant()
    def extends_never_lies_and_the_store_writes_the_difference(self) -> None:
        k = len(self.values)
        for a, b in itertools.product(range(max(0, k - 6), k), repeat=2):
            old, new = self.values[a], self.values[b]
            mo, mn = self.models[a], self.models[b]
            if extends(old, new):
                assert mn[: len(mo)] == mo, "extends said a prefix where it is not"
            if not mn or old is new:
                continue
            gone, added = _changed_bodies(old, new)
            kept = Counter(map(key, mo))
            kept.subtract(map(key, gone))
            kept.update(map(key, added))
            assert +kept == Counter(map(key, mn)), "the store's rows would not be the new value's"


Holders.TestCase.settings = settings(
    max_examples=int(os.environ.get("RUNS_EXAMPLES", "200")),
    stateful_step_count=int(os.environ.get("RUNS_STEPS", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_holders_of_shared_runs_each_read_their_own_bodies = Holders.TestCase


def test_a_grown_part_extended_by_two_values_keeps_each_ones_bodies() -> None:
    """Plain bodies after a plain last part are grown into it: two values ending in one ``Grown`` (a
    fork of plain pushes after a run) each get their own bodies, and the first keeps its own."""
    run = run_after(FIRST, 2)
    base = appended(appended((), run), grown((), tuple(run_after(run[-1], 2))))
    assert type(base) is Runs and type(base.parts[-1]) is Grown
    x, y = (tuple(run_after(base[-1], 2)) for _ in range(2))
    one, two = appended(base, x), appended(base, y)
    assert tuple(one) == (*base, *x) and tuple(two) == (*base, *y) and len(base) == 4
    assert not extends(one, two) and not extends(two, one)


OWNER = Identity.from_seed(b"r" * 32)


@settings(max_examples=int(os.environ.get("RUNS_EXAMPLES", "200")) // 10, deadline=None)
@given(
    stamps=st.lists(st.integers(min_value=2, max_value=2**40), min_size=4, max_size=30),
    plan=st.lists(st.tuples(st.integers(0, 99), st.integers(1, 6), st.booleans()), min_size=1, max_size=12),
)
def test_joins_of_live_pushes_into_any_held_value_keep_every_value(
    stamps: list[int], plan: list[tuple[int, int, bool]]
) -> None:
    """Replicas' values joined with the owner's chunks through the wire (runs not built): each join into
    any value held (the newest, or one already joined: two joins of one value), some dropped (refused, or
    their commit rolled back), read as the same join of that value with its bodies copied to a tuple, and
    no value held changes."""
    owner = single_offers(OWNER, sorted(stamps))
    held = [queue2.empty_state(OWNER.public_key, "q")]
    seen = [tuple(held[0].bodies)]
    for pick, size, keep in plan:
        state = held[pick % len(held)]
        if state.held == owner.held:
            continue
        d = chunk(owner, state, size if state.held[1] else max(size, 2))  # (a first one: two at least)
        joined = queue2.join_verified(state, queue2.verify_delta(state, d)).state
        plain = replace(state, bodies=tuple(state.bodies))
        model = queue2.join_verified(plain, queue2.verify_delta(plain, d)).state
        assert tuple(joined.bodies) == tuple(model.bodies) and joined.records() == model.records()
        if keep:
            held.append(joined)
            seen.append(tuple(joined.bodies))
        assert all(tuple(s.bodies) == b for s, b in zip(held, seen, strict=True))
