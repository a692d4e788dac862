"""OffloadedOptimizer: a torch.optim.Optimizer whose fp32 master weights and states live in a
tier (DRAM or NVMe), streamed through a few staging buffers subgroup by subgroup.

It is a real Optimizer (``defaults``, ``param_groups``, hooks, ``zero_grad``, every LR
scheduler: each step reads the groups' current hyperparameters). ``self.state`` holds only the
per-parameter scalars (``step``); the per-element states are in the tier, and ``state_dict()``
exports them in torch's layout (state_dict.py).
``step`` streams the subgroups that hold at least one parameter with a gradient
(versioned.VersionedState.commit): read the subgroup's object, copy its gradients in, step it
with the wrapped optimizer (inner.SubgroupStepper), copy the new weights to the parameters,
write the object under a new version; then commit the step with the manifest. On DRAM a
replaced object is deleted as soon as its successor is stored; on NVMe only after the commit,
so a crash mid-step leaves the previous step whole, and objects a named checkpoint holds are
never deleted.
With ``resident=True`` (DRAM's default) each subgroup's object lives in its own host buffer,
stepped in place (resident.py). With ``master="params"`` fp32 CPU parameters are the masters
and only the states are stored (params_master.py). Checkpoints: checkpoints.py.

Thread-safety: like any torch optimizer, one thread at a time. A step that raises leaves the
parameters partly updated; the stored (NVMe) state stays at the previous committed step.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

from kvstore.optim import state_dict as sd_io
from kvstore.optim import transfer
from kvstore.optim.checkpoints import CheckpointsMixin
from kvstore.optim.inner import Grads, SubgroupStepper, sections
from kvstore.optim.layout import OffloadError, Subgroup
from kvstore.optim.opening import open_state, plan_layout
from kvstore.optim.params_master import (
    MASTERS,
    check_params_master,
    fp32_cpu,
    master_views,
    stored_master,
)
from kvstore.optim.pipeline import Staging
from kvstore.optim.resident import (
    ResidentStaging,
    ResidentState,
    step_resident,
    unalias_params,
)
from kvstore.optim.schema import probe_schema, scalar_from_json
from kvstore.optim.state_tier import StateTier
from kvstore.optim.transfer import check_params, gather_grads, gather_params, scatter_params
from kvstore.optim.versioned import VersionedState
from tiers import IORuntime, default_runtime

__all__ = ["OffloadedOptimizer"]


class OffloadedOptimizer(CheckpointsMixin, torch.optim.Optimizer):
    """``optimizer(params, **optimizer_kwargs)`` with its state offloaded to ``tier``.

    Args:
        params: parameters or param groups, as for any torch optimizer (one device).
        optimizer: an elementwise torch optimizer class (AdamW, Adam, SGD, Adagrad, ...).
        tier: "dram", "nvme" or a tiers store configuration dict.
        directory: the NVMe tier's directory (required for "nvme"); a directory holding a
            committed state for the same parameters and optimizer resumes from it.
        create: make ``directory`` when missing (False: a missing directory is an error).
        subgroup_bytes: fp32 master bytes per streamed subgroup; None: sized from the model
            so the pipeline overlaps (about 16 subgroups of 8-64 MiB, sizing.py).
        host_budget_bytes: bound on staging memory; default: 4 subgroups' objects + gradients.
        runtime: the IORuntime (default: ``tiers.default_runtime()``).
        resident: the state in host buffers stepped in place (resident.py): no staging
            copies; host memory ``(1 + states) * 4`` bytes per parameter element. Default: on
            for ``tier="dram"`` (DRAM state is host memory either way), off otherwise.
        master: "tier" (an fp32 master stored with the states; reopening gives the parameters
            back), "params" (fp32 CPU parameters are the masters, only states are stored:
            Adam moves 8 bytes per parameter, not 12; see params_master.py) or "auto" (the
            default): a stored state's own mode, else "params" for fp32 CPU parameters on a
            persistent tier, else "tier"; a reopen then pairs the parameters at the first
            step, not at once (params_master.py).
    Raises OffloadError (a tiers.TierkitError) for what cannot be offloaded.
    """

    # set by opening.plan_layout / open_state
    subgroups: list[Subgroup]
    subgroup_bytes: int
    signature: dict[str, Any]
    resident: bool
    resumed: bool
    _stepper: SubgroupStepper
    _stored_sections: int
    _sums: Callable[[Subgroup], int] | None
    _object_bytes: int
    _grad_bytes: int
    _slots: int

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        optimizer: type[torch.optim.Optimizer] = torch.optim.AdamW,
        *,
        tier: str | dict[str, Any] = "dram",
        directory: str | os.PathLike[str] | None = None,
        create: bool = True,
        subgroup_bytes: int | None = None,
        host_budget_bytes: int | None = None,
        runtime: IORuntime | None = None,
        resident: bool | None = None,
        master: str = "auto",
        **optimizer_kwargs: Any,
    ) -> None:
        self._tier: StateTier | None = None
        self._aliased: dict[int, int] = {}  # resident: param index -> its master's data_ptr
        self._staging: Staging | ResidentStaging | None = None
        self._versions: VersionedState | ResidentState | None = None
        self.schema = probe_schema(optimizer, optimizer_kwargs)
        self.optimizer_class = optimizer
        defaults = dict(optimizer([torch.zeros(1)], **optimizer_kwargs).defaults)
        super().__init__(params, defaults)
        self._params = [p for group in self.param_groups for p in group["params"]]
        self.device = check_params(self._params)
        if master not in MASTERS:
            raise OffloadError(f"master must be one of {MASTERS}, got {master!r}")
        runtime = runtime or default_runtime()
        self._unpaired: str | None = None  # why the next step must pair the parameters first
        self._deferred = master == "auto"  # auto: a reopen pairs at the first step, not here
        try:
            if master == "auto":  # a stored state decides; else fp32 CPU params -> "params"
                if not resident and tier != "dram" and fp32_cpu(self._params):
                    self._tier = StateTier(tier, directory, create=create, runtime=runtime)
                master = stored_master(self._tier)
            self.master = master
            if master == "params":
                check_params_master(self._params)
            plan_layout(
                self, tier, subgroup_bytes, host_budget_bytes, resident, optimizer_kwargs, runtime
            )
            open_state(self, tier, directory, create, runtime)
        except BaseException:
            self.close()
            raise

    def _signature(self, subgroup_numel: int, split: bool) -> dict[str, Any]:
        cls = self.optimizer_class
        return {
            "optimizer": f"{cls.__module__}.{cls.__qualname__}",
            "params": [[list(p.shape), str(p.dtype)] for p in self._params],
            "groups": [len(g["params"]) for g in self.param_groups],
            "subgroup_numel": subgroup_numel,
            "split_params": split,
            "vector_keys": list(self.schema.vector_keys),
            "scalar_keys": list(self.schema.scalar_keys),
            "subgroups": len(self.subgroups),
        } | ({"master": "params"} if self.master == "params" else {})

    def _initial(self, subgroup: Subgroup, slot: int) -> dict[int, Any]:
        """Version 0 of a subgroup: master weights from the parameters, zero states (and the
        eager states of optimizers that make them in __init__, like Adagrad)."""
        buffer = self.staging.slot_fp32(slot, self._stored_sections * subgroup.stride)
        buffer.zero_()
        if (masters := self._master_views(subgroup)) is None:
            gather_params(subgroup, self._params, sections(buffer, subgroup, 1)[0])
        return self._stepper.step(subgroup, buffer, None, [], self._hyper(subgroup), {}, masters)

    def _master_views(self, subgroup: Subgroup) -> list[torch.Tensor] | None:
        """master="params": the parameter pieces the wrapped optimizer steps; else None."""
        return master_views(subgroup, self._params) if self.master == "params" else None

    def _refresh_state(self) -> None:
        """``self.state`` holds, for each parameter with state, its scalars (``step``): torch
        code that asks whether an optimizer has state (DCP's ``_init_optim_state``) sees what it
        would see with the wrapped optimizer; the per-element states stay in the tier."""
        state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
        for index, scalars in self.versions.manifest.scalars.items():
            state[self._params[index]] = {k: scalar_from_json(v) for k, v in scalars.items()}
        self.state = state

    def load_params(self) -> None:
        """Copy the committed master weights into the parameters (done on resume/restore;
        with master="params" the parameters are the masters: nothing to copy)."""
        if self.master == "params":
            return

        def copy(subgroup: Subgroup, slot: int) -> None:
            master = self.staging.slot_fp32(slot, subgroup.stride)[: subgroup.numel]
            scatter_params(subgroup, self._params, master, [True] * len(subgroup.segments))

        self.versions.scan(copy)

    # ------------------------------------------------------------------ stepping
    @property
    def versions(self) -> VersionedState | ResidentState:
        if self._versions is None:
            raise OffloadError("this OffloadedOptimizer is closed")
        return self._versions

    @property
    def staging(self) -> Staging | ResidentStaging:
        if self._staging is None:
            raise OffloadError("this OffloadedOptimizer is closed")
        return self._staging

    @property
    def committed_step(self) -> int:
        """Steps (and loads) committed to the tier since the state was made."""
        return self.versions.manifest.step

    def _hyper(self, subgroup: Subgroup) -> dict[str, Any]:
        group = self.param_groups[subgroup.group_index]
        return {key: value for key, value in group.items() if key != "params"}

    def _is_aliased(self, index: int) -> bool:
        """Parameter ``index`` is (still) a view of its resident master: no copy back."""
        pointer = self._aliased.get(index)
        return pointer is not None and self._params[index].data_ptr() == pointer

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        versions = self.versions
        if self._unpaired is not None:
            self._pair_params(at_open=False)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        has_grad = [p.grad is not None for p in self._params]
        todo = [s for s in self.subgroups if any(has_grad[g.param_index] for g in s.segments)]
        committed = versions.manifest.scalars  # a parameter cut in two reads the same scalars

        def step_one(subgroup: Subgroup, slot: int) -> dict[int, Any]:
            buffer = self.staging.slot_fp32(slot, self._stored_sections * subgroup.stride)
            grad = self.staging.grad_fp32(subgroup.stride)
            mask = [has_grad[s.param_index] for s in subgroup.segments]
            grads: Grads = grad
            masters = self._master_views(subgroup)
            if self.resident or masters is not None:
                grads = transfer.grad_views(subgroup, self._params, grad, mask)
            else:
                gather_grads(subgroup, self._params, grad, mask)
            hyper = self._hyper(subgroup)
            out = self._stepper.step(subgroup, buffer, grads, mask, hyper, committed, masters)
            if masters is not None:
                return out  # the parameters were stepped in place
            self._scatter(subgroup, buffer, mask)
            return out

        if isinstance(versions, ResidentState):  # the whole state at hand: one inner step
            versions.commit_together(todo, lambda todo: step_resident(self, todo, has_grad))
        else:
            versions.commit(todo, step_one, sums=self._sums)
        self._refresh_state()
        return loss

    def _scatter(self, subgroup: Subgroup, buffer: torch.Tensor, mask: list[bool]) -> None:
        """Copy a stepped subgroup's masters into its parameters that do not alias them."""
        back = [
            wanted and not self._is_aliased(s.param_index)
            for s, wanted in zip(subgroup.segments, mask, strict=True)
        ]
        scatter_params(subgroup, self._params, sections(buffer, subgroup, 1)[0], back)

    # ------------------------------------------------------------------ state dicts
    def state_dict(self) -> dict[str, Any]:
        return sd_io.export_state(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sd_io.import_state(self, state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "subgroups", None) is not None:
            raise OffloadError("OffloadedOptimizer's groups are fixed: give them all at creation")
        super().add_param_group(param_group)

    # ------------------------------------------------------------------ life cycle
    def close(self) -> None:
        """Give back the staging buffers and close the tier (idempotent)."""
        staging, self._staging = self._staging, None
        tier, self._tier = self._tier, None
        self._versions = None
        aliased, self._aliased = self._aliased, {}
        unalias_params(self._params, aliased)
        if staging is not None:
            staging.close()
        if tier is not None:
            tier.close()

    def __enter__(self) -> OffloadedOptimizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
