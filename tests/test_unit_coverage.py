"""Every module of latticed/ and cli/ is imported by at least one unit test (tests/, its helpers included),
or is listed below with the integration test that covers it and why no unit test does. A new module with
neither fails here; so does a listed module that a unit test now imports, or that no longer exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support.paths import ROOT

#: Modules no unit test imports, each with the reason and the test that covers it: a module reached only
#: through another (a handler through the op table, a command through the CLI's lazy table), a Protocol
#: (checked by mypy), or code that needs a JVM or an installed script (integration/).
COVERED_ELSEWHERE: dict[str, str] = {
    "cli.bundle_commands": (
        "a latticectl command module, loaded by name from cli/ctl.py's lazy table: "
        "tests/command_line/test_cli_lazy.py loads each one in a subprocess; run end to end in "
        "tests/test_bundles.py"
    ),
    "cli.doctor": (
        "a latticectl command module, loaded by name from cli/ctl.py's lazy table: "
        "tests/command_line/test_cli_lazy.py loads each one in a subprocess; run in "
        "tests/command_line/test_doctor_offline.py"
    ),
    "cli.entry": (
        "the console-script entry points: integration/test_cli.py runs the installed latticed and latticectl"
    ),
    "cli.join": (
        "a latticectl command module, loaded by name from cli/ctl.py's lazy table: "
        "tests/command_line/test_cli_lazy.py loads each one in a subprocess; invite/join run in "
        "integration/test_init_join.py"
    ),
    "cli.kv_commands": (
        "a latticectl command module, loaded by name from cli/ctl.py's lazy table: "
        "tests/command_line/test_cli_lazy.py loads each one in a subprocess; run against real daemons in "
        "integration/test_replication.py"
    ),
    "cli.migrate": (
        "`latticed migrate`, loaded by cli/latticed_command.py: run in tests/storage/test_store_upgrade.py"
    ),
    "cli.offer_file": (
        "`latticectl offer --file`, called by cli/ctl.py: run in tests/command_line/test_cli_records.py"
    ),
    "cli.print_records": (
        "what `latticectl range` and `tail` print, called by cli/ctl.py: run in "
        "tests/command_line/test_cli_records.py"
    ),
    "cli.retention_commands": (
        "a latticectl command module, loaded by name from cli/ctl.py's lazy table: "
        "tests/command_line/test_cli_lazy.py loads each one in a subprocess; run in "
        "tests/command_line/test_retention_cli.py and integration/test_retention.py"
    ),
    "cli.store_commands": (
        "a latticectl command module, loaded by name from cli/ctl.py's lazy table: "
        "tests/command_line/test_cli_lazy.py loads each one in a subprocess; `store compact` runs in "
        "tests/api/test_disk_api.py"
    ),
    "cli.times": (
        "the time options of `tail` and `range`, called by cli/ctl.py: run in tests/test_read_by_time.py"
    ),
    "cli.why_commands": (
        "a latticectl command module, loaded by name from cli/ctl.py's lazy table: "
        "tests/command_line/test_cli_lazy.py loads each one in a subprocess; `queue why` runs in "
        "tests/test_queue_why.py"
    ),
    "cli.work": (
        "`latticectl work`, called by cli/groups.py: run against real daemons in "
        "integration/test_workqueue.py"
    ),
    "latticed.__main__": "`python -m latticed`: a subprocess in integration/test_upgrade_kill.py",
    "latticed.api.client.bundle_client": (
        "the client's bundle streams, reached through the blocking client: tests/test_bundles.py"
    ),
    "latticed.api.server.bundle_handlers": (
        "runs inside every in-process daemon (tests/support/inprocess.py); its ops in tests/test_bundles.py"
    ),
    "latticed.api.server.consumer_id": (
        "runs inside every in-process daemon (tests/support/inprocess.py); subscriptions in "
        "tests/api/test_workqueue_api.py"
    ),
    "latticed.storage.core2_many": (
        "the job behind Engine.append_many: tests/storage/test_core2_engine.py::"
        "test_append_many_writes_parts_on_both_cores_together_or_not_at_all"
    ),
    "latticed.api.server.upgrade_handlers": (
        "runs inside every in-process daemon (tests/support/inprocess.py); queue_upgrade and the recover "
        "of a forked core-1 queue in tests/api/test_core1_upgrade_api.py"
    ),
    "latticed.api.server.listener": (
        "runs inside every in-process daemon (tests/support/inprocess.py); the socket's life in "
        "tests/daemon/test_daemon_startup.py"
    ),
    "latticed.api.server.member_handlers": (
        "runs inside every in-process daemon (tests/support/inprocess.py); invite/join in "
        "tests/services/test_membership.py"
    ),
    "latticed.api.server.peer_handlers": (
        "runs inside every in-process daemon (tests/support/inprocess.py); peers and doctor in "
        "tests/net/test_peer_rows.py"
    ),
    "latticed.api.server.produce_handlers": (
        "runs inside every in-process daemon (tests/support/inprocess.py); offers in "
        "tests/api/test_pipelining.py"
    ),
    "latticed.api.server.push": (
        "runs inside every in-process daemon (tests/support/inprocess.py); pushed subscriptions in "
        "tests/api/test_workqueue_api.py"
    ),
    "latticed.api.server.remote_subscribe": (
        "subscriptions to another daemon's group: integration/test_workqueue_mesh.py"
    ),
    "latticed.api.server.retention_handlers": (
        "runs inside every in-process daemon (tests/support/inprocess.py); retention ops in "
        "tests/api/test_disk_api.py"
    ),
    "latticed.api.server.served": (
        "the refusal of a second daemon on one socket: tests/daemon/test_daemon_startup.py"
    ),
    "latticed.api.server.store_handlers": (
        "runs inside every in-process daemon (tests/support/inprocess.py); `store compact` in "
        "tests/api/test_disk_api.py"
    ),
    "latticed.api.server.subscribe": (
        "runs inside every in-process daemon (tests/support/inprocess.py); subscriptions in "
        "tests/api/test_workqueue_api.py"
    ),
    "latticed.api.server.time_handlers": (
        "runs inside every in-process daemon (tests/support/inprocess.py); offsets_for_times in "
        "tests/test_read_by_time.py"
    ),
    "latticed.api.server.why_handlers": (
        "runs inside every in-process daemon (tests/support/inprocess.py); `queue why` in "
        "tests/test_queue_why.py"
    ),
    "latticed.bundle.plan": "what an export carries, called by the bundle handlers: tests/test_bundles.py",
    "latticed.demo.walkthrough": (
        "the script `make demo` runs for a newcomer; no test runs it (tests/test_makefile.py only checks "
        "that `make demo` installs once), and nothing imports it"
    ),
    "latticed.groups.group_ports": (
        "a Protocol only (the groups' view of the store): checked by mypy; tests/groups/test_remote_groups.py"
    ),
    "latticed.groups.replica_dlq": "dead letters read from a replica: tests/api/test_replica_dlq.py",
    "latticed.groups.runtime": (
        "one group's lease runtime inside the group service: tests/groups/test_remote_groups.py"
    ),
    "latticed.groups.views": (
        "the wire form of leases and tasks, used by the group handlers: tests/api/test_workqueue_api.py"
    ),
    "latticed.host.socket_path": (
        "the API socket's default path, re-used by host/config.py: tests/host/test_config.py"
    ),
    "latticed.net.ports": (
        "a Protocol only (replication's view of the store): checked by mypy; tests/net/test_peer_rows.py"
    ),
    "latticed.net.queue_errors": "the gossip link's per-queue error log: tests/net/test_gossip.py",
    "latticed.net.reports": (
        "a Protocol only (what replication reports to metrics): checked by mypy; tests/net/test_peer_rows.py"
    ),
    "latticed.net.why_facts": (
        "what replication knows of a queue's peers, for `queue why`: tests/test_queue_why.py"
    ),
    "latticed.crdt._chain_build": (
        "the cffi build script of the compiled chain hasher (run by setup.py): "
        "tests/crdt/test_chain_compiled.py"
    ),
    "latticed.crdt._columns_build": (
        "the build script of the compiled column passes (run by setup.py): "
        "tests/crdt/test_columns_compiled.py"
    ),
    "latticed.privacy._seal_build": (
        "the cffi build script of the compiled sealer (run by setup.py): tests/privacy/test_sealed_accel.py"
    ),
    "latticed.protocol.replay": (
        "the handshake's replay cache: tests/protocol/test_handshake.py and tests/net/test_handshake_flood.py"
    ),
    "latticed.services.membership": (
        "built by the root in every in-process daemon (tests/support/inprocess.py): "
        "tests/services/test_membership.py"
    ),
    "latticed.services.service_ports": (
        "Protocols only (the services' view of the store): checked by mypy; tests/services/test_metrics.py"
    ),
    "latticed.spark.local_daemon": (
        "the Spark side's connection to its host's daemon: tests/spark/test_spark_replica_wait.py"
    ),
    "latticed.spark.time_options": (
        "the timestamp options, parsed through spark/options.py: tests/spark/test_spark_time_options.py"
    ),
    "latticed.storage.catalog": (
        "a Protocol only (the queue lookups the groups and retention ports share): checked by mypy; "
        "tests/services/test_metrics.py"
    ),
    "latticed.storage.upgrade": (
        "the upgrade plan of `latticed migrate`: tests/storage/test_store_upgrade.py"
    ),
}


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> set[str]:
    """Every module with code: a package's ``__init__`` counts only if it holds more than its docstring."""
    found = set()
    for package in ("latticed", "cli"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "__init__.py":
                body = ast.parse(path.read_text()).body
                if all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body):
                    continue
            found.add(_dotted(path))
    return found


