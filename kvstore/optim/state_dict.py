"""Torch-layout state dicts of an OffloadedOptimizer, streamed from and into its tier.

``export_state`` returns ``{"state": {index: {...}}, "param_groups": [...]}`` exactly as the
wrapped torch optimizer's ``state_dict()`` would (indices numbered across groups, per-element
states shaped like their parameter, scalars as torch keeps them: ``step`` a 0-d fp32 tensor),
made only of tensors, numbers, strings and lists, so ``torch.load(weights_only=True)`` reads
it. A parameter that is not fp32 also gets ``"master"``: its fp32 master weights. The subgroups
are read one at a time through the staging buffers. With ``master="params"`` the stored
objects hold only the states (the parameters are the masters and are neither exported nor
imported: they are the model's).

``import_state`` takes that layout, or one saved by the plain torch optimizer (migrating keeps
the moments; the master weights then come from the parameters): group hyperparameters are
set as torch's ``load_state_dict`` sets them, then each subgroup is filled from the dict in a
staging buffer and written to the tier, and the load is committed like a step. Only one
subgroup is staged at a time; the dict itself is the caller's.

Thread-safety: as the optimizer (one thread).
"""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, Any

import torch

from kvstore.optim.inner import sections
from kvstore.optim.layout import OffloadError, Subgroup
from kvstore.optim.schema import scalar_from_json, scalar_to_json
from kvstore.optim.transfer import gather_params

if TYPE_CHECKING:
    from kvstore.optim.offloaded import OffloadedOptimizer

__all__ = ["export_state", "import_state"]

MASTER_KEY = "master"


def _groups(opt: OffloadedOptimizer) -> list[dict[str, Any]]:
    groups, start = [], 0
    for group in opt.param_groups:
        saved = {key: value for key, value in group.items() if key != "params"}
        saved["params"] = list(range(start, start + len(group["params"])))
        start += len(group["params"])
        groups.append(saved)
    return groups


def export_state(opt: OffloadedOptimizer) -> dict[str, Any]:
    for pre_hook in opt._optimizer_state_dict_pre_hooks.values():
        pre_hook(opt)
    manifest = opt.versions.manifest
    keys = opt.schema.vector_keys
    state: dict[int, dict[str, Any]] = {}
    for index, scalars in sorted(manifest.scalars.items()):
        p = opt._params[index]
        entry = {key: scalar_from_json(value) for key, value in scalars.items()}
        for key in keys:
            entry[key] = torch.empty(p.shape, dtype=torch.float32)
        state[index] = entry
    masters = {
        i: torch.empty(p.shape) for i, p in enumerate(opt._params) if p.dtype != torch.float32
    }

    def copy(subgroup: Subgroup, slot: int) -> None:
        master, parts = _sections(opt, slot, subgroup)
        for segment in subgroup.segments:
            span = slice(segment.offset, segment.offset + segment.length)
            into = slice(segment.start, segment.start + segment.length)
            targets = [] if master is None else [(masters.get(segment.param_index), master)]
            entry = state.get(segment.param_index)
            if entry is not None:
                targets += [(entry[key], parts[k]) for k, key in enumerate(keys)]
            for target, part in targets:
                if target is not None:
                    target.view(-1)[into].copy_(part[span])

    opt.versions.scan(copy)
    for index, master in masters.items():
        state.setdefault(index, {})[MASTER_KEY] = master
    result: dict[str, Any] = {"state": state, "param_groups": _groups(opt)}
    for post_hook in opt._optimizer_state_dict_post_hooks.values():
        result = post_hook(opt, result) or result
    return result


