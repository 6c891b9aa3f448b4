"""The trio shell around the handshake and the secure channel: it only moves bytes and owns the timeout.

``secure_connect`` / ``secure_accept`` turn any ``trio.abc.Stream`` (TCP, or memory streams in tests) into a
:class:`SecureStream` of authenticated, encrypted messages. Every failure surfaces as a
:class:`~latticed.errors.LatticedError`: :class:`HandshakeError` when authentication fails (including a peer
that hangs up mid-handshake, which is how a peer with another network key or allow-list refuses us),
:class:`ConnectionClosedError` when the peer goes away, never answers or cuts the stream, and
:class:`RemoteProtocolError` for a forged or malformed frame. A failed handshake closes the stream.

Why one module: the handshake's driver and :class:`SecureStream` share the error mapping and the stream's
locks and timeouts, and the direct socket fast paths only make sense next to the trio paths they skip.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from collections.abc import Callable
from typing import Final

import trio

from latticed.errors import ConnectionClosedError, HandshakeError, LatticedError
from latticed.protocol.handshake import (
    FRESHNESS_WINDOW_MS,
    Allowed,
    Handshake,
    HandshakeResult,
    HandshakeState,
    Initiator,
    ReplayCache,
    Responder,
    Role,
)
from latticed.protocol.secure import DEFAULT_MAX_MESSAGE_SIZE, SecureChannel

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "SecureStream",
    "connect_failure",
    "open_peer",
    "secure_accept",
    "secure_connect",
]

#: Seconds a peer gets to complete the handshake (connect included, for :func:`open_peer`).
DEFAULT_HANDSHAKE_TIMEOUT: Final = 10.0
_RECEIVE_SIZE: Final = 1 << 16
# How long aclose() tries to get the final frame out to a peer that is not reading before it just closes.
_CLOSE_TIMEOUT: Final = 1.0
# Reads that found data at once, one after the other, before one yields to the scheduler anyway.
_MAX_READS_UNYIELDED: Final = 16
# Reads :meth:`SecureStream.peer_ended` makes at most (it runs on the loop without yielding: a peer that
# floods a link it stopped reading must not hold the daemon there).
_MAX_END_READS: Final = 4
# With a send timeout, a frame goes out in pieces of at most this size (see :func:`_pieces`).
_SEND_CHUNK: Final = 1 << 16
#: :meth:`SecureStream.send_many` joins frames into writes of about this size.
_SEND_BATCH: Final = 1 << 20
#: The one floor of a slow honest link, in bytes a second, for both ends of it: below it a frame still
#: arriving no longer counts as hearing its peer (:attr:`SecureStream.progress_at`), and a send whose
#: peer takes its bytes slower falls behind its credit until ``slow_timeout`` gives it up (:meth:`_write`).
#: A link moving at this rate or faster is kept by both ends (4 KiB/s is 32 kbit/s), however large its
#: messages; a trickle that never makes a message holds a link at most ``max_message_size`` bytes' worth
#: of this (256 s for 1 MiB) past its first byte, and then fails authentication.
MIN_PROGRESS_RATE: Final = 4096
# Openings already answered, for responders not given a cache of their own (one per process).
_SHARED_REPLAY_CACHE: Final = ReplayCache()
# The message a hang-up interrupted (HandshakeError.waiting_for).
_WAITING_FOR: Final = {
    HandshakeState.WAIT_MSG1: "msg1",
    HandshakeState.WAIT_MSG2: "msg2",
    HandshakeState.WAIT_MSG3: "msg3",
    HandshakeState.WAIT_MSG4: "msg4",
}


def _wall_clock_ms() -> int:
    """msg1's time is compared across hosts: Unix time, not trio's clock."""
    return time.time_ns() // 1_000_000


class SecureStream(trio.abc.AsyncResource):
    """Authenticated, encrypted, ordered messages over a byte stream.

    Tasks may send and receive concurrently: each direction is serialized by a FIFO lock, since frames must
    hit the wire in the order they were sealed. For a graceful end call
    :meth:`send_eof`, read until :meth:`receive` returns ``None``, then :meth:`aclose`.

    With a ``send_timeout`` (seconds), a send whose peer takes nothing for ``send_timeout`` (it stopped
    reading), or takes its bytes slower than :data:`MIN_PROGRESS_RATE` (the receiving end's floor too)
    until it is ``slow_timeout`` behind that rate, fails with
    :class:`ConnectionClosedError` and leaves the stream unusable (:attr:`send_stalled`); a peer taking
    them at the floor rate or faster is not cut off, however long a large message takes.
    """

    def __init__(
        self, stream: trio.abc.Stream, channel: SecureChannel, *, send_timeout: float | None = None
    ) -> None:
        self._stream = stream
        self._channel = channel
        self._send_lock = trio.StrictFIFOLock()
        self._receive_lock = trio.StrictFIFOLock()
        self._send_broken = False
        self._send_stalled = False
        self._closed = False
        #: Seconds a send may go without progress before the peer is given up (None: forever).
        self.send_timeout = send_timeout
        #: Seconds a moving send may fall behind :data:`MIN_PROGRESS_RATE` before the peer is given up
        #: (None: ``send_timeout``); the gossip layer sets its receiving end's silence bound here.
        self.slow_timeout: float | None = None
        #: A TCP stream's (non-blocking) socket, written and read directly while that does not block.
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._reads_unyielded = 0
        #: The last direct read emptied the socket: the next one waits for bytes without trying first.
        self._drained = False
        #: The rest of frames :meth:`send_now` sealed that the socket did not take: written first by the
        #: next send (frames must reach the wire whole and in the order they were sealed).
        self._unsent: bytes | memoryview | None = None
        #: When the send under way began waiting for the peer to take its piece (trio time), else None.
        self._blocked_since: float | None = None
        #: When the first bytes of the frame being received arrived (trio time), None between frames.
        self._frame_since: float | None = None
        self._progress_at = -math.inf

    @property
    def remote_public_key(self) -> bytes:
        """The peer's authenticated Ed25519 public key."""
        return self._channel.remote_public_key

    @property
    def handshake(self) -> HandshakeResult:
        """The handshake outcome (peer identity, ``session_id``)."""
        return self._channel.handshake

    @property
    def max_message_size(self) -> int:
        """Largest message sent or accepted."""
        return self._channel.max_message_size

    @property
    def transport_stream(self) -> trio.abc.Stream:
        """The underlying byte stream."""
        return self._stream

    @property
    def blocked_since(self) -> float | None:
        """When the send under way began waiting for the peer to take a piece of it (trio time; None:
        no send waits). A link whose writer waits long while its peer dials again is dead on that side."""
        return self._blocked_since

    @property
    def progress_at(self) -> float:
        """When the peer was last heard from short of a whole message (trio time; ``-inf``: never): bytes
        of a frame still arriving, credited at most ``1 / MIN_PROGRESS_RATE`` seconds a byte since the
        frame's first bytes. So a link whose large message takes longer than the silence bound is not
        given up while the message arrives at :data:`MIN_PROGRESS_RATE` or faster, and bytes trickled
        slower (or an endless run of them: a frame ends at ``max_message_size``) stop counting."""
        return self._progress_at

    def peer_ended(self) -> bool:
        """Whether the peer closed on purpose: its final frame is among what was read, or what the socket
        holds now (at most :data:`_MAX_END_READS` reads, without waiting; messages before it are
        dropped). For a link already ending (the receiver no longer reads): a send that failed on a peer
        that had just closed is still its clean end, not a lost link."""
        channel = self._channel
        if channel.remote_closed:
            return True
        lock = self._receive_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            return False
        try:
            for _ in range(_MAX_END_READS):
                data = self._read_now()
                if data is None:
                    break
                channel.receive_data(data)
                if not data:
                    break
            while channel.next_message() is not None:
                pass
            return channel.remote_closed
        except (LatticedError, trio.ClosedResourceError, OSError):
            return channel.remote_closed
        finally:
            lock.release()

    @property
    def send_stalled(self) -> bool:
        """Whether a send failed because the peer took nothing for ``send_timeout`` seconds."""
        return self._send_stalled

    async def send(self, message: bytes | bytearray | memoryview) -> None:
        """Send one message (at most ``max_message_size`` bytes)."""
        async with self._send_lock:
            self._check_can_send()
            await self._write_unsent()
            await self._write(self._channel.seal(message))

    async def send_many(self, messages: list[bytes]) -> None:
        """Send several messages, each sealed as its own frame, in order: small ones share a write (one
        syscall for a burst of answers), at most :data:`_SEND_BATCH` bytes each. Nothing to send is
        not a checkpoint: callers flush after every event, most of the time with nothing queued."""
        if not messages and self._unsent is None:
            return
        lock = self._send_lock
        try:
            lock.acquire_nowait()  # free (the usual case): no scheduler pass of its own before the write
        except trio.WouldBlock:
            await lock.acquire()
        try:
            self._check_can_send()
            await self._write_unsent()
            seal, batch, size = self._channel.seal, list[bytes](), 0
            for message in messages:
                frame = seal(message)
                batch.append(frame)
                size += len(frame)
                if size >= _SEND_BATCH:
                    await self._write(b"".join(batch))
                    batch, size = [], 0
            if batch:
                await self._write(b"".join(batch) if len(batch) > 1 else batch[0])
        finally:
            lock.release()

    def send_now(self, messages: list[bytes]) -> bool:
        """Send ``messages`` from any task without waiting, if the stream is a TCP one and no send is under
        way: each is sealed and written at once; what the socket does not take right now waits in the
        stream, and the next :meth:`send_many` (with or without messages) writes it first. False: nothing
        was sent (the caller sends them the usual way). A failed write marks the stream broken, raises
        nothing: the next send raises :class:`ConnectionClosedError` in the task that owns the link."""
        if self._socket is None or self._unsent is not None or self._send_broken or self._closed:
            return False
        # A send under way (``send_many`` holds the lock across its waits) goes first. This method does
        # not wait, so no other task runs before it returns: it need not take the lock itself to keep
        # frames whole and in order, only find it free (trio's lock has no waiters when it has no owner).
        if self._send_lock.locked():
            return False
        seal = self._channel.seal
        frame = seal(messages[0]) if len(messages) == 1 else b"".join([seal(m) for m in messages])
        try:
            written = self._write_now(frame)
        except (trio.ClosedResourceError, OSError):
            self._send_broken = True
            return True
        if written < len(frame):
            self._unsent = memoryview(frame)[written:]
        return True

    def can_send_now(self) -> bool:
        """Whether :meth:`send_now` would send (a TCP stream, no send under way, nothing left unsent)."""
        return (
            self._socket is not None
            and self._unsent is None
            and not self._send_broken
            and not self._closed
            and not self._send_lock.locked()
        )

    @property
    def has_unsent(self) -> bool:
        """Whether :meth:`send_now` left bytes that the next send must write first."""
        return self._unsent is not None

    async def _write_unsent(self) -> None:
        unsent, self._unsent = self._unsent, None
        if unsent is not None:
            await self._write(unsent)

    async def send_eof(self) -> None:
        """Send the final frame: we will send nothing more, but keep receiving. Idempotent."""
        async with self._send_lock:
            if self._channel.local_closed:
                return
            self._check_can_send()
            await self._write_unsent()
            await self._write(self._channel.close())
            if isinstance(self._stream, trio.abc.HalfCloseableStream):
                # The final frame is out; failing to half-close as well loses nothing.
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    await self._stream.send_eof()

    async def receive(self) -> bytes | None:
        """The next message, or ``None`` once the peer ended cleanly.

        A stream cut off before the peer's final frame raises :class:`ConnectionClosedError`.

        Taking the (usually free) lock is no scheduler pass of its own, so a message already read is
        returned at once; the socket read yields as usual when more bytes are needed.
        """
        lock = self._receive_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            channel = self._channel
            fresh = False
            while True:
                message = channel.next_message()
                if message is not None:
                    self._frame_since = None
                    return message
                if fresh:
                    self._progress(channel.pending)
                if channel.remote_closed:
                    return None
                if self._closed:
                    raise ConnectionClosedError("secure stream was closed locally")
                try:
                    now = None if self._drained else self._read_now()
                    if now is None and self._socket is not None:
                        # Wait for bytes and read them ourselves: trio's receive_some would first try
                        # the read that just failed (or that the last short read says would fail), a
                        # syscall and its wrappers per message.
                        self._drained = False
                        await trio.lowlevel.wait_readable(self._socket)
                        self._reads_unyielded = 0
                        continue
                    data = await self._stream.receive_some(_RECEIVE_SIZE) if now is None else now
                except trio.ClosedResourceError as error:
                    raise ConnectionClosedError("secure stream was closed locally") from error
                except (trio.BrokenResourceError, OSError) as error:
                    raise ConnectionClosedError(f"connection to peer lost: {error}") from error
                channel.receive_data(data)
                fresh = bool(data)
                if now is None:
                    self._reads_unyielded = 0
                elif self._reads_unyielded >= _MAX_READS_UNYIELDED:
                    self._reads_unyielded = 0
                    await trio.lowlevel.checkpoint()  # a peer that never lets up starves no one
        finally:
            lock.release()

    def _progress(self, pending: int) -> None:
        """Credit ``pending`` bytes of the frame in progress, just read (see :attr:`progress_at`)."""
        if not pending:
            return
        now = trio.current_time()
        since = self._frame_since
        if since is None:
            self._frame_since = since = now
        self._progress_at = max(self._progress_at, min(now, since + pending / MIN_PROGRESS_RATE))

    def _read_now(self) -> bytes | None:
        """What the TCP socket holds already (``b""``: the peer's end), None if it holds nothing (or this
        is no TCP stream). A read that needs no waiting is no scheduler pass: a relay reads a delta and
        an ACK per record, and each pass of trio's loop costs as much as the read."""
        sock = self._socket
        if sock is None:
            return None
        try:
            data = os.read(sock.fileno(), _RECEIVE_SIZE)  # -1 once closed: EBADF, as a closed socket
        except BlockingIOError:
            return None
        except OSError as error:
            if sock.fileno() == -1:
                raise trio.ClosedResourceError from error
            raise
        self._reads_unyielded += 1
        self._drained = len(data) < _RECEIVE_SIZE  # it emptied the socket: the next read waits first
        return data

    def _write_now(self, frame: bytes | memoryview) -> int:
        """Write what the TCP socket takes without waiting; the count of bytes written (0: none, or no
        TCP stream). The rest goes through the stream, which waits for room."""
        sock = self._socket
        if sock is None:
            return 0
        try:
            return os.write(sock.fileno(), frame)
        except BlockingIOError:
            return 0
        except OSError as error:
            if sock.fileno() == -1:
                raise trio.ClosedResourceError from error
            raise

    async def aclose(self) -> None:
        """Send the final frame if we can, then close the underlying stream (always, even if cancelled)."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._send_broken and not self._channel.local_closed and not self._send_lock.locked():
                with trio.move_on_after(_CLOSE_TIMEOUT):
                    await self._write_unsent()
                    await self._write(self._channel.close())
        except LatticedError:
            pass  # the peer is gone already: it will see a cut-off stream, which is the truth
        finally:
            await trio.aclose_forcefully(self._stream)

    def _check_can_send(self) -> None:
        if self._closed:
            raise ConnectionClosedError("secure stream was closed locally")
        if self._send_broken:
            raise ConnectionClosedError("an earlier send failed midway; the connection is unusable")

    async def _write(self, frame: bytes | memoryview) -> None:
        # Any interruption may leave a partial frame on the wire, or a sealed frame unsent (which the peer
        # would see as a gap): either way the stream is done for.
        timeout = self.send_timeout
        try:
            written = self._write_now(frame)
            if written == len(frame):
                return
            if written:
                frame = memoryview(frame)[written:]
            try:
                if timeout is None:
                    self._blocked_since = trio.current_time()
                    await self._stream.send_all(frame)
                    return
                # Credit for the bytes through, as the receiver counts them (progress_at): at most
                # 1 / MIN_PROGRESS_RATE s a byte since the wait began, never past the clock.
                start = credit = trio.current_time()
                behind = timeout if self.slow_timeout is None else max(timeout, self.slow_timeout)
                through = 0
                for piece in _pieces(frame, timeout):
                    self._blocked_since = now = trio.current_time()
                    with trio.move_on_at(min(now + timeout, credit + behind)) as waited:
                        await self._stream.send_all(piece)
                    if waited.cancelled_caught:
                        self._send_stalled = True
                        raise ConnectionClosedError(
                            f"peer stopped reading: it took nothing for {timeout:g} s, or less than "
                            f"{MIN_PROGRESS_RATE} B/s until {behind:g} s behind"
                        )
                    through += len(piece)
                    credit = min(trio.current_time(), start + through / MIN_PROGRESS_RATE)
            finally:
                self._blocked_since = None
        except trio.ClosedResourceError as error:
            self._send_broken = True
            raise ConnectionClosedError("secure stream was closed locally") from error
        except (trio.BrokenResourceError, OSError) as error:
            self._send_broken = True
            raise ConnectionClosedError(f"connection to peer lost: {error}") from error
        except BaseException:
            self._send_broken = True
            raise


def _pieces(frame: bytes | memoryview, timeout: float) -> list[bytes | memoryview]:
    """``frame`` in pieces that take at most half of ``timeout`` at the floor rate: a peer taking them at
    :data:`MIN_PROGRESS_RATE` never waits a whole timeout for one piece's credit."""
    size = max(1, min(_SEND_CHUNK, int(timeout * MIN_PROGRESS_RATE) // 2))
    if len(frame) <= size:
        return [frame]
    view = memoryview(frame)
    return [view[start : start + size] for start in range(0, len(view), size)]


async def _run_handshake(
    stream: trio.abc.Stream,
    make_handshake: Callable[[], Handshake],
    timeout: float | None,
    max_message_size: int,
) -> SecureStream:
    try:
        handshake = make_handshake()
        with trio.fail_after(math.inf if timeout is None else timeout):
            if handshake.role is Role.INITIATOR:
                await stream.send_all(handshake.initiate())
            while not handshake.done:
                data = await stream.receive_some(_RECEIVE_SIZE)
                if not data:
                    raise HandshakeError(
                        f"peer hung up during the handshake (state {handshake.state.value}): it has another "
                        "network key, refuses our identity, runs an older latticed (handshake v1), its "
                        f"clock differs from ours by more than {FRESHNESS_WINDOW_MS // 1000} s, or it went "
                        "away",
                        waiting_for=_WAITING_FOR.get(handshake.state),
                    )
                out = handshake.receive_data(data)
                if out:
                    await stream.send_all(out)
        channel = SecureChannel(handshake.result, max_message_size=max_message_size)
        trailing = handshake.trailing_data  # frames the responder pipelined behind msg4
        if trailing:
            channel.receive_data(trailing)
    except BaseException as error:
        await trio.aclose_forcefully(stream)
        if isinstance(error, trio.TooSlowError):
            raise ConnectionClosedError(f"handshake not completed within {timeout} s") from error
        if isinstance(error, trio.BrokenResourceError | trio.ClosedResourceError | OSError):
            raise ConnectionClosedError(f"connection lost during the handshake: {error}") from error
        raise
    return SecureStream(stream, channel)


async def secure_connect(
    stream: trio.abc.Stream,
    *,
    seed: bytes,
    network_key: bytes,
    public_key: bytes | None = None,
    allowed: Allowed | None = None,
    timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> SecureStream:
    """Run the handshake as initiator over ``stream``; the peer must be in ``allowed`` if given."""
    return await _run_handshake(
        stream,
        lambda: Initiator(
            seed=seed,
            network_key=network_key,
            now_ms=_wall_clock_ms(),
            public_key=public_key,
            allowed=allowed,
        ),
        timeout,
        max_message_size,
    )


async def secure_accept(
    stream: trio.abc.Stream,
    *,
    seed: bytes,
    network_key: bytes,
    public_key: bytes | None = None,
    allowed: Allowed | None = None,
    timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    replay_cache: ReplayCache | None = None,
    source: str = "",
) -> SecureStream:
    """Run the handshake as responder over ``stream`` (e.g. in a ``trio.serve_tcp`` handler).

    ``replay_cache`` holds the openings already answered (default: one shared by the whole process), so
    a recorded msg1 replayed to us gets no answer; ``source`` is where the connection came from
    (``latticed.net.admission.source_of``): each source's openings count against its own share of the
    cache, so one source flooding it locks out no one else."""
    cache = (_SHARED_REPLAY_CACHE if replay_cache is None else replay_cache).for_source(source)
    return await _run_handshake(
        stream,
        lambda: Responder(
            seed=seed,
            network_key=network_key,
            now_ms=_wall_clock_ms(),
            public_key=public_key,
            allowed=allowed,
            replay_cache=cache,
        ),
        timeout,
        max_message_size,
    )


def connect_failure(error: OSError) -> str:
    """Why a TCP connect failed, once: "Connection refused", not trio's "all attempts to connect to X
    failed" around "Error connecting to (X): Connection refused" (the caller names the address)."""
    cause = error.__cause__
    leaves = cause.exceptions if isinstance(cause, BaseExceptionGroup) else (error,)
    reasons = []
    for leaf in leaves:
        if isinstance(leaf, socket.gaierror) or not isinstance(leaf, OSError):
            reasons.append(str(leaf.strerror if isinstance(leaf, OSError) else leaf))
        elif leaf.errno:
            reasons.append(os.strerror(leaf.errno))
        else:
            reasons.append(leaf.strerror or str(leaf))
    return ", ".join(dict.fromkeys(r for r in reasons if r)) or str(error)


async def open_peer(
    host: str,
    port: int,
    *,
    seed: bytes,
    network_key: bytes,
    public_key: bytes | None = None,
    allowed: Allowed | None = None,
    timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> SecureStream:
    """Connect over TCP and run the handshake as initiator; ``timeout`` covers both."""
    deadline = trio.current_time() + (math.inf if timeout is None else timeout)
    try:
        with trio.fail_at(deadline):
            stream = await trio.open_tcp_stream(host, port)
    except trio.TooSlowError as error:
        raise ConnectionClosedError(
            f"cannot connect to {host}:{port}: timed out after {timeout} s"
        ) from error
    except OSError as error:
        raise ConnectionClosedError(f"cannot connect to {host}:{port}: {connect_failure(error)}") from error
    remaining = None if timeout is None else max(0.0, deadline - trio.current_time())
    return await secure_connect(
        stream,
        seed=seed,
        network_key=network_key,
        public_key=public_key,
        allowed=allowed,
        timeout=remaining,
        max_message_size=max_message_size,
    )
