"""A stream that passes everything through to the one it wraps, for tests that change one side of a real
peer's stream (pace its sends, record or rewrite its bytes) and keep the rest as it is."""

from __future__ import annotations

import trio


class PassThrough(trio.abc.HalfCloseableStream):
    """Every call goes to ``inner``: a subclass overrides what its test changes (usually ``send_all``)."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


__all__ = ["PassThrough"]