def _reexports(package: str) -> dict[str, str]:
    """What a package's ``__init__`` re-exports: name -> the module it comes from."""
    init = ROOT.joinpath(*package.split("."), "__init__.py")
    if not init.exists():
        return {}
    return {
        alias.asname or alias.name: node.module
        for node in ast.parse(init.read_text()).body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def imported_by_unit_tests(known: set[str]) -> set[str]:
    """Modules a file under tests/ names in an import, directly or through a package's re-exports."""
    imported = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module)
                reexports = _reexports(node.module) if node.module in known else {}
                for alias in node.names:
                    imported.add(f"{node.module}.{alias.name}")
                    imported.add(reexports.get(alias.name, ""))
    # a package whose ``__init__`` re-exports its modules' names stands for those modules
    imported.update(source for package in imported & known for source in _reexports(package).values())
    return imported & known


def test_every_module_is_imported_by_a_unit_test_or_says_what_covers_it() -> None:
    modules = project_modules()
    untested = modules - imported_by_unit_tests(modules)
    assert sorted(untested - set(COVERED_ELSEWHERE)) == [], "import it in a unit test, or list it with why"
    assert sorted(set(COVERED_ELSEWHERE) & (modules - untested)) == [], "a unit test imports it: unlist it"
    assert sorted(set(COVERED_ELSEWHERE) - modules) == [], "no such module: unlist it"


def test_every_exception_names_the_test_that_covers_it() -> None:
    for module, reason in COVERED_ELSEWHERE.items():
        named = re.findall(r"\b(?:tests|integration)/[\w/]+\.py", reason)
        assert named, f"{module}: name the test that covers it"
        for path in named:
            assert (ROOT / path).exists(), f"{module}: {path} does not exist"
