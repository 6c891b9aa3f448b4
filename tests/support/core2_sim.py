"""Replicas of core-2 queues (``crdt/queue2``) over the real sans-IO replication sessions, in memory.

:class:`MemoryCore2Host` is the core-2 host a daemon's store will be (``latticed/net/core2_host.py``):
link summaries, deltas from its states, and merges that verify against the state they join, keeping the
evidence aside. :class:`Core2Node` is a :class:`~support.sim.SimNode` (so it holds core-1 queues too)
whose sessions carry a :class:`~latticed.protocol.core2_session.Core2Link`; :class:`Core2Network` is the
:class:`~support.sim.SimNetwork` of them, where a link agrees on its features as it starts, later
(:meth:`Core2Network.agree`), or never.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from latticed.crdt import queue as core
from latticed.crdt import queue2
from latticed.crdt.core_errors import GapError
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.records import Record
from latticed.net.core2_host import Core2Host, PendingMerge2
from latticed.protocol.core2_session import Core2Link, Delta2Received, NeedDelta2
from latticed.protocol.core2_steps import Outgoing2, outgoing, unpack_steps
from latticed.protocol.core2_wire import Steps, Summary2, link_summary
from latticed.protocol.replication import DeltaReceived, NeedDelta, QueueKey, ReplicationSession
from support.sim import SimNetwork, SimNode


@dataclass
class MemoryCore2Host:
    """Core-2 states in memory, with the host methods the store will provide."""

    states2: dict[QueueKey, QueueState2] = field(default_factory=dict)
    #: Records held past a fork point learned by a merge, per queue: kept aside, never merged.
    evidence: dict[QueueKey, list[Record]] = field(default_factory=dict)
    #: Whether deltas go out with their leaves as steps where the receiver can rebuild them.
    steps: bool = True

    def summaries2(self) -> Mapping[QueueKey, Summary2]:
        return {key: link_summary(state) for key, state in self.states2.items()}

    def delta2_for(
        self, key: QueueKey, since: queue2.Summary | None, max_records: int, max_bytes: int | None = None
    ) -> Outgoing2 | None:
        """A delta for ``since`` as the link sends it (with :attr:`steps` False: its bodies whole)."""
        state = self.states2.get(key)
        return None if state is None else outgoing(state, since, max_records, max_bytes, steps=self.steps)

    def merge2(self, delta: queue2.Delta, steps: Steps | None = None) -> tuple[Summary2 | None, bool]:
        """Rebuild its steps, verify against what is held, join, keep: (what is held now, None if
        nothing; whether it changed). A delta that does not fit any more changes nothing; anything
        forged raises."""
        key = (delta.owner, delta.name, delta.kind)
        held = self.states2.get(key)
        before = held or queue2.empty_state(*key)
        try:
            whole = unpack_steps(before, delta, steps)
            merged = queue2.join_verified(before, queue2.verify_delta(before, whole))
        except GapError:
            return (None if held is None else link_summary(held)), False
        after = merged.state
        if merged.evidence:
            self.evidence.setdefault(key, []).extend(merged.evidence)
        self.states2[key] = after
        return link_summary(after), after != before


class _Stored:
    def __init__(self, outcome: tuple[Summary2 | None, bool]) -> None:
        self.outcome = outcome

    async def result(self) -> tuple[Summary2 | None, bool]:
        return self.outcome


class AsyncCore2Host:
    """A :class:`MemoryCore2Host` behind the interface the daemon's store will provide (mypy checks it
    is a :class:`~latticed.net.core2_host.Core2Host`)."""

    def __init__(self, memory: MemoryCore2Host) -> None:
        self.memory = memory

    def summaries2(self) -> Mapping[QueueKey, Summary2]:
        return self.memory.summaries2()

    async def delta2_for(
        self, key: QueueKey, since: queue2.Summary | None, max_records: int, max_bytes: int
    ) -> Outgoing2 | None:
        return self.memory.delta2_for(key, since, max_records, max_bytes)

    def submit_merge2(self, delta: queue2.Delta, steps: Steps | None, peer: bytes) -> PendingMerge2:
        return _Stored(self.memory.merge2(delta, steps))


def core2_host(memory: MemoryCore2Host) -> Core2Host:
    return AsyncCore2Host(memory)


@dataclass
class Core2Node(SimNode):
    host2: MemoryCore2Host = field(default_factory=MemoryCore2Host)
    merges2: int = 0

    @property
    def states2(self) -> dict[QueueKey, QueueState2]:
        return self.host2.states2

    def put2(self, state: QueueState2) -> None:
        """The owner's own change (or a copy of its store) lands here: joined, and told to every link."""
        key = (state.owner, state.name, state.kind)
        before = self.states2.get(key)
        after = state if before is None else queue2.join(before, state)
        self.states2[key] = after
        if before is None or after != before:
            self._changed2(key, after)

    def _changed2(self, key: QueueKey, state: QueueState2, source: int | None = None) -> None:
        """``Gossip.local_change2``: a committed change is told to every link, the one its delta came
        from included (that link judges by the summary whether it is news there); only a push relayed
        ahead of its commit skips its ``source``."""
        summary = link_summary(state)
        for peer, session in self.sessions.items():
            if peer != source and session.core2 is not None:
                session.core2.local_update(key, summary)

    def process(self, peer: int) -> None:
        session = self.sessions[peer]
        core2 = session.core2
        assert core2 is not None
        while (event := session.next_event()) is not None:
            if isinstance(event, NeedDelta2):
                core2.provide_delta(
                    event.key, self.host2.delta2_for(event.key, event.since, event.max_records)
                )
            elif isinstance(event, Delta2Received):
                summary, changed = self.host2.merge2(event.delta, event.steps)
                self.merges2 += 1
                if changed:  # the store's change hook, before the ACK2: every link, this one too
                    self._changed2(event.key, self.states2[event.key])
                core2.delta_applied(event.seq, summary, changed)
            elif isinstance(event, (NeedDelta, DeltaReceived)):
                self._core1(session, event)

    def _core1(self, session: ReplicationSession, event: NeedDelta | DeltaReceived) -> None:
        """A core-1 event, handled as :meth:`SimNode.process` does."""
        if isinstance(event, NeedDelta):
            state = self.states.get(event.key)
            session.provide_delta(
                event.key, None if state is None else core.delta(state, event.since, event.max_records)
            )
            return
        before = self.states.get(event.key) or core.empty_state(*event.key)
        after = core.merge(before, event.delta)
        changed = after.summary() != before.summary()
        self.states[event.key] = after
        session.delta_applied(event.seq, after.summary(), changed)
        if changed:
            self._changed(event.key, after, source=next(p for p, s in self.sessions.items() if s is session))


