"""The v2 queue state's fork rules on one copied store: frozen at the fork point with the rest handed back as
evidence, the owner's writes refused until it recovers, recovery (with ``keep_mine``) superseding the
forked epoch, and forged records refused."""

from __future__ import annotations

import dataclasses

import pytest
from support.queue2_histories import OWNER, catch_up, empty, extend

from latticed.crdt import queue2
from latticed.crdt.core_errors import EquivocationError, MalformedError, TamperedError
from latticed.crdt.records import Record


def _copied() -> tuple[queue2.QueueState2, queue2.QueueState2]:
    """A store with 10 records copied; the owner writes 5 more, the copy 3."""
    shared = extend(empty(), [("offer", 3), ("offer", 3), ("offer", 3), ("offer", 1)], b"s")[-1]
    mine = extend(shared, [("offer", 3), ("offer", 2)], b"a")[-1]
    theirs = extend(shared, [("offer", 3)], b"b")[-1]
    return mine, theirs


def test_a_replica_freezes_at_the_fork_point_and_hands_back_what_it_held_past_it() -> None:
    mine, theirs = _copied()
    replica = queue2.join_verified(empty(), queue2.verify_delta(empty(), queue2.delta(mine, None))).state
    assert replica.held == (0, 15)
    merged = queue2.join_verified(replica, queue2.verify_delta(replica, queue2.delta(theirs, None)))
    assert merged.state.forked and merged.state.held == (0, 10)
    assert merged.state.records() == mine.records()[:10] == theirs.records()[:10]
    assert merged.evidence == tuple(mine.records()[10:])
    assert merged.state == queue2.join(mine, theirs) == queue2.join(theirs, mine)


def test_a_frozen_owner_signs_nothing_until_it_recovers_and_keep_mine_offers_its_records_again() -> None:
    mine, theirs = _copied()
    frozen = queue2.join(mine, theirs)
    with pytest.raises(EquivocationError):
        queue2.commit(frozen, OWNER, now_ms=99, records=[Record(value=b"x")])
    with pytest.raises(MalformedError):
        queue2.recover(mine, OWNER, now_ms=99)
    lost = mine.records()[10:]
    recovered = queue2.recover(frozen, OWNER, now_ms=99, keep_mine=lost)
    assert recovered.chains.epoch == 1 and not recovered.forked
    assert [r.value for r in recovered.records()] == [r.value for r in mine.records()]
    later = extend(theirs, [("offer", 2)], b"b")[-1]  # the copy goes on writing in the old epoch
    for other in (frozen, later, queue2.join(frozen, later)):
        assert queue2.join(recovered, other) == recovered == queue2.join(other, recovered)
    replica = queue2.join_verified(frozen, queue2.verify_delta(frozen, queue2.delta(recovered, None))).state
    replica = queue2.join_verified(
        replica, queue2.verify_delta(replica, queue2.delta(recovered, queue2.summary(replica)))
    ).state
    assert replica == recovered


def test_forged_records_or_a_missing_body_are_refused() -> None:
    mine, _ = _copied()
    d = queue2.delta(mine, None)
    forged = dataclasses.replace(d, records=(Record(value=b"forged"), *d.records[1:]))
    without = dataclasses.replace(d, bodies=tuple(b for b in d.bodies if b.end != 6))
    for bad in (forged, without):
        with pytest.raises(TamperedError):
            queue2.verify_delta(empty(), bad)


def test_records_from_a_superseded_epoch_are_left_out_not_refused() -> None:
    """A copy still writing in the forked epoch sends its records with its own bodies, which vouch for
    nothing in the new epoch: the recovered replica takes the leaves (a no-op) and leaves the records."""
    mine, theirs = _copied()
    recovered = queue2.recover(queue2.join(mine, theirs), OWNER, now_ms=99)
    replica = queue2.join_verified(empty(), queue2.verify_delta(empty(), queue2.delta(recovered, None))).state
    replica = dataclasses.replace(replica, chains=dataclasses.replace(replica.chains, held_end=0))
    replica = queue2.join(replica, replica)  # normalised: the new epoch, no records yet
    verified = queue2.verify_delta(replica, queue2.delta(theirs, None))
    assert verified.records == () and queue2.join_verified(replica, verified).state == replica


def test_a_body_from_a_branch_the_frozen_value_does_not_keep_is_left_out_not_refused() -> None:
    """Three copies: one forks at version 3, the other two share version 3 and part at version 4. A frozen
    value keeps one tip per branch at the first branching, so the third copy's version 4 is on no kept
    branch; its body rides along with records below the fork point that versions 2 and 3 vouch for."""
    shared = extend(empty(), [("offer", 1), ("offer", 1)], b"s")[-1]
    first = extend(shared, [("offer", 1)], b"a")[-1]
    second = extend(shared, [("touch", 0), ("offer", 1)], b"a")[-1]
    third = extend(shared, [("touch", 0), ("touch", 0)], b"a")[-1]
    replica = queue2.join(catch_up(empty(), first, 1, 1), catch_up(empty(), second, 1, 1))
    assert replica.forked and replica.chains.fork_point == 2 and replica.held == (0, 1)
    d = queue2.delta(third, queue2.summary(replica), max_records=3)
    assert any(b.version == 4 for b in d.bodies) and d.from_offset == 1 and len(d.records) == 1
    verified = queue2.verify_delta(replica, d)
    assert all(b.version < 4 for b in verified.bodies)
    joined = queue2.join_verified(replica, verified).state
    assert joined.held == (0, 2) and joined == queue2.join(replica, third)
    forged = dataclasses.replace(d, records=(Record(value=b"forged"),))
    with pytest.raises(TamperedError):
        queue2.verify_delta(replica, forged)
