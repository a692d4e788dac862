"""Trainer runs that save a checkpoint, the last of them then killed by its parent (kill -9).

    python tests/kvstore/optim/trainer_resume_writer.py ROOT MAX_STEPS SAVE_STEPS KIND [KIND ...]

For each optimizer ``KIND`` ("torch", "dram" or "nvme"; its states in ``ROOT/KIND/state``),
trains the tiny Llama of :mod:`helpers_integration` with the schedule of a ``MAX_STEPS`` run
and saves ``ROOT/KIND/run/checkpoint-SAVE_STEPS``, printing ``saved KIND STEP`` (flushed) once
the checkpoint is complete on disk. Every run but the last stops there (one process serves
them all: importing transformers is most of a run's time); the last goes on, each step
sleeping a little, so that the parent's kill lands mid-run, often mid-step: between a
streamed subgroup's read and its write.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

from transformers import TrainerCallback

from tests.kvstore.optim import helpers_integration as harness

STEP_AFTER_SAVE_S = 0.02


class AnnounceSaves(TrainerCallback):
    def __init__(self, kind: str, stop: bool) -> None:
        self.kind, self.stop, self.saved = kind, stop, False

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        print(f"saved {self.kind} {state.global_step}", flush=True)
        self.saved = True
        control.should_training_stop = self.stop
        return control

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.saved:
            time.sleep(STEP_AFTER_SAVE_S)


def paths(root: str, kind: str) -> tuple[str, str]:
    """The run's output directory and its optimizer's state directory."""
    return os.path.join(root, kind, "run"), os.path.join(root, kind, "state")


def main(root: str, max_steps: int, save_steps: int, kinds: list[str]) -> None:
    with harness.one_thread():
        for number, kind in enumerate(kinds):
            output_dir, state_dir = paths(root, kind)
            trainer = harness.make_trainer(
                output_dir,
                max_steps,
                optimizer=harness.optimizer_factory(kind, state_dir),
                save_steps=save_steps,
                callbacks=[AnnounceSaves(kind, stop=number < len(kinds) - 1)],
            )
            trainer.train()
            close = getattr(trainer.optimizer.optimizer, "close", None)
            if close is not None:
                close()
    print("finished", flush=True)


if __name__ == "__main__":
    root, steps, save, *kinds = sys.argv[1:]
    main(root, int(steps), int(save), kinds)
