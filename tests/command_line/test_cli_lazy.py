"""latticectl builds only the command that runs and converts plain values without pydantic (cli/lazy.py):
the table of lazily loaded commands says the truth, and the light conversion agrees with typer's."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import typer
import typer.main
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param
from typer.core import _TyperParameter

import cli.ctl
import cli.latticed_command
from cli import lazy

_LOOKUPS = """
import json, sys
import typer.main
import cli.ctl
root = typer.main.get_command(cli.ctl.app)
steps = []
for module, (names, _) in cli.ctl._ELSEWHERE.items():
    for name in names:
        before = cli.ctl._COMMANDS.loaded
        assert root.commands[name].name == name
        steps.append([name, sorted(cli.ctl._COMMANDS.loaded - before)])
print(json.dumps(steps))
"""


def test_looking_up_a_command_imports_only_its_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _LOOKUPS], capture_output=True, text=True, timeout=60, check=True
    )
    steps = json.loads(proc.stdout)
    expected = []
    for module, (names, _) in cli.ctl._ELSEWHERE.items():
        expected += [[name, [module] if n == 0 else []] for n, name in enumerate(names)]
    assert steps == expected


def test_the_table_names_exactly_what_each_module_registers() -> None:
    root = typer.main.get_command(cli.ctl.app)
    listed = list(root.commands)  # loads every module
    table = cli.ctl._COMMANDS
    for module, (names, _) in cli.ctl._ELSEWHERE.items():
        assert {name for name in listed if table.origin(name) == module} == set(names), module
    assert {"id", "status", "offer", "queue", "meta"} <= {n for n in listed if table.origin(n) == ""}
    # typer's order: single commands, then groups, each as registered
    assert listed[:2] == ["id", "status"]
    assert listed[-9:] == ["queue", "meta", "kv", "group", "dlq", "peers", "identity", "store", "bundle"]


def test_every_root_group_builds_its_own_commands() -> None:
    first, second = (typer.main.get_command(cli.ctl.app) for _ in range(2))
    assert first.commands["status"] is not second.commands["status"]
    assert first.commands["status"] is first.commands["status"]
    with pytest.raises(KeyError):
        _ = first.commands["no-such-command"]
    assert "no-such-command" not in first.commands


# --- the light conversion ------------------------------------------------------------------------------

SINGLE = [None, "", "0", "7", "007", "-1", "+5", " 5", "1.5", "0.25", "2000", "99999999999999999999", "abc"]
SINGLE += ["/tmp", "-", "~/x", "a//b/"]
MULTI: list[Any] = [None, (), ("a",), ("1", "2"), ("-1",), ("x", "3"), ["0", "1.5"]]


def outcome(convert: Any) -> tuple[Any, ...]:
    try:
        value = convert()
    except BadParameter as exc:
        return ("error", exc.format_message())
    return ("ok", value, type(value))


def typer_params() -> list[tuple[Any, _TyperParameter]]:
    """Every parameter of ``latticectl`` and of ``latticed`` (its root group converts the light way too)."""
    found = []
    for app in (cli.ctl.app, cli.latticed_command.app):
        root = typer.main.get_command(app)
        for command in [root, *(c for sub in root.commands.values() for c in lazy.subcommands(sub))]:
            ctx = Context(command, help_option_names=["-h", "--help"])
            found += [(ctx, p) for p in command.get_params(ctx) if isinstance(p, _TyperParameter)]
    return found


def test_light_conversion_agrees_with_typer_for_every_parameter() -> None:
    light_only = 0
    for ctx, param in typer_params():
        descriptor = param.type_descriptor
        multi = param.multiple or param.nargs == -1
        for value in [*(MULTI if multi else SINGLE), param.default]:
            info, annotation = descriptor.parameter_info, descriptor.annotation
            light = lazy._LightParam(parameter_info=info, annotation=annotation)
            param._runtime_param = None
            theirs = outcome(lambda: build_runtime_param(descriptor).coerce(value, param=param, ctx=ctx))
            ours = outcome(lambda: light.coerce(value, param=param, ctx=ctx))
            assert ours == theirs, (ctx.command.name, param.name, value)
            plain = lazy._plain(annotation, info, value, param, ctx)
            light_only += value is not None and plain is not lazy._TYPER
    assert light_only > 500  # most plain values never reach pydantic


@pytest.mark.parametrize(
    ("annotation", "value", "expected"),
    [
        (str, "x", "x"),
        (int, "7", 7),
        (float, "1.5", 1.5),
        (list[str], ("a", "b"), ["a", "b"]),
        (bool, True, True),
        (bool, False, False),
    ],
)
def test_plain_values_need_no_pydantic(annotation: Any, value: Any, expected: Any) -> None:
    ctx = Context(typer.main.get_command(cli.ctl.app))
    assert lazy._plain(annotation, typer.models.OptionInfo(), value, None, ctx) == expected


def test_values_typer_must_judge_go_to_typer() -> None:
    ctx = Context(typer.main.get_command(cli.ctl.app))
    plain, ranged = typer.models.OptionInfo(), typer.models.OptionInfo(min=1)
    cases = [
        (int, "-1", plain),
        (int, "0", ranged),
        (int, "1_000", plain),
        (bool, "1", plain),
        (str, b"x", plain),
    ]
    for annotation, value, info in cases:
        assert lazy._plain(annotation, info, value, None, ctx) is lazy._TYPER
