"""Where a replication session is in its life, held as data: a state enum and one table of what may happen
in each state and where it leads (as h11's ``_state.py`` does), instead of flags scattered over methods.

Inputs are the host's commands (:class:`Command`) and the peer's messages (their classes, from
:mod:`latticed.protocol.replication_messages`). Anything the table does not list is illegal: the host's
own mistakes are a :class:`~latticed.errors.LocalProtocolError` (a bug here), the peer's a
:class:`~latticed.errors.RemoteProtocolError` (close that link).

    IDLE --start--> AWAITING_HELLO --HELLO--> OPEN
    IDLE --start(memory)--> DIGEST_DEFERRED --HELLO--> OPEN   (first digest sent on the HELLO)

Everything else (digests, deltas, ACKs, HAVE/WANT/PRUNE, pings) happens in OPEN and stays there; only a
local update and a ping may come before the peer's HELLO (the ping after ours).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Final

from latticed.errors import LocalProtocolError, RemoteProtocolError
from latticed.protocol.replication_messages import (
    Ack,
    Delta,
    Digest,
    Have,
    Hello,
    Message,
    Ping,
    Pong,
    Prune,
    Want,
)

__all__ = ["TRANSITIONS", "Command", "Input", "SessionState", "transition"]


class SessionState(Enum):
    #: Not started: nothing sent, nothing may be received.
    IDLE = "idle"
    #: Our HELLO and first digest are out; the peer's HELLO has not come.
    AWAITING_HELLO = "awaiting_hello"
    #: Our HELLO is out; our first digest waits for the peer's HELLO, whose incarnation says whether what
    #: we remember of the peer still holds (see ``PeerMemory``).
    DIGEST_DEFERRED = "digest_deferred"
    #: Both HELLOs exchanged: replicating.
    OPEN = "open"

    # Members are singletons compared by identity: hashed by identity too, in C (Enum's own hash is a
    # Python call, and every message and command looks the state and itself up in TRANSITIONS).
    __hash__ = object.__hash__


class Command(Enum):
    """What the host does to a session."""

    START = "start"
    START_REMEMBERING = "start with a memory of the peer"
    LOCAL_UPDATE = "local_update"
    PROVIDE_DELTA = "provide_delta"
    DELTA_APPLIED = "delta_applied"
    PING = "ping"

    __hash__ = object.__hash__  # as SessionState's


Input = Command | type[Message]

_IDLE, _AWAITING, _DEFERRED, _OPEN = SessionState

TRANSITIONS: Final[Mapping[SessionState, Mapping[Input, SessionState]]] = {
    _IDLE: {
        Command.START: _AWAITING,
        Command.START_REMEMBERING: _DEFERRED,
        Command.LOCAL_UPDATE: _IDLE,  # remembered; start() then replaces it with what we hold
    },
    _AWAITING: {Hello: _OPEN, Command.LOCAL_UPDATE: _AWAITING, Command.PING: _AWAITING},
    _DEFERRED: {Hello: _OPEN, Command.LOCAL_UPDATE: _DEFERRED, Command.PING: _DEFERRED},
    _OPEN: {
        **dict.fromkeys((Digest, Delta, Ack, Have, Want, Prune, Ping, Pong), _OPEN),
        **dict.fromkeys(
            (Command.LOCAL_UPDATE, Command.PROVIDE_DELTA, Command.DELTA_APPLIED, Command.PING), _OPEN
        ),
    },
}


def transition(state: SessionState, event: Input) -> SessionState:
    """The state after ``event``, or the typed error that says whose mistake it is."""
    following = TRANSITIONS[state].get(event)
    if following is not None:
        return following
    if isinstance(event, Command):
        if event in (Command.START, Command.START_REMEMBERING):
            raise LocalProtocolError("session already started")
        raise LocalProtocolError(f"{event.value} while the session is {state.value}")
    name = event.__name__.upper()
    if state is _IDLE:
        raise LocalProtocolError(f"a {name} was fed to a session not started yet")
    if event is Hello:
        raise RemoteProtocolError("HELLO twice")
    raise RemoteProtocolError(f"the first message must be HELLO, not {name}")
