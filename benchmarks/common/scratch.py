"""Scratch files of a benchmark run: generated inputs, removed when the process ends.

Data files of random bytes (1-4 GiB each, cheap to write again) are scratch: they live under
benchmarks/out/ (git-ignored) and are removed when the process exits, whether the run ends,
fails or is stopped (Ctrl-C, SIGTERM), unless ``--keep-data`` keeps them for the next run.
Caches of costly work (datasets, ground truth, index builds, the DiskANN venv) are not scratch:
they stay under benchmarks/out/ to be reused; removing that folder reclaims them all.
A file half written when the process dies is named ``*.partial`` and rewritten next time.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import sys
import threading
from pathlib import Path

__all__ = ["remove_at_exit"]

_PATHS: list[Path] = []


def remove_at_exit(path: Path, keep: bool = False) -> Path:
    """Remove ``path`` (a file or a directory tree) when the process exits, unless ``keep``.
    Returns ``path``."""
    if keep or path in _PATHS:
        return path
    if not _PATHS:
        atexit.register(_remove_all)
        _exit_on_sigterm()
    _PATHS.append(path)
    return path


def _remove_all() -> None:
    for path in reversed(_PATHS):
        if not path.exists():
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        print(f"removed scratch {path} (--keep-data keeps it)", file=sys.stderr, flush=True)


def _exit_on_sigterm() -> None:
    """A SIGTERM (a timeout, a kill) ends the process without running atexit handlers: turn it
    into a SystemExit, which does. Only where nothing else handles the signal."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
