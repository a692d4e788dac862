"""Memory cgroups for the budget benchmark: one per worker process, removed after it.

cgroup v1 (``memory.limit_in_bytes``) counts a group's anonymous memory and the page cache its
processes brought in, so a cap holds an mmapped index (faiss OnDisk) to the same bytes as a
cache inside a process (ours). v2 (``memory.max``) counts the same; it is used where the v1
memory controller is absent.

A group is made a child of the memory cgroup this process already is in (``/proc/self/cgroup``),
not of the root: a limit the machine puts on us keeps holding for the workers, and nothing is
moved out of the accounting it belongs to. A worker joins its group before Python starts: it is
launched as ``sh -c 'echo $$ > cgroup.procs && exec python ...'`` (``wrap``), so the interpreter
and every library it imports are counted, as the budget (baseline + data) assumes.

Only the standard library here: the worker imports this before anything it measures.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")
_V1_FILES = {"limit": "memory.limit_in_bytes", "usage": "memory.usage_in_bytes",
             "peak": "memory.max_usage_in_bytes"}  # fmt: skip
_V2_FILES = {"limit": "memory.max", "usage": "memory.current", "peak": "memory.peak"}


@dataclass
class Cgroup:
    path: Path
    version: int  # 1 or 2

    def _file(self, what: str) -> Path:
        return self.path / (_V1_FILES if self.version == 1 else _V2_FILES)[what]

    def set_limit(self, limit_bytes: int) -> None:
        self._file("limit").write_text(str(limit_bytes))

    def peak_bytes(self) -> int | None:
        """The group's high-water mark (v2 kernels before 5.19 have none)."""
        try:
            return int(self._file("peak").read_text())
        except (OSError, ValueError):
            return None

    def events(self) -> dict[str, int]:
        """How often the limit was hit (v1 failcnt) and how many processes the OOM killer took."""
        out: dict[str, int] = {}
        with contextlib.suppress(OSError, ValueError):
            if self.version == 1:
                out["limit_hits"] = int((self.path / "memory.failcnt").read_text())
                lines = (self.path / "memory.oom_control").read_text().splitlines()
            else:
                lines = (self.path / "memory.events").read_text().splitlines()
            for line in lines:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    out["oom_kills"] = int(value)
                elif key == "max":  # v2: times usage reached memory.max
                    out["limit_hits"] = int(value)
        return out

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` started inside this group: the shell writes its own pid, then execs."""
        procs = str(self.path / "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *command]

    def remove(self) -> None:
        """rmdir the group; its last process may take a moment to leave it after exiting."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def usage_bytes(path: str) -> int | None:
    """Bytes charged to the group at ``path`` now (read by the worker inside it)."""
    for name in (_V1_FILES["usage"], _V2_FILES["usage"]):
        with contextlib.suppress(OSError, ValueError):
            return int(Path(path, name).read_text())
    return None


def _own_v1_group() -> Path:
    """The v1 memory cgroup this process is in (the root where it cannot be told)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, where = line.split(":", 2)
            if "memory" in controllers.split(","):
                return V1_ROOT / where.lstrip("/")
    return V1_ROOT


def create(name: str) -> tuple[Cgroup | None, str]:
    """A new, unlimited memory cgroup ``name`` (made unique by our pid), or None and why not."""
    unique = f"{name}-{os.getpid()}"
    if (V1_ROOT / "memory.limit_in_bytes").exists():
        candidates = [(_own_v1_group() / unique, 1)]
    elif (V2_ROOT / "cgroup.controllers").exists():
        candidates = [(V2_ROOT / unique, 2)]  # v2 forbids a child of a group with processes
    else:
        return None, "no memory cgroup controller mounted"
    why = ""
    for path, version in candidates:
        try:
            path.mkdir()
            group = Cgroup(path, version)
            group.set_limit(2**62)  # probes run unlimited; set_limit caps the real workers
            return group, ""
        except OSError as error:
            with contextlib.suppress(OSError):
                path.rmdir()
            why = f"cannot create {path}: {error.strerror or error}"
    return None, why
