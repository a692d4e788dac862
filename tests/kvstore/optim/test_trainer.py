"""Hugging Face's Trainer with the offloaded optimizer: a tiny Llama trained by ours (DRAM and
NVMe) for MAX_STEPS steps, killed (-9) after its checkpoint at SAVE_STEP and resumed from it
(``optimizer.pt`` reloaded with ``weights_only=True``), logs a loss curve bit-identical to
torch's AdamW's over every step (the steps before the kill come back with the checkpoint's
``trainer_state.json``), ends with identical weights and saved torch's optimizer state. One run
per kind does both jobs (the loss curve and the resume), as the Trainer's own history makes the
first part of the curve the killed run's; ``optimizer_cls_and_kwargs`` is checked apart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the Trainer tests need transformers")
pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")

from tests.kvstore.optim import helpers_integration as harness
from tests.kvstore.optim import trainer_resume_writer as writer

MAX_STEPS = 30  # warm-up (10 steps), then the linear decay on both sides of the kill
SAVE_STEP = 20
OFFLOADED_KINDS = ["dram", "nvme"]


def _train(
    output_dir: Path, kind: str, state_dir: Path | None = None, **make: Any
) -> tuple[dict[int, float], dict[str, torch.Tensor]]:
    """Train MAX_STEPS steps, saving at SAVE_STEP; the per-step losses and final weights."""
    directory = str(state_dir) if state_dir is not None else None
    with harness.one_thread():
        trainer = harness.make_trainer(
            str(output_dir),
            MAX_STEPS,
            optimizer=harness.optimizer_factory(kind, directory),
            save_steps=SAVE_STEP,
            **make,
        )
        trainer.train()
        _close(trainer.optimizer)
    return harness.step_losses(trainer), harness.parameters(trainer.model)


def _close(optimizer: Any) -> None:
    """Release an offloaded optimizer's tier (the Trainer wraps it in accelerate's)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    close = getattr(inner, "close", None)
    if close is not None:
        close()


def _saved_optimizer(output_dir: Path, step: int) -> dict[str, Any]:
    """``optimizer.pt`` of a checkpoint, loaded as the Trainer loads it: weights only."""
    path = os.path.join(harness.checkpoint_dir(str(output_dir), step), "optimizer.pt")
    loaded: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return loaded


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[int, float], dict[str, torch.Tensor], dict[str, Any]]:
    """torch's AdamW: the losses, final weights and checkpointed optimizer state to match."""
    output_dir = tmp_path_factory.mktemp("reference")
    losses, weights = _train(output_dir, "torch")
    assert len(losses) == MAX_STEPS
    assert losses[MAX_STEPS] < losses[1] - 1.0  # it learns: 4.9 nats down to about 3.5
    return losses, weights, _saved_optimizer(output_dir, SAVE_STEP)


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def _assert_same_optimizer_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    """torch's layout: the same state per parameter index, bit for bit, and the same
    hyperparameters in every group (ours may add keys of its own)."""
    assert got["state"].keys() == want["state"].keys()
    for index, state in want["state"].items():
        assert got["state"][index].keys() == state.keys(), index
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(got["state"][index][key]), value), (index, key)
    assert len(got["param_groups"]) == len(want["param_groups"])
    for got_group, want_group in zip(got["param_groups"], want["param_groups"], strict=True):
        assert {k: got_group[k] for k in want_group} == want_group


@pytest.fixture
def deterministic_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo, after the test, what the Trainer's ``full_determinism`` sets process-wide."""
    for name in _DETERMINISM_ENV:
        monkeypatch.setenv(name, os.environ.get(name, ""))
    was = torch.are_deterministic_algorithms_enabled()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    yield
    torch.use_deterministic_algorithms(was)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


_DETERMINISM_ENV = [
    "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "ASCEND_LAUNCH_BLOCKING",
    "HCCL_DETERMINISTIC",
    "FLASH_ATTENTION_DETERMINISTIC",
]


