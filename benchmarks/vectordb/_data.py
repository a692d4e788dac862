"""The benchmark's datasets: base vectors, queries, exact top-k ground truth, metric.

* ``debian-minilm``: ../shared/data/debian-minilm (62,440 x 384, L2-normalised; its own exact
  top-100 by inner product). Metric cosine for our index, inner product for faiss.
* ``fashion-mnist``: Debian's ``dataset-fashion-mnist`` (installed with apt when missing): 60k
  train images as base, the first 1,000 of the 10k test images as queries, 784-d float32
  pixels, L2. Ground truth computed exactly with faiss ``knn`` (brute force).
* ``gmm-<n>``: ``n`` vectors drawn from a Gaussian mixture fitted to debian-minilm (faiss k-means
  with 256 components; per component the member mean and per-dimension std; weights = sizes),
  then L2-normalised; 1,000 queries from the same mixture with another seed. Exact ground truth
  by brute force in base chunks. Diagonal components drop every correlation between
  dimensions: within a component the points fill all 384 dimensions, far more diffuse than
  the real embeddings (a stress case for any partitioned index).
* ``gmmfull-<n>``: the same mixture with full covariance: per component the members' mean and
  sample covariance (the maximum-likelihood fit), sampled as mean + z @ centred members /
  sqrt(members - 1) with z standard normal, so each component keeps the correlations (and
  the low intrinsic dimension) of the real points it was fitted to.
* ``smoke-<n>``: ``n`` x 128 unit vectors around 32 random centres and 50 queries, made on the
  spot with exact ground truth: the test suite's smoke runs, which must not need ../shared.

Everything derived is cached as .npy under benchmarks/out/vectordb/data/ (memory-mapped when
read back, so the 2M set does not have to fit next to the indexes).
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from benchmarks.common.paths import SHARED_DATA
from benchmarks.vectordb._common import log

MINILM_DIR = SHARED_DATA / "debian-minilm"
SMOKE_SET = "smoke-4000"
FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
GT_K = 100
FMNIST_QUERIES = 1000
_GMM_COMPONENTS = 256
_CHUNK = 200_000


@dataclass
class Dataset:
    name: str
    base: np.ndarray  # float32 [n, d], possibly memory-mapped
    queries: np.ndarray  # float32 [q, d]
    gt: np.ndarray  # int64 [q, >= 10], exact nearest first
    metric: str  # "cosine" or "l2" (our IndexConfig name)

    @property
    def faiss_metric(self) -> int:
        return faiss.METRIC_L2 if self.metric == "l2" else faiss.METRIC_INNER_PRODUCT

    @property
    def raw_bytes(self) -> int:
        return self.base.shape[0] * self.base.shape[1] * 4


def exact_knn(base: np.ndarray, queries: np.ndarray, k: int, metric: int) -> np.ndarray:
    """Exact top-k ids by brute force, in base chunks merged by score (faiss.knn per chunk)."""
    best_d = np.full((len(queries), 0), 0.0, np.float32)
    best_i = np.full((len(queries), 0), -1, np.int64)
    for start in range(0, len(base), _CHUNK):
        chunk = np.ascontiguousarray(base[start : start + _CHUNK], dtype=np.float32)
        dist, ids = faiss.knn(queries, chunk, min(k, len(chunk)), metric=metric)
        best_d = np.concatenate([best_d, dist], axis=1)
        best_i = np.concatenate([best_i, ids + start], axis=1)
        # IP: larger is nearer; sort descending by negating
        key = -best_d if metric == faiss.METRIC_INNER_PRODUCT else best_d
        order = np.argsort(key, axis=1, kind="stable")[:, :k]
        best_d = np.take_along_axis(best_d, order, axis=1)
        best_i = np.take_along_axis(best_i, order, axis=1)
    return best_i


def load(name: str, data_dir: Path) -> Dataset | None:
    """The named dataset, or None (with a message) when its source is not on this machine."""
    if name == "debian-minilm":
        return _minilm()
    if name == "fashion-mnist":
        return _fmnist(data_dir)
    if name.startswith("gmm-"):
        return _gmm(int(name.removeprefix("gmm-")), data_dir)
    if name.startswith("gmmfull-"):
        return _gmm(int(name.removeprefix("gmmfull-")), data_dir, full=True)
    if name.startswith("smoke-"):
        return smoke_set(int(name.removeprefix("smoke-")))
    raise ValueError(f"unknown dataset {name!r}")


def _minilm() -> Dataset | None:
    if not (MINILM_DIR / "embeddings.npy").exists():
        log(f"debian-minilm: {MINILM_DIR} is absent (no ../shared checkout); skipped")
        return None
    return Dataset(
        "debian-minilm",
        np.load(MINILM_DIR / "embeddings.npy", mmap_mode="r"),
        np.load(MINILM_DIR / "queries.npy"),
        np.load(MINILM_DIR / "gt_ids.npy"),
        "cosine",
    )


def smoke_set(n: int, dim: int = 128, queries: int = 50) -> Dataset:
    """Clustered unit vectors (no file read or written), cosine, exact top-k ground truth."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((32, dim)).astype(np.float32)
    rows = centres[rng.integers(32, size=n + queries)]
    rows += 0.5 * rng.standard_normal(rows.shape).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    base, found = rows[:n], rows[n:]
    gt = exact_knn(base, found, min(GT_K, n), faiss.METRIC_INNER_PRODUCT)
    return Dataset(f"smoke-{n}", base, found, gt, "cosine")


