"""From a request frame to its reply: parse and check the envelope, then run its handler from the op table.

Shared by the connection loop (:mod:`.api_server`) and the subscribe stream (:mod:`.subscribe`), which
answers ordinary requests on its own connection; neither imports the other. A pipelined request begins
here too (:func:`begin_pipelined`), and a write refused by the start gate waits for it here.
"""

from __future__ import annotations

from typing import Any

from latticed.api.messages import MAP_FIRST_BYTES, SUPPORTED_VERSIONS, error_reply, unpack_request
from latticed.api.server.context import Context, OpTable, PipelinedHandler
from latticed.errors import BehindPeersError, LatticedError, MalformedError, ProtocolError
from latticed.process.logs import get_logger, log_event
from latticed.storage.jobs import SUBMITTER, Job, Submitter

log = get_logger(__name__)

#: A request is a map: anything else is refused before it is decoded, since a frame of tiny containers
#: decodes to tens of times its size in objects.
_MAP_FIRST_BYTES = MAP_FIRST_BYTES
_NOT_A_MAP = "a request is a map with 'v', 'id' and 'op'"


def parse_request(frame: bytes, ops: OpTable) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The request (of an op in ``ops``), or the error reply to send instead."""
    if not frame or frame[0] not in _MAP_FIRST_BYTES:
        return None, error_reply(None, MalformedError(_NOT_A_MAP))
    try:
        request = unpack_request(frame)
    except MalformedError as exc:
        return None, error_reply(None, exc)
    if not isinstance(request, dict):
        return None, error_reply(None, MalformedError(_NOT_A_MAP))
    rid = request.get("id")
    if not (rid is None or isinstance(rid, int | str)):
        return None, error_reply(None, MalformedError("a request 'id' is an integer or a string"))
    version = request.get("v")
    op = request.get("op")
    if version not in SUPPORTED_VERSIONS and op != "hello":
        return None, error_reply(
            rid,
            ProtocolError(
                f"unsupported API version {version!r}; this daemon speaks {list(SUPPORTED_VERSIONS)}"
            ),
        )
    if not isinstance(op, str) or not ops.knows(op):
        shown = repr(op)[:60]
        return None, error_reply(rid, ProtocolError(f"unknown op {shown}"))
    return request, None


async def dispatch(ctx: Context, request: dict[str, Any]) -> dict[str, Any]:
    rid = request.get("id")
    handler = ctx.ops.handlers[request["op"]]
    try:
        try:
            result = await handler(ctx, request)
        except BehindPeersError:
            # Refused by the catch-up after a start (the owner fence is checked before anything is
            # written): wait for it, bounded, and run the request again once; any other cause stands.
            if not await waited_for_start_gate(ctx):
                raise
            result = await handler(ctx, request)
    except LatticedError as exc:
        return error_reply(rid, exc)
    except Exception as exc:
        log_event(log, "api.handler_failed", level=40, exc_info=exc, op=request.get("op"))
        return error_reply(rid, LatticedError(f"internal error: {type(exc).__name__}"))
    result["id"] = rid
    result["ok"] = True
    return result


def begin_pipelined(
    ctx: Context, begin: PipelinedHandler, request: dict[str, Any], submitter: Submitter
) -> tuple[Job, Any] | LatticedError:
    """A pipelined request's job (carrying ``submitter`` from its start) and reply builder, or why it
    could not start."""
    # ``submitting(submitter)`` spelled out: a generator context manager is ~8 calls a request.
    token = SUBMITTER.set(submitter)
    try:
        try:
            return begin(ctx, request)
        finally:
            SUBMITTER.reset(token)
    except LatticedError as exc:
        return exc
    except Exception as exc:
        log_event(log, "api.handler_failed", level=40, exc_info=exc, op=request.get("op"))
        return LatticedError(f"internal error: {type(exc).__name__}")


async def waited_for_start_gate(ctx: Context) -> bool:
    """After a write's BehindPeersError: True if the start gate was closed and opened since (waited for,
    bounded by its deadline), so the write may run once more; False if another cause refused it."""
    view = ctx.replication
    return view is not None and await view.wait_start_gate()


__all__ = ["begin_pipelined", "dispatch", "parse_request", "waited_for_start_gate"]
