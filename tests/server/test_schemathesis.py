"""Schemathesis against our live /openapi.json: no 5xx, and every response matches the schema.

Every operation the schema lists gets a bounded number of generated requests (valid and
invalid ones) with the admin key; each response must not be a server error, must have a
status code and content type the schema documents, and a body that matches its schema.
Generated collection names rarely exist, so each operation on a collection runs once more with
``collection_name`` set to "docs", a small collection made first (and made again when a
generated DELETE removed it), with the admin key and then with a tenant key. Bounded: 20
examples per operation and mode, derandomized (the same requests each run), under a minute.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.live_server import LiveServer, result

pytestmark = [pytest.mark.slow]

EXAMPLES_PER_OPERATION = 20
CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def ensure_docs(live: LiveServer) -> None:
    """The "docs" collection (4-d, 20 points), made again if a generated request deleted it."""
    if live.admin("GET", "/collections/docs").status_code == 200:
        return
    result(live.admin("PUT", "/collections/docs", {"vectors": {"size": 4, "distance": "Dot"}}))
    points = [{"id": i, "vector": [i, 1, 0, 0], "payload": {"k": f"v{i % 3}"}} for i in range(20)]
    result(
        live.admin("PUT", "/collections/docs/points", {"points": points}, params={"wait": "true"})
    )


@pytest.fixture(scope="module")
def api_schema(live: LiveServer) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(live.url + "/openapi.json")


def test_schema_lists_the_api(api_schema: schemathesis.BaseSchema) -> None:
    """The documented API is the one issue 16 names (a schema of nothing would pass below)."""
    paths = set(api_schema.raw_schema["paths"])
    for path in (
        "/collections",
        "/collections/{collection_name}",
        "/collections/{collection_name}/index",
        "/collections/{collection_name}/points",
        "/collections/{collection_name}/points/{point_id}",
        "/collections/{collection_name}/points/delete",
        "/collections/{collection_name}/points/count",
        "/collections/{collection_name}/points/query",
        "/collections/{collection_name}/points/query/batch",
        "/collections/{collection_name}/points/grant",
        "/collections/{collection_name}/points/revoke",
        "/admin/keys",
        "/admin/keys/{key_id}",
    ):
        assert path in paths, f"{path} is not in /openapi.json"
    # Request bodies are described (so that generated requests are shaped like real ones).
    put = api_schema.raw_schema["paths"]["/collections/{collection_name}/points"]["put"]
    assert "requestBody" in put


def run_operation(
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    live: LiveServer,
    path_parameters: dict[str, str] | None = None,
    key: str | None = None,
) -> None:
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],  # no shrinking: report as found
        database=None,
        derandomize=True,  # the same requests every run: a failure reproduces
    )
    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(
            base_url=live.url,
            headers={"api-key": key or live.admin_key},
            checks=CHECKS,
            timeout=30,
        )

    try:
        run()
    except Unsatisfiable:
        # Nothing to make invalid (GET /healthz has no parameters): no negative case exists.
        assert mode is schemathesis.GenerationMode.NEGATIVE
        assert not operation.path_parameters and not operation.body


@pytest.mark.timeout(240)
def test_api_conforms(api_schema: schemathesis.BaseSchema, live: LiveServer) -> None:
    """Each operation with valid and with invalid generated requests, and the operations on a
    collection once more with valid requests to an existing one ("docs")."""
    failures = []
    operations = 0
    tenant_key = result(live.admin("POST", "/admin/keys", {"tenant": "fuzzer"}))["key"]
    for found in api_schema.get_all_operations():
        operation = found.ok()  # a schema error fails here, naming the operation
        operations += 1
        positive = schemathesis.GenerationMode.POSITIVE
        runs: list[tuple[schemathesis.GenerationMode, dict[str, str] | None, str | None]] = [
            (mode, None, None) for mode in schemathesis.GenerationMode
        ]
        if "{collection_name}" in operation.path:
            runs.append((positive, {"collection_name": "docs"}, None))
            # and as a tenant: its refusals (403) and scoped answers are documented too
            runs.append((positive, {"collection_name": "docs"}, tenant_key))
        for mode, params, key in runs:
            ensure_docs(live)
            try:
                run_operation(operation, mode, live, params, key)
            except Exception as exc:  # collect: one report of every operation that fails
                how = ", docs" if params else ""
                how += ", tenant key" if key else ""
                failures.append(f"--- {operation.label} ({mode.value}{how}) ---\n{exc}")
    assert operations >= 15
    assert not failures, f"{len(failures)} run(s) fail:\n" + "\n".join(failures)