def _idx_images(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as stream:
        raw = stream.read()
    count, rows, cols = (int.from_bytes(raw[i : i + 4], "big") for i in (4, 8, 12))
    pixels = np.frombuffer(raw, np.uint8, count * rows * cols, offset=16)
    return pixels.reshape(count, rows * cols).astype(np.float32)


def _fmnist(data_dir: Path) -> Dataset | None:
    if not (FMNIST_DIR / "train-images-idx3-ubyte.gz").exists():
        log("fashion-mnist: apt-get install -y dataset-fashion-mnist")
        cmd = "apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist"
        done = subprocess.run(cmd, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if done.returncode:
            log(f"fashion-mnist: install failed ({done.stderr.decode()[-300:]}); skipped")
            return None
    base = _idx_images(FMNIST_DIR / "train-images-idx3-ubyte.gz")
    # the first 1,000 test images: 10k queries would take minutes per setting at ~300 QPS
    queries = _idx_images(FMNIST_DIR / "t10k-images-idx3-ubyte.gz")[:FMNIST_QUERIES]
    path = data_dir / f"fashion-mnist_gt{FMNIST_QUERIES}.npy"
    gt = _cached(path, lambda: exact_knn(base, queries, GT_K, faiss.METRIC_L2))
    return Dataset("fashion-mnist", base, queries, gt, "l2")


def _cached(path: Path, make) -> np.ndarray:  # type: ignore[no-untyped-def]
    if path.exists():
        return np.load(path, mmap_mode="r")
    log(f"computing {path.name} ...")
    array = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path.with_suffix(".partial.npy"), array)
    path.with_suffix(".partial.npy").rename(path)  # a killed run never leaves half a file
    return np.load(path, mmap_mode="r")


@dataclass
class _Mixture:
    means: np.ndarray  # [components, d]
    stds: np.ndarray  # [components, d] per-dimension (diagonal mixture)
    centred: list[np.ndarray]  # per component its members minus their mean (full covariance)
    weights: np.ndarray  # [components]


def _fit_mixture(real: np.ndarray) -> _Mixture:
    kmeans = faiss.Kmeans(real.shape[1], _GMM_COMPONENTS, niter=20, seed=1, verbose=False)
    kmeans.train(real)
    _, labels = kmeans.index.search(real, 1)
    labels = labels[:, 0]
    counts = np.bincount(labels, minlength=_GMM_COMPONENTS).astype(np.float64)
    means = np.zeros((_GMM_COMPONENTS, real.shape[1]), np.float32)
    stds = np.zeros_like(means)
    centred = [np.zeros((0, real.shape[1]), np.float32)] * _GMM_COMPONENTS
    for c in np.flatnonzero(counts):
        members = real[labels == c]
        means[c], stds[c] = members.mean(axis=0), members.std(axis=0)
        centred[c] = members - means[c]
    return _Mixture(means, stds, centred, counts / counts.sum())


def _sample(mixture: _Mixture, n: int, seed: int, full: bool = False) -> np.ndarray:
    means, stds = mixture.means, mixture.stds
    rng = np.random.default_rng(seed)
    comp = rng.choice(len(mixture.weights), size=n, p=mixture.weights)
    if not full:
        out = means[comp] + stds[comp] * rng.standard_normal((n, means.shape[1]), np.float32)
    else:
        out = means[comp]
        for c in np.unique(comp):
            rows = np.flatnonzero(comp == c)
            members = mixture.centred[c]
            if len(members) < 2:
                continue  # one member: its mean, no spread to fit
            z = rng.standard_normal((len(rows), len(members)), np.float32)
            out[rows] += z @ members / np.float32(np.sqrt(len(members) - 1))
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out.astype(np.float32)


def _gmm(n: int, data_dir: Path, full: bool = False) -> Dataset | None:
    minilm = _minilm()
    if minilm is None:
        return None
    name = f"{'gmmfull' if full else 'gmm'}-{n}"
    base_path = data_dir / f"{name}_base.npy"
    if not base_path.exists():
        log(f"{name}: fitting a {_GMM_COMPONENTS}-component mixture, sampling {n:,} vectors")
        mixture = _fit_mixture(np.ascontiguousarray(minilm.base))
        partial = data_dir / f"{name}_base.partial.npy"
        data_dir.mkdir(parents=True, exist_ok=True)
        array = np.lib.format.open_memmap(partial, "w+", np.float32, (n, minilm.base.shape[1]))
        for i, start in enumerate(range(0, n, _CHUNK)):  # chunked: 2M x 384 is 3 GiB
            rows = min(_CHUNK, n - start)
            array[start : start + _CHUNK] = _sample(mixture, rows, 100 + i, full)
        array.flush()
        del array
        np.save(data_dir / f"{name}_queries.npy", _sample(mixture, 1000, 99, full))
        shutil.move(partial, base_path)
    base = np.load(base_path, mmap_mode="r")
    queries = np.load(data_dir / f"{name}_queries.npy")
    ip = faiss.METRIC_INNER_PRODUCT
    gt = _cached(data_dir / f"{name}_gt.npy", lambda: exact_knn(base, queries, GT_K, ip))
    return Dataset(name, base, queries, gt, "cosine")
