"""The installed scripts' entry points: ``--version`` answers before anything heavy is imported.

``latticed``'s command module imports the daemon (trio, libsodium, the store: most of a second), and
``latticectl``'s imports typer; ``--version`` needs neither, so it is answered here from
:mod:`latticed.version` alone. Every other invocation goes on to the program itself.
"""

from __future__ import annotations

import sys

_VERSION_FLAGS = frozenset({"--version", "-V"})


def _wants_version(argv: list[str]) -> bool:
    return len(argv) == 1 and argv[0] in _VERSION_FLAGS


def _print_version(program: str) -> None:
    from latticed.version import describe  # noqa: PLC0415 - the light path imports only this

    try:
        print(describe(program), flush=True)
    except BrokenPipeError:  # `latticectl --version | head -1`: stdout closed early, as cli/boundary.py says
        sys.stdout = None  # nothing more to flush at exit
        sys.exit(141)


def latticed() -> None:
    """``latticed``."""
    if _wants_version(sys.argv[1:]):
        _print_version("latticed")
        return
    from cli.latticed_command import main  # noqa: PLC0415 - the daemon, only when it is asked for

    main()


def latticectl() -> None:
    """``latticectl``."""
    if _wants_version(sys.argv[1:]):
        _print_version("latticectl")
        return
    from cli.ctl import main  # noqa: PLC0415 - as above

    main()


__all__ = ["latticectl", "latticed"]
