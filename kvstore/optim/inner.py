"""The wrapped torch optimizer stepping one subgroup in its staging slot.

A slot holds a subgroup's object: sections of ``stride`` fp32 elements, the master weights
first, then one per per-element state (schema.vector_keys); with ``masters`` given
(``master="params"``, params_master.py) the slot holds only the states and the masters are
views of the parameters themselves. For each segment (a piece of one parameter) the stepper
makes a view of the master section (or takes the given one) as an inner parameter, gives it the
segment's gradient (a view of the gradient buffer, or of the parameter's own gradient) and,
when the parameter already has state, inner state entries that are views of the state
sections plus its scalars from the manifest.
A fresh inner optimizer (the user's class and flags, the group's current hyperparameters, so
an LR scheduler's change is seen) then steps them all at once: torch skips segments without a
gradient exactly as it skips parameters. States torch made anew (the first step) or replaced
rather than updated in place are copied into their sections afterwards.

Thread-safety: stateless between calls; the caller owns the slot and gradient buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstore.optim.layout import Subgroup
from kvstore.optim.schema import StateSchema, scalar_from_json, scalar_to_json

__all__ = ["SubgroupStepper", "sections"]

Grads = torch.Tensor | Sequence[torch.Tensor | None] | None
# (subgroup, its slot, its gradients, which segments have one, masters or None): see step
StepItem = tuple[Subgroup, torch.Tensor, Grads, list[bool], Sequence[torch.Tensor] | None]


def sections(slot: torch.Tensor, subgroup: Subgroup, count: int) -> list[torch.Tensor]:
    """The ``count`` sections of a subgroup's object in a slot (fp32 flat), each ``numel``
    long."""
    stride, numel = subgroup.stride, subgroup.numel
    return [slot[k * stride : k * stride + numel] for k in range(count)]


class SubgroupStepper:
    def __init__(
        self, cls: type[torch.optim.Optimizer], kwargs: dict[str, Any], schema: StateSchema
    ) -> None:
        self.cls = cls
        self.kwargs = kwargs
        self.schema = schema

    def _views(
        self,
        subgroup: Subgroup,
        masters: Sequence[torch.Tensor],
        parts: list[torch.Tensor],
        grad: Grads,
        has_grad: list[bool],
        scalars: dict[int, dict[str, Any]],
    ) -> tuple[list[torch.Tensor], dict[int, dict[str, Any]]]:
        """The inner parameters of one subgroup (with their gradients) and the inner state of
        those that already have state (keyed by position in the returned list)."""
        views = []
        states: dict[int, dict[str, Any]] = {}
        for i, (segment, with_grad) in enumerate(zip(subgroup.segments, has_grad, strict=True)):
            span = slice(segment.offset, segment.offset + segment.length)
            view = masters[i].detach()  # a tensor of its own: the .grad set here is ours
            if with_grad and grad is not None:
                view.grad = grad[span] if isinstance(grad, torch.Tensor) else grad[i]
            views.append(view)
            stored = scalars.get(segment.param_index)
            if stored is None:
                continue
            state: dict[str, Any] = {
                key: parts[k][span] for k, key in enumerate(self.schema.vector_keys)
            }
            for key in self.schema.scalar_keys:
                state[key] = scalar_from_json(stored[key])
            states[i] = state
        return views, states

    def _split(
        self, subgroup: Subgroup, slot: torch.Tensor, masters: Sequence[torch.Tensor] | None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(one master per segment, the state sections) of a subgroup's slot."""
        if masters is None:
            parts = sections(slot, subgroup, self.schema.sections)
            return [parts[0][s.offset : s.offset + s.length] for s in subgroup.segments], parts[1:]
        return list(masters), sections(slot, subgroup, self.schema.sections - 1)

    def step(
        self,
        subgroup: Subgroup,
        slot: torch.Tensor,
        grad: Grads,
        has_grad: list[bool],
        hyper: dict[str, Any],
        scalars: dict[int, dict[str, Any]],
        masters: Sequence[torch.Tensor] | None = None,
    ) -> dict[int, dict[str, Any]]:
        """Step the subgroup in ``slot`` (None grad: no step, only eager state is made;
        ``grad`` is the flat gradient buffer or one gradient per segment; ``masters``: one
        master per segment, the slot then holding only the states); returns the new scalars
        of each parameter that has state after it."""
        return self.step_many([(subgroup, slot, grad, has_grad, masters)], [hyper], scalars)

    def step_many(
        self,
        items: Sequence[StepItem],
        hypers: Sequence[dict[str, Any]],
        scalars: dict[int, dict[str, Any]],
    ) -> dict[int, dict[str, Any]]:
        """``step`` of several subgroups with one inner optimizer and one ``step()`` call (one
        fused kernel call per param group, as torch makes over its parameters): ``hypers[i]``
        is item i's group's hyperparameters; items of one group share an inner param group."""
        groups: dict[int, dict[str, Any]] = {}
        made: list[tuple[Subgroup, list[torch.Tensor], list[torch.Tensor]]] = []
        preset: list[tuple[torch.Tensor, dict[str, Any] | None]] = []
        stepping = False
        for (subgroup, slot, grad, has_grad, masters), hyper in zip(items, hypers, strict=True):
            master_list, parts = self._split(subgroup, slot, masters)
            if grad is None:
                has_grad = [False] * len(subgroup.segments)
            stepping = stepping or (grad is not None and any(has_grad))
            views, states = self._views(subgroup, master_list, parts, grad, has_grad, scalars)
            group = groups.setdefault(subgroup.group_index, {**hyper, "params": []})
            group["params"].extend(views)
            made.append((subgroup, parts, views))
            preset.extend((view, states.get(i)) for i, view in enumerate(views))
        # the user's arguments too: some classes read them, not the group, in __init__
        # (Adagrad's initial_accumulator_value), as torch itself does
        inner = self.cls(list(groups.values()), **self.kwargs)
        for view, state in preset:
            if state is not None:
                inner.state[view] = state
            elif not self.schema.eager:
                inner.state.pop(view, None)
        if stepping:
            inner.step()
        out: dict[int, dict[str, Any]] = {}
        for subgroup, parts, views in made:
            out.update(self._collect(subgroup, parts, inner, views))
        return out

    def _collect(
        self,
        subgroup: Subgroup,
        parts: list[torch.Tensor],
        inner: torch.optim.Optimizer,
        views: list[torch.Tensor],
    ) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for segment, view in zip(subgroup.segments, views, strict=True):
            state = inner.state.get(view)
            if not state:
                continue
            span = slice(segment.offset, segment.offset + segment.length)
            for k, key in enumerate(self.schema.vector_keys):
                target, value = parts[k][span], state[key]
                if value.data_ptr() != target.data_ptr():  # made or replaced, not updated
                    target.copy_(value.reshape(-1))
            out[segment.param_index] = {
                key: scalar_to_json(state[key]) for key in self.schema.scalar_keys
            }
        return out
