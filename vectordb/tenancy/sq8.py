"""Sq8Codec: a byte a dimension for the compact copies of shortlist runs (tenant_store).

Each dimension d keeps an offset ``low[d]`` and a step ``step[d]`` (from the range of the
vectors it was trained on); a vector x is held as ``code = round((x - low) / step)`` clipped
to 0..255, so x is about ``low + step * code``. A prepared query q then scores a code with
one product: ``q . x ~ q . low + (q * step) . code``, so the codes are never widened to a
float copy (numpy multiplies the uint8 rows by the float32 query directly).

Only for inner-product distances (ip, cosine: metric.distances is ``-(x . q)``); an L2 index
keeps no compact copies (tenant_store). Values outside the trained range clip (a vector
inserted later far outside it scores as its nearest representable point; the access check
and the exact search do not depend on codes).

Immutable once trained; thread-safe.
"""

from __future__ import annotations

import numpy as np

from vectordb.metric import Metric

__all__ = ["Sq8Codec"]

_LEVELS = 255
_TRAIN_ROWS = 65_536  # enough rows for each dimension's range; training stays fast


class Sq8Codec:
    def __init__(self, low: np.ndarray, step: np.ndarray) -> None:
        self.low = np.ascontiguousarray(low, np.float32)
        self.step = np.ascontiguousarray(step, np.float32)

    @classmethod
    def supports(cls, metric: Metric, dtype: str) -> bool:
        """Compact copies pay where the stored values are wider than a byte and the distance
        is an inner product."""
        return metric is not Metric.L2 and np.dtype(dtype).itemsize > 1

    @classmethod
    def train(cls, vectors: np.ndarray, seed: int = 0) -> Sq8Codec:
        """Per-dimension range of ``vectors`` (a sample of ``_TRAIN_ROWS`` rows at most)."""
        rows = np.asarray(vectors, np.float32)
        if len(rows) > _TRAIN_ROWS:
            pick = np.random.default_rng(seed).choice(len(rows), _TRAIN_ROWS, replace=False)
            rows = rows[np.sort(pick)]
        if not len(rows):
            raise ValueError("Sq8Codec.train needs at least one vector")
        low, high = rows.min(axis=0), rows.max(axis=0)
        # a margin of 1/64 of the range each side: later vectors a little outside do not clip
        margin = (high - low) / 64
        low, high = low - margin, high + margin
        step = np.maximum(high - low, 1e-12) / _LEVELS
        return cls(low, step)

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """uint8 [n, dim] codes of float vectors (as the runs store them)."""
        scaled = (np.asarray(vectors, np.float32) - self.low) / self.step
        return np.clip(np.rint(scaled), 0, _LEVELS).astype(np.uint8)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """float32 [n, dim]: the vectors the codes stand for (tests, checks)."""
        return self.low + self.step * np.asarray(codes, np.float32)

    def query_terms(self, query: np.ndarray) -> tuple[np.ndarray, float]:
        """(``query * step``, ``query . low``) of one prepared query: the code distance is
        ``-(codes @ terms[0] + terms[1])``."""
        q = np.asarray(query, np.float32)
        return q * self.step, float(q @ self.low)

    def distances(self, query_terms: tuple[np.ndarray, float], codes: np.ndarray) -> np.ndarray:
        """float32 [n] internal distances (metric.distances' sign: smaller is nearer)."""
        scaled, bias = query_terms
        out = codes @ scaled
        out += bias
        np.negative(out, out=out)
        return out.astype(np.float32, copy=False)

    def snapshot(self) -> dict[str, np.ndarray]:
        return {"tenant_sq8_low": self.low, "tenant_sq8_step": self.step}

    @classmethod
    def restore(cls, arrays: dict[str, np.ndarray]) -> Sq8Codec | None:
        """The codec in a checkpoint (None: one written without compact copies)."""
        if "tenant_sq8_low" not in arrays:
            return None
        return cls(arrays["tenant_sq8_low"], arrays["tenant_sq8_step"])

    def resident_bytes(self) -> int:
        return int(self.low.nbytes + self.step.nbytes)
