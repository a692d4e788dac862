"""The access log's writer: the event loop hands each answered request's line over as a tuple;
a thread of its own turns what has queued into JSON lines and logs them as one record.

Why: one ``logging`` record per request cost the event loop, which also drives the index, a
LogRecord, a JSON encoding and the QueueHandler's formatting and copy on every request, and
the log thread a ``write`` and a flush per line (py-spy of the server at concurrency 64 on
debian-minilm: ~4% of the loop thread's samples and ~9% of a log thread's). Now the loop
appends a tuple to a deque (no lock, no allocation beyond the tuple, and no wake-up: waking a
thread per request is a futex call on the loop and a GIL hand-over it then waits for); the
writer wakes every ``interval_s`` (50 ms), drains what has queued and logs every line it found,
newline-separated, through the ``tierkit.server.access`` logger, so the output is still one
JSON object a line and goes where that logger's handlers send it.

Lines are written in the order requests finished, within ``interval_s``. ``flush(timeout_s)``
wakes the writer and waits until every line queued before it is logged: the app's shutdown
calls it, so the last requests' lines are out before the log thread stops.

Thread-safety: ``put`` from any thread (the event loop in practice); one writer thread per
process, started on first use, a daemon.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import orjson

__all__ = ["AccessWriter", "access_log", "writer"]

access_log = logging.getLogger("tierkit.server.access")
FIELDS = ("request_id", "method", "route", "status", "duration_ms", "tenant")
_MAX_LINES_PER_RECORD = 256
INTERVAL_S = 0.05


class AccessWriter:
    def __init__(self, logger: logging.Logger = access_log, interval_s: float = INTERVAL_S):
        self.logger = logger
        self.interval_s = interval_s
        # lines (tuples) and flush waiters (Events), in order; deque appends and pops are
        # atomic, so the loop and the writer share it without a lock
        self._queue: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()  # set by flush: drain now
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.records = 0  # log records written (each holds one or more lines)

    def put(self, line: tuple[Any, ...]) -> None:
        """Queue one request's fields, in FIELDS' order."""
        if self._thread is None:
            self._start()
        self._queue.append(line)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the lines queued so far are logged; False on timeout."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._queue.append(done)
        self._wake.set()
        return done.wait(timeout_s)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="tierkit-access-log", daemon=True)
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            while self._queue:
                self._drain()

    def _drain(self) -> None:
        """Log up to _MAX_LINES_PER_RECORD queued lines as one record; release the flush
        waiters queued among them once they are out."""
        lines: list[str] = []
        waiters: list[threading.Event] = []
        while self._queue and len(lines) < _MAX_LINES_PER_RECORD:
            item = self._queue.popleft()
            if isinstance(item, threading.Event):
                waiters.append(item)
            else:
                lines.append(orjson.dumps(dict(zip(FIELDS, item, strict=True))).decode())
        if lines:
            self.logger.info("\n".join(lines))  # logging reports a handler's errors
            self.records += 1
        for waiter in waiters:
            waiter.set()


writer = AccessWriter()
