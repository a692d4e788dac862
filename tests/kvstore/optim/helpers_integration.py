"""The Hugging Face Trainer harness of the optimizer integration tests: a tiny random Llama,
a byte-level corpus and one training run, with the optimizer as the only variable.

Everything is deterministic on the CPU: the model's weights come from a seeded generator, the
corpus is the Zen of Python (``this``, part of every CPython) as byte tokens, the Trainer runs
with a fixed seed and no dataloader workers. Two runs that differ only in an optimizer giving
bit-identical updates therefore log bit-identical losses. Nothing is downloaded.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

VOCAB_SIZE = 128  # byte tokens: the corpus is ASCII
SEQUENCE_TOKENS = 32
LR = 3e-3
WARMUP_STEPS = 10
WEIGHT_DECAY = 0.01
SEED = 1234


def corpus_tokens() -> torch.Tensor:
    """The Zen of Python as byte tokens (856 of them)."""
    with contextlib.redirect_stdout(io.StringIO()):  # ``import this`` prints the text
        import this
    text = codecs.decode(this.s, "rot13")
    return torch.tensor(list(text.encode("ascii")), dtype=torch.long) % VOCAB_SIZE


def corpus_dataset() -> list[dict[str, torch.Tensor]]:
    """Causal-LM examples: overlapping windows of the corpus, half a window apart."""
    tokens = corpus_tokens()
    stride = SEQUENCE_TOKENS // 2
    windows = [
        tokens[start : start + SEQUENCE_TOKENS]
        for start in range(0, tokens.numel() - SEQUENCE_TOKENS + 1, stride)
    ]
    return [{"input_ids": w.clone(), "labels": w.clone()} for w in windows]


def tiny_model(seed: int = SEED) -> torch.nn.Module:
    """A 2-layer Llama of hidden size 32 with random weights drawn from ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQUENCE_TOKENS,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


OptimizerFactory = Callable[[torch.nn.Module], torch.optim.Optimizer]


def torch_adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The reference: torch's AdamW, in memory."""
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)


# The model's 105 KiB of fp32 weights stream in seven subgroups from DRAM; on NVMe, where every
# subgroup written is a durable write, in one (seven made a step 140 ms on this machine's disk;
# the NVMe pipeline over many subgroups is test_exact's and test_crash's).
SUBGROUP_BYTES = {"dram": 16 << 10, "nvme": 128 << 10}


def offloaded_adamw(tier: str, directory: str | None = None) -> OptimizerFactory:
    """Ours: AdamW with the same flags as :func:`torch_adamw`, its states in ``tier``."""

    def make(model: torch.nn.Module) -> torch.optim.Optimizer:
        from kvstore.optim import OffloadedOptimizer

        return OffloadedOptimizer(
            model.parameters(),
            torch.optim.AdamW,
            tier=tier,
            directory=directory,
            subgroup_bytes=SUBGROUP_BYTES[tier],
            lr=LR,
            weight_decay=WEIGHT_DECAY,
        )

    return make


def optimizer_factory(kind: str, directory: str | None = None) -> OptimizerFactory:
    """``"torch"`` (the reference), ``"dram"`` or ``"nvme"`` (ours; ``directory`` for NVMe)."""
    return torch_adamw if kind == "torch" else offloaded_adamw(kind, directory)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread: bit-identical runs need the same reduction order in every
    process, and on a loaded 2-vCPU machine a second spinning thread makes a step ~50x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def training_args(
    output_dir: str, max_steps: int, save_steps: int | None = None, device: str = "cpu"
) -> Any:
    """Arguments of every run: seeded, a loss logged at every step, gradient clipping at 1.0
    (the Trainer clips the model's gradients before ``optimizer.step``); on CUDA, torch's
    deterministic algorithms."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output_dir,
        use_cpu=device == "cpu",
        full_determinism=device != "cpu",
        report_to=[],
        seed=SEED,
        data_seed=SEED,
        dataloader_num_workers=0,
        max_steps=max_steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        max_grad_norm=1.0,
        learning_rate=LR,
        weight_decay=WEIGHT_DECAY,
        warmup_steps=WARMUP_STEPS,
        lr_scheduler_type="linear",
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        disable_tqdm=True,
        log_level="error",
    )


def make_trainer(
    output_dir: str,
    max_steps: int,
    optimizer: OptimizerFactory | None = None,
    optimizer_cls_and_kwargs: tuple[type, dict[str, Any]] | None = None,
    save_steps: int | None = None,
    callbacks: list[Any] | None = None,
    device: str = "cpu",
) -> Any:
    """A Trainer over a fresh tiny model: with ``optimizer``, the run's optimizer and a linear
    warmup schedule are passed in ``optimizers=``; otherwise the Trainer builds them itself,
    from ``optimizer_cls_and_kwargs`` (its two param groups: with and without weight decay).
    The model is on ``device`` before the optimizer is made."""
    from transformers import PrinterCallback, Trainer, get_linear_schedule_with_warmup

    model = tiny_model().to(device)
    args = training_args(output_dir, max_steps, save_steps, device)
    optimizers: tuple[Any, Any] = (None, None)
    if optimizer is not None:
        opt = optimizer(model)
        schedule = get_linear_schedule_with_warmup(opt, WARMUP_STEPS, max_steps)
        optimizers = (opt, schedule)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=corpus_dataset(),
        optimizers=optimizers,
        optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # a line per step on stdout otherwise
    return trainer


def step_losses(trainer: Any) -> dict[int, float]:
    """The loss logged at each step (``logging_steps=1``), unrounded."""
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def checkpoint_dir(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"checkpoint-{step}")
