"""PackedStrings: one batch's string or binary column as value bytes plus offsets.

ParquetSource gathers a batch's rows of a null-free string/binary column by copying their
bytes back to back into the batch's buffer (``SampleBatch.data``, a slab) instead of making a
Python ``str`` per row on the loader's loop thread. A row becomes a ``str`` (or ``bytes``) when
it is indexed -- by the transform, in whichever thread or worker process runs it. With worker
processes the column crosses the pipe as its offsets only (:meth:`detached`): the bytes are
already in shared memory, and the worker re-attaches them (:meth:`attached`) to the view of
the slab it maps. Pickled with its bytes (``data`` set), it is self-contained.

Indexing equals the list it replaces: ``column[j] == values[j]`` for every row, iteration and
``len`` too. No pyarrow import here: a worker unpickles this without loading Arrow.

Concurrency: read-only after construction; any thread may index it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["PackedStrings", "pack_rows"]


class PackedStrings:
    """Rows ``data[offsets[j] : offsets[j + 1]]``, decoded as UTF-8 when ``text``."""

    __slots__ = ("_offsets", "_text", "_view", "data")

    def __init__(self, data: np.ndarray | None, offsets: list[int], text: bool) -> None:
        self.data = data
        self._offsets = offsets
        self._text = text
        self._view = memoryview(data) if data is not None else None  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, position: int) -> str | bytes:
        view = self._view
        if view is None:
            raise ValueError("PackedStrings without its bytes: attach the batch's data first")
        offsets = self._offsets
        if position < 0:  # as a list indexes
            position += len(offsets) - 1
        piece = view[offsets[position] : offsets[position + 1]]
        return str(piece, "utf-8") if self._text else bytes(piece)

    def __iter__(self) -> Iterator[str | bytes]:
        return (self[j] for j in range(len(self)))

    def tolist(self) -> list[str | bytes]:
        return list(self)

    @property
    def text(self) -> bool:
        return self._text

    def detached(self) -> PackedStrings:
        """The same rows without the bytes (to send where ``data`` is already shared)."""
        return PackedStrings(None, self._offsets, self._text)

    def attached(self, data: np.ndarray) -> PackedStrings:
        """These offsets over ``data`` (the batch's bytes as the receiving process sees them)."""
        return PackedStrings(data, self._offsets, self._text)

    def __reduce__(self) -> tuple[Any, ...]:
        data = None if self.data is None else np.array(self.data, copy=True)
        return (PackedStrings, (data, self._offsets, self._text))


def pack_rows(
    columns: dict[str, tuple[list[memoryview], bool]], acquire: Callable[[int], np.ndarray]
) -> tuple[np.ndarray, dict[str, PackedStrings]]:
    """Copy each column's row bytes (``(pieces, text)`` by name) back to back into one buffer
    from ``acquire(size_bytes)``; that buffer and a PackedStrings per column over it."""
    data = acquire(sum(len(p) for pieces, _ in columns.values() for p in pieces))
    view = memoryview(data)  # type: ignore[arg-type]
    out: dict[str, PackedStrings] = {}
    at = 0
    for name, (pieces, text) in columns.items():
        offsets = [at]
        for piece in pieces:
            end = at + len(piece)
            view[at:end] = piece
            at = end
            offsets.append(at)
        out[name] = PackedStrings(data, offsets, text)
    return data, out