@dataclass
class Core2Network(SimNetwork):
    """A :class:`SimNetwork` of :class:`Core2Node`; ``features`` are agreed as a link starts unless
    ``agree_at_start`` is False (then :meth:`agree` does it, as the daemon does once the peer answered)."""

    agree_at_start: bool = True
    #: Each session's graft timer (0: a HAVE2 with news grafts at once; else at a :meth:`tick_all`).
    graft_timeout: float = 0.0
    #: Each session's HAVE linger (0: HAVE2s go with the next send; else at a :meth:`tick_all`).
    have_linger: float = 0.0
    clock: float = 0.0

    def add(self, name: int) -> SimNode:
        node = self.nodes[name] = Core2Node(name, incarnation=name.to_bytes(8, "big") + bytes(8))
        return node

    def connect(self, a: int, b: int) -> None:
        if a == b:
            raise ValueError("a node does not connect to itself")
        for x, y in ((a, b), (b, a)):
            node = self.nodes[x]
            session = ReplicationSession(
                window=self.window,
                depth=self.depth,
                max_records=self.max_records,
                key_budget=node.key_budget,
                incarnation=node.incarnation if self.remember else None,
                graft_timeout=self.graft_timeout,
                have_linger=self.have_linger,
            )
            session.attach_core2(Core2Link())
            node.sessions[y] = session
            self.wires[(x, y)] = deque()
        for x, y in ((a, b), (b, a)):
            node = self.nodes[x]
            assert isinstance(node, Core2Node)
            memory = node.memories.pop(y, None) if self.remember else None
            session = node.sessions[y]
            session.start(node.summaries(), memory=memory)
            assert session.core2 is not None
            session.core2.start(node.host2.summaries2())
            if self.agree_at_start:
                session.agree_features(self.features)
            self._flush(x, y)

    def tick_all(self, step: float = 1.0) -> bool:
        """Every session's clock moves ``step`` on (messages arrive at time 0, so any waiting graft
        falls due); returns whether any session still waits for its clock."""
        self.clock += step
        for x, node in self.nodes.items():
            for y, session in node.sessions.items():
                session.tick(self.clock)
                self._flush(x, y)
        return any(s.next_deadline() is not None for n in self.nodes.values() for s in n.sessions.values())

    def agree(self, a: int, b: int, features: frozenset[str] | None = None) -> None:
        """Both ends of the link settle on ``features`` (default: the network's)."""
        for x, y in ((a, b), (b, a)):
            session = self.nodes[x].sessions.get(y)
            if session is not None:
                session.agree_features(self.features if features is None else features)
                self._flush(x, y)

    def node2(self, name: int) -> Core2Node:
        node = self.nodes[name]
        assert isinstance(node, Core2Node)
        return node
