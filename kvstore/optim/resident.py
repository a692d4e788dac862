"""Resident DRAM state: each subgroup's object kept in its own host buffer and stepped in place.

With ``resident=True`` (DRAM only) an OffloadedOptimizer does not copy its state through a
TieredStore: every subgroup's object (master weights then each per-element state, laid out as
layout.py says) lives for the optimizer's life in one page-aligned buffer from the runtime's
buffer cache, and that buffer IS the DRAM copy of the state. A step computes on the buffer
directly (no read, no write back, no second copy while stepping), which is what makes a DRAM
step cost about what the wrapped optimizer's own step costs.

Host memory is therefore proportional to the model, not to ``subgroup_bytes``: ``host_bytes``
is ``sections * 4`` bytes per (page-rounded) parameter element plus one subgroup of gradient
staging (used only for gradients that cannot be viewed: not fp32, not contiguous, not on the
CPU). There is no crash consistency to provide (DRAM dies with the process), so there are no
versions and no named checkpoints; ``state_dict()`` is the way to save it.

An fp32 CPU parameter held whole by one subgroup is made a view of its master section
(``alias_params``: ``p.data`` points into the buffer), so the step updates the model in place
and nothing is copied back; this is what torch's own optimizer does (its weights are the
parameters), so a ``model.load_state_dict`` or DCP load into the parameters updates the master
as it would torch's. A parameter whose storage is later replaced (``p.data = ...``) is noticed
(``data_ptr`` no longer the master's) and gets copied into again, as a non-aliased one;
``unalias_params`` gives every aliased parameter its own storage again before the buffers are
given back at close.

``step_resident`` steps every subgroup of a step with one inner optimizer (one fused kernel call
per param group, as torch makes), since the whole state is at hand.

``ResidentStaging`` stands where pipeline.Staging does, with slot number == subgroup index;
``ResidentState`` stands where versioned.VersionedState does: ``commit``/``scan`` call
``compute(subgroup, subgroup.index)`` in turn and keep the manifest (step count, scalars) in
memory.

Thread-safety: one optimizer, one thread at a time.
Invariants: slot ``i`` holds subgroup ``i``'s committed object whenever no compute runs; a
compute that raises leaves the subgroups it reached updated (as a DRAM tier step would).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvstore.optim import transfer
from kvstore.optim.inner import StepItem
from kvstore.optim.layout import OffloadError, Subgroup
from kvstore.optim.manifest import Manifest
from tiers import IORuntime

if TYPE_CHECKING:
    from kvstore.optim.offloaded import OffloadedOptimizer

__all__ = [
    "ResidentStaging",
    "ResidentState",
    "alias_params",
    "step_resident",
    "unalias_params",
]

Compute = Callable[[Subgroup, int], Any]


class ResidentStaging:
    def __init__(
        self,
        runtime: IORuntime,
        subgroups: Sequence[Subgroup],
        sections: int,
        grad_bytes: int,
    ) -> None:
        self.runtime = runtime
        self.slots: list[np.ndarray] = []
        try:
            for subgroup in subgroups:
                self.slots.append(runtime.buffers.take(subgroup.object_bytes(sections)))
            self.grad: np.ndarray = runtime.buffers.take(grad_bytes)
        except BaseException:
            for buffer in self.slots:
                runtime.buffers.give(buffer)
            raise

    @property
    def host_bytes(self) -> int:
        return sum(b.nbytes for b in self.slots) + self.grad.nbytes

    def slot_bytes(self, slot: int, size_bytes: int) -> np.ndarray:
        return self.slots[slot][:size_bytes]

    def slot_fp32(self, slot: int, numel: int) -> torch.Tensor:
        return torch.from_numpy(self.slots[slot][: numel * 4]).view(torch.float32)

    def grad_fp32(self, numel: int) -> torch.Tensor:
        return torch.from_numpy(self.grad[: numel * 4]).view(torch.float32)

    def close(self) -> None:
        slots, self.slots = self.slots, []
        for buffer in [*slots, self.grad]:
            self.runtime.buffers.give(buffer)


class ResidentState:
    """The VersionedState interface over resident buffers (no tier, no versions)."""

    persistent = False

    def __init__(
        self, staging: ResidentStaging, subgroups: Sequence[Subgroup], signature: dict[str, Any]
    ) -> None:
        self.staging = staging
        self.subgroups = list(subgroups)
        self.signature = signature
        self.checkpoints: dict[str, Manifest] = {}
        self.manifest = Manifest(signature, 0, [0] * len(self.subgroups))

    def open(self, initialise: Compute) -> bool:
        """Make every subgroup's first state; nothing to resume from (returns False)."""
        self.commit(self.subgroups, initialise, read=False, scalars={}, first=True)
        return False

    def scan(self, compute: Callable[[Subgroup, int], None]) -> None:
        for subgroup in self.subgroups:
            compute(subgroup, subgroup.index)

    def commit(
        self,
        todo: Sequence[Subgroup],
        compute: Compute,
        *,
        read: bool = True,
        scalars: dict[int, Any] | None = None,
        first: bool = False,
        sums: Callable[[Subgroup], int] | None = None,
    ) -> None:
        old = self.manifest  # sums: master="params" is never resident
        base = dict(old.scalars if scalars is None else scalars)
        new = Manifest(self.signature, 0 if first else old.step + 1, list(old.versions), base)
        for subgroup in todo:
            new.scalars.update(compute(subgroup, subgroup.index))
        self.manifest = new

    def commit_together(
        self,
        todo: Sequence[Subgroup],
        compute_all: Callable[[list[Subgroup]], dict[int, Any]],
    ) -> None:
        """``commit`` with one ``compute_all(todo)`` for every subgroup (one inner step)."""
        old = self.manifest
        new = Manifest(self.signature, old.step + 1, list(old.versions), dict(old.scalars))
        new.scalars.update(compute_all(list(todo)))
        self.manifest = new

    def collect_garbage(self) -> None:
        pass

    def checkpoint(self, name: str, verify: bool) -> None:
        raise OffloadError("checkpoint() needs a persistent (nvme) tier; use state_dict()")

    def restore(self, name: str, check: Callable[[Manifest], None] | None = None) -> None:
        raise OffloadError(f"no checkpoint {name!r}: resident DRAM state keeps none")

    def delete_checkpoint(self, name: str) -> None:
        self.checkpoints.pop(name, None)


