"""NVMe crash consistency: a writer killed (SIGKILL) in the middle of a step leaves the last
committed step, whole (with master="params": the states of the step whose weights the writer
saved last); named checkpoints survive later steps and restore exactly; a directory holding the
state of other parameters or another optimizer is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kvstore.optim import OffloadedOptimizer, OffloadError
from kvstore.optim.manifest import MANIFEST_KEY, Manifest, referenced_keys
from tests.kvstore.optim import crash_writer
from tests.kvstore.optim.train_loop import Model, groups, make_model, same_params, train
from tiers import default_runtime, open_store

ROOT = Path(__file__).resolve().parents[3]


def _reference(steps: int) -> tuple[Model, torch.optim.Optimizer]:
    model = make_model()
    opt = torch.optim.AdamW(groups(model), **crash_writer.KWARGS)
    train(model, opt, steps, schedule="constant")
    return model, opt


def _run_and_kill(
    directory: Path, acks_before_kill: int, fraction: float, master: str = "tier"
) -> int:
    """Start the writer; after its ``acks_before_kill``-th committed step wait ``fraction`` of
    a step's time (measured between acknowledgements) and SIGKILL it. Returns the last step
    it acknowledged."""
    writer = [sys.executable, "-m", "tests.kvstore.optim.crash_writer", str(directory), "0"]
    process = subprocess.Popen(
        [*writer, master],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    last, times = -1, []
    try:
        assert process.stdout.readline() == "ready\n", process.stderr.read()
        for _ in range(acks_before_kill):
            line = process.stdout.readline()
            assert line, f"writer died: {process.stderr.read()}"
            last = int(line)
            times.append(time.perf_counter())
        time.sleep(fraction * (times[-1] - times[0]) / (len(times) - 1))
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    for line in process.stdout.readlines():  # printed before the kill: committed too
        last = int(line)
    process.stdout.close()
    process.stderr.close()
    return last


def _uncommitted_objects(directory: Path) -> list[str]:
    """Subgroup objects in the tier that its committed manifest does not name."""

    async def look() -> list[str]:
        config = {"tiers": [{"kind": "nvme", "capacity": 1 << 30, "path": str(directory)}]}
        store = await open_store(config)
        try:
            data = await store.get(MANIFEST_KEY)
            named = referenced_keys([Manifest.from_bytes(data, "test")])
            return [key for key in store.keys("optim/sg") if key not in named]
        finally:
            await store.aclose()

    return default_runtime().submit(look()).result()


def _assert_state_of_step(opt: OffloadedOptimizer, step: int) -> None:
    """The optimizer's states are exactly torch's after ``step`` steps."""
    saved = opt.state_dict()
    for index, entry in _reference(step)[1].state_dict()["state"].items():
        for key, value in entry.items():
            assert torch.equal(saved["state"][index][key], value), (index, key)


def _kill_inside_a_step(tmp_path: Path) -> tuple[Path, int]:
    """A writer killed while a step's objects are written but not committed. Where in a step
    the kill lands depends on the machine's timing (a step computes, then writes), so it is
    tried at other fractions of a step until one lands inside the writes."""
    for attempt, fraction in enumerate((0.5, 0.8, 0.3, 0.65, 0.9, 0.15)):
        directory = tmp_path / f"state{attempt}"
        acked = _run_and_kill(directory, 2, fraction)
        if _uncommitted_objects(directory):
            return directory, acked
    raise AssertionError("no kill landed inside a step's writes in six tries")


def test_kill_mid_step_leaves_the_last_committed_step(tmp_path: Path) -> None:
    directory, acked = _kill_inside_a_step(tmp_path)
    model = make_model()
    with crash_writer.open_optimizer(model, str(directory)) as opt:
        assert opt.resumed
        # the step in flight may have committed before the kill, unacknowledged
        assert opt.committed_step in (acked, acked + 1), (opt.committed_step, acked)
        reference, ref_opt = _reference(opt.committed_step)
        assert same_params(model, reference)  # the masters of exactly that step
        _assert_state_of_step(opt, opt.committed_step)
        # what the killed step had written is gone; what the manifest names is all there is
        stored = set(opt.versions.tier.keys("optim/sg"))
        assert stored == referenced_keys([opt.versions.manifest])
        train(model, opt, 2, first_step=opt.committed_step, schedule="constant")
        train(reference, ref_opt, 2, first_step=opt.committed_step - 2, schedule="constant")
        assert same_params(model, reference)


def test_kill_with_params_as_masters_resumes_the_saved_weights_step(tmp_path: Path) -> None:
    """master="params": the tier holds no weights, so the writer saves them, then a
    checkpoint, after each step; killed anywhere, reopening with the saved weights adopts the
    states of their step (the committed one, or the checkpoint when the kill came between a
    commit and the save), and other weights are refused, not paired with the wrong states."""
    directory = tmp_path / "state"
    acked = _run_and_kill(directory, 2, 0.5, master="params")
    saved = torch.load(directory / crash_writer.WEIGHTS, weights_only=True)
    assert saved["step"] in (acked, acked + 1)  # the save in flight may have landed
    model = make_model()
    model.load_state_dict(saved["model"])
    assert same_params(model, _reference(saved["step"])[0])
    with crash_writer.open_optimizer(model, str(directory), master="params") as opt:
        assert opt.resumed and opt.committed_step == saved["step"]
        _assert_state_of_step(opt, saved["step"])
        train(model, opt, 2, first_step=saved["step"], schedule="constant")
        assert same_params(model, _reference(saved["step"] + 2)[0])
    with pytest.raises(OffloadError, match="not that step's weights"):
        crash_writer.open_optimizer(make_model(), str(directory), master="params")


def test_named_checkpoints_survive_later_steps_and_restore(tmp_path: Path) -> None:
    model = make_model()
    with crash_writer.open_optimizer(model, str(tmp_path)) as opt:
        train(model, opt, 4, schedule="constant")
        opt.checkpoint("four", verify=True)
        train(model, opt, 3, first_step=4, schedule="constant")
        assert opt.checkpoints() == ["four"]
    model = make_model()
    with crash_writer.open_optimizer(model, str(tmp_path)) as opt:
        assert opt.committed_step == 7 and opt.checkpoints() == ["four"]
        assert same_params(model, _reference(7)[0])
        opt.restore("four")
        assert opt.committed_step == 4
        assert same_params(model, _reference(4)[0])
        train(model, opt, 2, first_step=4, schedule="constant")
        assert same_params(model, _reference(6)[0])
        opt.delete_checkpoint("four")
        named = {k for k in opt.versions.tier.keys("optim/")}
        assert all(k.startswith("optim/sg") or k == "optim/manifest" for k in named)
        assert len(named) == len(opt.subgroups) + 1  # no object but the current ones
        with pytest.raises(OffloadError, match="no checkpoint"):
            opt.restore("four")


def test_a_directory_of_other_parameters_or_optimizer_is_refused(tmp_path: Path) -> None:
    model = make_model()
    with crash_writer.open_optimizer(model, str(tmp_path)) as opt:
        train(model, opt, 1, schedule="constant")
    wider = torch.nn.Linear(8, 8)
    with pytest.raises(OffloadError, match="groups is"):
        OffloadedOptimizer(wider.parameters(), tier="nvme", directory=tmp_path)
    with pytest.raises(OffloadError, match="optimizer is"):
        OffloadedOptimizer(
            groups(make_model()),  # type: ignore[arg-type]
            torch.optim.Adam,
            tier="nvme",
            directory=tmp_path,
            subgroup_bytes=crash_writer.SUBGROUP_BYTES,
        )
    with crash_writer.open_optimizer(make_model(), str(tmp_path)) as opt:
        assert opt.committed_step == 1  # refusing changed nothing
