"""``latticectl bundle want|export|import``: sync two daemons that share no network, through a file.

``want`` writes what this daemon holds (small); ``export`` writes a bundle of what the other side lacks
(everything without ``--want``), ``import`` verifies every byte of one as a peer link would and merges
it. A bundle is signed, not encrypted: whoever holds the file can read what it carries, except sealed
queues and KV namespaces, which travel as the envelopes only their readers open (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, BinaryIO

import typer

from cli.common import JsonFlag, note, settings
from cli.output import emit, write_bytes
from cli.progress import bar
from latticed.api.client.blocking_client import Client
from latticed.errors import MalformedError

#: Bytes read from the file per frame sent to the daemon.
CHUNK_BYTES = 1 << 20
#: Records below this export or merge too fast to need a bar.
MIN_RECORDS_FOR_BAR = 20_000

bundle_app = typer.Typer(
    help="Sync with no network: write what another daemon lacks to a file, verify and merge such a file.",
    no_args_is_help=True,
)


def _client(ctx: typer.Context) -> Client:
    # No reply timeout: a large bundle takes as long as it takes (progress shows it is alive).
    return ctx.find_root().with_resource(Client(settings(ctx).socket_path, timeout=None))


@bundle_app.command("want")
def want(
    ctx: typer.Context,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")
    ] = None,
) -> None:
    """Write a summary of everything this daemon holds (give it to the other daemon's `bundle export
    --want`, so its bundle carries only what is missing here)."""
    data = _client(ctx).bundle_want()
    if output is not None:
        output.write_bytes(data)
        return
    if sys.stdout.isatty():
        raise MalformedError("the want file is binary: redirect it (bundle want > want.lat) or use -o FILE")
    write_bytes(data)


@contextlib.contextmanager
def _replaced(path: Path) -> Iterator[BinaryIO]:
    """``path`` written through a temporary file beside it, renamed over it only once complete (a failed
    export leaves no partial bundle)."""
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as out:
        try:
            yield out
            out.flush()
            os.fsync(out.fileno())
        except BaseException:
            out.close()
            tmp.unlink(missing_ok=True)
            raise
    tmp.replace(path)


@bundle_app.command("export")
def export(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(metavar="FILE", help="The bundle to write.")],
    select: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[NAME|PATTERN]...",
            help="Queues and KV namespaces (kv) by NAME, OWNER/NAME or glob (default: everything held).",
        ),
    ] = None,
    want_file: Annotated[
        Path | None,
        typer.Option(
            "--want", metavar="WANT", help="The other side's `bundle want`: export only what it lacks."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Write a bundle: verifiable deltas, heads, metadata and fork proofs of the logs asked for."""
    want_bytes = want_file.read_bytes() if want_file is not None else None
    client = _client(ctx)
    with _replaced(file) as out, _Bar("exporting") as shown:
        result = client.bundle_export(out.write, want=want_bytes, select=select or (), progress=shown)
    if as_json:
        emit(result, None, as_json=True)
        return
    note(f"exported {result['records']} records of {result['logs']} logs to {file} ({result['bytes']} bytes)")
    if result.get("core2_left_out"):
        note(
            f"not in the bundle: {len(result['core2_left_out'])} queues on fork core 2, which bundles do not "
            "carry yet (they replicate over links; create queues with --core 1 to move them by bundle)"
        )


@bundle_app.command("import")
def import_(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(metavar="FILE", help="The bundle to verify and merge.")],
    as_json: JsonFlag = False,
) -> None:
    """Verify every byte of a bundle (signatures, hash chains, the file's digest), then merge it. A damaged
    bundle is refused whole (exit 6): nothing of it is stored. Importing it again changes nothing."""
    client = _client(ctx)
    size = file.stat().st_size
    with open(file, "rb") as source, _Bar("merging") as merging:
        # The bytes' bar (sending and verifying) gives way to the records' bar when the merge begins.
        merging.before(bar(size if size >= CHUNK_BYTES * 8 else None, "verifying"))
        result = client.bundle_import(_chunks(source), sent=merging.sent, progress=merging)
    if as_json:
        emit(result, None, as_json=True)
        return
    note(
        f"imported {file}: {result['records']} records of {result['logs']} logs "
        f"({result['changed']} chunks changed this daemon)"
    )
    for item in result.get("skipped") or ():
        note(f"skipped {item['log']}: {item['reason']}")


def _chunks(source: BinaryIO) -> Iterator[bytes]:
    while chunk := source.read(CHUNK_BYTES):
        yield chunk


def _ignore(_n: int) -> None:
    return None


class _Bar:
    """A bar over records that appears once the daemon says how many there are (if worth one)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._stack = contextlib.ExitStack()
        self._advance: Callable[[int], None] | None = None
        self._shown = 0
        self._total = -1
        self._first = contextlib.ExitStack()
        self._sent: Callable[[int], None] = _ignore

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self._first.close()
        self._stack.close()

    def before(self, first: contextlib.AbstractContextManager[Callable[[int], None]]) -> None:
        """Show ``first`` (a bar over bytes) until the records' bar appears."""
        self._first = contextlib.ExitStack()
        self._sent = self._first.enter_context(first)

    def sent(self, nbytes: int) -> None:
        self._sent(nbytes)

    def __call__(self, done: int, total: int) -> None:
        if self._total < 0:
            self._first.close()
            self._total = total
            if total >= MIN_RECORDS_FOR_BAR:
                self._advance = self._stack.enter_context(bar(total, self.label))
        if self._advance is not None and done > self._shown:
            self._advance(done - self._shown)
            self._shown = done


def register(app: typer.Typer) -> None:
    app.add_typer(bundle_app, name="bundle")


__all__ = ["bundle_app", "register"]
