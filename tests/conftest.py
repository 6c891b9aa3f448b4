"""The in-process daemon and client many unit tests share; a module needing one daemon for all its tests
overrides ``daemon`` with a module-scoped one (``support.inprocess.daemon_at``), a module needing another
kind of daemon overrides it with its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.inprocess import InProcessDaemon, daemon_at

from latticed.api.client.blocking_client import Client


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    with daemon_at(tmp_path) as d:
        yield d


@pytest.fixture
def client(daemon: InProcessDaemon) -> Iterator[Client]:
    with daemon.client() as c:
        yield c
