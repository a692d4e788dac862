"""Workload (d): a map-style Dataset over a folder of PNG files, decoded with Pillow per sample.

The folder holds Fashion-MNIST images as 28x28 grayscale PNGs in ``class_<label>/`` folders
(10,000 in quick mode, all 70,000 in full; written once into benchmarks/out and kept); without
the Debian package it holds synthetic 28x28 images instead, with a note. Both loaders read the
same :class:`dataload.ImageFolder` -- DataLoader through its ``__getitem__`` (open, read,
decode in the worker), tierkit through its located bytes (the I/O core reads a batch's files,
the workers decode) -- with the same per-sample transform.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.dataload._fmnist import FMNIST_DIR, ensure_fmnist
from dataload import ImageFolder

WORKLOAD = "map_dataset"
BATCH = 128
CLASSES = 10


def png_transform(image: Image.Image) -> torch.Tensor:
    """The per-sample transform: normalised 1x28x28 float tensor."""
    pixels = torch.from_numpy(np.asarray(image, np.float32)).reshape(1, 28, 28)
    return (pixels / 255.0 - 0.2860) / 0.3530


def make_dataset(folder: Path) -> ImageFolder:
    return ImageFolder(folder, png_transform, mode="L")


def ensure_pngs(out: Path, count: int, notes: list[str], install: bool = True) -> Path:
    """The PNG folder with ``count`` images (written unless it is complete)."""
    real = ensure_fmnist(notes, install)
    folder = out / f"dataload_png_{'fmnist' if real else 'synthetic'}_{count}"
    done = folder / ".complete"
    if done.exists():
        return folder
    if real:
        images, labels = _fmnist_arrays(count)
    else:
        notes.append("(d) Fashion-MNIST absent: synthetic 28x28 PNGs")
        rng = np.random.default_rng(7)
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = np.arange(count) % CLASSES
    for label in range(CLASSES):
        (folder / f"class_{label}").mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = folder / f"class_{int(labels[index])}" / f"{index:06d}.png"
        Image.fromarray(images[index]).save(path)
    done.write_text(str(count))
    return folder


def _fmnist_arrays(count: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for split in ("train", "t10k"):
        with gzip.open(FMNIST_DIR / f"{split}-images-idx3-ubyte.gz") as f:
            images.append(np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28))
        with gzip.open(FMNIST_DIR / f"{split}-labels-idx1-ubyte.gz") as f:
            labels.append(np.frombuffer(f.read(), np.uint8, offset=8))
    return np.concatenate(images)[:count], np.concatenate(labels)[:count]


def png_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("class_*/*.png"))
