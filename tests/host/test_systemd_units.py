"""The shipped systemd units: required keys, a comment on every sandboxing line, and systemd's own checks.

``systemd-analyze verify`` and ``systemd-sysusers --dry-run`` need no running systemd (Debian package
``systemd``). Where they are missing those two checks skip, unless ``LATTICED_REQUIRE_SYSTEMD=1`` makes
that a failure (for CI); the structural checks below always run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.paths import ROOT

from latticed.host.install import DROP_IN_NAME, latticed_command, render_drop_in

SYSTEMD_DIR = ROOT / "systemd"
SYSTEM_UNIT = SYSTEMD_DIR / "latticed.service"
USER_UNIT = SYSTEMD_DIR / "latticed-user.service"
SYSUSERS = SYSTEMD_DIR / "sysusers.d-latticed.conf"

SANDBOX_PREFIXES = ("Protect", "Private", "Restrict", "SystemCall")
SANDBOX_KEYS = {
    "NoNewPrivileges",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "ProcSubset",
    "UMask",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "DevicePolicy",
    "DeviceAllow",
    "IPAddressDeny",
    "IPAddressAllow",
    "KeyringMode",
    "RemoveIPC",
}


@dataclass(frozen=True)
class Line:
    section: str
    key: str
    value: str
    lineno: int
    commented: bool  # the line right above is a comment


def parse_unit(path: Path) -> list[Line]:
    """A systemd-style parser: unlike configparser it keeps repeated keys, order and comments."""
    out: list[Line] = []
    section = ""
    previous_is_comment = False
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        assert not line.endswith("\\"), f"{path.name}:{lineno}: avoid continuation lines"
        if line.startswith(("#", ";")):
            previous_is_comment = True
            continue
        if not line:
            previous_is_comment = False
            continue
        if line.startswith("["):
            assert line.endswith("]"), f"{path.name}:{lineno}: bad section header"
            section = line[1:-1]
        else:
            key, sep, value = line.partition("=")
            assert sep, f"{path.name}:{lineno}: expected KEY=VALUE"
            assert section, f"{path.name}:{lineno}: key outside a section"
            out.append(Line(section, key.strip(), value.strip(), lineno, previous_is_comment))
        previous_is_comment = False
    return out


def values(lines: list[Line], section: str, key: str) -> list[str]:
    return [line.value for line in lines if line.section == section and line.key == key]


def single(lines: list[Line], section: str, key: str) -> str:
    found = values(lines, section, key)
    assert len(found) == 1, f"[{section}] {key}= appears {len(found)} times"
    return found[0]


def is_sandboxing(key: str) -> bool:
    return key.startswith(SANDBOX_PREFIXES) or key in SANDBOX_KEYS


# --- structure (always runs) ----------------------------------------------------------------------

COMMON = {
    "Type": "notify",
    "NotifyAccess": "main",
    "WatchdogSec": "30",
    "Restart": "on-failure",
    "RestartSec": "2",
    "LimitNOFILE": "65536",
    "StateDirectory": "latticed",
    "StateDirectoryMode": "0700",
    "RuntimeDirectory": "latticed",
    "NoNewPrivileges": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallArchitectures": "native",
}
SYSTEM_ONLY = {
    "ExecStart": "latticed run --config %E/latticed/latticed.toml",
    "User": "latticed",
    "Group": "latticed",
    "DynamicUser": "no",
    "RuntimeDirectoryMode": "0750",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "CapabilityBoundingSet": "",
}


@pytest.mark.parametrize(
    ("unit", "expected", "target"),
    [(SYSTEM_UNIT, COMMON | SYSTEM_ONLY, "multi-user.target"), (USER_UNIT, COMMON, "default.target")],
    ids=["system", "user"],
)
def test_required_keys(unit: Path, expected: dict[str, str], target: str) -> None:
    lines = parse_unit(unit)
    for key, value in expected.items():
        assert single(lines, "Service", key) == value, key
    assert "@system-service" in values(lines, "Service", "SystemCallFilter")
    assert single(lines, "Install", "WantedBy") == target
    assert single(lines, "Unit", "Description")


def test_user_unit_runs_as_the_invoking_user() -> None:
    lines = parse_unit(USER_UNIT)
    assert not values(lines, "Service", "User")
    assert not values(lines, "Service", "Group")


@pytest.mark.parametrize("unit", [SYSTEM_UNIT, USER_UNIT], ids=["system", "user"])
def test_every_sandboxing_line_has_a_comment(unit: Path) -> None:
    sandboxing = [line for line in parse_unit(unit) if is_sandboxing(line.key)]
    assert len(sandboxing) >= 10
    bare = [f"{unit.name}:{line.lineno}: {line.key}" for line in sandboxing if not line.commented]
    assert not bare, "sandboxing lines without a comment right above:\n" + "\n".join(bare)


@pytest.mark.parametrize("unit", [SYSTEM_UNIT, USER_UNIT], ids=["system", "user"])
def test_unit_documents_an_execstart_drop_in(unit: Path) -> None:
    text = unit.read_text()
    assert re.search(r"^#\s+ExecStart=$", text, re.MULTILINE), "drop-in example must clear ExecStart="


def test_comment_check_catches_a_bare_line(tmp_path: Path) -> None:
    unit = tmp_path / "x.service"
    unit.write_text("[Service]\n# why\nProtectHome=yes\n\nPrivateTmp=yes\n")
    bare = [line.key for line in parse_unit(unit) if is_sandboxing(line.key) and not line.commented]
    assert bare == ["PrivateTmp"]


def test_sysusers_creates_the_service_user() -> None:
    entries = [
        line.split()
        for line in SYSUSERS.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert [e[:2] for e in entries] == [["u", "latticed"]]
    assert single(parse_unit(SYSTEM_UNIT), "Service", "User") == entries[0][1]


# --- systemd's own checks (need the tools, not a running systemd) ---------------------------------


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} not installed (Debian/Ubuntu package: systemd)"
        if os.environ.get("LATTICED_REQUIRE_SYSTEMD") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def verify(unit_text: str, tmp_path: Path, *, user: bool, drop_in: str | None = None) -> list[str]:
    """Run ``systemd-analyze verify``; return its complaints about our unit (it exits 0 on most of them).

    ``drop_in`` goes where systemd looks for drop-ins of the unit (verify reads them too)."""
    analyze = require_tool("systemd-analyze")
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    unit = unit_dir / "latticed.service"
    # The real binary is not installed here; any existing absolute executable satisfies verify.
    unit.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={sys.executable}", unit_text, flags=re.MULTILINE))
    if drop_in is not None:
        (unit_dir / "latticed.service.d").mkdir()
        (unit_dir / "latticed.service.d" / DROP_IN_NAME).write_text(drop_in)
    runtime = tmp_path / "xdg-runtime"
    runtime.mkdir(mode=0o700)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "XDG_RUNTIME_DIR": str(runtime),  # the user manager's paths derive from it
        "SYSTEMD_LOG_COLOR": "0",
        "SYSTEMD_PAGER": "",
    }
    cmd = [analyze, "verify", "--man=no", *(["--user"] if user else []), str(unit)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    output = proc.stdout + proc.stderr
    complaints = [line for line in output.splitlines() if "latticed" in line]
    if proc.returncode != 0:
        complaints.append(f"exit status {proc.returncode}: {output.strip()}")
    return complaints


@pytest.mark.parametrize(("unit", "user"), [(SYSTEM_UNIT, False), (USER_UNIT, True)], ids=["system", "user"])
def test_systemd_analyze_verify(unit: Path, user: bool, tmp_path: Path) -> None:
    assert verify(unit.read_text(), tmp_path, user=user) == []


@pytest.mark.parametrize(("unit", "user"), [(SYSTEM_UNIT, False), (USER_UNIT, True)], ids=["system", "user"])
def test_unit_with_the_drop_in_latticed_init_writes_verifies(unit: Path, user: bool, tmp_path: Path) -> None:
    """The drop-in starts this installation's latticed (a venv here), quoted as systemd wants it."""
    drop_in = render_drop_in(latticed_command(), tmp_path / "my config" / "latticed.toml")
    assert verify(unit.read_text(), tmp_path, user=user, drop_in=drop_in) == []


