"""The faiss peers: IVF-Flat and HNSW in memory, IVF-Flat with ``OnDiskInvertedLists`` (and, on
byte-valued data, an on-disk IVF with 8-bit direct codes, the peer of our uint8 lists).

All three run with 2 OpenMP threads and get the whole query batch in one ``search`` call. Builds
are cached under benchmarks/out/vectordb/faiss/ (``write_index``). Resident bytes: the serialised
size of an in-memory index (vectors + ids + quantizer/graph); for the on-disk IVF the size of its
``.index`` file, i.e. the part faiss keeps in RAM (quantizer + per-list size/offset table).

The on-disk IVF is measured with a cold page cache like ours: before every timed search the index
is closed (OnDiskInvertedLists mmaps its ``.ivfdata``, and the kernel does not drop pages a
process still maps), the file gets ``posix_fadvise(DONTNEED)``, and the index is reopened with
``IO_FLAG_ONDISK_SAME_DIR`` (never ``IO_FLAG_MMAP``: it segfaults on search in faiss 1.15.1, see
research/spann-diskann.md). Its bytes per query are computed, not measured: the stored vectors
of the lists the quantizer probes times (code_size + 8-byte id), per query alone and with each
list counted once per batch (see ``io_per_query``); mmap readahead may read more.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import faiss
import numpy as np

from benchmarks.vectordb._common import PAGE_BYTES, drop_page_cache, log, stdout_to_stderr
from benchmarks.vectordb._data import Dataset

THREADS = 2
_ADD_CHUNK = 100_000


def nlist_for(n: int) -> int:
    """A power of two near 4 * sqrt(n), faiss's usual IVF sizing."""
    return 2 ** round(math.log2(4 * math.sqrt(n)))


def _add_chunked(index: faiss.Index, base: np.ndarray) -> None:
    for start in range(0, len(base), _ADD_CHUNK):  # the 2M base is memory-mapped
        index.add(np.ascontiguousarray(base[start : start + _ADD_CHUNK], dtype=np.float32))


def _cached_index(path: Path, make) -> tuple[faiss.Index, float]:  # type: ignore[no-untyped-def]
    """(index, build seconds or nan when read from cache)."""
    if path.exists():
        return faiss.read_index(str(path)), float("nan")
    start = time.perf_counter()
    index = make()
    build_s = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(path) + ".partial")
    Path(str(path) + ".partial").rename(path)
    return index, build_s


def _trained_ivf(ds: Dataset, nlist: int, cache_dir: Path) -> faiss.Index:
    """An empty trained IVF-Flat, shared by the in-RAM and the on-disk system (k-means on the
    2M set takes minutes; both then probe identical lists)."""
    path = cache_dir / f"{ds.name}-ivf{nlist}.trained"
    if path.exists():
        return faiss.read_index(str(path))
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(len(ds.base), min(len(ds.base), 64 * nlist), replace=False))
    quantizer = faiss.IndexFlat(ds.base.shape[1], ds.faiss_metric)
    ivf = faiss.IndexIVFFlat(quantizer, ds.base.shape[1], nlist, ds.faiss_metric)
    ivf.train(np.ascontiguousarray(ds.base[sample], dtype=np.float32))
    ivf.own_fields = True
    quantizer.this.disown()  # the IVF owns it now (SWIG would free it twice otherwise)
    cache_dir.mkdir(parents=True, exist_ok=True)
    faiss.write_index(ivf, str(path))
    return ivf


class MemorySystem:
    """IVF-Flat (knob nprobe) or HNSW-Flat M=32 (knob efSearch), all in RAM."""

    def __init__(self, kind: str, ds: Dataset, cache_dir: Path) -> None:
        faiss.omp_set_num_threads(THREADS)
        self.name = f"faiss_{kind}"
        d = ds.base.shape[1]
        if kind == "ivf":
            self.knob, nlist = "nprobe", nlist_for(len(ds.base))
            path = cache_dir / f"{ds.name}-ivf{nlist}.index"

            def make() -> faiss.Index:
                ivf = _trained_ivf(ds, nlist, cache_dir)
                _add_chunked(ivf, ds.base)
                return ivf
        else:
            self.knob, path = "efSearch", cache_dir / f"{ds.name}-hnsw32.index"

            def make() -> faiss.Index:
                hnsw = faiss.IndexHNSWFlat(d, 32, ds.faiss_metric)
                _add_chunked(hnsw, ds.base)
                return hnsw

        log(f"{self.name}: {'loading' if path.exists() else 'building'} {path.name}")
        self.index, self.build_s = _cached_index(path, make)
        self.resident_bytes = float(path.stat().st_size)

    def run(self, value: int, queries: np.ndarray, k: int) -> tuple[np.ndarray, float, dict]:
        if self.knob == "nprobe":
            params: faiss.SearchParameters = faiss.SearchParametersIVF(nprobe=int(value))
        else:
            params = faiss.SearchParametersHNSW(efSearch=max(int(value), k))
        start = time.perf_counter()
        _, ids = self.index.search(queries, k, params=params)
        return ids, time.perf_counter() - start, {"bytes": 0.0, "pages": 0.0}

    def close(self) -> None:
        del self.index


