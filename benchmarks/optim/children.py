"""Run one system in a child process and read its last JSON line and its ``wait4`` usage.

Each system steps in a fresh process so that it starts cold and its peak resident set is its
own. The child reports its own peak (VmHWM, which exec resets) in its JSON line; ``os.wait4``'s
``ru_maxrss`` is kept only as an upper bound: Linux carries the high-water mark across exec, so
it includes this (parent) process's image at fork time, and ``RUSAGE_CHILDREN`` would further
mix every child so far. The child's stdout and
stderr go to a log file under benchmarks/out/ (DeepSpeed is chatty); a child past its timeout is
killed. Not thread-safe: one child at a time, which the benchmark needs anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ChildFailed", "ChildResult", "run_child"]


class ChildFailed(RuntimeError):
    """A system's process exited non-zero or printed no JSON; ``log_path`` has its output."""

    def __init__(self, message: str, log_path: Path):
        super().__init__(f"{message} (log: {log_path})")
        self.log_path = log_path


@dataclass(frozen=True)
class ChildResult:
    record: dict[str, Any]
    wait4_maxrss_bytes: int  # an upper bound: includes the parent's image at fork
    wall_s: float


def run_child(
    command: list[str], env: dict[str, str], log_path: Path, timeout_s: float, cwd: Path
) -> ChildResult:
    """Run ``command``; its last stdout line starting with ``{`` is its record."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start_s = time.perf_counter()
    with open(log_path, "w+", encoding="utf-8") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        timer = threading.Timer(timeout_s, child.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(child.pid, 0)
        finally:
            timer.cancel()
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        wall_s = time.perf_counter() - start_s
        log.seek(0)
        lines = log.read().splitlines()
    if child.returncode != 0:
        tail = "\n".join(lines[-15:])
        raise ChildFailed(f"exit {child.returncode} after {wall_s:.0f} s:\n{tail}", log_path)
    records = [line for line in lines if line.startswith("{")]
    if not records:
        raise ChildFailed("no JSON record printed", log_path)
    return ChildResult(json.loads(records[-1]), usage.ru_maxrss * 1024, wall_s)