def _sections(
    opt: OffloadedOptimizer, slot: int, subgroup: Subgroup
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """The master section (None with master="params") and the state sections in a slot."""
    count = opt._stored_sections
    parts = sections(opt.staging.slot_fp32(slot, count * subgroup.stride), subgroup, count)
    return (None, parts) if opt.master == "params" else (parts[0], parts[1:])


def _match(opt: OffloadedOptimizer, state_dict: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Check the layout and map the saved state onto our parameter indices (by position,
    as torch does)."""
    if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
        raise OffloadError("expected a torch optimizer state dict: {'state', 'param_groups'}")
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(opt.param_groups):
        raise OffloadError(
            f"the state dict has {len(saved_groups)} param groups, this optimizer "
            f"{len(opt.param_groups)}"
        )
    for number, (ours, saved) in enumerate(zip(opt.param_groups, saved_groups, strict=True)):
        if len(ours["params"]) != len(saved["params"]):
            raise OffloadError(
                f"param group {number} has {len(saved['params'])} parameters in the state "
                f"dict, {len(ours['params'])} here"
            )
    ids = {saved_id: i for i, saved_id in enumerate(chain(*(g["params"] for g in saved_groups)))}
    state = {}
    for saved_id, entry in state_dict["state"].items():
        if saved_id not in ids:
            raise OffloadError(f"state for parameter {saved_id!r}, which no group lists")
        index = ids[saved_id]
        param = opt._params[index]
        for key in opt.schema.vector_keys + ((MASTER_KEY,) if MASTER_KEY in entry else ()):
            value = entry.get(key)
            if not isinstance(value, torch.Tensor) or value.shape != param.shape:
                raise OffloadError(
                    f"state of parameter {index}: {key!r} must be a tensor of shape "
                    f"{tuple(param.shape)}, got {_describe(value)}"
                )
        missing = [key for key in opt.schema.scalar_keys if key not in entry]
        if missing and opt.schema.vector_keys:
            raise OffloadError(f"state of parameter {index} lacks {missing}")
        state[index] = entry
    return state


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"shape {tuple(value.shape)}"
    return type(value).__name__ if value is not None else "nothing"


def import_state(opt: OffloadedOptimizer, state_dict: dict[str, Any]) -> None:
    for pre_hook in opt._optimizer_load_state_dict_pre_hooks.values():
        state_dict = pre_hook(opt, state_dict) or state_dict
    opt.versions  # noqa: B018  (raises when closed, before anything changes
    state = _match(opt, state_dict)
    for group, saved in zip(opt.param_groups, state_dict["param_groups"], strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})
    staging, count, keys = opt.staging, opt._stored_sections, opt.schema.vector_keys
    dtypes = dict(zip(opt.schema.scalar_keys, opt.schema.scalar_dtypes, strict=True))

    def fill(subgroup: Subgroup, slot: int) -> dict[int, Any]:
        buffer = staging.slot_fp32(slot, count * subgroup.stride)
        # not the masters: resident parameters may view them
        buffer[0 if opt.master == "params" else subgroup.numel :].zero_()
        master, parts = _sections(opt, slot, subgroup)
        if master is not None:
            gather_params(subgroup, opt._params, master)
        scalars: dict[int, dict[str, Any]] = {}
        for segment in subgroup.segments:
            entry = state.get(segment.param_index)
            if entry is None:
                continue
            span = slice(segment.offset, segment.offset + segment.length)
            into = slice(segment.start, segment.start + segment.length)
            sources = [(parts[k], entry[key]) for k, key in enumerate(keys)]
            if MASTER_KEY in entry and master is not None:
                sources.append((master, entry[MASTER_KEY]))
            for part, source in sources:
                part[span].copy_(source.detach().reshape(-1)[into])
            scalars[segment.param_index] = {
                key: scalar_to_json(_as_stored(entry[key], dtypes[key]))
                for key in opt.schema.scalar_keys
            }
        hyper, views = opt._hyper(subgroup), opt._master_views(subgroup)
        return opt._stepper.step(subgroup, buffer, None, [], hyper, scalars, views)

    opt.versions.commit(opt.subgroups, fill, read=False, scalars={}, sums=opt._sums)
    opt._unpaired = None  # every state replaced, paired with the parameters as they are now
    opt._refresh_state()
    for post_hook in opt._optimizer_load_state_dict_post_hooks.values():
        post_hook(opt)


def _as_stored(value: Any, dtype: str | None) -> Any:
    """A saved scalar as the optimizer keeps it (an old checkpoint's int ``step`` becomes the
    0-d tensor torch now uses)."""
    if dtype is not None and not isinstance(value, torch.Tensor):
        return torch.tensor(value, dtype=getattr(torch, dtype))
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    return value
