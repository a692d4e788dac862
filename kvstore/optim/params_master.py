"""``master="params"``: fp32 CPU parameters are the master weights; the tier holds only states.

torch's own AdamW keeps no second fp32 copy of an fp32 parameter: the parameter is the master.
With ``master="params"`` an OffloadedOptimizer does the same: each subgroup's stored object is
only the per-element states (Adam: ``exp_avg``, ``exp_avg_sq``; 8 bytes per parameter, not 12),
the wrapped optimizer steps views of the parameters themselves (``master_views``) with the
parameters' own gradients, and nothing is copied back. The updates are the wrapped optimizer's
bit for bit (it steps the same tensors torch would). Every parameter must be an fp32 CPU tensor
(a bf16 or CUDA parameter needs an fp32 master on the host: use ``master="tier"``).

Crash story. The tier can no longer give the parameters back after a crash: they are the
user's, saved with the model. So that states and parameters are never silently paired from
different steps, every committed manifest (and named checkpoint) records, per subgroup, the
sum of its parameters' raw fp32 bits as int32 (``param_sums``: exact, any changed element
changes it; ~0.2 s of one core per GB with numpy, computed while the subgroup's I/O is in
flight). On reopen the current parameters' sums are compared (``match_params``):

* equal to the committed step's: resume it;
* else equal to a named checkpoint's: that checkpoint is restored (the parameters are the
  weights saved with it; the later steps' states are dropped) and ``resumed_from`` names it;
* else OffloadError naming the committed step: load the weights saved with it (or with a
  checkpoint), or use a fresh directory.

The recipe that always resumes after ``kill -9``: save the model's weights, then call
``opt.checkpoint(name)`` (a manifest, no copy). ``restore(name)`` likewise requires the
parameters to already hold that checkpoint's weights.

``master="auto"`` (the default) is "params" for fp32 CPU parameters on a persistent tier with no
state yet, the stored state's own mode when there is one (a directory written with "tier"
reopens as "tier"), and "tier" otherwise. With "auto" a reopen whose parameters match nothing
does not refuse at once: the weights are usually loaded after the optimizer is made (Hugging
Face's Trainer loads the model's and then the optimizer's checkpoint), so the pairing runs again
at the first ``step()`` (the same OffloadError if still unmatched) unless ``load_state_dict``
(which replaces every state) or ``restore`` (which checks) comes first.

Thread-safety: pure functions over the caller's tensors (one thread, as the optimizer).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvstore.optim.layout import OffloadError, Subgroup
from kvstore.optim.manifest import Manifest
from kvstore.optim.state_tier import StateTier

__all__ = [
    "MASTERS",
    "check_params_master",
    "fp32_cpu",
    "master_views",
    "match_params",
    "param_sums",
    "stored_master",
]

MASTERS = ("auto", "tier", "params")


def fp32_cpu(params: Sequence[torch.Tensor]) -> bool:
    """Every parameter is an fp32 CPU tensor (``master="params"`` can hold them)."""
    return all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params)


def stored_master(tier: StateTier | None) -> str:
    """``master="auto"``: the mode of the state ``tier`` holds ("tier" for a state written
    before "params" existed), "params" for an empty tier, "tier" for no tier (DRAM, or
    parameters that are not all fp32 CPU: those need an fp32 master kept apart)."""
    if tier is None:
        return "tier"
    found = tier.load_manifest()
    if found is None:
        return "params"
    return "params" if found.signature.get("master") == "params" else "tier"


def check_params_master(params: Sequence[torch.Tensor]) -> None:
    for index, p in enumerate(params):
        if p.dtype != torch.float32 or p.device.type != "cpu":
            raise OffloadError(
                f'master="params" needs fp32 CPU parameters; parameter {index} is {p.dtype} '
                f'on {p.device} (use master="tier": an fp32 master kept in the tier)'
            )


def master_views(subgroup: Subgroup, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each segment's piece of its parameter, flat: what the wrapped optimizer steps."""
    return [
        params[s.param_index].detach().view(-1)[s.start : s.start + s.length]
        for s in subgroup.segments
    ]


@torch.no_grad()
def param_sums(subgroup: Subgroup, params: Sequence[torch.Tensor]) -> int:
    """Sum of the raw int32 bits of the subgroup's parameter pieces (an exact fingerprint)."""
    views = master_views(subgroup, params)
    # numpy's integer sum, not torch's: the same exact int64, 5-15x faster on this CPU
    # (torch's int32 -> int64 reduction cost 0.15-0.57 s per 200 MB, a second per step at 500M)
    return sum(int(view.view(torch.int32).numpy().sum(dtype=np.int64)) for view in views)


def match_params(
    current: list[int],
    committed: Manifest,
    checkpoints: dict[str, Manifest],
    where: str,
) -> str | None:
    """None when ``current`` sums are the committed step's, else the name of the checkpoint
    they are (the caller restores it); raises OffloadError when they are neither."""
    if committed.param_sums == current:
        return None
    for name in sorted(checkpoints):
        if checkpoints[name].param_sums == current:
            return name
    differ = sum(1 for a, b in zip(committed.param_sums or [], current, strict=False) if a != b)
    names = ", ".join(sorted(checkpoints)) or "none"
    raise OffloadError(
        f'{where} holds optimizer states (master="params") of step {committed.step}, but the '
        f"parameters are not that step's weights ({differ} of {len(current)} subgroups "
        f"differ) nor any checkpoint's ({names}): load the model weights saved with that step "
        "or with a checkpoint, or use a fresh directory"
    )
