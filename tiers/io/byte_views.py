"""Byte views: any caller buffer or tensor as one flat uint8 array or tensor, without a copy.

Memory tiers move bytes whatever the caller's type: numpy arrays of any dtype and shape,
bytes-likes, torch tensors on any device. These helpers reduce each to a flat uint8 numpy array
(host memory) or a flat uint8 torch tensor (a tensor on an accelerator), so that every copy a tier
makes is one ``np.copyto`` or one ``Tensor.copy_``. torch is never imported here: a tensor can only
reach these functions from a process that has imported it already.

Concurrency: pure functions; a view aliases the caller's memory and is valid while that lives.
Invariants: a view's size in bytes is the buffer's size in bytes; nothing is ever copied;
object (pointer) arrays and non-contiguous buffers are refused, never reinterpreted.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from tiers.io.errors import InvalidArgumentError

__all__ = ["U8", "host_bytes", "is_tensor", "tensor_bytes"]

U8 = np.dtype(np.uint8)


def is_tensor(obj: Any) -> bool:
    """True for a torch tensor, subclasses included: the one test every module here uses. No
    object can be a tensor before torch is imported, so this never imports it."""
    # torch may be half-imported (another thread is importing it): no Tensor class yet, so no
    # tensor can exist either
    tensor_type = getattr(sys.modules.get("torch"), "Tensor", None)
    return tensor_type is not None and isinstance(obj, tensor_type)


def tensor_bytes(tensor: Any) -> Any:
    """A flat uint8 view of a contiguous tensor of any dtype, on its own device."""
    import torch  # already imported by whoever made the tensor

    try:
        if not tensor.is_contiguous():
            raise InvalidArgumentError("tensors must be contiguous (call .contiguous())")
        flat = tensor.detach().view(-1)
        return flat if flat.dtype is torch.uint8 else flat.view(torch.uint8)
    except RuntimeError as exc:  # sparse, quantized, conjugate-view tensors and the like
        raise InvalidArgumentError(f"cannot view this tensor as bytes: {exc}") from exc


def host_bytes(obj: Any, *, writable: bool = False) -> np.ndarray:
    """A flat uint8 numpy view of a host buffer: numpy array, CPU tensor or bytes-like.

    Raises InvalidArgumentError for a non-contiguous or non-buffer object, a tensor that is not
    on the CPU, an object array, or (with ``writable``) a read-only buffer.
    """
    if isinstance(obj, np.ndarray):  # the hot path of a tier hit: keep it short
        if obj.dtype is U8 and obj.ndim == 1:
            flags = obj.flags  # one flags object, not one per test: ~0.1 us of a 2 us hit
            if writable and not flags.writeable:
                raise InvalidArgumentError("the destination array is read-only")
            if not flags.c_contiguous:
                raise InvalidArgumentError("numpy buffers must be C-contiguous")
            return obj
        if not obj.flags.c_contiguous or obj.dtype.hasobject:
            raise InvalidArgumentError("numpy buffers must be C-contiguous plain-data arrays")
        if writable and not obj.flags.writeable:
            raise InvalidArgumentError("the destination array is read-only")
        return obj.reshape(-1).view(U8)
    if is_tensor(obj):
        if obj.device.type != "cpu":
            raise InvalidArgumentError(f"expected a host buffer, got a tensor on {obj.device}")
        return tensor_bytes(obj).numpy()
    try:
        view = memoryview(obj)
    except TypeError as exc:
        raise InvalidArgumentError(f"not a buffer: {type(obj).__name__}") from exc
    if not view.c_contiguous:
        raise InvalidArgumentError("buffers must be C-contiguous")
    if writable and view.readonly:
        raise InvalidArgumentError(f"the destination {type(obj).__name__} is read-only")
    if not view.nbytes:
        return np.empty(0, U8)
    return np.frombuffer(view, dtype=U8)
