"""StateSchema: what a wrapped torch optimizer keeps per parameter, found by running it.

An OffloadedOptimizer stores the per-element states (Adam's ``exp_avg``, SGD's
``momentum_buffer``, Adagrad's ``sum``) as fp32 sections of each subgroup and the per-parameter
scalars (``step``, NAdam's ``mu_product``) as numbers in the manifest. Which is which is learnt
by stepping the optimizer class, with the user's arguments, on a tiny parameter: a state shaped
like the parameter is per-element, a 0-d tensor or a number is a scalar, anything else (a
factored second moment, a Hessian history) means the optimizer is not elementwise and is
refused. The probe also steps a parameter whole and in two pieces and requires equal bits, so an
optimizer whose update mixes elements (a norm over the tensor) is refused with a clear error
rather than trained differently.

Thread-safety: pure functions; the schema is immutable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvstore.optim.layout import OffloadError

__all__ = ["StateSchema", "probe_schema", "scalar_from_json", "scalar_to_json"]

# Optimizers that need a closure, sparse gradients or whole-tensor state: refused by name so the
# message is precise (the probe would refuse them too, less clearly).
_REFUSED = {
    "LBFGS": "needs a closure and keeps a history of whole-model vectors",
    "SparseAdam": "steps sparse gradients",
    "Adafactor": "keeps factored (row/column) second moments, not per-element ones",
    "Muon": "orthogonalises whole matrices",
}


@dataclass(frozen=True)
class StateSchema:
    vector_keys: tuple[str, ...]  # per-element fp32 states, stored as subgroup sections
    scalar_keys: tuple[str, ...]  # per-parameter 0-d tensors or numbers, kept in the manifest
    scalar_dtypes: tuple[str | None, ...]  # each scalar's tensor dtype, None for a number
    eager: bool  # the class makes its state in __init__ (Adagrad), not at the first step

    @property
    def sections(self) -> int:
        return 1 + len(self.vector_keys)


def _step(
    cls: type[torch.optim.Optimizer],
    params: list[torch.Tensor],
    kwargs: dict[str, Any],
    grads: list[list[torch.Tensor]],
) -> torch.optim.Optimizer:
    opt = cls(params, **kwargs)
    for round_grads in grads:
        for p, g in zip(params, round_grads, strict=True):
            p.grad = g
        opt.step()
    return opt


def probe_schema(cls: type[torch.optim.Optimizer], kwargs: dict[str, Any]) -> StateSchema:
    """The schema of ``cls(params, **kwargs)``; raises OffloadError for one that cannot be
    offloaded (not an Optimizer subclass, refused by name, not elementwise)."""
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise OffloadError(f"optimizer must be a torch.optim.Optimizer subclass, got {cls!r}")
    if cls.__name__ in _REFUSED:
        raise OffloadError(f"{cls.__name__} cannot be offloaded: it {_REFUSED[cls.__name__]}")
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(2, 33, generator=generator)
    grads = [[torch.randn(2, 33, generator=generator)] for _ in range(3)]
    whole = start.clone()
    try:
        fresh = cls([torch.zeros(2, 33)], **kwargs)
        opt = _step(cls, [whole], kwargs, grads)
    except Exception as exc:  # the class refuses these arguments, or needs a closure
        raise OffloadError(f"{cls.__name__}(**{kwargs!r}) cannot step a parameter: {exc}") from exc
    flat = start.clone().reshape(-1)
    pieces = [flat[:29], flat[29:]]
    split_grads = [[g[0].reshape(-1)[:29], g[0].reshape(-1)[29:]] for g in grads]
    _step(cls, pieces, kwargs, split_grads)
    if not torch.equal(whole.reshape(-1), flat):
        raise OffloadError(
            f"{cls.__name__} is not elementwise: stepping a tensor in pieces changes its update"
        )
    vector, scalar, dtypes = [], [], []
    for key, value in opt.state[whole].items():
        if isinstance(value, torch.Tensor) and value.shape == whole.shape:
            if value.dtype != torch.float32:
                raise OffloadError(f"{cls.__name__} state {key!r} is {value.dtype}, not fp32")
            vector.append(key)
        elif (isinstance(value, torch.Tensor) and value.dim() == 0) or _is_number(value):
            scalar.append(key)
            is_tensor = isinstance(value, torch.Tensor)
            dtypes.append(str(value.dtype).removeprefix("torch.") if is_tensor else None)
        else:
            raise OffloadError(
                f"{cls.__name__} state {key!r} is not per-element ({_describe(value)}): "
                "only elementwise optimizers can be offloaded"
            )
    return StateSchema(tuple(vector), tuple(scalar), tuple(dtypes), eager=bool(fresh.state))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"shape {tuple(value.shape)}"
    return type(value).__name__


def scalar_to_json(value: Any) -> list[Any]:
    """A per-parameter scalar as JSON: ``["tensor", dtype, number]`` or ``["number", n]``;
    a float32 or float64 value round-trips exactly through a JSON float."""
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype).removeprefix("torch."), value.item()]
    return ["number", value]


def scalar_from_json(item: list[Any]) -> Any:
    if item[0] == "tensor":
        return torch.tensor(item[2], dtype=getattr(torch, item[1]))
    return item[1]
