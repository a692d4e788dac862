"""The located-bytes protocol: a map-style Dataset that can say where each sample's bytes are.

A plain map-style ``Dataset`` (``__len__`` + ``__getitem__``) works with ``ShuffledLoader`` as
it is: workers call ``__getitem__``, which does its own reads, one sample at a time. A dataset
that also implements the two methods below lets the loader do the reading instead: the I/O
core reads every sample of a batch (and of the batches after it) in one submission, ahead of
time, and the worker only decodes::

    class MyDataset(torch.utils.data.Dataset):
        def __len__(self) -> int: ...
        def __getitem__(self, index):                  # still used by DataLoader
            path, offset, length = self.locate(index)
            with open(path, "rb") as f:
                f.seek(offset)
                return self.decode(index, f.read(length))

        def locate(self, index: int) -> tuple[str, int, int]:
            '''(path, offset in bytes, length in bytes) of sample ``index``.'''

        def decode(self, index: int, data) -> Any:
            '''Sample ``index`` from its bytes (``data``: a read-only bytes-like view, valid
            only during the call -- copy what you keep).'''

Rules: ``locate`` must be cheap (no I/O: keep an index) and deterministic; ``decode(i,
bytes_at(locate(i)))`` must equal ``__getitem__(i)``. Many samples may share a file (a shard,
a packed file); the loader keeps a bounded set of files open. A file that cannot be read, or
is shorter than ``offset + length``, fails that sample (SampleReadError, CorruptSampleError),
which ``on_error="skip"`` drops like any other.

:class:`~dataload.image_folder.ImageFolder` implements it for a folder of image files.

Concurrency: ``locate`` is called on the loader's I/O thread, ``decode`` in its workers.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["LocatedDataset", "is_located"]


@runtime_checkable
class LocatedDataset(Protocol):
    """A map-style dataset whose samples are byte ranges of files (see the module doc)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...

    def locate(self, index: int) -> tuple[str, int, int]: ...

    def decode(self, index: int, data: Any) -> Any: ...


def is_located(dataset: object) -> bool:
    """Whether ``dataset`` implements the located-bytes protocol (both methods callable)."""
    return callable(getattr(dataset, "locate", None)) and callable(getattr(dataset, "decode", None))
