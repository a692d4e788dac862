"""The vectors every system of the load benchmark gets: base, queries, exact top-10, upserts.

* ``debian-minilm``: ../shared/data/debian-minilm (62,440 x 384, L2-normalised, 500 held-out
  queries, exact top-100 by inner product), read in place.
* ``gen-<n>x<d>``: ``n`` unit vectors around 64 random centres and 500 queries drawn the same
  way, made on the spot with exact top-10 by brute force: the fallback without ../shared (a
  user's clone) and, tiny, the smoke run's.

Upserts (the 90/10 mix) add new points: each is a base vector negated, with a little noise, so
it lies in the data's own geometry but far from every query (cosine with its true neighbours
< 0): the ground truth of the query-only set stays exact while points are added.

Workers read one manifest (JSON) naming .npy files; the base is read in place when it is the
shared file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common.paths import SHARED_DATA

MINILM_DIR = SHARED_DATA / "debian-minilm"
K = 10
_GEN_CENTRES = 64
_GEN_QUERIES = 500


@dataclass
class Data:
    name: str
    base: np.ndarray  # float32 [n, d]; row i is point id i
    queries: np.ndarray  # float32 [q, d]
    gt: np.ndarray  # int64 [q, >= 10], nearest first
    note: str  # where it came from
    base_path: Path | None = None  # the shared file, read in place by workers

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "vectors": int(self.base.shape[0]),
            "dim": self.dim,
            "queries": int(self.queries.shape[0]),
            "note": self.note,
        }


def exact_top(base: np.ndarray, queries: np.ndarray, k: int = K) -> np.ndarray:
    """Exact top-k ids by inner product (unit vectors: cosine), base in chunks."""
    best_s = np.full((len(queries), 0), -np.inf, np.float32)
    best_i = np.zeros((len(queries), 0), np.int64)
    for start in range(0, len(base), 50_000):
        scores = queries @ np.ascontiguousarray(base[start : start + 50_000]).T
        best_s = np.concatenate([best_s, scores], axis=1)
        best_i = np.concatenate(
            [best_i, np.arange(start, start + scores.shape[1])[None].repeat(len(queries), 0)],
            axis=1,
        )
        order = np.argsort(-best_s, axis=1, kind="stable")[:, :k]
        best_s = np.take_along_axis(best_s, order, axis=1)
        best_i = np.take_along_axis(best_i, order, axis=1)
    return best_i


def generated(n: int, dim: int, queries: int = _GEN_QUERIES, note: str = "") -> Data:
    """Clustered unit vectors (seeded), exact top-10."""
    rng = np.random.default_rng(16)
    centres = rng.standard_normal((_GEN_CENTRES, dim)).astype(np.float32)
    rows = centres[rng.integers(_GEN_CENTRES, size=n + queries)]
    rows += 0.6 * rng.standard_normal(rows.shape).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    base, found = rows[:n], rows[n:]
    return Data(f"gen-{n}x{dim}", base, found, exact_top(base, found), note or "generated")


def load(mode: str) -> Data:
    """debian-minilm when ../shared has it (quick, full); a generated set otherwise."""
    if mode == "smoke":
        return generated(2000, 64, 100, "generated (smoke: tiny, figures meaningless)")
    if (MINILM_DIR / "embeddings.npy").exists():
        path = MINILM_DIR / "embeddings.npy"
        return Data(
            "debian-minilm",
            np.load(path, mmap_mode="r"),
            np.load(MINILM_DIR / "queries.npy"),
            np.load(MINILM_DIR / "gt_ids.npy"),
            f"{MINILM_DIR} (read in place)",
            path,
        )
    why = f"{MINILM_DIR} is absent (no ../shared checkout): generated 20k x 128 clustered instead"
    return generated(20_000, 128, note=why)


def upsert_vectors(data: Data, count: int) -> np.ndarray:
    """``count`` new points: negated base rows plus noise, unit length (see the module doc)."""
    rng = np.random.default_rng(1616)
    rows = -np.asarray(data.base[rng.integers(len(data.base), size=count)], np.float32)
    rows += 0.05 * rng.standard_normal(rows.shape).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


def write_manifest(data: Data, work: Path, upserts: int) -> Path:
    """The files a worker loads, under ``work``; returns the manifest's path."""
    work.mkdir(parents=True, exist_ok=True)
    base = data.base_path
    if base is None:
        base = work / "base.npy"
        np.save(base, np.ascontiguousarray(data.base, np.float32))
    np.save(work / "queries.npy", np.ascontiguousarray(data.queries, np.float32))
    np.save(work / "gt.npy", np.ascontiguousarray(data.gt[:, :K], np.int64))
    np.save(work / "upserts.npy", upsert_vectors(data, upserts))
    manifest = {
        "name": data.name,
        "base": str(base),
        "queries": str(work / "queries.npy"),
        "gt": str(work / "gt.npy"),
        "upserts": str(work / "upserts.npy"),
    }
    path = work / "manifest.json"
    path.write_text(json.dumps(manifest))
    return path


@dataclass
class Work:
    """What a worker process reads back from a manifest."""

    name: str
    base: np.ndarray
    queries: np.ndarray
    gt: np.ndarray
    upserts: np.ndarray

    @classmethod
    def read(cls, manifest: str | Path) -> Work:
        files = json.loads(Path(manifest).read_text())
        return cls(
            files["name"],
            np.load(files["base"], mmap_mode="r"),
            np.load(files["queries"]),
            np.load(files["gt"]),
            np.load(files["upserts"]),
        )


def recall(found: dict[int, np.ndarray], gt: np.ndarray) -> float | None:
    """Mean recall@10 over the queries answered (their first answer); None when none was."""
    if not found:
        return None
    hits = sum(len(np.intersect1d(ids[ids >= 0][:K], gt[q, :K])) for q, ids in found.items())
    return hits / (K * len(found))
