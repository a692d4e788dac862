"""Our index (vectordb.SpannIndex) as a benchmarked system: build (cached), cold-cache searches.

The build is cached under benchmarks/out/vectordb/spann/<dataset>-<code>/, where <code> is a hash
of vectordb/*.py: any change to the index code rebuilds (the on-disk format may have changed), and
the new build removes the builds of the same data by other code versions (never reused again,
each as big as the dataset) unless an index holds them open. A ``BUILT`` stamp is written after
``aclose``, so a killed build is never reused.

Each timed search first drops the index's data files from the page cache (``index.data_files()``,
``posix_fadvise(DONTNEED)``; the index reads with O_DIRECT anyway). Bytes and pages per query come
from the index's own counters (``stats()`` before/after). The index reads the union of the lists
a whole batch needs once, so the batch figure shares lists between queries; ``alone`` figures come
from a sample of queries searched one at a time (no sharing), comparable with faiss's per-query
figure.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import hashlib
import importlib
import os
import pkgutil
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

import vectordb
from benchmarks.vectordb._common import drop_page_cache, log
from benchmarks.vectordb._data import Dataset
from vectordb import IndexConfig, SearchParams, SpannIndex

_ALONE_SAMPLE = 50  # queries searched one by one for the unshared I/O figure


@functools.cache
def code_hash() -> str:
    """Hash of vectordb/*.py, taken once, when every vectordb module is imported: the index
    imports its parts lazily, and an edit to vectordb/ during a long run must neither mix code
    versions nor rename the build the run already uses."""
    for module in pkgutil.iter_modules(vectordb.__path__):
        importlib.import_module(f"vectordb.{module.name}")
    digest = hashlib.sha256()
    for source in sorted(Path(vectordb.__file__).resolve().parent.glob("*.py")):
        digest.update(source.name.encode() + source.read_bytes())
    return digest.hexdigest()[:10]


async def _build(
    directory: Path,
    ds: Dataset,
    ids: np.ndarray | None,
    rows: Any,
    dtype: str = "float32",
    overrides: dict[str, Any] | None = None,
) -> float:
    start = time.perf_counter()
    # defaults throughout, but for the posting-list precision of the float16 variant (and what
    # a sweep of one setting overrides)
    config = IndexConfig(dim=ds.base.shape[1], metric=ds.metric, dtype=dtype, **(overrides or {}))
    index = await SpannIndex.create(directory, config)
    try:
        await index.build(ids, rows, progress=True)
    finally:
        await index.aclose()
    build_s = time.perf_counter() - start
    (directory / "BUILT").write_text(f"{build_s:.3f}\n")
    return build_s


def cached_build(
    runner: asyncio.Runner,
    cache_dir: Path,
    tag: str,
    ds: Dataset,
    ids: np.ndarray | None = None,
    dtype: str = "float32",
    overrides: dict[str, Any] | None = None,
    reuse_any: bool = False,
) -> tuple[Path, float]:
    """(index directory, build seconds) for ``ds`` (rows ``ids`` only, if given).
    ``reuse_any``: without a build by this code, the newest finished one of the same data by
    other vectordb code (the caller vouches the on-disk format is the same: a 2M build is
    ~10-20 min, and a timed run must not start with one)."""
    suffix = "" if dtype == "float32" else f"-{dtype}"
    suffix += "".join(f"-{key}{value}" for key, value in sorted((overrides or {}).items()))
    directory = cache_dir / f"{tag}{suffix}-{code_hash()}"
    stamp = directory / "BUILT"
    if not stamp.exists() and reuse_any:
        directory = next(iter(_finished_siblings(directory)), directory)
        stamp = directory / "BUILT"
    if stamp.exists():
        log(f"ours: reusing the build in {directory}")
        return directory, float(stamp.read_text())
    rows = ds.base if ids is None else np.ascontiguousarray(ds.base[ids])
    log(f"ours: building {len(rows):,} vectors into {directory}")
    _remove_stale_builds(directory)
    shutil.rmtree(directory, ignore_errors=True)  # a build that never finished
    build_s = runner.run(_build(directory, ds, ids, rows, dtype, overrides))
    log(f"ours: built in {build_s:.1f} s")
    return directory, build_s


def _siblings(directory: Path) -> list[Path]:
    """The builds of the same data and settings as ``directory`` by other vectordb code."""
    stem = directory.name.rsplit("-", 1)[0]
    same = re.compile(re.escape(stem) + r"-[0-9a-f]{10}")
    return [p for p in directory.parent.glob("*") if p != directory and same.fullmatch(p.name)]


def _finished_siblings(directory: Path) -> list[Path]:
    """Those of ``_siblings`` whose build finished, newest first."""
    done = [p for p in _siblings(directory) if (p / "BUILT").exists()]
    return sorted(done, key=lambda p: (p / "BUILT").stat().st_mtime, reverse=True)


def _remove_stale_builds(directory: Path) -> None:
    """Remove the siblings of ``directory`` that differ from it only in the code hash."""
    for other in _siblings(directory):
        if not _in_use(other):
            log(f"ours: removing {other}, built by other vectordb code")
            shutil.rmtree(other, ignore_errors=True)


def _in_use(index_dir: Path) -> bool:
    """Whether an open SpannIndex holds the directory's LOCK (another run, older code)."""
    try:
        fd = os.open(index_dir / "LOCK", os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock
    return False


class OursSystem:
    """SpannIndex; knob ``max_postings``; cold page cache before every timed search."""

    name, knob = "ours", "max_postings"

    def __init__(
        self,
        runner: asyncio.Runner,
        ds: Dataset,
        cache_dir: Path,
        dtype: str = "float32",
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.runner = runner
        if dtype != "float32":
            self.name = f"ours_{dtype.replace('float', 'fp')}"
        directory, self.build_s = cached_build(
            runner, cache_dir, ds.name, ds, dtype=dtype, overrides=overrides
        )
        self.index: SpannIndex = runner.run(SpannIndex.open(directory))
        self.stats: dict[str, Any] = self.index.stats()
        self.resident_bytes = float(self.stats["resident_bytes"])
        self._alone: dict[int, dict] = {}

    def _search(self, queries: np.ndarray, k: int, value: int) -> np.ndarray:
        params = SearchParams(max_postings=int(value))
        ids, _ = self.runner.run(self.index.search(queries, k=k, params=params))
        return ids

    def run(self, value: int, queries: np.ndarray, k: int) -> tuple[np.ndarray, float, dict]:
        drop_page_cache(self.index.data_files())
        before = self.index.stats()
        start = time.perf_counter()
        ids = self._search(queries, k, value)
        wall_s = time.perf_counter() - start
        after = self.index.stats()
        q = len(queries)
        io = {
            "bytes": (after["bytes_read"] - before["bytes_read"]) / q,
            "pages": (after["pages_read"] - before["pages_read"]) / q,
        }
        io.update(self.alone(value, queries, k))
        return ids, wall_s, io

    def alone(self, value: int, queries: np.ndarray, k: int) -> dict:
        """Bytes and pages per query when each query is its own batch (measured once)."""
        if value not in self._alone:
            before = self.index.stats()
            for row in queries[:_ALONE_SAMPLE]:
                self._search(row[None, :], k, value)
            after = self.index.stats()
            n = min(_ALONE_SAMPLE, len(queries))
            self._alone[value] = {
                "bytes_alone": (after["bytes_read"] - before["bytes_read"]) / n,
                "pages_alone": (after["pages_read"] - before["pages_read"]) / n,
            }
        return self._alone[value]

    def close(self) -> None:
        self.runner.run(self.index.aclose())