def _byte_ivf(ds: Dataset, nlist: int, cache_dir: Path) -> faiss.Index:
    """An empty IVF with 8-bit direct scalar codes (a byte per dimension, exact for integers
    0..255: the peer at our uint8 lists' precision), on the same trained coarse quantizer."""
    flat = _trained_ivf(ds, nlist, cache_dir)
    quantizer = faiss.clone_index(flat.quantizer)
    ivf = faiss.IndexIVFScalarQuantizer(
        quantizer, ds.base.shape[1], nlist, faiss.ScalarQuantizer.QT_8bit_direct, ds.faiss_metric
    )
    ivf.own_fields = True
    quantizer.this.disown()
    ivf.by_residual = False  # codes of the vectors themselves (residuals are not integers)
    ivf.train(np.ascontiguousarray(ds.base[:1000], dtype=np.float32))  # no-op for direct codes
    return ivf


class OnDiskIvf:
    """IVF-Flat (or, ``codes="u8"``, IVF with 8-bit direct codes) whose lists live in an
    mmapped ``.ivfdata`` file; knob nprobe; cold cache."""

    knob = "nprobe"

    def __init__(self, ds: Dataset, cache_dir: Path, codes: str = "flat") -> None:
        faiss.omp_set_num_threads(THREADS)
        nlist = nlist_for(len(ds.base))
        self.name = "faiss_ondisk" if codes == "flat" else f"faiss_ondisk_{codes}"
        suffix = "" if codes == "flat" else f"-{codes}"
        self.path = cache_dir / f"{ds.name}-ondisk{nlist}{suffix}.index"
        self.data_path = cache_dir / f"{ds.name}-ondisk{nlist}{suffix}.ivfdata"
        self.build_s = float("nan")
        if not self.path.exists():
            log(f"{self.name}: building {self.path.name} + {self.data_path.name}")
            start = time.perf_counter()
            cache_dir.mkdir(parents=True, exist_ok=True)
            make = _trained_ivf if codes == "flat" else _byte_ivf
            ivf = make(ds, nlist, cache_dir)
            self.data_path.unlink(missing_ok=True)
            lists = faiss.OnDiskInvertedLists(nlist, ivf.code_size, str(self.data_path))
            ivf.replace_invlists(lists, True)
            lists.this.disown()  # owned by the index from here on
            _add_chunked(ivf, ds.base)
            faiss.write_index(ivf, str(self.path))
            self.build_s = time.perf_counter() - start
            del ivf
        self.resident_bytes = float(self.path.stat().st_size)
        index = self._open()
        invlists = faiss.extract_index_ivf(index).invlists
        self.sizes = np.array([invlists.list_size(i) for i in range(nlist)], np.int64)
        self.code_size = faiss.extract_index_ivf(index).code_size
        self.quantizer = faiss.clone_index(faiss.extract_index_ivf(index).quantizer)
        del invlists, index

    def _open(self) -> faiss.Index:
        with stdout_to_stderr():  # faiss reports the SAME_DIR path rewrite with printf
            return faiss.read_index(str(self.path), faiss.IO_FLAG_ONDISK_SAME_DIR)

    def io_per_query(self, queries: np.ndarray, nprobe: int) -> dict:
        """Bytes and pages of the probed lists per query: ``alone`` counts every query's lists,
        ``batch`` each list once per batch (a list already faulted in stays in the page cache
        for the rest of the batch, as ours reads the union of the batch's lists once)."""
        _, probed = self.quantizer.search(queries, nprobe)
        probed = probed[probed >= 0]
        out = {}
        for key, lists in (("_alone", probed), ("", np.unique(probed))):
            sizes = self.sizes[lists]
            # codes and ids are stored apart inside a list's slot: two page spans per list
            pages = np.ceil(sizes * self.code_size / PAGE_BYTES) + np.ceil(sizes * 8 / PAGE_BYTES)
            out["bytes" + key] = float((sizes * (self.code_size + 8)).sum()) / len(queries)
            out["pages" + key] = float(pages.sum()) / len(queries)
        return out

    def run(self, value: int, queries: np.ndarray, k: int) -> tuple[np.ndarray, float, dict]:
        drop_page_cache([str(self.data_path)])  # no index is open here: nothing maps the file
        index = self._open()
        try:
            params = faiss.SearchParametersIVF(nprobe=int(value))
            start = time.perf_counter()
            _, ids = index.search(queries, k, params=params)
            wall_s = time.perf_counter() - start
        finally:
            del index  # unmaps .ivfdata so the next drop_page_cache works
        return ids, wall_s, self.io_per_query(queries, int(value))

    def close(self) -> None:
        pass
