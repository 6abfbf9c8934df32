"""The time floor between a trial's checkpoints (`checkpoints.min_interval_s`): none before it has
passed, one at every due evaluation with 0; either way the same training."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.config import CheckpointConfig, EvalConfig, ModelConfig, OptimizerConfig, ResourcesConfig, TrainConfig
from worker.loop import Layout, rank0_agrees, train
from worker.session import LocalSession

CFG = TrainConfig(
    model=ModelConfig(preset="gpt2-nano", seq_len=32),
    optimizer=OptimizerConfig(name="adamw", lr=3e-3),
    batch_size=8,
    token_budget=8 * 32 * 24,
    evaluation=EvalConfig(every_tokens=8 * 32 * 6, tokens=256),  # 4: checkpoints after the first 3 (none at the end)
    resources=ResourcesConfig(cpus_per_worker=1),
)


def floored(seconds: float) -> TrainConfig:
    """CFG with a checkpoint at every evaluation, once `seconds` of training have passed since the last."""
    return CFG.model_copy(update={"checkpoints": CheckpointConfig(every_tokens=None, min_interval_s=seconds)})


@pytest.fixture(autouse=True)
def _cache(token_cache: Path) -> None:
    """The session's token cache of the built-in corpus."""


def test_no_checkpoint_before_the_floor_and_one_per_evaluation_without_it(tmp_path: Path) -> None:
    every = LocalSession(checkpoint_root=tmp_path / "every")
    final = train(floored(0.0), every)
    hour = LocalSession(checkpoint_root=tmp_path / "floored")
    again = train(floored(3600.0), hour)
    assert len(every.checkpoints) == 3 and hour.checkpoints == []
    assert again["val_loss"] == final["val_loss"]  # checkpoints change nothing of the training


def test_one_process_decides_alone() -> None:
    import torch

    layout = Layout(torch.device("cpu"), 0, 1, 8, 1)
    assert rank0_agrees(True, layout) is True and rank0_agrees(False, layout) is False
