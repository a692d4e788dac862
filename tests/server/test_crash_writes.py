"""``kill -9`` of the server during ``wait=true`` writes: every acknowledged write survives.

Concurrent clients write with ``?wait=true`` and record each write the server answered 200:
six create points of new ids (half of them with a tenant key), and three more, with the admin
key, overwrite, delete and grant (to a second tenant) points whose creation was acknowledged.
After some hundreds of acknowledged new points the server is killed with SIGKILL (no chance to
flush) while they are still writing, restarted on the same data folder, and every point must
be as its last acknowledged write left it: the exact payload and float32 vector bits, absent
if deleted, readable by the tenant it was granted to; a write that was in flight may have
happened or not, but nothing in between (no torn writes). A query with a point's vector finds
it first, and a deleted point's vector finds it no more. Three rounds, each killed at a
different moment, on one data folder: what earlier rounds left must survive later crashes. The
collection, the admin key and the tenant keys made before the first crash keep working. (A
process crash: what the kernel was handed survives; power loss is not simulated.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.server.crash_checks import check_after_restart
from tests.server.crash_writers import (
    DIM,
    FIRST_ID,
    PATH,
    READER_TENANT,
    ROUNDS,
    WRITER_TENANT,
    Ledger,
    vector_of,
    write_until_killed,
)
from tests.server.live_server import LiveServer, new_admin_key, result

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(420)
def test_acknowledged_writes_survive_kill9(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "data", admin_key=new_admin_key())
    server.start()
    try:
        admin = server.admin_key
        result(server.admin("PUT", PATH, {"vectors": {"size": DIM, "distance": "Euclid"}}))
        index = {"field_name": "color", "field_schema": "keyword"}
        result(server.admin("PUT", f"{PATH}/index", index))
        tenant_key = result(server.admin("POST", "/admin/keys", {"tenant": WRITER_TENANT}))["key"]
        reader_key = result(server.admin("POST", "/admin/keys", {"tenant": READER_TENANT}))["key"]
        first = {"id": FIRST_ID, "vector": vector_of(FIRST_ID), "payload": {"first": True}}
        body = {"points": [first]}
        result(server.call("PUT", f"{PATH}/points", tenant_key, body, params={"wait": "true"}))
        ledger = Ledger()
        keys: dict[str, Any] = {"made": [], "revoked": []}
        for round_no, kill_after in enumerate(ROUNDS, start=1):
            made = asyncio.run(
                write_until_killed(server, admin, tenant_key, round_no, kill_after, ledger, keys)
            )
            assert not ledger.refused, f"round {round_no}: refused writes {ledger.refused[:3]}"
            assert made >= kill_after, (
                f"round {round_no}: only {made} new points before the writers stopped\n"
                + server.log_tail()
            )
            assert ledger.pending, f"round {round_no}: no write was in flight at the kill"
            server.restart()

            # The collection and the keys made before the first crash work.
            info = result(server.admin("GET", PATH))
            assert info["config"]["params"]["vectors"]["size"] == DIM
            mine = result(server.call("POST", f"{PATH}/points", tenant_key, {"ids": [FIRST_ID]}))
            assert [p["id"] for p in mine] == [FIRST_ID]
            # The key made just before the kill works; the one revoked then stays revoked.
            for key in keys["made"]:
                assert result(server.call("POST", f"{PATH}/points/count", key["key"], {})) == {
                    "count": 0
                }
            for key in keys["revoked"]:
                response = server.call("POST", f"{PATH}/points/count", key["key"], {})
                assert response.status_code in (401, 403), response.text
            check_after_restart(server, admin, tenant_key, reader_key, ledger)
        # The run did what it is about (or it proves nothing).
        assert all(n > 0 for n in ledger.counts.values()), ledger.counts
        assert len(keys["revoked"]) == len(ROUNDS) - 1
    finally:
        server.stop()
