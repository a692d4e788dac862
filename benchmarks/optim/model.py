"""The synthetic model every system steps: transformer-shaped fp32 tensors with fixed gradients.

Imports only torch (the DeepSpeed venv has no tierkit). Values and gradients are drawn in place
from a seeded generator, so building a model allocates exactly params + grads (8 bytes per
parameter) and never a temporary: the process's RSS right after ``build_params`` is the model's
share, which the benchmark subtracts to give each optimizer's own host memory.
"""

from __future__ import annotations

import os

import torch

__all__ = [
    "HIDDEN",
    "build_params",
    "disk_io_bytes",
    "param_shapes",
    "peak_rss_bytes",
    "rss_bytes",
]

HIDDEN = 1024
_FFN = 4 * HIDDEN
_BLOCK = [(_FFN, HIDDEN), (_FFN,), (HIDDEN, _FFN), (HIDDEN,), (HIDDEN,), (HIDDEN,)]


def param_shapes(total_params: int) -> list[tuple[int, ...]]:
    """Shapes of an MLP stack (two 1024x4096 matrices, biases, a norm's weight and bias per
    block) holding ``total_params`` elements; the last matrix is cut short to hit the total."""
    shapes: list[tuple[int, ...]] = []
    left = total_params
    while left > 0:
        for shape in _BLOCK:
            numel = 1
            for dim in shape:
                numel *= dim
            if numel <= left:
                shapes.append(shape)
                left -= numel
            elif left > 0:
                shapes.append((left,))
                left = 0
    return shapes


def build_params(total_params: int, seed: int = 0, grads: bool = True) -> list[torch.nn.Parameter]:
    """fp32 parameters of ``param_shapes(total_params)``, values ~N(0, 0.02) and, with
    ``grads``, gradients ~N(0, 1e-3), both filled in place."""
    generator = torch.Generator().manual_seed(seed)
    params: list[torch.nn.Parameter] = []
    for shape in param_shapes(total_params):
        value = torch.empty(shape, dtype=torch.float32)
        value.normal_(0.0, 0.02, generator=generator)
        param = torch.nn.Parameter(value)
        if grads:
            grad = torch.empty(shape, dtype=torch.float32)
            param.grad = grad.normal_(0.0, 1e-3, generator=generator)
        params.append(param)
    return params


def _status_kib(field: str) -> int:
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def rss_bytes() -> int:
    """Resident set size of this process now."""
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """High-water mark of this process's resident set (VmHWM)."""
    return _status_kib("VmHWM") * 1024


def disk_io_bytes() -> tuple[int, int]:
    """(read, written) bytes this process has made the block layer move (/proc/self/io
    ``read_bytes``/``write_bytes``: O_DIRECT and io_uring I/O counted, page-cache hits not)."""
    fields: dict[str, int] = {}
    with open(f"/proc/{os.getpid()}/io", encoding="ascii") as io_file:
        for line in io_file:
            name, _, value = line.partition(":")
            fields[name] = int(value)
    return fields["read_bytes"], fields["write_bytes"]
