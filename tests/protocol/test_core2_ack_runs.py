"""A relay stores the pushes that came together in one commit: on a compact link their ACK2s go as one
``CACKS2 [44, seq, count]`` (a few bytes, one frame) instead of a full 56-byte ACK2 each carrying the
newer summary, and the sender ends in the same state as after those full ACK2s. A run the pass does not
complete goes as the ACK2s it held back; a link without ``compact`` never sends one; and a run that names
deltas not in flight, or of two queues, is the peer's RemoteProtocolError, with nothing of it taken.
Sans-IO, the real codecs on both ends."""

from __future__ import annotations

import itertools

import pytest
from support.queue2_histories import OWNER

from latticed.crdt import queue2
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.errors import RemoteProtocolError
from latticed.protocol.core2_session import Core2Link, Delta2Received, NeedDelta2
from latticed.protocol.core2_steps import outgoing
from latticed.protocol.core2_wire import ACK2, CACK2, CACKS2, Ack2, Summary2, encode2, link_summary
from latticed.protocol.replication_messages import QueueKey, unpack_message
from latticed.protocol.versions import HEADS_V2, WIDE_WINDOW2, WINDOW2

KEY = (OWNER.public_key, "q", 0)
OTHER = (OWNER.public_key, "r", 0)
BOTH = frozenset({HEADS_V2, "compact"})


def _line(n: int, name: str = "q") -> list[QueueState2]:
    """A queue of one record, then ``n`` single offers: every state along the way."""
    state = queue2.empty_state(OWNER.public_key, name)
    states = [queue2.commit(state, OWNER, now_ms=1_700_000_000_000, records=[Record(bytes(100))])]
    for i in range(n):
        now = 1_700_000_001_000 + 5 * i
        states.append(
            queue2.commit(states[-1], OWNER, now_ms=now, records=[Record(bytes([i]) * 100, timestamp=now)])
        )
    return states


def _linked(features: frozenset[str], held: dict[QueueKey, Summary2]) -> tuple[Core2Link, Core2Link]:
    """The writer's side and the relay's, both holding ``held``, digests exchanged."""
    writer, relay = Core2Link(), Core2Link()
    for link in (writer, relay):
        link.agree(features)
        link.start(held)
    _deliver(writer, relay)
    _deliver(relay, writer)
    return writer, relay


def _deliver(sender: Core2Link, receiver: Core2Link) -> list[list[object]]:
    raws = [unpack_message(m) for m in sender.messages_to_send()]
    for raw in raws:
        receiver.receive(raw)
    return raws


def _push(writer: Core2Link, key: QueueKey, before: QueueState2, after: QueueState2) -> None:
    """A live change on the writer: the delta its link asks for goes out."""
    writer.local_update(key, link_summary(after))
    event = writer.next_event()
    assert isinstance(event, NeedDelta2) and event.since == link_summary(before).core
    writer.provide_delta(key, outgoing(after, event.since, event.max_records))


def _pushed(features: frozenset[str], n: int) -> tuple[Core2Link, Core2Link, list[QueueState2], list[int]]:
    """``n`` live pushes in flight from writer to relay, received there; their seqs."""
    line = _line(n)
    writer, relay = _linked(features, {KEY: link_summary(line[0])})
    for before, after in itertools.pairwise(line):
        _push(writer, KEY, before, after)
    _deliver(writer, relay)
    seqs = []
    while (event := relay.next_event()) is not None:
        assert isinstance(event, Delta2Received)
        seqs.append(event.seq)
    assert len(seqs) == n
    return writer, relay, line, seqs


def _view(link: Core2Link) -> tuple[object, ...]:
    return link.peer_summary(KEY), link.inflight, link.has_work()


def test_pushes_stored_in_one_commit_are_acked_by_one_short_run_that_leaves_the_sender_as_full_acks() -> None:
    writer, relay, line, seqs = _pushed(BOTH, 4)
    twin, _, _, _ = _pushed(BOTH, 4)  # the same writer, told the same by full ACK2s
    stored = link_summary(line[-1])
    for seq in seqs:  # one commit: each merge's outcome is what the relay holds after all four
        relay.delta_applied(seq, stored, True)
    out = relay.messages_to_send()
    assert len(out) == 1 and unpack_message(out[0]) == [CACKS2, seqs[0], 4]
    assert len(out[0]) <= 8  # against 4 x 56 bytes
    assert (writer.stats["deltas_sent"], writer.stats["deltas_acked"]) == (4, 0)
    writer.receive(unpack_message(out[0]))
    for seq in seqs[:-1]:
        twin.receive(unpack_message(encode2(Ack2(seq, KEY, stored))))
    twin.receive([ACK2, seqs[-1]])
    assert _view(writer) == _view(twin) == (stored, 0, False)
    assert writer.stats["deltas_acked"] == twin.stats["deltas_acked"] == 4  # the run counts each delta
    line2 = _line(5)[-1]
    for link in (writer, twin):
        link.local_update(KEY, link_summary(line2))
    assert writer.next_event() == twin.next_event()


