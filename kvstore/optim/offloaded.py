"""OffloadedOptimizer: a torch.optim.Optimizer whose fp32 master weights and states live in a
tier (DRAM or NVMe), streamed through a few staging buffers subgroup by subgroup.

It is a real Optimizer (``defaults``, ``param_groups``, hooks, ``zero_grad``, every LR
scheduler: each step reads the groups' current hyperparameters). ``self.state`` stays empty;
the state is in the tier and ``state_dict()`` exports it in torch's layout (state_dict.py).
``step`` streams the subgroups that hold at least one parameter with a gradient
(pipeline.stream): read the subgroup's object, copy its gradients in, step it with the wrapped
optimizer (inner.SubgroupStepper), copy the new weights to the parameters, write the object
under a new version; then commit the step with the manifest (manifest.py). On DRAM a replaced
object is deleted as soon as its successor is stored; on NVMe only after the commit, so a crash
mid-step leaves the previous step whole, and objects a named checkpoint holds are never deleted.

Thread-safety: like any torch optimizer, one thread at a time. A step that raises leaves the
parameters partly updated; the stored (NVMe) state stays at the previous committed step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import torch

from kvstore.optim import state_dict as sd_io
from kvstore.optim.inner import SubgroupStepper, sections
from kvstore.optim.layout import OffloadError, Subgroup, build_layout
from kvstore.optim.manifest import (
    OBJECT_PREFIX,
    Manifest,
    checkpoint_key,
    object_key,
    parse_object_key,
    referenced_keys,
)
from kvstore.optim.pipeline import Staging, stream
from kvstore.optim.schema import probe_schema
from kvstore.optim.state_tier import StateTier
from kvstore.optim.transfer import check_params, gather_grads, gather_params, scatter_params
from tiers import IORuntime, default_runtime

__all__ = ["OffloadedOptimizer"]

_MAX_SLOTS = 3  # read ahead, step, write behind: more buys no overlap


class OffloadedOptimizer(torch.optim.Optimizer):
    """``optimizer(params, **optimizer_kwargs)`` with its state offloaded to ``tier``.

    Args:
        params: parameters or param groups, as for any torch optimizer (one device).
        optimizer: an elementwise torch optimizer class (AdamW, Adam, SGD, Adagrad, ...).
        tier: "dram", "nvme" or a tiers store configuration dict.
        directory: the NVMe tier's directory (required for "nvme"); a directory holding a
            committed state for the same parameters and optimizer resumes from it.
        create: make ``directory`` when missing (False: a missing directory is an error).
        subgroup_bytes: fp32 master bytes per streamed subgroup.
        host_budget_bytes: bound on staging memory; default: 3 subgroups' objects + gradients.
        runtime: the IORuntime (default: ``tiers.default_runtime()``).
    Raises OffloadError (a tiers.TierkitError) for what cannot be offloaded.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        optimizer: type[torch.optim.Optimizer] = torch.optim.AdamW,
        *,
        tier: str | dict[str, Any] = "dram",
        directory: str | os.PathLike[str] | None = None,
        create: bool = True,
        subgroup_bytes: int = 64 << 20,
        host_budget_bytes: int | None = None,
        runtime: IORuntime | None = None,
        **optimizer_kwargs: Any,
    ) -> None:
        self._tier: StateTier | None = None
        self._staging: Staging | None = None
        self.schema = probe_schema(optimizer, optimizer_kwargs)
        self.optimizer_class = optimizer
        defaults = dict(optimizer([torch.zeros(1)], **optimizer_kwargs).defaults)
        super().__init__(params, defaults)
        self._params = [p for group in self.param_groups for p in group["params"]]
        self.device = check_params(self._params)
        if isinstance(subgroup_bytes, bool) or not isinstance(subgroup_bytes, int):
            raise OffloadError(f"subgroup_bytes must be an int, got {subgroup_bytes!r}")
        split = not optimizer_kwargs.get("fused")  # layout.py: fused kernels round by position
        numels = [[p.numel() for p in g["params"]] for g in self.param_groups]
        self.subgroups = build_layout(numels, max(1, subgroup_bytes // 4), split_params=split)
        self._stepper = SubgroupStepper(optimizer, dict(optimizer_kwargs), self.schema)
        self.signature = self._signature(subgroup_bytes // 4, split)
        count = self.schema.sections
        object_bytes = max((s.object_bytes(count) for s in self.subgroups), default=4096)
        grad_bytes = max((s.stride * 4 for s in self.subgroups), default=4096)
        budget = host_budget_bytes or _MAX_SLOTS * object_bytes + grad_bytes
        slots = min(_MAX_SLOTS, (budget - grad_bytes) // object_bytes)
        if slots < 1:
            raise OffloadError(
                f"host_budget_bytes={budget} is less than one subgroup's staging "
                f"({object_bytes + grad_bytes} bytes): raise it or lower subgroup_bytes"
            )
        runtime = runtime or default_runtime()
        self._tier = StateTier(
            tier,
            directory,
            create=create,
            runtime=runtime,
            state_bytes=sum(s.object_bytes(count) for s in self.subgroups),
            in_flight_bytes=slots * object_bytes,
        )
        try:
            pin = self.device.type == "cuda"
            self._staging = Staging(runtime, object_bytes, slots, grad_bytes, pin)
            self._open()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening
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
        }

    def _open(self) -> None:
        tier = self.tier
        found = tier.load_manifest()
        self._checkpoints = tier.checkpoints() if tier.persistent else {}
        versions = [v for k in tier.keys(OBJECT_PREFIX) if (v := parse_object_key(k))]
        self._next_version = 1 + max((v for _, v in versions), default=0)
        if found is None:
            self._manifest = Manifest(self.signature, 0, [0] * len(self.subgroups))
            self._initialise()
        else:
            found.check(self.signature, tier.where)
            self._manifest = found
            self.load_params()
        self._collect_garbage()

    def _initialise(self) -> None:
        """Version 0 of every subgroup: master weights from the parameters, zero states (and
        the eager states of optimizers that make them in __init__, like Adagrad)."""
        staging, count = self.staging, self.schema.sections
        scalars: dict[int, dict[str, Any]] = {}

        def fill(subgroup: Subgroup, slot: int) -> None:
            buffer = staging.slot_fp32(slot, count * subgroup.stride)
            buffer.zero_()
            gather_params(subgroup, self._params, sections(buffer, subgroup, 1)[0])
            hyper = self._hyper(subgroup)
            scalars.update(self._stepper.step(subgroup, buffer, None, [], hyper, {}))

        def write(subgroup: Subgroup, slot: int) -> Any:
            data = staging.slot_bytes(slot, subgroup.object_bytes(count))
            return self.tier.write(object_key(subgroup.index, 0), data)

        stream(self.subgroups, staging_slots(staging), _no_read, fill, write)
        self._manifest.scalars = scalars
        self.tier.save_manifest(self._manifest)

    def load_params(self) -> None:
        """Copy the committed master weights into the parameters (done on resume)."""
        staging, count = self.staging, self.schema.sections

        def read(subgroup: Subgroup, slot: int) -> Any:
            key = object_key(subgroup.index, self._manifest.versions[subgroup.index])
            return self.tier.read(key, staging.slot_bytes(slot, subgroup.object_bytes(count)))

        def copy(subgroup: Subgroup, slot: int) -> None:
            master = staging.slot_fp32(slot, subgroup.stride)[: subgroup.numel]
            scatter_params(subgroup, self._params, master, [True] * len(subgroup.segments))

        stream(self.subgroups, staging_slots(staging), read, copy, lambda s, i: None)

    def _collect_garbage(self) -> None:
        keep = referenced_keys([self._manifest, *self._checkpoints.values()])
        self.tier.delete(k for k in self.tier.keys(OBJECT_PREFIX) if k not in keep)

    # ------------------------------------------------------------------ stepping
    @property
    def tier(self) -> StateTier:
        if self._tier is None:
            raise OffloadError("this OffloadedOptimizer is closed")
        return self._tier

    @property
    def staging(self) -> Staging:
        if self._staging is None:
            raise OffloadError("this OffloadedOptimizer is closed")
        return self._staging

    @property
    def committed_step(self) -> int:
        """Steps (and loads) committed to the tier since the state was made."""
        return self._manifest.step

    def _hyper(self, subgroup: Subgroup) -> dict[str, Any]:
        group = self.param_groups[subgroup.group_index]
        return {key: value for key, value in group.items() if key != "params"}

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        self.tier  # noqa: B018  (raises when closed)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        has_grad = [p.grad is not None for p in self._params]
        todo = [s for s in self.subgroups if any(has_grad[g.param_index] for g in s.segments)]
        self._commit(todo, lambda s, slot: self._step_one(s, slot, has_grad))
        return loss

    def _step_one(self, subgroup: Subgroup, slot: int, has_grad: list[bool]) -> dict[int, Any]:
        staging, count = self.staging, self.schema.sections
        buffer = staging.slot_fp32(slot, count * subgroup.stride)
        grad = staging.grad_fp32(subgroup.stride)
        mask = [has_grad[s.param_index] for s in subgroup.segments]
        gather_grads(subgroup, self._params, grad, mask)
        committed = self._manifest.scalars
        out = self._stepper.step(subgroup, buffer, grad, mask, self._hyper(subgroup), committed)
        scatter_params(subgroup, self._params, sections(buffer, subgroup, 1)[0], mask)
        return out

    def _commit(
        self,
        todo: list[Subgroup],
        compute: Callable[[Subgroup, int], dict[int, Any]],
        read: bool = True,
        scalars: dict[int, Any] | None = None,
    ) -> None:
        """Read, ``compute`` (returns new scalars), write each subgroup of ``todo`` under a
        new version, then commit the manifest and drop what it no longer names."""
        tier, staging, count = self.tier, self.staging, self.schema.sections
        old = self._manifest
        version = self._next_version
        self._next_version += 1
        base = dict(old.scalars if scalars is None else scalars)
        new = Manifest(self.signature, old.step + 1, list(old.versions), base)
        keep = referenced_keys(self._checkpoints.values())

        def read_one(subgroup: Subgroup, slot: int) -> Any:
            key = object_key(subgroup.index, old.versions[subgroup.index])
            return tier.read(key, staging.slot_bytes(slot, subgroup.object_bytes(count)))

        def compute_one(subgroup: Subgroup, slot: int) -> None:
            new.scalars.update(compute(subgroup, slot))

        def write_one(subgroup: Subgroup, slot: int) -> Any:
            previous = object_key(subgroup.index, old.versions[subgroup.index])
            new.versions[subgroup.index] = version
            replaces = None if tier.persistent or previous in keep else previous
            data = staging.slot_bytes(slot, subgroup.object_bytes(count))
            return tier.write(object_key(subgroup.index, version), data, replaces)

        stream(todo, staging_slots(staging), read_one if read else _no_read, compute_one, write_one)
        tier.save_manifest(new)
        self._manifest = new
        if tier.persistent:
            stale = {object_key(s.index, old.versions[s.index]) for s in todo}
            tier.delete(stale - keep - referenced_keys([new]))

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, name: str, *, verify: bool = False) -> None:
        """Keep the committed step's objects under ``name`` (NVMe): a manifest, no copy. Later
        steps write new objects and never delete ones a checkpoint names. ``verify`` reads
        every object back through the tier's checksums first (CorruptionError if one fails)."""
        key = checkpoint_key(name)
        if not self.tier.persistent:
            raise OffloadError("checkpoint() needs a persistent (nvme) tier; use state_dict()")
        if verify:
            self._verify()
        self.tier.save_manifest(self._manifest, key)
        self._checkpoints[name] = self._manifest

    def _verify(self) -> None:
        staging, count = self.staging, self.schema.sections

        def read(subgroup: Subgroup, slot: int) -> Any:
            key = object_key(subgroup.index, self._manifest.versions[subgroup.index])
            return self.tier.read(key, staging.slot_bytes(slot, subgroup.object_bytes(count)))

        stream(self.subgroups, staging_slots(staging), read, lambda s, i: None, lambda s, i: None)

    def checkpoints(self) -> list[str]:
        return sorted(self._checkpoints)

    def restore(self, name: str) -> None:
        """Make checkpoint ``name`` the current state (committed) and copy its master weights
        into the parameters; the abandoned steps' objects are deleted."""
        found = self.tier.load_manifest(checkpoint_key(name))
        if found is None:
            raise OffloadError(f"no checkpoint {name!r} in {self.tier.where}")
        found.check(self.signature, f"{self.tier.where} checkpoint {name!r}")
        self.tier.save_manifest(found)
        self._manifest = found
        self.load_params()
        self._collect_garbage()

    def delete_checkpoint(self, name: str) -> None:
        self._checkpoints.pop(name, None)
        self.tier.delete([checkpoint_key(name)])
        self._collect_garbage()

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
        staging, self._staging = self._staging, None
        tier, self._tier = self._tier, None
        if staging is not None:
            staging.close()
        if tier is not None:
            tier.close()

    def __enter__(self) -> OffloadedOptimizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def staging_slots(staging: Staging) -> int:
    return len(staging.slots)


def _no_read(subgroup: Subgroup, slot: int) -> Any:
    import concurrent.futures

    done: concurrent.futures.Future[None] = concurrent.futures.Future()
    done.set_result(None)
    return done
