"""Operations over real HTTP: health and readiness, request ids, one JSON log line per request
(never a key), and Prometheus metrics by route template with the collections' counters."""

from __future__ import annotations

import json
import re
import time

import httpx

from tests.server.live_server import LiveServer, result


def test_health_and_readiness_need_no_key(live: LiveServer) -> None:
    assert result(httpx.get(live.url + "/healthz")) == {"status": "alive"}
    assert result(httpx.get(live.url + "/readyz")) == {"status": "ready"}


def test_request_id_is_echoed_or_made(live: LiveServer) -> None:
    given = httpx.get(live.url + "/healthz", headers={"X-Request-Id": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"
    made = httpx.get(live.url + "/healthz").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f-]{36}", made)
    odd = httpx.get(live.url + "/healthz", headers={"X-Request-Id": "a b\tc"})
    assert odd.headers["x-request-id"] != "a b\tc"  # not echoed into our logs as given


def test_metrics_count_requests_by_route_and_collection(live: LiveServer) -> None:
    result(live.admin("PUT", "/collections/m", {"vectors": {"size": 2, "distance": "Dot"}}))
    result(live.admin("PUT", "/collections/m/points", {"points": [{"id": 1, "vector": [1, 0]}]}))
    for _ in range(3):
        result(live.admin("POST", "/collections/m/points/count", {}))
    live.call("GET", "/collections", "tk_000000000000_wrongwrongwrongwrong")
    response = httpx.get(live.url + "/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/")
    text = response.text
    counted = re.search(
        r'tierkit_http_requests_total\{method="POST",route="/collections/\{collection_name\}'
        r'/points/count",status="200"\} (\d+)',
        text,
    )
    assert counted and int(float(counted.group(1))) >= 3, text[:2000]
    assert 'route="/collections",status="401"' in text
    assert "tierkit_http_request_duration_seconds_bucket" in text
    assert 'tierkit_collection_points{collection="m"} 1.0' in text
    assert "wrongwrong" not in text


def test_access_log_is_json_without_keys(live: LiveServer) -> None:
    marker = "log-check-42"
    live.call("GET", "/collections", live.admin_key)
    headers = {"api-key": live.admin_key, "x-request-id": marker}
    httpx.get(live.url + "/collections", headers=headers)
    deadline = time.monotonic() + 5
    line = None
    while line is None and time.monotonic() < deadline:
        lines = [x for x in live.stderr_path.read_text().splitlines() if marker in x]
        line = json.loads(lines[-1]) if lines else None
        time.sleep(0.05)
    assert line is not None
    assert line["route"] == "/collections" and line["status"] == 200
    assert line["tenant"] == "admin" and line["method"] == "GET"
    assert isinstance(line["duration_ms"], float)
    logs = live.stderr_path.read_text() + live.stdout_path.read_text()
    assert live.admin_key not in logs
