"""Where benchmarks keep their files and find shared data, whatever the working directory.

``OUT_DIR`` (benchmarks/out/, git-ignored) holds outputs, caches and scratch files; ``SHARED_DATA``
is the data checkout beside the repository (``../shared/data``), which some parts need and skip
without.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["OUT_DIR", "REPO_ROOT", "SHARED_DATA"]

REPO_ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = REPO_ROOT / "benchmarks" / "out"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
