"""Turning a SampleBatch into what the training loop receives.

Without a transform or a ``collate_fn``, equal-size samples become one tensor of shape
``(n, *sample_shape)`` that is a view of the buffer the reads landed in (``torch.from_numpy``;
no per-sample Python work, no copy). Variable-size samples become a list of uint8 tensors (views
too); table sources a dict of column -> tensor (numeric) or list (strings, other objects).

With a ``transform``, it runs once per sample (in the loader's decode threads) and the results
go through ``collate_fn`` or, by default, ``torch.utils.data.default_collate`` -- what DataLoader
users expect. Failed samples are either raised (first by position) or dropped and counted.

Concurrency: ``BatchAssembler.__call__`` is a pure function of its batch; any thread may run it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils import worker as torch_worker

from dataload.errors import TransformError
from dataload.source import SampleBatch, Source
from tiers.io import InvalidArgumentError

__all__ = ["Assembled", "BatchAssembler", "OnError", "collate", "mark_loader_worker"]

OnError = Literal["raise", "skip"]
_in_loader_worker = False  # set once in each of the loader's worker processes


def mark_loader_worker() -> None:
    """Called first thing in a loader worker process (``workers/worker.py``)."""
    global _in_loader_worker
    _in_loader_worker = True


def collate(samples: list[Any], collate_fn: Callable[[list[Any]], Any] | None) -> Any:
    """``collate_fn(samples)``, else ``default_collate(samples)`` -- in a loader worker into
    private memory: there ``get_worker_info()`` is set (as in a DataLoader worker), which makes
    ``default_collate`` put every batch in a new shared-memory segment for a trip through
    DataLoader's queues (a /dev/shm file, its mapping and fresh pages: ~0.2 ms a batch of 128
    small images, five times the stacking itself). Our workers copy the result into the
    loader's own slab instead, so the worker info is hidden from that one call (the process
    has one thread: nothing else can observe it)."""
    if collate_fn is not None:
        return collate_fn(samples)
    if not _in_loader_worker:
        return default_collate(samples)
    info, torch_worker._worker_info = torch_worker._worker_info, None
    try:
        return default_collate(samples)
    finally:
        torch_worker._worker_info = info


class Assembled:
    """What a worker returns for one batch: the collated value and how many samples it dropped."""

    __slots__ = ("bytes_read", "samples", "skipped", "value")

    def __init__(self, value: Any, samples: int, skipped: int, bytes_read: int) -> None:
        self.value = value
        self.samples = samples
        self.skipped = skipped
        self.bytes_read = bytes_read


class BatchAssembler:
    """Applies transform, error policy and collate to one SampleBatch."""

    def __init__(
        self,
        source: Source,
        transform: Callable[[Any], Any] | None,
        collate_fn: Callable[[list[Any]], Any] | None,
        on_error: OnError,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.source = source
        self.transform = transform
        self.collate_fn = collate_fn
        self.on_error = on_error

    @property
    def heavy(self) -> bool:
        """Whether assembling runs per-sample Python code (then it belongs in a decode thread)."""
        return self.transform is not None or self.collate_fn is not None

    def __call__(self, batch: SampleBatch) -> Assembled:
        if batch.errors and self.on_error == "raise":
            raise batch.errors[min(batch.errors)]
        keep = [j for j in range(len(batch)) if j not in batch.errors] if batch.errors else None
        if not self.heavy:
            value = self._zero_copy(batch, keep)
            return Assembled(value, len(batch), len(batch.errors), batch.bytes_read)
        positions = keep if keep is not None else range(len(batch))
        samples = batch.samples(positions)
        skipped = len(batch.errors)
        if self.transform is not None:
            samples, failed = self._apply_transform(batch, positions, samples)
            skipped += failed
        return Assembled(collate(samples, self.collate_fn), len(batch), skipped, batch.bytes_read)

    def _apply_transform(
        self, batch: SampleBatch, positions: Any, samples: list[Any]
    ) -> tuple[list[Any], int]:
        transform = self.transform
        assert transform is not None
        out: list[Any] = []
        for position, sample in zip(positions, samples, strict=True):
            try:
                out.append(transform(sample))
            except Exception as exc:
                index = int(batch.indices[position])
                error = TransformError(self.source.name, index, f"transform raised {exc!r}")
                if self.on_error == "raise":
                    raise error from exc
        return out, len(samples) - len(out)

    def _zero_copy(self, batch: SampleBatch, keep: list[int] | None) -> Any:
        if batch.columns is not None:
            return {name: _column(values, keep) for name, values in batch.columns.items()}
        source = self.source
        assert batch.data is not None and batch.sizes is not None and batch.starts is not None
        if source.sample_size_bytes is not None and source.sample_shape is not None:
            n, size = len(batch), source.sample_size_bytes
            if batch.packed:
                rows = batch.data[: n * size].view(source.sample_dtype)
            else:  # aligned reads with gaps: gather each sample's span once
                spans = batch.starts[:, None] + np.arange(size)
                rows = batch.data[spans].reshape(-1).view(source.sample_dtype)
            rows = rows.reshape(n, *source.sample_shape)
            if keep is not None:
                rows = rows[keep]
            return torch.from_numpy(rows)
        positions = keep if keep is not None else range(len(batch))
        tensors = [torch.from_numpy(_view(batch, j)) for j in positions]
        if batch.labels is None:
            return tensors
        labels = batch.labels if keep is None else batch.labels[keep]
        return tensors, torch.from_numpy(np.ascontiguousarray(labels))


def _view(batch: SampleBatch, position: int) -> np.ndarray:
    start = int(batch.starts[position])  # type: ignore[index]
    return batch.data[start : start + int(batch.sizes[position])]  # type: ignore[index]


def _column(values: Any, keep: list[int] | None) -> Any:
    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
        return torch.from_numpy(values if keep is None else values[keep])
    if keep is None:
        return list(values)
    return [values[j] for j in keep]
