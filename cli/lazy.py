"""What keeps a short ``latticectl`` command short: build only the command that runs, and read its values
without pydantic.

Most of what ``latticectl id`` costs is start-up (bench/bench_cli.py measures it). Built the usual typer
way, every run imports the modules of every command (``work``, ``doctor``, ``join``...), builds all of
them from their signatures, and imports pydantic, which typer converts each value with, ``--socket``'s
``None`` included. So:

* :class:`CommandTable` takes the commands and groups registered on the root ``typer.Typer`` out of
  typer's eager build, and :class:`LazyCommands` (the root group's ``commands``) builds each on first
  use. Commands that other modules register are named in the table with their module, which is imported
  only when one of those names is looked up. Listing the commands (``--help``, completing a command
  name, suggestions for a typo) builds them all, in the order typer would have listed them.
* :func:`lighten` gives parameters a conversion that needs no pydantic for what most invocations pass:
  no value, a string, a flag, a path, a plain decimal number within its range. Anything else goes through
  typer's own conversion, built when first needed, so what is accepted and every message stay typer's.
  With a typer that has no such conversion, :func:`lighten` does nothing.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, get_args, get_origin

import typer
import typer.main
from typer.core import TyperGroup
from typer.models import CommandInfo, TyperInfo

if TYPE_CHECKING:
    from typer._click import Command, Context, Parameter

#: A module whose commands are registered only when it is imported: the names it registers, and how to
#: register them on the app (given the imported module).
Registrar = tuple[Sequence[str], Callable[[ModuleType], object]]


class CommandTable:
    """The commands of a root ``typer.Typer``, built one by one when asked for.

    Built the typer way, the root group would import and build everything at every start; this table
    takes what is registered on ``app`` away from typer (so typer builds an empty root group), and
    ``elsewhere`` names the commands of the other modules, which are imported on first use. It is shared
    by every root group built from ``app`` (each keeps its own built commands, as with typer)."""

    def __init__(self, app: typer.Typer, elsewhere: Mapping[str, Registrar]) -> None:
        self._app = app
        self._elsewhere = dict(elsewhere)
        self._module_of = {name: module for module, (names, _) in elsewhere.items() for name in names}
        self._rank = {module: rank for rank, module in enumerate(elsewhere, start=1)}
        #: name -> (listing order, registration, the module that registered it; "" for the app's own).
        self._infos: dict[str, tuple[tuple[int, int, int], CommandInfo | TyperInfo, str]] = {}
        self._loaded: set[str] = set()
        self._absorb("")

    def _absorb(self, module: str) -> None:
        """Move what was registered on the app since the last call into the table. Typer lists single
        commands before groups, each in registration order; ``module`` ranks as its place in the table."""
        rank = self._rank.get(module, 0)
        for info in self._app.registered_commands:
            callback = info.callback
            name = info.name or typer.main.get_command_name(getattr(callback, "__name__", ""))
            self._infos[name] = ((0, rank, len(self._infos)), info, module)
        for group in self._app.registered_groups:
            group_name = group.name
            if not isinstance(group_name, str):  # a placeholder: the sub-app's own name, if it has one
                group_name = typer.main.solve_typer_info_defaults(group).name
            if not isinstance(group_name, str) or not group_name:
                raise TypeError("latticectl: every sub-app needs a name (add_typer(..., name=...))")
            self._infos[group_name] = ((1, rank, len(self._infos)), group, module)
        self._app.registered_commands.clear()
        self._app.registered_groups.clear()

    def _load(self, module: str) -> None:
        if module in self._loaded:
            return
        self._loaded.add(module)
        self._absorb("")  # the app's own, registered before this import
        _, register = self._elsewhere[module]
        register(importlib.import_module(module))
        self._absorb(module)

    def info(self, name: str) -> CommandInfo | TyperInfo | None:
        """What was registered under ``name``, importing the module that registers it if need be."""
        self._absorb("")
        module = self._module_of.get(name)
        if name not in self._infos and module is not None:
            self._load(module)
        entry = self._infos.get(name)
        return entry[1] if entry is not None else None

    def names(self) -> list[str]:
        """Every command's name, in typer's order: all modules are imported."""
        self._absorb("")
        for module in self._elsewhere:
            self._load(module)
        return sorted(self._infos, key=lambda name: self._infos[name][0])

    def origin(self, name: str) -> str | None:
        """The module of ``elsewhere`` that registered ``name`` ("" for the app's own), once loaded."""
        entry = self._infos.get(name)
        return entry[2] if entry is not None else None

    @property
    def loaded(self) -> frozenset[str]:
        """The modules of ``elsewhere`` imported so far."""
        return frozenset(self._loaded)

    def build(self, name: str) -> Command | None:
        """A new click command (or group) for ``name``, as typer would have built it; None if unknown."""
        info = self.info(name)
        app = self._app
        if isinstance(info, TyperInfo):
            return typer.main.get_group_from_info(
                info,
                pretty_exceptions_short=app.pretty_exceptions_short,
                suggest_commands=app.suggest_commands,
                rich_markup_mode=app.rich_markup_mode,
            )
        if isinstance(info, CommandInfo):
            return typer.main.get_command_from_info(
                info,
                pretty_exceptions_short=app.pretty_exceptions_short,
                rich_markup_mode=app.rich_markup_mode,
            )
        return None


class LazyCommands(MutableMapping[str, "Command"]):
    """A root group's ``commands``: each built from ``table`` on first access, then ``prepare``d (once)."""

    def __init__(self, table: CommandTable, prepare: Callable[[Command], None]) -> None:
        self._table = table
        self._prepare = prepare
        self._built: dict[str, Command] = {}
        self._removed: set[str] = set()

    def __getitem__(self, name: str) -> Command:
        if name in self._removed:
            raise KeyError(name)
        if name not in self._built:
            command = self._table.build(name)
            if command is None:
                raise KeyError(name)
            self._prepare(command)
            self._built[name] = command
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._removed.discard(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        _ = self[name]
        self._removed.add(name)
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        names = self._table.names()
        extra = [name for name in self._built if name not in names]
        return iter([name for name in [*names, *extra] if name not in self._removed])

    def __len__(self) -> int:
        return sum(1 for _ in self)


def subcommands(command: Command) -> list[Command]:
    """``command`` and every command below it (a group built by typer holds its commands in a dict)."""
    found = [command]
    for sub in getattr(command, "commands", {}).values():
        found += subcommands(sub)
    return found


class FlagDefaults(MutableMapping[str, Any]):
    """A click ``default_map`` that turns on the flag ``name`` for every command below ``command`` that
    has it; click asks it for one command at a time as it descends, so only those are built."""

    def __init__(self, command: Command, name: str) -> None:
        self._command = command
        self._name = name
        self._set: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self._set:
            return self._set[key]
        if isinstance(self._command, TyperGroup):
            sub = self._command.commands.get(key)
            if sub is not None:
                return FlagDefaults(sub, self._name)
        elif key == self._name and any(p.name == key for p in self._command.params):
            return True
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._set[key] = value

    def __delitem__(self, key: str) -> None:
        del self._set[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._set)

    def __len__(self) -> int:
        return len(self._set)


# --- values without pydantic --------------------------------------------------------------------------

_DIGITS = re.compile(r"[0-9]{1,18}")
_DECIMAL = re.compile(r"[0-9]{1,15}(\.[0-9]{1,15})?")
#: What :func:`_plain` returns when it leaves a value to typer.
_TYPER: Any = object()

try:  # typer's own conversion, through pydantic (typer 0.2x); older typers convert with click's types
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_path
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover - depends on the installed typer
    _LIGHT = False
else:
    _LIGHT = True


def _in_range(number: float, info: Any) -> bool:
    return (info.min is None or number >= info.min) and (info.max is None or number <= info.max)


def _plain(annotation: Any, info: Any, value: Any, param: Any, ctx: Context) -> Any:
    """``value`` converted exactly as typer would, where that needs no pydantic; else :data:`_TYPER`."""
    if get_origin(annotation) is list:
        [item_type] = get_args(annotation) or [Any]
        if not isinstance(value, list | tuple):
            return _TYPER
        items = [_plain(item_type, info, item, param, ctx) for item in value]
        return _TYPER if any(item is _TYPER for item in items) else items
    if annotation is str:
        return value if isinstance(value, str) else _TYPER
    if annotation is bool:  # a flag: click hands it over as a bool already
        return value if isinstance(value, bool) else _TYPER
    if annotation is Path and info.path_type is None:
        if not isinstance(value, str | Path):
            return _TYPER
        try:
            return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
        except ValueError:  # typer wraps it into its own message
            return _TYPER
    if annotation in (int, float) and not info.clamp:
        number: Any = _TYPER
        if type(value) is annotation:  # a default, already of the type
            number = value
        elif isinstance(value, str):
            pattern = _DIGITS if annotation is int else _DECIMAL
            if pattern.fullmatch(value):
                number = annotation(value)
        if number is not _TYPER and _in_range(number, info):
            return number
    return _TYPER


if _LIGHT:

    @dataclass(frozen=True)
    class _LightParam(RuntimeParam):
        """Converts with :func:`_plain`; hands anything else to the parameter's typer conversion."""

        def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
            converted = _plain(self.annotation, self.parameter_info, value, param, ctx)
            if converted is not _TYPER:
                return converted
            full = build_runtime_param(param.type_descriptor)
            param._runtime_param = full
            return full.coerce(value, param=param, ctx=ctx)


def lighten(params: Iterable[Parameter]) -> None:
    """Let these parameters convert plain values without importing pydantic (see the module docstring)."""
    if not _LIGHT:
        return
    for param in params:
        if not isinstance(param, _TyperParameter) or param._runtime_param is not None:
            continue
        descriptor = param.type_descriptor
        info = descriptor.parameter_info
        if descriptor.file_annotation is not None or info.parser is not None:
            continue
        param._runtime_param = _LightParam(parameter_info=info, annotation=descriptor.annotation)


def lighten_command(command: Command, help_option_names: Sequence[str]) -> None:
    """:func:`lighten` a command's parameters and its ``--help`` option, which has no value unless given
    (so typer would convert that ``None`` too). Click makes the help option once, from the context's
    option names: ``help_option_names`` must be the ones the command runs with."""
    if _LIGHT:
        lighten(command.get_params(typer.Context(command, help_option_names=list(help_option_names))))


__all__ = [
    "CommandTable",
    "FlagDefaults",
    "LazyCommands",
    "Registrar",
    "lighten",
    "lighten_command",
    "subcommands",
]
