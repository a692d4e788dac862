"""server.access_log: the loop hands lines over as tuples; the writer logs them as JSON lines,
in order, several to a record under load; flush waits for every line queued before it."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from server.access_log import FIELDS, AccessWriter


class _Held(logging.Handler):
    """Collects messages; ``gate`` holds the writer inside its first record (lines pile up)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.gate = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.gate.wait(5)
        self.messages.append(record.getMessage())


@pytest.fixture
def held() -> tuple[AccessWriter, _Held]:
    logger = logging.getLogger("tests.server.access_log")
    logger.handlers[:] = [handler := _Held()]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return AccessWriter(logger), handler


def _line(i: int) -> tuple[object, ...]:
    return (f"r{i}", "POST", "/collections/{name}/points/query", 200, 1.5 + i, "acme")


def test_lines_are_json_in_order_and_batched_when_they_pile_up(
    held: tuple[AccessWriter, _Held],
) -> None:
    writer, handler = held
    writer.put(_line(0))
    for i in range(1, 300):  # queued while the writer is held inside the first record
        writer.put(_line(i))
    handler.gate.set()
    assert writer.flush(5.0)
    lines = [json.loads(x) for m in handler.messages for x in m.split("\n")]
    assert [x["request_id"] for x in lines] == [f"r{i}" for i in range(300)]
    assert lines[7] == dict(zip(FIELDS, _line(7), strict=True))
    assert writer.records < 10  # 300 lines in a few records, not 300


def test_flush_waits_for_the_lines_before_it(held: tuple[AccessWriter, _Held]) -> None:
    writer, handler = held
    assert writer.flush(0.1)  # nothing started yet: nothing to wait for
    writer.put(_line(1))
    assert not writer.flush(0.2)  # the writer is held: the line is not out yet
    handler.gate.set()
    assert writer.flush(5.0)
    assert "r1" in handler.messages[0]


def test_lines_go_out_within_the_interval_without_a_flush() -> None:
    """The loop never wakes the writer: it drains on its own every ``interval_s``."""
    logger = logging.getLogger("tests.server.access_log.timed")
    logger.handlers[:] = [handler := _Held()]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler.gate.set()
    writer = AccessWriter(logger, interval_s=0.02)
    writer.put(_line(1))
    deadline = time.monotonic() + 5.0
    while not handler.messages and time.monotonic() < deadline:
        time.sleep(0.005)
    assert handler.messages and json.loads(handler.messages[0])["request_id"] == "r1"
    writer.put(_line(2))
    writer.put(_line(3))
    assert writer.flush(5.0)
    lines = [json.loads(x)["request_id"] for m in handler.messages for x in m.split("\n")]
    assert lines == ["r1", "r2", "r3"]
