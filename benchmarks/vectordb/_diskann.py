"""DiskANN (diskannpy 0.7.0 disk index) as a benchmarked system, at our index's memory.

diskannpy pins numpy==1.25, so it lives in its own venv (benchmarks/out/venv-diskann, created
here on first use with ``python3 -m venv`` + ``pip install diskannpy==0.7.0``) and runs in a
worker process (``-m benchmarks.vectordb._diskann_worker`` under that venv's Python, the
repository root put on its PYTHONPATH) that reads .npy files and answers JSON lines.

Equal memory: DiskANN's RAM at search time is its PQ codes (+ pivots) and its node cache. The PQ
size is fixed at build (``search_memory_maximum``): we ask for 80% of our resident bytes; the node
cache (``num_nodes_to_cache``, full vector + neighbour list per node) fills the rest, so PQ +
pivots + cache = our ``resident_bytes``. Builds are slow (minutes), cached per dataset and PQ
width under benchmarks/out/vectordb/diskann/; a cached build with a narrower PQ is reused when
it fits the budget. Normalised datasets use metric ``l2`` (same ranking as cosine for unit
vectors). DiskANN reads with O_DIRECT; its files are still fadvised before each timed search.
Bytes per query: not exposed by diskannpy (n/a).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common.paths import REPO_ROOT
from benchmarks.vectordb._common import drop_page_cache, log
from benchmarks.vectordb._data import Dataset

WORKER = ["-m", "benchmarks.vectordb._diskann_worker"]
PQ_SHARE = 0.8
GRAPH_DEGREE = 32
BEAM_WIDTH = 4
THREADS = 2


class Unavailable(Exception):
    """DiskANN cannot run here (install failed, or no cached build in quick mode)."""


def ensure_venv(out_dir: Path) -> Path:
    python = out_dir / "venv-diskann" / "bin" / "python"
    if python.exists():
        return python
    log("diskann: creating benchmarks/out/venv-diskann (pip install diskannpy==0.7.0)")
    for cmd in (
        ["python3", "-m", "venv", str(python.parents[1])],
        [str(python), "-m", "pip", "install", "--quiet", "diskannpy==0.7.0"],
    ):
        done = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            shutil.rmtree(python.parents[1], ignore_errors=True)
            raise Unavailable(f"{' '.join(cmd[:3])} failed: {done.stderr.strip()[-400:]}")
    return python


def _worker_env() -> dict[str, str]:
    """This environment with the repository root first on PYTHONPATH: the worker runs as a
    module of this package whatever the working directory."""
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _npy(array: np.ndarray, path: Path) -> str:
    """A .npy file holding ``array`` for the worker (the memory-mapped original if there is one)."""
    source = getattr(array, "filename", None)
    if source:
        return str(source)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.ascontiguousarray(array, dtype=np.float32))
    return str(path)


def _pq_bytes(directory: Path) -> int:
    """PQ codes + pivots held in RAM by a StaticDiskIndex (the compressed file holds the codes)."""
    return sum(
        (directory / f"ann_{name}.bin").stat().st_size for name in ("pq_compressed", "pq_pivots")
    )


class DiskAnnSystem:
    name, knob = "diskann", "L"

    def __init__(
        self, ds: Dataset, out_dir: Path, data_dir: Path, target_bytes: float, may_build: bool
    ) -> None:
        python = ensure_venv(out_dir)
        cache_dir = out_dir / "vectordb" / "diskann"
        n, dim = ds.base.shape
        want = min(dim, int(PQ_SHARE * target_bytes / n))
        usable = [
            (int(d.name.rsplit("-pq", 1)[1]), d)
            for d in cache_dir.glob(f"{ds.name}-pq*")
            if d.is_dir() and not d.name.endswith(".partial") and _pq_bytes(d) <= target_bytes
        ]
        usable = [(c, d) for c, d in usable if c >= 0.6 * want]
        self.build_s = float("nan")
        if usable:
            chunks, self.directory = max(usable)
            log(f"diskann: reusing {self.directory.name} (PQ {chunks} B/vector; wanted {want})")
        elif not may_build:
            raise Unavailable(f"no cached DiskANN build of {ds.name} fits (quick mode: not built)")
        else:
            self.directory = cache_dir / f"{ds.name}-pq{want}"
            self.build_s = self._build(python, ds, data_dir, want)
        metric = "l2"  # both our datasets are either L2 or unit-normalised (l2 ranks as cosine)
        node_bytes = dim * 4 + (GRAPH_DEGREE + 1) * 4
        pq = _pq_bytes(self.directory)
        self.cache_nodes = max(0, int((target_bytes - pq) // node_bytes))
        self.resident_bytes = float(pq + self.cache_nodes * node_bytes)
        queries = _npy(ds.queries, data_dir / f"{ds.name}_queries.npy")
        args = [str(self.directory), metric, str(dim), str(self.cache_nodes), str(THREADS), queries]
        self.proc = subprocess.Popen(
            [str(python), *WORKER, "serve", *args], env=_worker_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
        )  # fmt: skip
        ready = self._reply()
        self.rss_growth_bytes = float(ready["rss_growth_bytes"])
        log(
            f"diskann: PQ+pivots {pq / 2**20:.1f} MiB + {self.cache_nodes} cached nodes = "
            f"{self.resident_bytes / 2**20:.1f} MiB budget; "
            f"RSS grew {self.rss_growth_bytes / 2**20:.1f} MiB while loading"
        )

    def _build(self, python: Path, ds: Dataset, data_dir: Path, chunks: int) -> float:
        n = len(ds.base)
        partial = self.directory.with_name(self.directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        base = _npy(ds.base, data_dir / f"{ds.name}_base.npy")
        pq_gb = (chunks + 0.5) * n / 2**30  # DiskANN: PQ bytes/vector = floor(budget / n)
        log(f"diskann: building {ds.name} ({n:,} vectors, PQ {chunks} B/vector); slow, minutes")
        start = time.perf_counter()
        cmd = [str(python), *WORKER, "build", base, str(partial), "l2", f"{pq_gb:.6f}", "2"]
        done = subprocess.run(
            cmd, env=_worker_env(), stdout=subprocess.PIPE, stderr=sys.stderr, text=True
        )
        if done.returncode:
            raise Unavailable(f"DiskANN build failed (rc {done.returncode})")
        partial.rename(self.directory)
        return time.perf_counter() - start

    def _reply(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            return json.loads(line)
        raise Unavailable(f"DiskANN worker exited (rc {self.proc.wait()})")

    def run(self, value: int, queries: np.ndarray, k: int) -> tuple[np.ndarray, float, dict]:
        assert self.proc.stdin is not None
        drop_page_cache(str(p) for p in self.directory.iterdir())
        out = self.directory.parent / f"ids-{os.getpid()}.npy"
        request = {"L": max(int(value), k), "k": k, "beam": BEAM_WIDTH, "out": str(out)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self._reply()
        ids = np.load(out)
        out.unlink()
        return ids, float(reply["wall_s"]), {"bytes": float("nan"), "pages": float("nan")}

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
