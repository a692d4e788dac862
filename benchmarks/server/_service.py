"""The service under test: ``python -m tierkit serve`` in its own process on a loopback port.

``Server`` starts it on a data folder with an admin key from the environment, waits for
``GET /readyz``, and stops it with SIGTERM (the service checkpoints on shutdown). ``upload``
creates the collection and sends the base vectors in ``batch`` form, ``wait=true``, chunk by
chunk (halving a chunk the server finds too large). The server's log goes to a file beside its
data, not to this process's output.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson

from benchmarks.common.paths import REPO_ROOT
from benchmarks.server._http import HttpConn, HttpError

ADMIN_KEY = "tk_admin_bench_0123456789abcdef"
COLLECTION = "bench"
_READY_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def env() -> dict[str, str]:
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def serve_available() -> str | None:
    """None when ``python -m tierkit serve`` exists here; else why not."""
    cmd = [sys.executable, "-m", "tierkit", "serve", "--help"]
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=env(), capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"`python -m tierkit serve` is not available at this commit ({tail[0][:200]})"
    return None


class Server:
    """One service process; ``pid`` is what the load generator watches."""

    def __init__(
        self,
        data_dir: Path,
        log_level: str | None = None,
        command: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        """``command``: what runs instead of ``tierkit serve`` (``--data D --port P`` are
        appended; memory_probe's instrumented server)."""
        self.data_dir, self.port = data_dir, free_port()
        self.log_path = data_dir.parent / f"{data_dir.name}.server.log"
        if command is None:
            cmd = [sys.executable, "-m", "tierkit", "serve", "--data", str(data_dir)]
            cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        else:
            cmd = [*command, "--data", str(data_dir), "--port", str(self.port)]
        extra = {"TIERKIT_ADMIN_KEY": ADMIN_KEY, **(extra_env or {})}
        if log_level:
            extra["TIERKIT_LOG_LEVEL"] = log_level
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env={**env(), **extra}, stdout=self._log, stderr=self._log
        )
        self.started = time.perf_counter()
        self.ready_s = self._wait_ready()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_ready(self) -> float:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if sock.recv(64).split(b" ")[1:2] == [b"200"]:
                        return time.perf_counter() - self.started
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"no 200 from /readyz in {_READY_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 600) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGTERM, wait for the drain and checkpoint; kill after a minute. The exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def conn(self) -> HttpConn:
        return HttpConn("127.0.0.1", self.port, {"api-key": ADMIN_KEY})


async def upload(server: Server, base: np.ndarray, chunk: int = 1000) -> float:
    """Create the collection and upsert every base row (id = row); seconds taken."""
    conn = server.conn()
    started = time.perf_counter()
    body = {"vectors": {"size": int(base.shape[1]), "distance": "Cosine"}}
    await conn.call("PUT", f"/collections/{COLLECTION}", orjson.dumps(body))
    path = f"/collections/{COLLECTION}/points?wait=true"
    start = 0
    while start < len(base):
        rows = np.ascontiguousarray(base[start : start + chunk], np.float32)
        ids = list(range(start, start + len(rows)))
        payload = orjson.dumps(
            {"batch": {"ids": ids, "vectors": rows}}, option=orjson.OPT_SERIALIZE_NUMPY
        )
        try:
            await conn.call("PUT", path, payload)
        except HttpError as exc:
            if exc.status == 413 and chunk > 16:
                chunk //= 2  # the server's body limit: smaller chunks
                continue
            raise
        start += len(rows)
    conn.close()
    return time.perf_counter() - started


def build_server_data(data_dir: Path, base: np.ndarray, log_level: str | None) -> float:
    """A fresh data folder holding the collection: started, uploaded, stopped."""
    server = Server(data_dir, log_level)
    try:
        seconds = asyncio.run(upload(server, base))
    finally:
        status = server.stop()
    if status not in (0, None, -signal.SIGTERM):
        raise RuntimeError(f"the server exited {status} after the upload: {server.log_tail()}")
    return seconds
