"""A :class:`Grown` reads as the tuple of its items, never changes once built, and a live push's join
extends the replica's leaves and bodies in place (O(the push), not O(the queue))."""

from __future__ import annotations

import bisect
import pickle
import threading

from hypothesis import given
from hypothesis import strategies as st
from support.queue2_histories import OWNER, empty

from latticed.crdt import queue2, shared_prefix
from latticed.crdt.records import Record
from latticed.crdt.shared_prefix import Grown, grown

_ITEMS = st.lists(st.integers(-3, 3), max_size=8)


@given(_ITEMS, st.lists(_ITEMS, max_size=4), st.integers(-12, 12), st.integers(-12, 12), st.integers(-3, 3))
def test_a_grown_reads_as_its_tuple(
    base: list[int], parts: list[list[int]], i: int, j: int, step: int
) -> None:
    g = grown(tuple(base))
    for part in parts:
        g = grown(g, part)
    t = tuple(base) + tuple(x for part in parts for x in part)
    assert (
        len(g) == len(t)
        and bool(g) == bool(t)
        and list(g) == list(t)
        and list(reversed(g)) == list(reversed(t))
    )
    assert g == t and t == g and (g != t) is False and hash(g) == hash(t) and repr(g) == f"Grown({t!r})"
    assert g != (*t, 0) and (*t, 0) != g and g != list(t)
    assert g[i:j] == t[i:j] and type(g[i:j]) is tuple and g[i:] == t[i:]
    if step:
        assert g[i:j:step] == t[i:j:step]
    if -len(t) <= i < len(t):
        assert g[i] == t[i]
    else:
        try:
            g[i]
        except IndexError:
            pass
        else:
            raise AssertionError("an index past the end")
    assert g.__add__((9,)) == (*t, 9) and g.__radd__((9,)) == (9, *t) and g + g == t + t  # (9,) + g: tuple's
    assert g.count(0) == t.count(0) and bisect.bisect_left(sorted(g), 0) == bisect.bisect_left(sorted(t), 0)
    assert pickle.loads(pickle.dumps(g)) == t and {g: 1}[t] == 1
    ordered, same = grown(sorted(t, key=abs)), tuple(sorted(t, key=abs))
    for x in (i, j, step):
        assert shared_prefix.bisect_left(ordered, x, key=abs) == bisect.bisect_left(same, x, key=abs)
        assert shared_prefix.bisect_right(ordered, x, key=abs) == bisect.bisect_right(same, x, key=abs)
        assert shared_prefix.bisect_right(same, x, key=abs) == bisect.bisect_right(same, x, key=abs)


def test_a_view_never_changes_when_it_is_extended_again() -> None:
    """The first extension of a view appends to its list; a second one of the same view (two joins of
    one value) copies, and neither changes what any earlier view holds."""
    a = grown((1, 2))
    b = grown(a, (3,))
    c = grown(a, (4, 5))
    d = grown(b, (6,))
    assert (a, b, c, d) == ((1, 2), (1, 2, 3), (1, 2, 4, 5), (1, 2, 3, 6))
    assert b._items is a._items and d._items is a._items and c._items is not a._items
    assert list(reversed(a)) == [2, 1] and list(reversed(b)) == [3, 2, 1] and a[-1] == 2
    assert shared_prefix.bisect_right(a, 9, key=int) == 2 and a[1:] == (2,)
    assert grown(c, ()) == c and grown((), ()) == ()


def test_threads_extending_one_view_each_get_their_own_items() -> None:
    """The event loop and the storage thread may join a push into the same value: each result holds
    the base and its own items, whoever appended to the shared list first."""
    base = grown(tuple(range(100)))
    results: list[Grown[int]] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def extend(k: int) -> None:
        start.wait()
        for _ in range(200):
            got = grown(base, range(1000 + k * 10, 1000 + k * 10 + 3))
            with lock:
                results.append(got)

    threads = [threading.Thread(target=extend, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert base == tuple(range(100))
    for got in results:
        k = (got[100] - 1000) // 10
        assert got == (*range(100), *range(1000 + k * 10, 1000 + k * 10 + 3))


def test_a_live_push_extends_the_replicas_leaves_and_bodies_in_place() -> None:
    """Pushes verified and joined one by one (a relay's path): each new value's shared leaves and bodies
    are the previous value's list appended to, and every earlier value still reads as it did."""
    owner, replica = empty(), empty()
    seen: list[tuple[queue2.QueueState2, tuple[object, ...], tuple[object, ...]]] = []
    for i in range(12):
        owner = queue2.commit(owner, OWNER, now_ms=i, records=[Record(value=b"r%d" % i)])
        v = queue2.verify_delta(replica, queue2.delta(owner, queue2.summary(replica), max_records=8))
        nxt = queue2.join_verified(replica, v).state
        if i >= 2:
            assert type(nxt.chains.shared) is Grown and type(nxt.bodies) is Grown
            assert nxt.chains.shared._items is replica.chains.shared._items  # type: ignore[attr-defined]
            assert nxt.bodies._items is replica.bodies._items  # type: ignore[attr-defined]
        replica = nxt
        seen.append((replica, tuple(replica.chains.shared), tuple(replica.bodies)))
        assert replica == owner
    for value, shared, bodies in seen:
        assert value.chains.shared == shared and value.bodies == bodies


def test_an_owners_commits_extend_its_leaves_and_bodies_in_place() -> None:
    """Each commit's shared leaves and bodies are the previous value's lists appended to; a truncation
    that drops bodies, or a second commit on one value, builds new ones; no earlier value changes."""
    state = empty()
    seen: list[tuple[queue2.QueueState2, tuple[object, ...], tuple[object, ...]]] = []
    for i in range(16):
        nxt = queue2.commit(state, OWNER, now_ms=i, records=[Record(value=b"r%d" % i)])
        if i >= 2:
            assert nxt.chains.shared._items is state.chains.shared._items  # type: ignore[attr-defined]
            assert nxt.bodies._items is state.bodies._items  # type: ignore[attr-defined]
        if i == 8:
            other = queue2.commit(state, OWNER, now_ms=i, records=[Record(value=b"other")])
            assert other.chains.shared._items is not nxt.chains.shared._items  # type: ignore[attr-defined]
            assert other.bodies[:-1] == nxt.bodies[:-1] and other.bodies[-1] != nxt.bodies[-1]
            seen.append((other, tuple(other.chains.shared), tuple(other.bodies)))
        if i == 12:
            nxt = queue2.truncate(nxt, OWNER, 5, now_ms=i)
            assert [b.end for b in nxt.bodies] == [*range(6, 14), 13] and nxt.held == (5, 13)
        state = nxt
        seen.append((state, tuple(state.chains.shared), tuple(state.bodies)))
    for value, shared, bodies in seen:
        assert value.chains.shared == shared and value.bodies == bodies
    replica = empty()
    whole = queue2.join_verified(replica, queue2.verify_delta(replica, queue2.delta(state, None))).state
    assert whole == state and tuple(whole.bodies) == tuple(state.bodies)
