"""``latticectl bundle`` calls of the blocking client: :class:`BundleOps` is mixed into
:class:`~latticed.api.client.blocking_client.Client` (the daemon side is
:mod:`latticed.api.server.bundle_handlers`).

Bundles stream through the socket on a dedicated connection, a megabyte a frame, so memory stays bounded
on both sides and the daemon never opens a path the client names."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from latticed.api.messages import API_VERSION, error_from_reply, is_unknown_op, version_gap
from latticed.errors import LatticedError, RemoteProtocolError

__all__ = ["BundleOps"]

#: Called with (records so far, records in all) while a bundle is written or merged.
Progress = Callable[[int, int], None]


class BundleStream(Protocol):
    """What a bundle needs of a connection (the client's ``_Connection``)."""

    def send(self, message: dict[str, Any]) -> None: ...

    def receive(self) -> dict[str, Any]: ...

    def reply_ready(self) -> bool: ...

    def close(self) -> None: ...


def _noop(_done: int, _total: int) -> None:
    return None


class BundleOps:
    """Bundle want, export and import, as client methods."""

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        raise NotImplementedError

    def open_stream(self, timeout: float | None) -> BundleStream:
        raise NotImplementedError

    def _stream_error(self, op: str, reply: dict[str, Any]) -> LatticedError:
        error = error_from_reply(reply.get("error"))
        if is_unknown_op(error):
            return version_gap(op, error, self.call("hello"))
        return error

    def bundle_want(self) -> bytes:
        """This daemon's want file: a summary of every log it holds, for another daemon's export."""
        want = self.call("bundle_want")["want"]
        if not isinstance(want, bytes):
            raise RemoteProtocolError("latticed sent a want file that is not bytes")
        return want

    def bundle_export(
        self,
        write: Callable[[bytes], object],
        *,
        want: bytes | None = None,
        select: Sequence[str] = (),
        progress: Progress = _noop,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Write a bundle through ``write``, piece by piece: the logs ``select`` names (globs on NAME or
        OWNER/NAME; none: all), only what ``want`` (a want file) says the other side lacks. Returns
        ``logs``, ``records`` and ``bytes``."""
        request: dict[str, Any] = {"v": API_VERSION, "id": 1, "op": "bundle_export", "select": list(select)}
        if want is not None:
            request["want"] = want
        conn = self.open_stream(timeout)
        try:
            conn.send(request)
            total = 0
            left_out: list[str] = []
            while True:
                reply = conn.receive()
                if not reply.get("ok"):
                    raise self._stream_error("bundle_export", reply)
                if reply.get("done"):
                    done = {k: reply.get(k) for k in ("logs", "records", "bytes")}
                    return {**done, "core2_left_out": left_out} if left_out else done
                if "total_records" in reply:
                    total = int(reply["total_records"])
                    left_out = [str(a) for a in reply.get("core2_left_out") or ()]
                data = reply.get("data")
                if isinstance(data, bytes):
                    write(data)
                    progress(int(reply.get("records", 0)), total)
        finally:
            conn.close()

    def bundle_import(
        self,
        chunks: Iterable[bytes],
        *,
        sent: Callable[[int], None] | None = None,
        progress: Progress = _noop,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send a bundle's bytes (``chunks``, a megabyte or so each); the daemon verifies all of it, then
        merges it. ``sent`` hears of each chunk's size as it goes, ``progress`` of the merge. Returns
        ``logs``, ``records``, ``changed`` (deltas that brought news) and ``skipped`` (logs whose records
        did not connect to what the daemon holds). A damaged bundle raises an IntegrityError (nothing of it
        was stored); something that is not a bundle a MalformedError."""
        conn = self.open_stream(timeout)
        try:
            conn.send({"v": API_VERSION, "id": 1, "op": "bundle_import"})
            for chunk in chunks:
                if conn.reply_ready():  # refused already: say why rather than send the rest
                    break
                conn.send({"data": chunk})
                if sent is not None:
                    sent(len(chunk))
            else:
                conn.send({"end": True})
            while True:
                reply = conn.receive()
                if not reply.get("ok"):
                    raise self._stream_error("bundle_import", reply)
                if reply.get("done"):
                    return {k: reply.get(k) for k in ("logs", "records", "changed", "skipped")}
                if "progress" in reply:
                    progress(int(reply["progress"]), int(reply.get("total_records", 0)))
        finally:
            conn.close()
