"""Settings precedence, the request timeout, and graceful shutdown draining in-flight writes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from server.deps import shielded
from server.limits import TimeoutMiddleware
from server.ratelimit import RateLimiter
from server.settings import Settings, SettingsError, load_settings
from tests.server.live_server import LiveServer, new_admin_key, result


def test_settings_flags_over_env_over_file(tmp_path: Path) -> None:
    config = tmp_path / "tierkit.toml"
    config.write_text('[server]\nport = 7000\nhost = "0.0.0.0"\nmax_body_bytes = 4096\n')
    env = {"TIERKIT_PORT": "7001", "TIERKIT_SAMPLE": "true"}
    settings = load_settings({"port": 7002, "host": None}, str(config), env)
    assert (settings.port, settings.host, settings.max_body_bytes) == (7002, "0.0.0.0", 4096)
    assert settings.sample is True
    assert load_settings({}, str(config), env).port == 7001
    assert load_settings({}, str(config), {}).port == 7000
    assert load_settings({}, None, {}) == Settings()
    for bad_env in [{"TIERKIT_PORT": "x"}, {"TIERKIT_SAMPLE": "maybe"}, {"TIERKIT_PORT": "70000"}]:
        with pytest.raises(SettingsError):
            load_settings({}, None, bad_env)
    (tmp_path / "bad.toml").write_text("colour = 1\n")
    with pytest.raises(SettingsError, match="unknown"):
        load_settings({}, str(tmp_path / "bad.toml"), {})
    with pytest.raises(SettingsError):
        load_settings({}, str(tmp_path / "missing.toml"), {})


def test_rate_limiter_refills_at_rps() -> None:
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert [limiter.acquire("t", 2.0) for _ in range(2)] == [0.0, 0.0]  # burst = max(1, rps)
    assert limiter.acquire("t", 2.0) == pytest.approx(0.5)
    now[0] += 0.5
    assert limiter.acquire("t", 2.0) == 0.0
    assert limiter.acquire("u", 0.5) == 0.0 and limiter.acquire("u", 0.5) == pytest.approx(2.0)


def test_timeout_answers_504_and_shielded_work_finishes() -> None:
    finished = asyncio.Event()

    async def write() -> None:
        await asyncio.sleep(0.2)
        finished.set()

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await shielded(write())

    async def run() -> None:
        app = TimeoutMiddleware(slow_app, timeout_s=0.05)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            response = await http.get("/")
        assert response.status_code == 504
        assert "timed out" in response.json()["status"]["error"]
        await asyncio.wait_for(finished.wait(), 5)  # the write was not torn

    asyncio.run(run())


def test_sigterm_drains_an_in_flight_upsert(tmp_path: Path) -> None:
    """SIGTERM while a ``wait=true`` upsert runs: it completes, is acknowledged, and is there
    after a restart. A first write of the same size times the second, so the signal lands
    while it is in flight."""
    env = {"TIERKIT_GRACEFUL_TIMEOUT_S": "120"}
    server = LiveServer(tmp_path / "data", new_admin_key(), env=env)
    server.start()
    try:
        n, dim = 4000, 64
        config = {"vectors": {"size": dim, "distance": "Dot"}}
        vectors = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
        body = {"batch": {"ids": list(range(n)), "vectors": vectors}}
        content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
        headers = {"api-key": server.admin_key, "content-type": "application/json"}
        timed: list[float] = []
        for name in ("warm", "g"):
            result(server.admin("PUT", f"/collections/{name}", config))
        started = time.perf_counter()
        url = server.url + "/collections/{}/points?wait=true"
        result(httpx.put(url.format("warm"), content=content, headers=headers, timeout=120))
        timed.append(time.perf_counter() - started)
        answers: list[Any] = []

        def write() -> None:
            try:
                answers.append(
                    httpx.put(url.format("g"), content=content, headers=headers, timeout=120)
                )
            except Exception as exc:  # reported below, with the server's log
                answers.append(exc)

        thread = threading.Thread(target=write)
        thread.start()
        time.sleep(timed[0] / 3)
        assert server.proc is not None
        server.proc.terminate()
        thread.join(150)
        assert answers, "no answer"
        answer = answers[0]
        assert isinstance(answer, httpx.Response), f"{answer!r}\n{server.log_tail()}"
        assert answer.status_code == 200, answer.text[:300]
        # uvicorn re-raises the signal once it has shut down cleanly: -15, or 0
        assert server.stop() in (0, -15)
        assert "Application shutdown complete" in server.stderr_path.read_text()
        server.restart()
        assert result(server.admin("POST", "/collections/g/points/count", {})) == {"count": n}
    finally:
        server.stop()


def test_cli_refuses_bad_settings_before_starting(tmp_path: Path) -> None:
    env = {**os.environ, "TIERKIT_PORT": "not-a-port"}
    for command, environ in [
        (["-m", "tierkit", "serve", "--data", str(tmp_path), "--port", "70000"], None),
        (["-m", "server", "--data", str(tmp_path)], env),
        (["-m", "server", "--data", str(tmp_path), "--config", str(tmp_path / "no.toml")], None),
    ]:
        done = subprocess.run(
            [sys.executable, *command], capture_output=True, text=True, timeout=60, env=environ
        )
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "error:" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "keys.json").exists()  # nothing started
