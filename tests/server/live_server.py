"""The REST service as a real process: ``python -m tierkit serve`` on a free loopback port.

``LiveServer`` starts the service in a subprocess with its data in a given folder, waits until
``GET /readyz`` answers 200 and hands out its ``url``. ``stop()`` sends SIGTERM (the graceful
path) and waits; ``kill9()`` kills it with no chance to flush (the crash tests); ``restart()``
starts it again on the same data folder (and port, while it is free). The server's stdout and
stderr go to files beside the data folder, and a server that dies before it is ready fails the
test with the tail of its log.

``call(method, path, key, json)`` is one request with the ``api-key`` header, for tests that do
not need a client of their own.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def new_admin_key() -> str:
    """A fresh admin key in the service's ``tk_<key_id>_<secret>`` form (12 hex digits of id)."""
    return f"tk_{secrets.token_hex(6)}_{secrets.token_hex(16)}"


def free_port() -> int:
    """A loopback port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(extra: Mapping[str, str] | None, admin_key: str) -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + path if path else "")
    env["TIERKIT_ADMIN_KEY"] = admin_key
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


class ServerDied(RuntimeError):
    """The server process exited (or never became ready); the message holds its log tail."""


class LiveServer:
    """``tierkit serve`` in a subprocess on 127.0.0.1, for end-to-end tests over real HTTP."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        admin_key: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.admin_key = admin_key or new_admin_key()
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        log_dir = self.data_dir.parent
        self.stdout_path = log_dir / f"{self.data_dir.name}.server.stdout.log"
        self.stderr_path = log_dir / f"{self.data_dir.name}.server.stderr.log"

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the server is not running")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tierkit",
            "serve",
            "--data",
            str(self.data_dir),
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def start(self, timeout: float = READY_TIMEOUT_S) -> LiveServer:
        if self.running:
            raise RuntimeError("the server is already running")
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        # Append: a restart keeps the earlier run's log above a marker line.
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            marker = f"\n===== start {self.starts} on port {self.port} =====\n".encode()
            out.write(marker)
            err.write(marker)
            out.flush()
            err.flush()
            self.proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=_env(self.env, self.admin_key),
                cwd=str(ROOT),
            )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self._kill_quietly()
            raise
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        with httpx.Client(timeout=2.0) as client:
            while True:
                assert self.proc is not None
                code = self.proc.poll()
                if code is not None:
                    raise ServerDied(
                        f"the server exited with status {code} before it was ready\n"
                        + self.log_tail()
                    )
                try:
                    response = client.get(self.url + "/readyz")
                    if response.status_code == 200:
                        return
                    last_error = f"/readyz answered {response.status_code}: {response.text[:200]}"
                except httpx.HTTPError as exc:
                    last_error = f"{type(exc).__name__}: {exc}"
                if time.monotonic() > deadline:
                    raise ServerDied(
                        f"the server was not ready within {timeout:.0f} s ({last_error})\n"
                        + self.log_tail()
                    )
                time.sleep(0.1)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL. Returns the exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.proc = None
        return proc.returncode

    def kill9(self) -> int:
        """SIGKILL: the process gets no chance to flush or close anything. Returns its exit
        status (``-9`` unless it had exited already)."""
        proc = self.proc
        if proc is None:
            raise RuntimeError("the server is not running")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.proc = None
        return proc.returncode

    def restart(self, timeout: float = READY_TIMEOUT_S) -> LiveServer:
        """Stop gracefully if still running, then start again on the same data folder."""
        if self.running:
            self.stop()
        self.proc = None
        # Another process may have taken the old port meanwhile (or it lingers in TIME_WAIT):
        # then take a fresh one; callers read ``url`` again after a restart.
        if not _port_free(self.port):
            self.port = free_port()
        return self.start(timeout)

    def _kill_quietly(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        parts = []
        for path in (self.stderr_path, self.stdout_path):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            tail = "\n".join(text.splitlines()[-lines:])
            parts.append(f"--- {path.name} (last {lines} lines) ---\n{tail}")
        return "\n".join(parts)

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests --------------------------------------------------------------------------

    def call(
        self,
        method: str,
        path: str,
        key: str | None = None,
        json: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> httpx.Response:
        """One request to this server; ``key`` goes in the ``api-key`` header when given."""
        return call(self.url, method, path, key, json, params=params, timeout=timeout)

    def admin(self, method: str, path: str, json: Any = None, **kwargs: Any) -> httpx.Response:
        """``call`` with the admin key."""
        return self.call(method, path, self.admin_key, json, **kwargs)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def call(
    base_url: str,
    method: str,
    path: str,
    key: str | None = None,
    json: Any = None,
    *,
    params: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> httpx.Response:
    """One HTTP request with the ``api-key`` header (when ``key`` is given)."""
    headers = {"api-key": key} if key is not None else {}
    return httpx.request(
        method,
        base_url + path,
        headers=headers,
        json=json,
        params=params,
        timeout=timeout,
    )


def result(response: httpx.Response, status: int = 200) -> Any:
    """The ``result`` of a Qdrant envelope, after checking the status code (with the body)."""
    assert response.status_code == status, (
        f"{response.request.method} {response.request.url} -> "
        f"{response.status_code}: {response.text[:500]}"
    )
    body = response.json()
    assert body.get("status") == "ok", body
    return body["result"]


@contextlib.contextmanager
def live_server(
    data_dir: str | os.PathLike[str],
    admin_key: str | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[LiveServer]:
    """``with live_server(tmp / "data") as server:`` — started, ready, stopped on exit."""
    server = LiveServer(data_dir, admin_key=admin_key, extra_args=extra_args, env=env)
    server.start()
    try:
        yield server
    finally:
        server.stop()
