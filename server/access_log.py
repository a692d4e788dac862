"""The access log's writer: the event loop hands each answered request's line over as a tuple;
a thread of its own turns what has queued into JSON lines and logs them as one record.

Why: one ``logging`` record per request cost the event loop, which also drives the index, a
LogRecord, a JSON encoding and the QueueHandler's formatting and copy on every request, and
the log thread a ``write`` and a flush per line (py-spy of the server at concurrency 64 on
debian-minilm: ~4% of the loop thread's samples and ~9% of a log thread's). Now the loop puts
a tuple on a queue (no lock, no allocation beyond the tuple); the writer drains the queue and
logs every line it found, newline-separated, through the ``tierkit.server.access`` logger, so
the output is still one JSON object a line and goes where that logger's handlers send it.

Lines are written in the order requests finished, shortly after (the writer wakes on the
first queued line). ``flush(timeout_s)`` waits until every line queued before it is logged:
the app's shutdown calls it, so the last requests' lines are out before the log thread stops.

Thread-safety: ``put`` from any thread (the event loop in practice); one writer thread per
process, started on first use, a daemon.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

import orjson

__all__ = ["AccessWriter", "access_log", "writer"]

access_log = logging.getLogger("tierkit.server.access")
FIELDS = ("request_id", "method", "route", "status", "duration_ms", "tenant")
_MAX_LINES_PER_RECORD = 256


class AccessWriter:
    def __init__(self, logger: logging.Logger = access_log) -> None:
        self.logger = logger
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.records = 0  # log records written (each holds one or more lines)

    def put(self, line: tuple[Any, ...]) -> None:
        """Queue one request's fields, in FIELDS' order."""
        if self._thread is None:
            self._start()
        self._queue.put(line)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the lines queued so far are logged; False on timeout."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="tierkit-access-log", daemon=True)
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        while True:
            lines: list[str] = []
            waiters: list[threading.Event] = []
            item = self._queue.get()
            while True:
                if isinstance(item, threading.Event):
                    waiters.append(item)
                else:
                    lines.append(orjson.dumps(dict(zip(FIELDS, item, strict=True))).decode())
                if len(lines) >= _MAX_LINES_PER_RECORD:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if lines:
                self.logger.info("\n".join(lines))  # logging reports a handler's errors
                self.records += 1
            for waiter in waiters:
                waiter.set()


writer = AccessWriter()