@torch.no_grad()
def alias_params(
    subgroups: Sequence[Subgroup], params: Sequence[torch.Tensor], staging: ResidentStaging
) -> dict[int, int]:
    """Point each fp32 CPU parameter that one segment holds whole at its master section (the
    master already holds its value); returns ``{param_index: master data_ptr}``."""
    aliased: dict[int, int] = {}
    for subgroup in subgroups:
        master = staging.slot_fp32(subgroup.index, subgroup.numel)
        for segment in subgroup.segments:
            p = params[segment.param_index]
            whole = segment.start == 0 and segment.length == p.numel()
            if not whole or p.dtype != torch.float32 or p.device.type != "cpu":
                continue
            view = master[segment.offset : segment.offset + segment.length].view(p.shape)
            p.data = view
            aliased[segment.param_index] = view.data_ptr()
    return aliased


@torch.no_grad()
def unalias_params(params: Sequence[torch.Tensor], aliased: dict[int, int]) -> None:
    """Give each parameter still viewing a master its own copy (the buffers are going back)."""
    for index, pointer in aliased.items():
        p = params[index]
        if p.data_ptr() == pointer:
            p.data = p.data.clone()


def step_resident(
    opt: OffloadedOptimizer, todo: list[Subgroup], has_grad: list[bool]
) -> dict[int, Any]:
    """Step the resident subgroups of ``todo`` with one inner optimizer: one fused kernel
    call per param group over all of them, as torch's own step makes (an inner optimizer
    per subgroup cost ~2 ms each: a 500M-parameter step was 1.19x torch's). A subgroup
    whose gradients must be copied (not fp32 CPU tensors) uses the one gradient buffer,
    and one whose states are made now has torch allocate them: each steps alone, first."""
    items: list[StepItem] = []
    hypers: list[dict[str, Any]] = []
    out: dict[int, Any] = {}
    scalars = opt.versions.manifest.scalars
    for subgroup in todo:
        buffer = opt.staging.slot_fp32(subgroup.index, opt.schema.sections * subgroup.stride)
        mask = [has_grad[s.param_index] for s in subgroup.segments]
        # a first step makes the states: torch allocates them (then copied into the buffer),
        # so a subgroup with a stateless stepped segment steps alone, bounding that transient
        fresh = bool(opt.schema.vector_keys) and any(
            w and s.param_index not in scalars for s, w in zip(subgroup.segments, mask, strict=True)
        )
        alone = fresh or not transfer.grads_viewable(subgroup, opt._params, mask)
        grad = opt.staging.grad_fp32(subgroup.stride)
        grads = transfer.grad_views(subgroup, opt._params, grad, mask)
        if alone:
            hyper = opt._hyper(subgroup)
            out |= opt._stepper.step(subgroup, buffer, grads, mask, hyper, scalars)
            opt._scatter(subgroup, buffer, mask)
        else:
            items.append((subgroup, buffer, grads, mask, None))
            hypers.append(opt._hyper(subgroup))
    if items:
        out |= opt._stepper.step_many(items, hypers, scalars)
    for subgroup, buffer, _, mask, _ in items:
        opt._scatter(subgroup, buffer, mask)
    return out
