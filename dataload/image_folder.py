"""ImageFolder: a folder of image files as a map-style Dataset with located bytes.

The layout is torchvision's: ``root/<class>/<any depth>/<file>``; classes are the sorted
sub-directory names, a sample is ``(image, class_index)`` and ``samples``/``targets``/
``classes``/``class_to_idx`` mean what they mean there (torchvision is not needed: it breaks
imports beside this project's pinned torch). Images are decoded with Pillow and converted to
``mode`` ("RGB" by default), then ``transform`` runs on the PIL image; without a transform the
image comes back as a uint8 tensor ``(channels, height, width)`` (:func:`pil_to_tensor`), so the
default collate can stack a batch.

It implements :mod:`dataload.located`: ``locate(i)`` is ``(path, 0, file size)`` from one
listing at construction, ``decode(i, data)`` decodes bytes already read -- so under
``ShuffledLoader`` the I/O core reads a batch's files together, ahead of the workers, while under
DataLoader ``__getitem__`` reads the file itself.

Concurrency: immutable after construction; any thread or process may call any method.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from dataload.errors import SourceError
from dataload.located import checked_batch

__all__ = ["IMAGE_EXTENSIONS", "ImageFolder", "pil_to_tensor"]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")


def pil_to_tensor(image: Any) -> torch.Tensor:
    """A PIL image as a uint8 tensor ``(channels, height, width)``."""
    array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))


class ImageFolder(Dataset):
    """Images under ``root/<class>/``, sorted by path; ``(image, class_index)`` per sample."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        *,
        extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
        mode: str = "RGB",
    ) -> None:
        self.root = os.fspath(root)
        self.transform = transform
        self.mode = mode
        top = Path(root)
        if not top.is_dir():
            raise SourceError(self.root, "not a directory")
        self.classes = sorted(d.name for d in os.scandir(top) if d.is_dir())
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        wanted = tuple(e.lower() for e in extensions)
        samples: list[tuple[str, int]] = []
        for name in self.classes:
            for dirpath, _, files in sorted(os.walk(top / name)):
                for file in sorted(files):
                    if file.lower().endswith(wanted):
                        samples.append((os.path.join(dirpath, file), self.class_to_idx[name]))
        if not samples:
            raise SourceError(self.root, f"no image files ({', '.join(wanted)}) in class folders")
        self.samples = samples
        self.targets = [target for _, target in samples]
        self.sizes = np.array([os.stat(path).st_size for path, _ in samples], np.int64)
        self._paths = [path for path, _ in samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, offset, length = self.locate(index)
        with open(path, "rb") as file:
            file.seek(offset)
            return self.decode(index, file.read(length))

    def locate(self, index: int) -> tuple[str, int, int]:
        """Where sample ``index``'s bytes are: the whole file."""
        return self.samples[index][0], 0, int(self.sizes[index])

    def locate_many(self, indices: Any) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`locate` for a batch, as arrays (paths, path ids, offsets, lengths)."""
        indices = checked_batch(self.root, indices, len(self))
        return self._paths, indices, np.zeros(len(indices), np.int64), self.sizes[indices]

    def decode(self, index: int, data: Any) -> tuple[Any, int]:
        """Sample ``index`` from the bytes of its file."""
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            converted = image.convert(self.mode)
        sample = self.transform(converted) if self.transform else pil_to_tensor(converted)
        return sample, self.samples[index][1]
