"""A module over :data:`LIMIT` lines says at its top why it is one module
(a paragraph of its docstring starting "Why one module:"), or it is split by job."""

from __future__ import annotations

import ast

from support.paths import ROOT

LIMIT = 400
MARK = "Why one module:"


def reason_given(source: str) -> bool:
    """Whether the module docstring has a paragraph that starts with :data:`MARK`."""
    doc = ast.get_docstring(ast.parse(source)) or ""
    return any(paragraph.lstrip().startswith(MARK) for paragraph in doc.split("\n\n"))


def test_reason_given_reads_only_a_paragraph_of_the_module_docstring() -> None:
    assert reason_given(f'"""Title.\n\n{MARK} one job."""\n')
    assert not reason_given(f'"""Title; {MARK} mid-paragraph."""\n')
    assert not reason_given(f'"""Title."""\n\ndef f() -> None:\n    """{MARK} a function\'s."""\n')
    assert not reason_given("x = 1\n")


def test_every_long_module_says_why_it_is_one() -> None:
    long = {
        path.relative_to(ROOT).as_posix(): len(text.splitlines())
        for package in ("latticed", "cli")
        for path in sorted((ROOT / package).rglob("*.py"))
        if len((text := path.read_text()).splitlines()) > LIMIT
    }
    assert long, "the walk found no long module: is ROOT right?"
    unexplained = {path: lines for path, lines in long.items() if not reason_given((ROOT / path).read_text())}
    assert not unexplained, (
        f"modules over {LIMIT} lines without a '{MARK}' paragraph in their docstring (split them by job, "
        f"or say why they are one): {unexplained}"
    )