@pytest.mark.gpu
def test_loss_curve_on_cuda_equals_torch_adamw(tmp_path: Path, deterministic_cuda: None) -> None:
    """CUDA parameters and gradients, states in DRAM: the updates come back to the GPU
    (pinned copies). The reference runs torch's single-tensor AdamW on the GPU. Untested: no
    GPU was available where this was written."""
    from kvstore.optim import OffloadedOptimizer

    flags: dict[str, Any] = {"lr": harness.LR, "weight_decay": harness.WEIGHT_DECAY}
    flags["foreach"] = False  # the CPU inner optimizer's loop; CUDA defaults to foreach

    def ours(model: torch.nn.Module) -> torch.optim.Optimizer:
        subgroup_bytes = harness.SUBGROUP_BYTES["dram"]
        return OffloadedOptimizer(
            model.parameters(), torch.optim.AdamW, subgroup_bytes=subgroup_bytes, **flags
        )

    runs = {}
    for name, factory in {
        "torch": lambda model: torch.optim.AdamW(model.parameters(), **flags),
        "ours": ours,
    }.items():
        trainer = harness.make_trainer(str(tmp_path / name), 100, factory, device="cuda")
        trainer.train()
        _close(trainer.optimizer)
        runs[name] = harness.step_losses(trainer), harness.parameters(trainer.model)
    assert runs["ours"][0] == runs["torch"][0]
    _assert_same_weights(runs["ours"][1], runs["torch"][1])


def test_optimizer_cls_and_kwargs(tmp_path: Path) -> None:
    """The Trainer builds the optimizer itself, ``cls(param_groups, **kwargs)``, with its two
    groups (no weight decay on norms): the inner optimizer is then a keyword."""
    from kvstore.optim import OffloadedOptimizer

    flags: dict[str, Any] = {"lr": harness.LR, "weight_decay": harness.WEIGHT_DECAY}
    ours: dict[str, Any] = {
        "optimizer": torch.optim.AdamW,
        "tier": "dram",
        "subgroup_bytes": harness.SUBGROUP_BYTES["dram"],
        **flags,
    }
    runs = {}
    setups: dict[str, tuple[type, dict[str, Any]]] = {
        "torch": (torch.optim.AdamW, flags),
        "ours": (OffloadedOptimizer, ours),
    }
    for name, cls_and_kwargs in setups.items():
        with harness.one_thread():
            trainer = harness.make_trainer(
                str(tmp_path / name), 12, optimizer_cls_and_kwargs=cls_and_kwargs
            )
            trainer.train()
            _close(trainer.optimizer)
        assert len(trainer.optimizer.param_groups) == 2
        runs[name] = harness.step_losses(trainer), harness.parameters(trainer.model)
    assert runs["ours"][0] == runs["torch"][0]
    _assert_same_weights(runs["ours"][1], runs["torch"][1])


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One writer process trains each offloaded kind to checkpoint-SAVE_STEP; the last run
    is killed (-9) in the steps after its checkpoint."""
    root = tmp_path_factory.mktemp("killed")
    command = [sys.executable, writer.__file__, str(root), str(MAX_STEPS), str(SAVE_STEP)]
    with open(root / "writer.stderr", "w") as stderr:
        process = subprocess.Popen(
            [*command, *OFFLOADED_KINDS], stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        assert process.stdout is not None
        lines = []
        try:
            for _ in OFFLOADED_KINDS:
                lines.append(process.stdout.readline())
        finally:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            process.stdout.close()
    log = (root / "writer.stderr").read_text()
    assert lines == [f"saved {kind} {SAVE_STEP}\n" for kind in OFFLOADED_KINDS], log
    assert process.returncode == -signal.SIGKILL  # killed mid-run, not finished
    return root


@pytest.mark.parametrize("kind", OFFLOADED_KINDS)
def test_killed_run_resumes_identically(
    killed_runs: Path,
    kind: str,
    reference: tuple[dict[int, float], dict[str, torch.Tensor], dict[str, Any]],
) -> None:
    """The new process's optimizer uses the killed run's state directory (for NVMe: reopened,
    then loaded from the checkpoint's ``optimizer.pt``)."""
    want_losses, want_weights, want_state = reference
    output_dir, state_dir = writer.paths(str(killed_runs), kind)
    # the killed run's optimizer.pt: ours saved torch's state (the killed run's own)
    _assert_same_optimizer_state(_saved_optimizer(Path(output_dir), SAVE_STEP), want_state)

    with harness.one_thread():
        trainer = harness.make_trainer(
            output_dir, MAX_STEPS, optimizer=harness.optimizer_factory(kind, state_dir)
        )
        trainer.train(resume_from_checkpoint=harness.checkpoint_dir(output_dir, SAVE_STEP))
        _close(trainer.optimizer)
    losses = harness.step_losses(trainer)
    assert sorted(losses) == list(range(1, MAX_STEPS + 1))  # the killed run's and the resumed
    assert losses == want_losses
    _assert_same_weights(harness.parameters(trainer.model), want_weights)
