"""Wait for the kernel to finish tearing down a closed io_uring before user code runs on.

Why this exists: closing a ring's last descriptor hands its teardown to a kernel worker, which
some milliseconds later (after an RCU grace period) queues task work on every thread that used the
ring, with ``TWA_SIGNAL``. To the thread that work looks like a pending signal: whatever blocking
call it is in returns early. A ``write`` to a pipe that is not drained at once then returns short
(65,536 bytes: one pipe buffer), and Python's ``print`` to such a stdout silently drops the rest
(``python query.py | jq`` got truncated JSON, exit status 0). Measured on Linux 6.18: the task
work lands 14-15 ms after ``close``.

The remedy is to take that interruption ourselves, in a call built to be interrupted: an
``epoll_wait`` on an empty epoll set, made through libc so Python's PEP 475 retry does not hide
the ``EINTR``. It returns as soon as the task work has run, and the next blocking call of the
thread is whole again. A kernel that never sends the notification (or a race in which it landed
before we started waiting) costs one bounded wait; after :data:`_STRIKES` such waits in a row the
process stops waiting.

Preconditions: called on the thread that created (and so used) the ring, right after the last
descriptor and mapping of it were closed. A real signal arriving during the wait ends it early;
the teardown's own notification may then still interrupt one later call, as without this module.
Concurrency: any thread; the strike counter is advisory.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import select
import time

__all__ = ["wait_for_ring_exit"]

log = logging.getLogger("tierkit.tiers")
_WAIT_S = 0.5  # far above the 15 ms measured; a loaded machine delays the kernel worker
_STRIKES = 3
_libc = ctypes.CDLL(None, use_errno=True)
_libc.epoll_wait.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
_libc.epoll_wait.restype = ctypes.c_int
_timeouts_in_a_row = 0


def wait_for_ring_exit(timeout_s: float = _WAIT_S) -> bool:
    """Block until this thread has taken the ring teardown's interruption, or ``timeout_s``.

    True when the interruption came; False when the wait ran out (or was skipped because the
    kernel has not been seen to send it).
    """
    global _timeouts_in_a_row
    if _timeouts_in_a_row >= _STRIKES:
        return False
    event = ctypes.create_string_buffer(16)  # one struct epoll_event, never filled
    deadline = time.monotonic() + timeout_s
    with select.epoll() as empty:
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            rc = _libc.epoll_wait(empty.fileno(), event, 1, left_ms)
            if rc < 0 and ctypes.get_errno() == errno.EINTR:
                _timeouts_in_a_row = 0
                return True
            if rc < 0:
                break  # cannot wait this way here; do not spin
    _timeouts_in_a_row += 1
    log.debug("io_uring teardown: no task-work notification within %.3f s", timeout_s)
    return False
