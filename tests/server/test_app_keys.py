"""API keys: stored only as scrypt hashes, verified once then cached, revoked at once, and
enforced on every route (401 without or with a wrong key, 403 revoked or not the admin's), with
no key ever echoed. In-process (httpx over ASGI) except the first-start print, which runs the
real command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from server.keys import ForbiddenError, KeyStore, UnauthorizedError
from tests.server.asgi_app import asgi_service

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "tk_00000000a11e_" + "s" * 32


@contextlib.asynccontextmanager
async def client(data: Path, **settings: object) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_service(data, ADMIN, send_key=False, **settings) as (http, _app):
        yield http


def test_keys_file_holds_hashes_only(tmp_path: Path) -> None:
    store, created = KeyStore.open(str(tmp_path))
    assert created is not None and created.startswith("tk_")
    key, record = store.create("acme", max_points=10, rps=5.0)
    text = (tmp_path / "keys.json").read_text()
    for secret in (key, created, key.split("_", 2)[2], created.split("_", 2)[2]):
        assert secret not in text
    assert record.key_id in text and "acme" in text
    assert oct((tmp_path / "keys.json").stat().st_mode & 0o777) == "0o600"
    listed = json.dumps(store.list())
    assert "hash" not in listed and "salt" not in listed and key not in listed
    # a second open finds the admin key: nothing new to print
    again, created_again = KeyStore.open(str(tmp_path))
    assert created_again is None
    principal = asyncio.run(again.authenticate(key))
    assert (principal.tenant, principal.max_points, principal.rps) == ("acme", 10, 5.0)


def test_verification_is_cached_and_revoke_is_immediate(tmp_path: Path) -> None:
    store, admin = KeyStore.open(str(tmp_path))
    key, record = store.create("acme")

    async def run() -> None:
        started = time.perf_counter()
        await store.authenticate(key)
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(100):
            await store.authenticate(key)
        cached_s = (time.perf_counter() - started) / 100
        assert cached_s < first_s / 10, (first_s, cached_s)  # no KDF per request
        assert store.revoke(record.key_id)
        with pytest.raises(ForbiddenError):
            await store.authenticate(key)
        for wrong in (None, "", key[:-1] + "x", "tk_ffffffffffff_" + "x" * 20, "plain"):
            with pytest.raises(UnauthorizedError) as caught:
                await store.authenticate(wrong)
            assert wrong is None or wrong == "" or wrong not in str(caught.value)
        assert (await store.authenticate(admin)).is_admin
        # a wrong key repeated, and a revoked key repeated, cost no KDF either
        for refused, error in [
            ("tk_abcdefabcdef_" + "w" * 20, UnauthorizedError),
            (key, ForbiddenError),
        ]:
            timings = []
            for _ in range(2):
                started = time.perf_counter()
                with pytest.raises(error):
                    await store.authenticate(refused)
                timings.append(time.perf_counter() - started)
            assert timings[1] < timings[0] / 10 or timings[1] < 0.02, timings  # scrypt: ~50 ms

    asyncio.run(run())


def test_env_admin_key_is_stored_hashed(tmp_path: Path) -> None:
    store, created = KeyStore.open(str(tmp_path), admin_key=ADMIN)
    assert created is None
    assert ADMIN not in (tmp_path / "keys.json").read_text()
    assert asyncio.run(store.authenticate(ADMIN)).is_admin
    with pytest.raises(ValueError):
        KeyStore.open(str(tmp_path / "short"), admin_key="short")


def test_routes_refuse_missing_wrong_and_revoked_keys(tmp_path: Path) -> None:
    async def run() -> None:
        async with client(tmp_path / "data") as http:
            admin = {"api-key": ADMIN}
            made = (await http.post("/admin/keys", json={"tenant": "acme"}, headers=admin)).json()
            key, key_id = made["result"]["key"], made["result"]["key_id"]
            tenant = {"api-key": key}
            assert (await http.get("/collections", headers=tenant)).status_code == 200
            bearer = {"Authorization": f"Bearer {key}"}
            assert (await http.get("/collections", headers=bearer)).status_code == 200
            wrong = key[:-4] + "abcd"
            for headers, status in [({}, 401), ({"api-key": wrong}, 401)]:
                response = await http.get("/collections", headers=headers)
                assert response.status_code == status
                assert response.json()["status"]["error"]
                assert wrong not in response.text and key not in response.text
            # a tenant on admin routes: 403
            for method, path, body in [
                ("POST", "/admin/keys", {"tenant": "other"}),
                ("GET", "/admin/keys", None),
                ("DELETE", f"/admin/keys/{key_id}", None),
                ("PUT", "/collections/c", {"vectors": {"size": 4, "distance": "Dot"}}),
                ("DELETE", "/collections/c", None),
            ]:
                response = await http.request(method, path, json=body, headers=tenant)
                assert response.status_code == 403, (method, path, response.text)
            listed = (await http.get("/admin/keys", headers=admin)).text
            assert key not in listed and ADMIN not in listed and "hash" not in listed
            assert (await http.delete(f"/admin/keys/{key_id}", headers=admin)).status_code == 200
            response = await http.get("/collections", headers=tenant)
            assert response.status_code == 403 and key not in response.text
            assert (await http.delete("/admin/keys/nope", headers=admin)).status_code == 404

    asyncio.run(run())


def test_rate_limit_answers_429_with_retry_after(tmp_path: Path) -> None:
    async def run() -> None:
        async with client(tmp_path / "data") as http:
            admin = {"api-key": ADMIN}
            body = {"tenant": "slow", "rps": 2.0}
            key = (await http.post("/admin/keys", json=body, headers=admin)).json()["result"]["key"]
            codes = []
            for _ in range(5):
                response = await http.get("/collections", headers={"api-key": key})
                codes.append(response.status_code)
                if response.status_code == 429:
                    assert int(response.headers["Retry-After"]) >= 1
                    assert "rate limit" in response.json()["status"]["error"]
            assert codes[:2] == [200, 200] and 429 in codes[2:]
            # the admin has no limit
            for _ in range(5):
                assert (await http.get("/collections", headers=admin)).status_code == 200

    asyncio.run(run())


def test_first_start_prints_the_admin_key_once(tmp_path: Path) -> None:
    """The real command: ``admin key: tk_...`` on stdout the first time, never again."""
    env = {k: v for k, v in os.environ.items() if k != "TIERKIT_ADMIN_KEY"}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "server", "--data", str(tmp_path / "d"), "--port", "0"]
    outputs = []
    for _ in range(2):
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        ) as proc:
            deadline = time.monotonic() + 60
            assert proc.stderr is not None
            for line in proc.stderr:  # uvicorn says when it is up
                if "Uvicorn running" in line or time.monotonic() > deadline:
                    break
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
            outputs.append(out)
    assert outputs[0].count("admin key: tk_") == 1, outputs[0]
    key = outputs[0].split("admin key: ")[1].split()[0]
    assert "admin key" not in outputs[1]
    assert key not in (tmp_path / "d" / "keys.json").read_text()
