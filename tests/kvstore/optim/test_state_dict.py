"""state_dict() is torch's own layout (weights_only loadable) and load_state_dict() resumes
exactly: ours -> ours, torch -> ours (migration) and ours -> torch."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.optim import OffloadedOptimizer, OffloadError
from tests.kvstore.optim.train_loop import groups, make_model, same_params, scheduler, train

KWARGS: dict[str, Any] = {"lr": 0.01, "weight_decay": 0.01}


def _saved(obj: Any) -> Any:
    """Through torch.save and torch.load(weights_only=True), as HF's Trainer reloads it."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _resume(
    model: torch.nn.Module, opt: torch.optim.Optimizer, saved: dict[str, Any], sched: Any
) -> torch.optim.lr_scheduler.LRScheduler:
    """Trainer's order: make the scheduler, then load the optimizer and the scheduler."""
    new_sched = scheduler(opt, "lambda")
    opt.load_state_dict(saved)
    new_sched.load_state_dict(sched)
    return new_sched


def _reference(steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = make_model()
    opt = torch.optim.AdamW(groups(model), **KWARGS)
    train(model, opt, steps)
    return model, opt


@pytest.mark.parametrize("tier", ["dram", "nvme"])
def test_save_load_continue_equals_an_uninterrupted_run(tier: str, tmp_path: Path) -> None:
    model = make_model()
    offload: dict[str, Any] = {"tier": tier, "subgroup_bytes": 4 * 97}
    with OffloadedOptimizer(groups(model), directory=tmp_path / "a", **offload, **KWARGS) as opt:
        sched = train(model, opt, 12)
        saved = _saved(opt.state_dict())
        sched_saved = sched.state_dict()
    restarted = make_model()
    restarted.load_state_dict(model.state_dict())
    with OffloadedOptimizer(
        groups(restarted), directory=tmp_path / "b", **offload, **KWARGS
    ) as opt:
        train(restarted, opt, 8, first_step=12, sched=_resume(restarted, opt, saved, sched_saved))
        reference, ref_opt = _reference(20)
        assert same_params(restarted, reference)
        _assert_same_state(opt.state_dict(), ref_opt.state_dict())


def _assert_same_state(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for index, entry in theirs["state"].items():
        assert ours["state"][index].keys() == entry.keys()
        for key, value in entry.items():
            assert torch.equal(ours["state"][index][key], value), (index, key)
            assert ours["state"][index][key].dtype == value.dtype


def test_state_dict_is_the_torch_optimizers_own() -> None:
    model = make_model()
    with OffloadedOptimizer(groups(model), subgroup_bytes=4 * 97, **KWARGS) as opt:
        train(model, opt, 7)  # the rare parameter has state, stepped on steps 0, 3, 6
        _, ref_opt = _reference(7)
        _assert_same_state(_saved(opt.state_dict()), ref_opt.state_dict())
        # .state holds the scalars, for the parameters torch's optimizer has state for
        ours = [opt.state[p]["step"] for g in opt.param_groups for p in g["params"]]
        theirs = [ref_opt.state[p]["step"] for g in ref_opt.param_groups for p in g["params"]]
        assert ours == theirs and len(opt.state) == len(ref_opt.state)


def test_a_torch_optimizers_state_migrates_in_and_out() -> None:
    model, ref_opt = _reference(10)
    sched_saved = {"last_epoch": 10, "_step_count": 11, "base_lrs": [0.01, 0.02]}
    with OffloadedOptimizer(groups(model), subgroup_bytes=4 * 50, **KWARGS) as opt:
        sched = scheduler(opt, "lambda")
        opt.load_state_dict(_saved(ref_opt.state_dict()))
        sched.load_state_dict({**sched.state_dict(), **sched_saved})
        train(model, opt, 5, first_step=10, sched=sched)
        back = torch.optim.AdamW(groups(model), **KWARGS)
        back_sched = scheduler(back, "lambda")
        back.load_state_dict(_saved(opt.state_dict()))
        back_sched.load_state_dict(sched.state_dict())
    train(model, back, 5, first_step=15, sched=back_sched)
    reference, _ = _reference(20)
    assert same_params(model, reference)


def test_bf16_state_dict_carries_fp32_masters_across_a_restart() -> None:
    """The bf16 parameters are only casts: the run continues from the saved fp32 masters
    (loading the parameters as masters instead would change the next updates)."""
    model = make_model(dtype=torch.bfloat16)
    with OffloadedOptimizer(groups(model), subgroup_bytes=4 * 97, **KWARGS) as opt:
        sched = train(model, opt, 6)
        saved, sched_saved = _saved(opt.state_dict()), sched.state_dict()
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        train(model, opt, 4, first_step=6, sched=sched)
    restarted = make_model(dtype=torch.bfloat16)
    restarted.load_state_dict(weights)
    with OffloadedOptimizer(groups(restarted), subgroup_bytes=4 * 300, **KWARGS) as opt:
        sched = _resume(restarted, opt, saved, sched_saved)
        train(restarted, opt, 4, first_step=6, sched=sched)
    assert same_params(restarted, model)


def test_a_state_dict_for_other_parameters_is_refused() -> None:
    model, ref_opt = _reference(2)
    saved = ref_opt.state_dict()
    with (
        OffloadedOptimizer(model.parameters(), **KWARGS) as opt,
        pytest.raises(OffloadError, match="param groups"),
    ):
        opt.load_state_dict(saved)
    with OffloadedOptimizer(groups(make_model()), **KWARGS) as opt:
        first = next(iter(saved["state"]))
        broken = {**saved, "state": {**saved["state"]}}
        broken["state"][first] = {**saved["state"][first], "exp_avg": torch.zeros(3)}
        with pytest.raises(OffloadError, match="exp_avg"):
            opt.load_state_dict(broken)
