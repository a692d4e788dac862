"""Copies between the model's parameters and a subgroup's staging buffers.

Parameters stay where the model keeps them (CPU or one CUDA device) in their dtype (fp32, bf16
or fp16); the buffers hold fp32. ``gather_grads`` copies each stepped segment's gradient into
the gradient buffer (cast to fp32), ``scatter_params`` copies updated master weights back into
the parameters (cast to their dtype, round to nearest even), ``gather_params`` makes master
weights from parameters. On CUDA the copies are issued ``non_blocking`` from page-locked
buffers and the stream is synchronised before the buffers are used again; that path is written
but untested (no GPU here).

Thread-safety: the caller owns the buffers; parameters are read or written under no_grad.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvstore.optim.layout import OffloadError, Subgroup

__all__ = [
    "check_params",
    "gather_grads",
    "gather_params",
    "grad_views",
    "grads_viewable",
    "scatter_params",
]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_params(params: Sequence[torch.Tensor]) -> torch.device:
    """The one device of ``params``; raises OffloadError for a parameter that cannot be
    offloaded (dtype, layout, device)."""
    devices = {p.device for p in params}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise OffloadError(f"parameters on mixed devices ({names}): one optimizer per device")
    for index, p in enumerate(params):
        if p.dtype not in _DTYPES:
            raise OffloadError(f"parameter {index} is {p.dtype}; fp32, bf16 or fp16 expected")
        if p.is_sparse or not p.is_contiguous():
            raise OffloadError(f"parameter {index} must be dense and contiguous")
        if p.device.type not in ("cpu", "cuda"):
            raise OffloadError(f"parameter {index} is on {p.device}; cpu or cuda expected")
    return devices.pop() if devices else torch.device("cpu")


def _flat(p: torch.Tensor) -> torch.Tensor:
    return p.detach().view(-1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # untested: the non_blocking copies must land first
        torch.cuda.current_stream(device).synchronize()


def gather_grads(
    subgroup: Subgroup, params: Sequence[torch.Tensor], grad: torch.Tensor, has_grad: list[bool]
) -> None:
    device = None
    for segment, with_grad in zip(subgroup.segments, has_grad, strict=True):
        if not with_grad:
            continue
        p = params[segment.param_index]
        source = p.grad
        assert source is not None
        if source.is_sparse:
            raise OffloadError(f"parameter {segment.param_index} has a sparse gradient")
        piece = source.reshape(-1)[segment.start : segment.start + segment.length]
        grad[segment.offset : segment.offset + segment.length].copy_(piece, non_blocking=True)
        device = p.device
    if device is not None:
        _sync(device)


def _viewable(grad: torch.Tensor) -> bool:
    return (
        grad.dtype == torch.float32
        and grad.device.type == "cpu"
        and grad.layout == torch.strided
        and grad.is_contiguous()
    )


def grads_viewable(
    subgroup: Subgroup, params: Sequence[torch.Tensor], has_grad: list[bool]
) -> bool:
    """Whether ``grad_views`` gives every stepped segment a view (no gradient buffer used)."""
    for segment, with_grad in zip(subgroup.segments, has_grad, strict=True):
        source = params[segment.param_index].grad if with_grad else None
        if source is not None and not _viewable(source):
            return False
    return True


def grad_views(
    subgroup: Subgroup, params: Sequence[torch.Tensor], grad: torch.Tensor, has_grad: list[bool]
) -> list[torch.Tensor | None]:
    """Each segment's gradient as fp32: a view of the parameter's own gradient where it is a
    dense contiguous fp32 CPU tensor (no copy: the resident step reads it in place, and torch
    would step that same tensor), else a copy into the gradient buffer as ``gather_grads``."""
    views: list[torch.Tensor | None] = []
    copy = [False] * len(subgroup.segments)
    for i, (segment, with_grad) in enumerate(zip(subgroup.segments, has_grad, strict=True)):
        source = params[segment.param_index].grad if with_grad else None
        if source is None:
            views.append(None)
            continue
        span = slice(segment.offset, segment.offset + segment.length)
        if _viewable(source):
            views.append(source.view(-1)[segment.start : segment.start + segment.length])
        else:
            copy[i] = True
            views.append(grad[span])
    if any(copy):
        gather_grads(subgroup, params, grad, copy)
    return views


@torch.no_grad()
def scatter_params(
    subgroup: Subgroup, params: Sequence[torch.Tensor], master: torch.Tensor, only: list[bool]
) -> None:
    device = None
    for segment, wanted in zip(subgroup.segments, only, strict=True):
        if not wanted:
            continue
        p = params[segment.param_index]
        target = _flat(p)[segment.start : segment.start + segment.length]
        target.copy_(master[segment.offset : segment.offset + segment.length], non_blocking=True)
        device = p.device
    if device is not None:
        _sync(device)


@torch.no_grad()
def gather_params(subgroup: Subgroup, params: Sequence[torch.Tensor], master: torch.Tensor) -> None:
    for segment in subgroup.segments:
        piece = _flat(params[segment.param_index])[segment.start : segment.start + segment.length]
        master[segment.offset : segment.offset + segment.length].copy_(piece)
