"""Named checkpoints of an OffloadedOptimizer's NVMe state, and pairing a reopened state with
the parameters (``master="params"``).

A checkpoint is a copy of the committed manifest under a name (versioned.py): later steps write
new objects and never delete the ones it names, so it costs a manifest, not a copy of the
state. ``restore`` makes it the committed state again. With ``master="params"`` the tier holds
no master weights, so the parameters must already be the weights saved with the step being
adopted: ``restore`` checks their fingerprint first, and reopening a directory adopts the
committed step or the checkpoint whose fingerprint the parameters have (params_master.py).

Thread-safety: as the optimizer (one thread at a time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvstore.optim.layout import OffloadError, Subgroup
from kvstore.optim.manifest import Manifest
from kvstore.optim.params_master import match_params, param_sums
from kvstore.optim.resident import ResidentState
from kvstore.optim.versioned import VersionedState

__all__ = ["CheckpointsMixin"]


class CheckpointsMixin:
    """The checkpoint methods of OffloadedOptimizer (mixed into it, which provides these)."""

    master: str
    resumed_from: str | None
    _deferred: bool  # master="auto"
    _unpaired: str | None  # why the next step must pair the parameters first
    subgroups: list[Subgroup]
    _params: list[torch.Tensor]

    if TYPE_CHECKING:  # OffloadedOptimizer's (declared here for the type checker, defined there)

        @property
        def versions(self) -> VersionedState | ResidentState: ...

        def load_params(self) -> None: ...

        def _refresh_state(self) -> None: ...

    def _param_sums(self, subgroup: Subgroup) -> int:
        return param_sums(subgroup, self._params)

    def _current_sums(self) -> list[int]:
        return [self._param_sums(s) for s in self.subgroups]

    def _pair_params(self, *, at_open: bool) -> None:
        """master="params": pair the stored states with the parameters' step, restoring the
        checkpoint they are the weights of if need be, else OffloadError; with
        master="auto" a reopen (``at_open``) that matches nothing is left for the first
        step to pair again (params_master.py)."""
        versions = self.versions
        if not isinstance(versions, VersionedState):
            raise OffloadError('master="params" state is never resident')
        where = versions.tier.where
        try:
            current = self._current_sums()
            name = match_params(current, versions.manifest, versions.checkpoints, where)
        except OffloadError as exc:
            if not (at_open and self._deferred):
                raise
            self._unpaired = str(exc)
            return
        self._unpaired = None
        if name is not None:
            versions.restore(name)
            self.resumed_from = name
            self._refresh_state()

    def checkpoint(self, name: str, *, verify: bool = False) -> None:
        """Keep the committed step's objects under ``name`` (NVMe only): a manifest, no copy.
        Later steps write new objects and never delete ones a checkpoint names. ``verify``
        first reads every object back through the tier's checksums (CorruptionError).
        With master="params", save the model's weights first: a checkpoint is adopted on
        reopen only with the weights it was taken with."""
        self.versions.checkpoint(name, verify)

    def checkpoints(self) -> list[str]:
        return sorted(self.versions.checkpoints)

    def restore(self, name: str) -> None:
        """Make checkpoint ``name`` the committed state and copy its master weights into the
        parameters; the objects of the abandoned steps are deleted. With master="params" the
        parameters must already hold the weights saved with it (else OffloadError, and
        nothing changes)."""

        def same_params(found: Manifest) -> None:
            match_params(self._current_sums(), found, {}, f"checkpoint {name!r}")

        self.versions.restore(name, same_params if self.master == "params" else None)
        self._unpaired = None
        self.load_params()
        self._refresh_state()

    def delete_checkpoint(self, name: str) -> None:
        self.versions.delete_checkpoint(name)
