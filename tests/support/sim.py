"""An in-process network of replication sessions: the protocol simulated without sockets or clocks.

Each :class:`SimNode` is a host as the daemon is one (answering ``NeedDelta`` from its states, verifying
and merging ``DeltaReceived``, telling its other sessions about what changed), only with in-memory states.
:class:`SimNetwork` delivers messages in rounds, optionally dropping links (loss is modelled as a link
dying, as on TCP: the session is torn down and reconnected later, which is what the daemon does).
Used by the protocol tests and by ``bench/bench_gossip.py``.

A test that wants to choose every step itself (hypothesis' stateful tests) uses :meth:`SimNetwork.deliver`
(the next messages of one link, in order, as TCP keeps them), :meth:`SimNetwork.handle` (one host answers
one session's events, as a link's driver does, at a time of the test's choosing), :meth:`SimNetwork.restart`
and ``remember=True`` (incarnations and :class:`PeerMemory` across reconnects, as ``net/gossip.py`` keeps
them). Nothing here draws random numbers except rounds with ``loss`` and :meth:`SimNetwork.random_graph`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from latticed.crdt import queue as core
from latticed.crdt.queue import QueueState
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.protocol.replication import (
    DeltaReceived,
    KeyBudget,
    NeedDelta,
    PeerMemory,
    QueueKey,
    ReplicationSession,
)


@dataclass
class SimNode:
    name: int
    states: dict[QueueKey, QueueState] = field(default_factory=dict)
    sessions: dict[int, ReplicationSession] = field(default_factory=dict)
    bytes_received: int = 0
    rejected: int = 0
    #: Per run of the node (see :meth:`SimNetwork.restart`); sent in HELLO when the network remembers.
    incarnation: bytes = b""
    #: What the node remembers of each peer from its last connection (``remember=True`` only).
    memories: dict[int, PeerMemory] = field(default_factory=dict)
    #: Queues the node does not hold that all its sessions track for their peers, as the daemon counts them.
    key_budget: KeyBudget = field(default_factory=KeyBudget)

    def summaries(self) -> dict[QueueKey, core.Summary]:
        return {k: s.summary() for k, s in self.states.items()}

    def write(self, identity: Identity, name: str, records: list[Record], now_ms: int) -> None:
        self.commit(identity, name, now_ms, records=records)

    def commit(
        self,
        identity: Identity,
        name: str,
        now_ms: int,
        *,
        records: list[Record] | None = None,
        new_start: int | None = None,
    ) -> core.QueueState:
        """The owner writes (or truncates) its queue here, on the state this node holds."""
        key = (identity.public_key, name, 0)
        state = self.states.get(key) or core.empty_state(identity.public_key, name)
        state = core.commit(state, identity, now_ms=now_ms, records=records or (), new_start=new_start)
        self._changed(key, state)
        return state

    def inject(self, state: QueueState) -> bool:
        """A state from outside the network (the owner's other device) joins this node's, verified as a
        delta from a peer would be; returns whether it changed anything."""
        key = (state.owner, state.name, state.kind)
        before = self.states.get(key) or core.empty_state(state.owner, state.name, state.kind)
        after = core.merge(before, state)
        if after.summary() == before.summary() and after.fork == before.fork:
            self.states[key] = after
            return False
        self._changed(key, after)
        return True

    def _changed(self, key: QueueKey, state: QueueState, source: int | None = None) -> None:
        self.states[key] = state
        for peer, session in self.sessions.items():
            if peer != source:
                session.local_update(key, state.summary())

    def process(self, peer: int) -> None:
        """Handle every pending event of the session with ``peer``."""
        session = self.sessions[peer]
        while (event := session.next_event()) is not None:
            if isinstance(event, NeedDelta):
                state = self.states.get(event.key)
                delta = None if state is None else core.delta(state, event.since, event.max_records)
                session.provide_delta(event.key, delta)
            elif isinstance(event, DeltaReceived):
                owner, name, kind = event.key
                before = self.states.get(event.key) or core.empty_state(owner, name, kind)
                after = core.merge(before, event.delta)
                # A frozen queue's summary stays put while its proof improves: that is news too.
                changed = after.summary() != before.summary() or after.fork != before.fork
                self.states[event.key] = after
                session.delta_applied(event.seq, after.summary(), changed)
                if changed:
                    self._changed(event.key, after, source=peer)


@dataclass
class SimNetwork:
    nodes: dict[int, SimNode] = field(default_factory=dict)
    wires: dict[tuple[int, int], deque[bytes]] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(1))
    window: int = 8
    max_records: int = 4096
    #: Probability that a message is lost. Sessions run over TCP, so a loss is a broken connection: the
    #: link goes down and is redialled ``redial_rounds`` later with fresh sessions (as the daemon does).
    loss: float = 0.0
    redial_rounds: int = 2
    round_number: int = 0
    _redial: list[tuple[int, int, int]] = field(default_factory=list)
    messages: int = 0
    #: Incarnations in HELLO and a :class:`PeerMemory` per peer kept across reconnects, as the daemon does
    #: (reconnect digests then list only what changed). Off: every connection starts from scratch.
    remember: bool = False
    depth: int = 4
    #: Optional protocol features every link agrees on as it starts (the daemon agrees a little later,
    #: once the peer answered; a session reads what either encoding sends at any time).
    features: frozenset[str] = frozenset()

    def add(self, name: int) -> SimNode:
        node = self.nodes[name] = SimNode(name, incarnation=_incarnation(name, 0))
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
            )
            node.sessions[y] = session
            self.wires[(x, y)] = deque()
        for x, y in ((a, b), (b, a)):
            node = self.nodes[x]
            memory = node.memories.pop(y, None) if self.remember else None
            node.sessions[y].start(node.summaries(), memory=memory)
            if self.features:
                node.sessions[y].agree_features(self.features)
            self._flush(x, y)

    def connected(self, a: int, b: int) -> bool:
        return b in self.nodes[a].sessions

    def random_graph(self, size: int, degree: int) -> None:
        """``size`` nodes, each dialling ``degree`` random others (random peer choice, as mDNS gives)."""
        for name in range(size):
            self.add(name)
        for name in range(size):
            for peer in self.rng.sample(range(size), degree + 1):
                if peer != name and peer not in self.nodes[name].sessions:
                    self.connect(name, peer)

    def disconnect(self, a: int, b: int) -> None:
        """The link breaks: what was in flight either way is lost, each side keeps what the daemon keeps."""
        for x, y in ((a, b), (b, a)):
            node = self.nodes[x]
            session = node.sessions.pop(y, None)
            self.wires.pop((x, y), None)
            if session is not None:
                memory = session.memory()
                session.release()
                if self.remember and memory is not None:
                    node.memories[y] = memory

    def restart(self, name: int) -> list[int]:
        """The node's daemon restarts: its links drop, it keeps its (durable) states, forgets its peers and
        comes back as a new incarnation. Returns the peers it was connected to."""
        node = self.nodes[name]
        peers = list(node.sessions)
        for peer in peers:
            self.disconnect(name, peer)
        node.memories.clear()
        node.incarnation = _incarnation(name, int.from_bytes(node.incarnation[8:], "big") + 1)
        return peers

    def deliver(self, x: int, y: int, count: int = 1, *, handle: bool = True) -> int:
        """Deliver the next ``count`` messages from ``x`` to ``y`` (in order); with ``handle``, ``y``
        answers each at once, as :meth:`round` does. Returns how many moved."""
        wire = self.wires.get((x, y))
        node = self.nodes[y]
        moved = 0
        while wire and moved < count:
            message = wire.popleft()
            moved += 1
            node.bytes_received += len(message)
            node.sessions[x].receive_message(message)
            if handle:
                node.process(x)
        self.messages += moved
        self._flush_node(y)
        return moved

    def handle(self, x: int, y: int) -> None:
        """Node ``x`` answers the pending events of its session with ``y`` (as that link's driver)."""
        if y in self.nodes[x].sessions:
            self.nodes[x].process(y)
            self._flush_node(x)

    def quiet(self) -> bool:
        """Nothing in flight, no redial due, and no session with events or messages waiting."""
        return not (
            any(self.wires.values())
            or self._redial
            or any(s.has_work() for node in self.nodes.values() for s in node.sessions.values())
        )

    def _flush_node(self, x: int) -> None:
        for y in self.nodes[x].sessions:
            self._flush(x, y)

    def _flush(self, x: int, y: int) -> None:
        session = self.nodes[x].sessions.get(y)
        if session is not None and (x, y) in self.wires:
            self.wires[(x, y)].extend(session.messages_to_send())

    def churn(self, name: int, peers: list[int]) -> None:
        """A node leaves (all its links drop) and comes back later connected to ``peers``."""
        for other in list(self.nodes[name].sessions):
            self.disconnect(name, other)
        for peer in peers:
            if peer != name:
                self._redial.append((self.round_number + self.redial_rounds, name, peer))

    def round(self) -> int:
        """Deliver everything in flight once (one network hop); returns how many messages moved."""
        self.round_number += 1
        due = [item for item in self._redial if item[0] <= self.round_number]
        self._redial = [item for item in self._redial if item[0] > self.round_number]
        for _, a, b in due:
            if b not in self.nodes[a].sessions:
                self.connect(a, b)
        in_flight = [(link, list(queue)) for link, queue in self.wires.items() if queue]
        for link, _ in in_flight:
            self.wires[link].clear()
        moved = 0
        for (x, y), messages in in_flight:
            node = self.nodes[y]
            for message in messages:
                session = node.sessions.get(x)
                if session is None:
                    break
                if self.loss and self.rng.random() < self.loss:
                    self.disconnect(x, y)
                    self._redial.append((self.round_number + self.redial_rounds, x, y))
                    break
                moved += 1
                node.bytes_received += len(message)
                session.receive_message(message)
                node.process(x)
        self.messages += moved
        self.settle()
        return moved

    def settle(self) -> None:
        """Let every host handle pending events (e.g. after a local write) and queue what they send."""
        for x, node in self.nodes.items():
            for y in node.sessions:
                node.process(y)
                self._flush(x, y)

    def run_until_quiet(self, max_rounds: int = 10_000) -> int:
        rounds = 0
        self.settle()
        while rounds < max_rounds and (any(self.wires.values()) or self._redial):
            self.round()
            rounds += 1
        return rounds

    def peak_until_quiet(self, measure: Callable[[], int], max_rounds: int = 10_000) -> int:
        """Run until quiet; the largest ``measure()`` seen after any round (e.g. deltas in flight)."""
        peak = 0
        self.settle()
        for _ in range(max_rounds):
            if not (any(self.wires.values()) or self._redial):
                break
            self.round()
            peak = max(peak, measure())
        return peak


def _incarnation(name: int, run: int) -> bytes:
    """16 bytes per run of a node, deterministic so that simulations replay."""
    return name.to_bytes(8, "big") + run.to_bytes(8, "big")
