"""Tenant isolation over HTTP: no response ever contains a point its tenant cannot read.

A plain model (which tenant owns and may read which point) says what each key may see. A
hypothesis state machine drives the live server with an admin key and three tenant keys:
tenant and admin upserts (payloads that claim other tenants' names), admin grants and revokes,
tenant deletes by ids and by filter, key revocations and new keys, and reads: queries with and
without filters (among them filters written to widen the view: ``should`` on other tenants'
values, ``has_id`` of their points, ``must_not`` of the caller's own), batch queries, retrieves,
single-point reads, counts and collection info. Every read is checked against the model: no
hit, record or count outside the caller's view, and (the collections are tiny and every limit
exceeds them) exactly the caller's view. A revoked key gets 401/403 and nothing else.

The machine is ``isolation_machine.Isolation`` (its model and rules: ``isolation_model.py``);
here it runs as it is, and with one ``kill -9`` and restart somewhere in each program. Why: a
leak is a sequence of writes, grants and reads nobody thought to script; a random program over
every route finds such sequences, and the model says what each answer must be.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import precondition, rule, run_state_machine_as_test

from tests.server.isolation_machine import Isolation
from tests.server.isolation_model import (
    BIG,
    ID_POOL,
    MAX_EXAMPLES,
    N_TENANTS,
    STEPS,
    Client,
    assert_denied,
    ok,
    vector_of,
)
from tests.server.live_server import LiveServer


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_response_leaks_a_point(live: LiveServer) -> None:
    Isolation.live = live
    Isolation.client = Client(live.url)
    Isolation.stats.clear()
    try:
        run_state_machine_as_test(
            Isolation,
            settings=settings(
                max_examples=MAX_EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                # Shrinking over HTTP takes minutes: report the first failing program as
                # found (hypothesis prints its steps); the example database replays it.
                phases=[Phase.explicit, Phase.reuse, Phase.generate],
                report_multiple_bugs=False,
            ),
        )
    finally:
        Isolation.client.http.close()
    # The run reached the cases it is about (or it proves nothing); the rarer ones are in
    # test_tenancy_rules_by_example.
    stats = Isolation.stats
    print(dict(stats), "runs:", next(Isolation.runs))
    for what in (
        "upsert",
        "upsert refused",
        "grant",
        "revoke",
        "deleted",
        "key revoked",
    ):
        assert stats[what] > 0, f"the random program never did {what!r}: {dict(stats)}"


class IsolationAcrossCrashes(Isolation):
    """The same program, with one ``kill -9`` and restart somewhere in it: what the server
    acknowledged (points, owners, grants, revokes, key revocations) is what it knows after."""

    def __init__(self) -> None:
        super().__init__()
        self.crashed = False

    @precondition(lambda self: not self.crashed)
    @rule()
    def crash_and_restart(self) -> None:
        self.crashed = True
        self.live.kill9()
        self.live.start()
        Isolation.client.http.close()
        Isolation.client = Client(self.live.url)  # the port may have changed
        self.stats["crash"] += 1
        self.check_unchanged()
        for who in range(N_TENANTS + 1):
            tenant, key = self.reader(who)
            view = self.model.visible(tenant)
            found = ok(self.call("POST", f"{self.base}/points", key, {"ids": ID_POOL}))
            assert {p["id"] for p in found} == view, f"{tenant}: retrieve after restart"
            body = {"query": vector_of(0), "limit": BIG}
            hits = ok(self.call("POST", f"{self.base}/points/query", key, body))["points"]
            assert {h["id"] for h in hits} == view, f"{tenant}: query after restart"
        for old in self.revoked:
            assert_denied(self.call("POST", f"{self.base}/points", old, {"ids": ID_POOL}))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_leak_across_kill9(live: LiveServer) -> None:
    Isolation.live = live
    Isolation.client = Client(live.url)
    Isolation.stats.clear()
    try:
        run_state_machine_as_test(
            IsolationAcrossCrashes,
            settings=settings(
                max_examples=4,
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.reuse, Phase.generate],
                report_multiple_bugs=False,
            ),
        )
    finally:
        Isolation.client.http.close()
    assert Isolation.stats["crash"] > 0, dict(Isolation.stats)
