"""Run the service under uvicorn: one worker, one event loop, graceful shutdown.

    serve(load_settings({"data_dir": "data", "port": 6333}))

On SIGINT/SIGTERM uvicorn stops accepting connections, waits up to ``graceful_timeout_s`` for
in-flight requests, then runs the app's shutdown (the catalog checkpoints). Logs go to stderr,
one JSON line per request from the ``tierkit.server.access`` logger, written by a thread of
their own (see ``_configure_logging``); stdout carries only the admin key line of a first
start.

Thread-safety: call once, from the main thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
from collections.abc import Generator
from logging.handlers import QueueHandler, QueueListener

import uvicorn

from server.access_log import access_log
from server.app import create_app
from server.http_protocol import OneWriteHttpToolsProtocol
from server.settings import Settings

__all__ = ["serve"]


def _configure_logging(level: str) -> QueueListener:
    """Records are queued by the event loop and written by the listener's thread: a write to
    stderr lets go of the GIL, and under load the loop would then wait for a search thread to
    give it back (up to the 5 ms switch interval) once per request. The access log is written
    by a thread of its own already (server.access_log): it writes through the same handler
    (one lock: lines never interleave) without a second hop through the listener's thread."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = QueueListener(records, handler)
    listener.start()
    for name in ("tierkit", "uvicorn.error", access_log.name):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler if name == access_log.name else QueueHandler(records)]
        logger.setLevel(level.upper())
        logger.propagate = False
    return listener


class _FlushingServer(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM when ``capture_signals`` exits, which ends the
    process before any ``finally`` after ``run()``: the queued lines ("Application shutdown
    complete", the last access lines) are written first, here."""

    def __init__(self, config: uvicorn.Config, listener: QueueListener) -> None:
        super().__init__(config)
        self._listener: QueueListener | None = listener

    def stop_logging(self) -> None:
        """Writes what is queued and stops the writer thread; once (a second stop would fail)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self.stop_logging()  # before the captured signal is raised again


def serve(settings: Settings) -> None:
    listener = _configure_logging(settings.log_level)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        workers=1,
        # uvloop (a dependency) when importable, else asyncio's loop: the loop in C cut the
        # server's CPU per query at concurrency 64 (issue 16's c64 ratio; RESULTS.md)
        loop="auto",
        # httptools, each response's header block and body in one write (server.http_protocol)
        http=OneWriteHttpToolsProtocol,
        log_config=None,  # ours above; uvicorn's access log is replaced by the JSON one
        access_log=False,
        timeout_graceful_shutdown=max(1, round(settings.graceful_timeout_s)),
        lifespan="on",
    )
    server = _FlushingServer(config, listener)
    try:
        server.run()
    finally:
        server.stop_logging()
    if not server.started:  # the port was taken, or the app failed to start
        raise SystemExit(1)
