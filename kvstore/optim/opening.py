"""Opening an OffloadedOptimizer: its layout (residency, subgroups, signature, staging sizes)
and its state (the tier, the staging buffers, and resuming a stored state or making version 0).

``plan_layout`` sizes subgroups for the chosen ``master`` (sizing.py) and cuts them
(layout.py); ``open_state`` opens the tier unless ``master="auto"`` already opened it to read
the stored mode, takes the staging buffers, and adopts the committed state: with
``master="tier"`` its master weights are copied into the parameters, with ``"params"`` the
parameters are paired with the stored step (params_master.py).

Thread-safety: called once, from the optimizer's constructor.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kvstore.optim.inner import SubgroupStepper
from kvstore.optim.layout import OffloadError, build_layout
from kvstore.optim.pipeline import Staging
from kvstore.optim.resident import ResidentStaging, ResidentState, alias_params
from kvstore.optim.sizing import auto_subgroup_bytes, staging_slots
from kvstore.optim.state_tier import StateTier
from kvstore.optim.versioned import VersionedState
from tiers import IORuntime

if TYPE_CHECKING:
    from kvstore.optim.offloaded import OffloadedOptimizer

__all__ = ["open_state", "plan_layout"]


def plan_layout(
    opt: OffloadedOptimizer,
    tier: str | dict[str, Any],
    subgroup_bytes: int | None,
    host_budget_bytes: int | None,
    resident: bool | None,
    optimizer_kwargs: dict[str, Any],
    runtime: IORuntime,
) -> None:
    """The layout: residency, subgroups, signature and staging sizes."""
    master = opt.master
    opt.resident = tier == "dram" and master == "tier" if resident is None else resident
    if opt.resident and (tier != "dram" or master != "tier"):
        raise OffloadError(f'resident=True needs tier="dram", master="tier"; got {tier!r}')
    opt._stored_sections = count = opt.schema.sections - (master == "params")
    if subgroup_bytes is None:
        numel = sum(p.numel() for p in opt._params)
        subgroup_bytes = auto_subgroup_bytes(4 * numel, count, host_budget_bytes)
    if isinstance(subgroup_bytes, bool) or not isinstance(subgroup_bytes, int):
        raise OffloadError(f"subgroup_bytes must be an int, got {subgroup_bytes!r}")
    opt.subgroup_bytes = subgroup_bytes
    split = not optimizer_kwargs.get("fused")  # layout.py: fused kernels round by position
    numels = [[p.numel() for p in g["params"]] for g in opt.param_groups]
    opt.subgroups = build_layout(numels, max(1, subgroup_bytes // 4), split_params=split)
    opt._stepper = SubgroupStepper(opt.optimizer_class, optimizer_kwargs, opt.schema)
    opt.signature = opt._signature(subgroup_bytes // 4, split)
    opt._sums = None if master == "tier" else opt._param_sums
    opt.resumed_from = None
    opt._object_bytes = max((s.object_bytes(count) for s in opt.subgroups), default=4096)
    opt._grad_bytes = max((s.stride * 4 for s in opt.subgroups), default=4096)
    size = runtime.buffers.class_bytes  # what a buffer of that size takes from the cache
    opt._slots = staging_slots(
        len(opt.subgroups), size(opt._object_bytes), size(opt._grad_bytes), host_budget_bytes
    )


def open_state(
    opt: OffloadedOptimizer,
    tier: str | dict[str, Any],
    directory: str | os.PathLike[str] | None,
    create: bool,
    runtime: IORuntime,
) -> None:
    """Open (or adopt) the tier, take the staging buffers, resume or make the state."""
    if opt.resident:
        _open_resident(opt, runtime, opt._grad_bytes)
        return
    count, object_bytes, slots = opt._stored_sections, opt._object_bytes, opt._slots
    if opt._tier is None:
        state_bytes = sum(s.object_bytes(count) for s in opt.subgroups)
        opt._tier = StateTier(
            tier,
            directory,
            create=create,
            runtime=runtime,
            state_bytes=state_bytes,
            in_flight_bytes=slots * object_bytes,
        )
    pin = opt.device.type == "cuda"
    opt._staging = Staging(runtime, object_bytes, slots, opt._grad_bytes, pin)
    opt._versions = VersionedState(opt._tier, opt._staging, opt.subgroups, count, opt.signature)
    opt.resumed = opt._versions.open(opt._initial, opt._sums)
    if opt.resumed and opt.master == "tier":
        opt.load_params()
    elif opt.resumed:  # the parameters must be the state's weights (params_master.py)
        opt._pair_params(at_open=True)
    opt._refresh_state()


def _open_resident(opt: OffloadedOptimizer, runtime: IORuntime, grad_bytes: int) -> None:
    count = opt.schema.sections
    opt._staging = ResidentStaging(runtime, opt.subgroups, count, grad_bytes)
    opt._versions = ResidentState(opt._staging, opt.subgroups, opt.signature)
    opt.resumed = opt._versions.open(opt._initial)
    opt._refresh_state()
    opt._aliased = alias_params(opt.subgroups, opt._params, opt._staging)
