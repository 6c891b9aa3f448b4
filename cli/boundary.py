"""The one place where errors become exit codes and one-line messages, for both programs.

Every command raises; nothing below the boundary prints an error or calls ``sys.exit``. The root group of
each program is a :class:`BoundaryGroup`, whose ``main`` (used by the installed script and by
``typer.testing.CliRunner`` alike) runs the command and maps what escapes it:

=====  ==================================================================  ==============================
code   cause                                                               raised as
=====  ==================================================================  ==============================
0      success
1      any other project error, an OS error (file not readable...)         LatticedError, OSError
2      bad command line or input that does not parse (bad config too)      typer usage error, Malformed
3      the daemon is not running, or the connection to it broke            ConnectionClosedError
4      no such queue, record, key or field                                 NotFoundError
5      a write to a queue or key owned by another identity; a group's      NotOwnerError,
       owner does not take remote consumers from this daemon               NotAllowedError
6      verification failed, the queue's owner forked it, or a write to     IntegrityError, ForkedQueue,
       our own queue would fork it (a peer holds records of it we lack)    BehindPeersError
7      the store cannot do it (disk full, read-only, corrupt)              StorageError
8      creating something that already exists                              AlreadyExistsError
9      a stale or unknown lease (acked, expired, from before a restart)    LeaseError
10     ``dequeue`` found no record (within ``--wait``)                     EmptyError
11     a group's consumer cap or a consumer's in-flight cap is reached     CapacityError
12     a KV write on a key that holds another kind (``kv incr`` on a       WrongTypeError
       plain value, hash or set; Redis's WRONGTYPE)
13     reading a sealed queue this daemon's identity is not a reader of    NotReaderError
       (for the key epoch of the records asked for)
14     the daemon that owns a group or a queue offered into could not be   OwnerUnreachableError
       reached in time: no link and none could be dialled, or no answer
130    interrupted (Ctrl-C): quiet
141    stdout was closed early (``latticectl tail q | head -1``): quiet
=====  ==================================================================  ==============================

An exception outside this table is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from latticed.errors import (
    AlreadyExistsError,
    BehindPeersError,
    CapacityError,
    ConnectionClosedError,
    EmptyError,
    ForkedQueueError,
    IntegrityError,
    LatticedError,
    LeaseError,
    MalformedError,
    NotFoundError,
    NotOwnerError,
    NotReaderError,
    OwnerUnreachableError,
    StorageError,
    WrongTypeError,
)


class ExitCode(enum.IntEnum):
    """Process exit codes of ``latticed`` and ``latticectl`` (see the module docstring)."""

    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_RUNNING = 3
    NOT_FOUND = 4
    NOT_OWNER = 5
    INTEGRITY = 6
    STORAGE = 7
    EXISTS = 8
    LEASE = 9
    EMPTY = 10
    CAPACITY = 11
    WRONG_TYPE = 12
    NOT_READER = 13
    OWNER_UNREACHABLE = 14
    INTERRUPTED = 130
    STDOUT_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for ``yes | head -1``


#: Looked up along each exception's MRO, so the most specific class listed wins.
_BY_CLASS: dict[type[BaseException], ExitCode] = {
    MalformedError: ExitCode.USAGE,
    ConnectionClosedError: ExitCode.NOT_RUNNING,
    ConnectionError: ExitCode.NOT_RUNNING,  # refused/reset on the socket, if the client lets one through
    NotFoundError: ExitCode.NOT_FOUND,
    NotOwnerError: ExitCode.NOT_OWNER,
    IntegrityError: ExitCode.INTEGRITY,
    ForkedQueueError: ExitCode.INTEGRITY,
    BehindPeersError: ExitCode.INTEGRITY,
    StorageError: ExitCode.STORAGE,
    AlreadyExistsError: ExitCode.EXISTS,
    LeaseError: ExitCode.LEASE,
    EmptyError: ExitCode.EMPTY,
    CapacityError: ExitCode.CAPACITY,
    WrongTypeError: ExitCode.WRONG_TYPE,
    NotReaderError: ExitCode.NOT_READER,
    OwnerUnreachableError: ExitCode.OWNER_UNREACHABLE,
    LatticedError: ExitCode.ERROR,
    OSError: ExitCode.ERROR,
}
#: The same table keyed by the wire ``code``, for a LatticedError whose class the client did not map.
_BY_CODE: dict[str, ExitCode] = {
    cls.code: exit_code for cls, exit_code in _BY_CLASS.items() if issubclass(cls, LatticedError)
}


class StdoutClosed(Exception):
    """Raised by :mod:`cli.output` when the reader of stdout went away (EPIPE)."""


def exit_code_for(exc: BaseException) -> ExitCode | None:
    """The exit code for an expected exception, or None for a bug."""
    for cls in type(exc).__mro__:
        if cls in _BY_CLASS:
            found = _BY_CLASS[cls]
            if found is ExitCode.ERROR and isinstance(exc, LatticedError):
                return _BY_CODE.get(getattr(exc, "code", ""), found)
            return found
    return None


def one_line(text: str) -> str:
    """Collapse a message onto one line so each error is exactly one line of stderr."""
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        names = [os.fsdecode(n) for n in (exc.filename, exc.filename2) if n is not None]
        return ": ".join([exc.strerror, *names])
    text = str(exc)
    if isinstance(exc, LatticedError) and not text:
        return exc.code
    return text or type(exc).__name__


def _leaf(exc: BaseException) -> BaseException:
    """The single exception inside (nested) exception groups, as trio nurseries wrap them."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's final flush cannot complain about the pipe."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class BoundaryGroup(TyperGroup):
    """Root command group whose ``main`` turns every expected failure into an exit code and one line."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the program; with ``standalone_mode`` (the default) never return, exit instead."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            result = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
            try:
                sys.stdout.flush()  # inside the boundary, so a closed pipe surfaces here
            except BrokenPipeError:
                raise StdoutClosed from None
        except StdoutClosed:
            _silence_stdout()
            sys.exit(ExitCode.STDOUT_CLOSED)
        except (KeyboardInterrupt, typer.Abort):
            sys.exit(ExitCode.INTERRUPTED)
        except typer.TyperException as exc:  # click's usage and file errors
            if type(exc).__name__ == "NoArgsIsHelpError":  # a group run bare: its help is the message
                _write_stderr(exc.format_message())  # (empty when typer's rich help already went out)
                sys.exit(exc.exit_code)
            self._fail(_usage_message(exc), exc.exit_code)
        except BaseException as exc:
            leaf = _leaf(exc)
            if isinstance(leaf, KeyboardInterrupt):
                sys.exit(ExitCode.INTERRUPTED)
            code = exit_code_for(leaf)
            if code is None:  # a bug, or SystemExit from shell completion: let it through
                raise
            self._fail(_message(leaf), code)
        # Non-standalone click returns an Exit's code (e.g. 0 after --help) or the command's return value.
        sys.exit(result if isinstance(result, int) else ExitCode.OK)

    def _fail(self, message: str, code: int) -> NoReturn:
        _write_stderr(f"{self.name}: error: {one_line(message)}\n")
        sys.exit(code)


def _write_stderr(text: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(text)
        sys.stderr.flush()


def _usage_message(exc: typer.TyperException) -> str:
    """Click's message plus where to get help, on one line (click prints usage and a hint over three)."""
    message = exc.format_message()
    ctx: Any = getattr(exc, "ctx", None)
    if exc.exit_code == ExitCode.USAGE and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


def version_option(program: str) -> Any:
    """The ``--version`` (``-V``) flag of ``program``'s root command, for when it comes with other
    arguments (alone, cli/entry.py answers it before typer is even imported)."""

    def show(value: bool) -> None:
        if value:
            from latticed.version import describe  # noqa: PLC0415 - only when asked

            typer.echo(describe(program))
            raise typer.Exit()

    return typer.Option(
        "--version",
        "-V",
        is_eager=True,
        expose_value=False,
        callback=show,
        help=f"Print {program}'s release and the wire, store and local API versions it speaks.",
    )


__all__ = ["BoundaryGroup", "ExitCode", "StdoutClosed", "exit_code_for", "one_line", "version_option"]