def test_a_run_the_pass_does_not_complete_goes_as_the_full_acks_it_held_back() -> None:
    writer, relay, line, seqs = _pushed(BOTH, 3)
    relay.delta_applied(seqs[0], link_summary(line[2]), True)  # a later delta carried this one
    assert relay.has_work()
    out = [unpack_message(m) for m in relay.messages_to_send()]
    assert [raw[:2] for raw in out] == [[CACK2, seqs[0]]] and out[0][3] is not None
    writer.receive(out[0])
    relay.delta_applied(seqs[1], link_summary(line[2]), True)
    relay.delta_applied(seqs[2], link_summary(line[3]), True)
    out = [unpack_message(m) for m in relay.messages_to_send()]
    assert out == [[ACK2, seqs[1]], [ACK2, seqs[2]]]  # each holds what it carried: the short form
    for raw in out:
        writer.receive(raw)
    assert _view(writer) == (link_summary(line[3]), 0, False)


def test_a_link_without_compact_acks_each_delta_in_the_full_form() -> None:
    _, relay, line, seqs = _pushed(frozenset({HEADS_V2}), 3)
    for seq in seqs:
        relay.delta_applied(seq, link_summary(line[-1]), True)
    raws = [unpack_message(m) for m in relay.messages_to_send()]
    assert [raw[1] for raw in raws] == seqs
    assert [(raw[0], len(raw)) for raw in raws] == [(ACK2, 6), (ACK2, 6), (ACK2, 2)]


@pytest.mark.parametrize(
    "run",
    [
        lambda seqs: [CACKS2, seqs[-1] + 1, 2],  # deltas never sent
        lambda seqs: [CACKS2, seqs[0], len(seqs) + 1],  # one past what is in flight
        lambda seqs: [CACKS2, seqs[0], 2**40],  # a count no link could have in flight
        lambda seqs: [CACKS2, seqs[0] - 1, 2],  # one before the first
        lambda seqs: [CACKS2, seqs[0], 2],  # one of each queue
        lambda seqs: [CACKS2, seqs[0], 3],  # the other queue's delta in the middle
    ],
)
def test_a_run_of_deltas_not_in_flight_or_of_two_queues_is_a_protocol_error_and_nothing_is_taken(
    run: object,
) -> None:
    line, other = _line(2), _line(1, "r")
    writer, relay = _linked(BOTH, {KEY: link_summary(line[0]), OTHER: link_summary(other[0])})
    _push(writer, KEY, line[0], line[1])
    _push(writer, OTHER, other[0], other[1])
    _push(writer, KEY, line[1], line[2])
    _deliver(writer, relay)
    seqs = []
    while (event := relay.next_event()) is not None:
        assert isinstance(event, Delta2Received)
        seqs.append(event.seq)
    before = writer.inflight, writer.peer_summary(KEY), writer.peer_summary(OTHER)
    assert callable(run)
    with pytest.raises(RemoteProtocolError):
        writer.receive(run(seqs))
    assert (writer.inflight, writer.peer_summary(KEY), writer.peer_summary(OTHER)) == before
    writer.receive([ACK2, seqs[0]])  # the link still takes an ACK2 of what is in flight
    assert writer.inflight == before[0] - 1


def test_pushes_acked_by_runs_on_a_wide_link_free_their_slots_for_the_next_ones() -> None:
    """On a link that agreed on the wider window, each small delta in flight holds a slot until its
    ACK2, whichever form acknowledges it: runs must free every slot they acknowledge, as full ACK2s do,
    or the link's count of small deltas in flight would drift from the truth."""
    lines = {(OWNER.public_key, f"q{i}", 0): _line(8, f"q{i}") for i in range(8)}
    writer, relay = _linked(BOTH | {WINDOW2}, {key: link_summary(line[0]) for key, line in lines.items()})
    for key, line in lines.items():  # each queue's pushes one after the other: a run each
        for before, after in itertools.pairwise(line[:5]):
            _push(writer, key, before, after)
    assert writer.inflight == WIDE_WINDOW2  # 32 in flight: past the narrow window of 8
    _deliver(writer, relay)
    while (event := relay.next_event()) is not None:
        assert isinstance(event, Delta2Received)
        relay.delta_applied(event.seq, link_summary(lines[event.key][4]), True)
    raws = _deliver(relay, writer)
    assert any(raw[0] == CACKS2 for raw in raws)
    assert writer.inflight == 0 and not writer._small_out  # every slot freed
    for key, line in lines.items():
        _push(writer, key, line[4], line[5])
    assert writer.inflight == len(lines)
