"""Fixtures for the end-to-end server tests: one live ``tierkit serve`` per test module.

``live`` is a started ``LiveServer`` on a fresh data folder shared by the module's tests (a
server start costs seconds); ``admin_key`` is its admin key. Tests that need their own server
(the crash tests) build a ``LiveServer`` themselves. The qdrant-client tests' fixtures
(``client``, ``loaded``, ``expected``: per module, on ``live``) are in ``qdrant_fixtures.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.live_server import LiveServer, new_admin_key
from tests.server.qdrant_fixtures import client, expected, loaded

__all__ = ["admin_key", "client", "expected", "live", "loaded"]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("server") / "data"
    server = LiveServer(data, admin_key=new_admin_key())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def admin_key(live: LiveServer) -> str:
    return live.admin_key
