"""The versions a build speaks are written once (latticed/version.py), agree with the code that implements
each format, and are in CHANGELOG.md: a wire, store or API change without a changelog entry fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

from support.paths import ROOT

from latticed.api import messages as wire
from latticed.api.messages import is_unknown_op, version_gap, versions_reply
from latticed.errors import ProtocolError, VersionGapError
from latticed.protocol import replication_messages
from latticed.storage import schema
from latticed.version import (
    API_VERSIONS,
    PROTOCOL_FEATURES,
    PROTOCOL_VERSIONS,
    RELEASE,
    STORE_SCHEMA,
    describe,
    span,
)


def _sections() -> list[tuple[str, str]]:
    """(heading, body) of each ``## `` section of CHANGELOG.md, newest first."""
    text = (ROOT / "CHANGELOG.md").read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def _speaks(body: str) -> str:
    lines = [line for line in body.splitlines() if line.startswith("Speaks: ")]
    assert len(lines) == 1, "each CHANGELOG section has one 'Speaks:' line"
    return lines[0]


def _releases() -> list[dict[str, object]]:
    return list(tomllib.loads((ROOT / "releases.toml").read_text())["release"])


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split(".dev", maxsplit=1)[0]))


def test_the_code_implements_the_versions_it_claims() -> None:
    assert schema.SCHEMA_VERSION == STORE_SCHEMA
    assert wire.SUPPORTED_VERSIONS == API_VERSIONS and wire.API_VERSION in API_VERSIONS
    assert PROTOCOL_VERSIONS[0] == replication_messages.PROTOCOL_VERSION
    assert list(PROTOCOL_VERSIONS) == sorted(set(PROTOCOL_VERSIONS))


def test_the_newest_changelog_section_states_what_this_build_speaks() -> None:
    heading, body = _sections()[0]
    assert heading.startswith("Unreleased") or heading.startswith(RELEASE)
    features = ", ".join(sorted(PROTOCOL_FEATURES)) or "none"
    expected = (
        f"Speaks: wire protocol {span(PROTOCOL_VERSIONS)} (features: {features}) · "
        f"store schema {STORE_SCHEMA} · local API {span(API_VERSIONS)}"
    )
    assert _speaks(body) == expected, "a wire, store or API version changed: say so in CHANGELOG.md"


def test_every_release_has_a_changelog_section_that_matches_releases_toml() -> None:
    sections = {heading.split()[0]: body for heading, body in _sections()}
    for release in _releases():
        version = str(release["version"])
        assert version in sections, f"CHANGELOG.md has no section for {version}"
        wire_low, wire_high = release["wire_protocol"]  # type: ignore[misc]
        api_low, api_high = release["local_api"]  # type: ignore[misc]
        assert _speaks(sections[version]).startswith(f"Speaks: wire protocol {span((wire_low, wire_high))} (")
        assert f"store schema {release['store_schema']} · local API {span((api_low, api_high))}" in (
            _speaks(sections[version])
        )
        assert re.fullmatch(r"[0-9a-f]{40}", str(release["commit"]))
        assert _version_key(version) < _version_key(RELEASE)


def test_this_build_speaks_the_previous_releases_protocol() -> None:
    # The promise (docs/operations.md, Upgrades): the previous release syncs with this one.
    previous = _releases()[-1]
    low, high = previous["wire_protocol"]  # type: ignore[misc]
    assert set(range(low, high + 1)) & set(PROTOCOL_VERSIONS)
    api_low, api_high = previous["local_api"]  # type: ignore[misc]
    assert set(range(api_low, api_high + 1)) & set(API_VERSIONS)


def test_pyproject_takes_its_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "latticed.version.RELEASE"}
    scripts = project["project"]["scripts"]
    assert scripts == {"latticed": "cli.entry:latticed", "latticectl": "cli.entry:latticectl"}


_PRINT_VERSION_AND_MODULES = """
import sys
sys.argv = [sys.argv[1], "--version"]
import cli.entry
getattr(cli.entry, sys.argv[0])()
heavy = ["trio", "nacl", "sqlite3", "typer", "msgpack", "latticed.daemon", "cli.latticed_command", "cli.ctl"]
print(sorted(m for m in heavy if m in sys.modules))
"""


def test_version_flags_print_every_version_without_importing_the_daemon_or_typer() -> None:
    for program in ("latticed", "latticectl"):
        argv = [sys.executable, "-c", _PRINT_VERSION_AND_MODULES, program]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60, cwd=ROOT)
        *printed, loaded = out.stdout.strip().splitlines()
        assert printed == describe(program).splitlines()
        assert loaded == "[]", out.stdout
    features = ", ".join(sorted(PROTOCOL_FEATURES)) or "none"
    assert describe("latticed").splitlines()[1:] == [
        f"wire protocol {span(PROTOCOL_VERSIONS)} (features: {features})",
        f"store schema {STORE_SCHEMA}",
        f"local API {span(API_VERSIONS)}",
    ]


def test_a_version_flag_into_a_closed_pipe_is_exit_141_not_a_traceback() -> None:
    """`latticectl --version | head -0`: the reader is gone before anything is written."""
    code = "import sys; sys.argv = [sys.argv[1], '--version']; import cli.entry; cli.entry.latticectl()"
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, "latticectl"],
            check=False,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    finally:
        os.close(write)
    assert out.returncode == 141 and out.stderr == ""


def test_python_m_latticed_answers_version_too() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "latticed", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.splitlines()[0] == f"latticed {RELEASE}"


# --- the local API: a newer client names the version gap to an older daemon ------------------------------


def test_an_unknown_op_from_another_release_names_both_releases() -> None:
    unknown = ProtocolError("unknown op 'versions'")
    assert is_unknown_op(unknown) and not is_unknown_op(ProtocolError("something else"))
    gap = version_gap("versions", unknown, {"server": "latticed/0.1.0", "versions": [1]})
    assert isinstance(gap, VersionGapError)
    message = str(gap)
    assert "latticed 0.2.0 or earlier (local API 1)" in message and "'versions'" in message
    assert f"this client is latticed {RELEASE}" in message and "upgrade the daemon" in message
    assert "\n" not in message
    # The same release: the op really is unknown, no gap to name.
    assert version_gap("nope", unknown, {"release": RELEASE, "versions": [1]}) is unknown
    # 0.2.0's ``server`` names the installed package, which may be this build's: no ``release``, older.
    stale = version_gap("versions", unknown, {"server": f"latticed/{RELEASE}", "versions": [1]})
    assert isinstance(stale, VersionGapError) and "0.2.0 or earlier" in str(stale)
    newer = version_gap("versions", unknown, {"release": "9.0.0", "versions": [1, 2]})
    assert isinstance(newer, VersionGapError) and "latticed 9.0.0 (local API 1-2)" in str(newer)


def test_the_versions_reply_is_what_this_build_speaks() -> None:
    assert versions_reply() == {
        "release": RELEASE,
        "wire_protocol": list(PROTOCOL_VERSIONS),
        "features": sorted(PROTOCOL_FEATURES),
        "store_schema": STORE_SCHEMA,
        "local_api": list(API_VERSIONS),
    }