def test_verify_reads_the_drop_in(tmp_path: Path) -> None:
    """Guards the check above: a drop-in naming a missing program is reported."""
    drop_in = render_drop_in(["/nonexistent/latticed"], Path("/etc/latticed/latticed.toml"))
    complaints = verify(SYSTEM_UNIT.read_text(), tmp_path, user=False, drop_in=drop_in)
    assert any("/nonexistent/latticed" in c for c in complaints), complaints


def test_systemd_analyze_verify_catches_mistakes(tmp_path: Path) -> None:
    """Guards the check above: verify reports bad keys and values on stderr but still exits 0."""
    broken = (
        SYSTEM_UNIT.read_text()
        .replace("Type=notify", "Type=notifyy")
        .replace("ProtectHome=yes", "ProtectHome=yes\nProtectHomeDir=yes")
    )
    complaints = verify(broken, tmp_path, user=False)
    assert any("notifyy" in c for c in complaints), complaints
    assert any("ProtectHomeDir" in c for c in complaints), complaints


def test_sysusers_dry_run(tmp_path: Path) -> None:
    sysusers = require_tool("systemd-sysusers")
    # --root keeps it away from the real /etc even though --dry-run writes nothing.
    proc = subprocess.run(
        [sysusers, f"--root={tmp_path}", "--dry-run", str(SYSUSERS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "latticed" in proc.stdout + proc.stderr


# --- MemoryDenyWriteExecute=yes against our real dependencies -------------------------------------

MDWE_PROBE = textwrap.dedent(
    """
    import ctypes, errno, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        sys.exit(77 if ctypes.get_errno() == errno.EINVAL else 1)
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
    """
)
MDWE_WORKLOAD = textwrap.dedent(
    """
    import ctypes, mmap
    import ifaddr, msgpack, nacl.signing, trio, zeroconf
    import latticed.host.config, latticed.process.logs, latticed.process.sdnotify
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        raise SystemExit("W+X mapping allowed: MDWE is not in force, the probe proves nothing")
    except PermissionError:
        pass
    key = nacl.signing.SigningKey.generate()
    key.verify_key.verify(key.sign(b"x"))
    assert msgpack.unpackb(msgpack.packb({"a": 1})) == {"a": 1}
    ifaddr.get_adapters()
    assert ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 7)() == 7
    trio.run(trio.sleep, 0)
    print("ok")
    """
)


def test_dependencies_run_without_write_execute_memory() -> None:
    """The kernel's PR_SET_MDWE is the policy MemoryDenyWriteExecute= enforces (systemd >= 255 uses it)."""
    proc = subprocess.run(
        [sys.executable, "-c", MDWE_PROBE, MDWE_WORKLOAD],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=SYSTEMD_DIR.parent,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(SYSTEMD_DIR.parent), os.environ.get("PYTHONPATH")])
            ),
        },
    )
    if proc.returncode == 77:
        pytest.skip("kernel has no PR_SET_MDWE (Linux < 6.3)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
