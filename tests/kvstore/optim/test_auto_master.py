"""master="auto" (the default): "params" for fp32 CPU parameters on a fresh persistent tier, the
stored mode of an existing directory (one written with "tier" reopens as "tier", parameters
given back), "tier" where the parameters cannot be masters or the state is DRAM; a reopen whose
parameters match no stored step opens, and the first step pairs again (refusing if still
unmatched) unless ``load_state_dict`` or ``restore`` came first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.optim import OffloadedOptimizer, OffloadError
from tests.kvstore.optim.train_loop import groups, make_model, same_params, train

KWARGS: dict[str, Any] = {"lr": 0.01, "weight_decay": 0.01}


def _open(model: torch.nn.Module, directory: Path | None, **kwargs: Any) -> OffloadedOptimizer:
    return OffloadedOptimizer(
        groups(model),  # type: ignore[arg-type]
        torch.optim.AdamW,
        tier="dram" if directory is None else "nvme",
        directory=directory,
        subgroup_bytes=4 * 97,
        **(KWARGS | kwargs),
    )


def _reference(steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = make_model()
    ref = torch.optim.AdamW(groups(model), **KWARGS)
    train(model, ref, steps, schedule="constant")
    return model, ref


def test_the_mode_follows_the_parameters_and_the_stored_state(tmp_path: Path) -> None:
    with _open(make_model(), tmp_path / "fresh") as opt:
        assert opt.master == "params"
    with _open(make_model(), None) as opt:
        assert (opt.master, opt.resident) == ("tier", True)
    with _open(make_model(dtype=torch.bfloat16), tmp_path / "bf16") as opt:
        assert opt.master == "tier"
    model = make_model()
    with _open(model, tmp_path / "old", master="tier") as opt:  # as the old default wrote it
        train(model, opt, 3, schedule="constant")
    model = make_model()  # step 0's weights: "tier" gives the stored step's back
    with _open(model, tmp_path / "old") as opt:
        assert (opt.master, opt.resumed, opt.committed_step) == ("tier", True, 3)
        assert same_params(model, _reference(3)[0])


def test_a_reopen_with_other_weights_pairs_at_the_first_step(tmp_path: Path) -> None:
    model = make_model()
    with _open(model, tmp_path) as opt:
        train(model, opt, 3, schedule="constant")
        at_three = {k: v.clone() for k, v in model.state_dict().items()}
    reference, ref = _reference(3)

    stranger = make_model()  # step 0's weights: neither step 3 nor a checkpoint
    with _open(stranger, tmp_path) as opt:
        assert (opt.master, opt.resumed, opt.committed_step) == ("params", True, 3)
        with pytest.raises(OffloadError, match="not that step's weights"):
            train(stranger, opt, 1, first_step=3, schedule="constant")
        assert opt.committed_step == 3  # refusing changed nothing
        stranger.load_state_dict(at_three)  # the weights saved with step 3: paired now
        train(stranger, opt, 2, first_step=3, schedule="constant")
        train(reference, ref, 2, first_step=3, schedule="constant")
        assert same_params(stranger, reference)


def test_trainers_order_weights_then_state_dict_resumes_exactly(tmp_path: Path) -> None:
    """Hugging Face's resume: the optimizer is made over fresh weights, then the checkpoint's
    model weights and ``optimizer.pt`` are loaded; the stored later steps are replaced."""
    model = make_model()
    with _open(model, tmp_path) as opt:
        train(model, opt, 2, schedule="constant")
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        saved = opt.state_dict()
        train(model, opt, 2, first_step=2, schedule="constant")  # past the checkpoint
    reference, ref = _reference(2)

    model = make_model()
    with _open(model, tmp_path) as opt:
        model.load_state_dict(weights)
        opt.load_state_dict(saved)
        assert opt.committed_step == 5  # four steps and the load
        train(model, opt, 3, first_step=2, schedule="constant")
        train(reference, ref, 3, first_step=2, schedule="constant")
        assert same_params(model, reference)


def test_an_explicit_params_master_still_refuses_at_open(tmp_path: Path) -> None:
    model = make_model()
    with _open(model, tmp_path) as opt:
        train(model, opt, 1, schedule="constant")
    with pytest.raises(OffloadError, match="not that step's weights"):
        _open(make_model(), tmp_path, master="params")
