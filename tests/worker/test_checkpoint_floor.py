"""The time floor between a trial's checkpoints (`checkpoint_min_interval_s`): none before it has
passed, one at every due evaluation with 0; either way the same training."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.config import ModelConfig, OptimizerConfig, TrainConfig
from worker.loop import Layout, rank0_agrees, train
from worker.session import LocalSession

CFG = TrainConfig(
    model=ModelConfig(preset="gpt2-nano", seq_len=32),
    optimizer=OptimizerConfig(name="adamw", lr=3e-3),
    batch_size=8,
    token_budget=8 * 32 * 24,
    eval_every_tokens=8 * 32 * 6,  # 4 evaluations: checkpoints after the first 3 (none at the end)
    eval_tokens=256,
    threads_per_worker=1,
    checkpoint_every_evals=1,
)


@pytest.fixture(autouse=True)
def _cache(token_cache: Path) -> None:
    """The session's token cache of the built-in corpus."""


def test_no_checkpoint_before_the_floor_and_one_per_evaluation_without_it(tmp_path: Path) -> None:
    every = LocalSession(checkpoint_root=tmp_path / "every")
    final = train(CFG.model_copy(update={"checkpoint_min_interval_s": 0.0}), every)
    floored = LocalSession(checkpoint_root=tmp_path / "floored")
    again = train(CFG.model_copy(update={"checkpoint_min_interval_s": 3600.0}), floored)
    assert len(every.checkpoints) == 3 and floored.checkpoints == []
    assert again["val_loss"] == final["val_loss"]  # checkpoints change nothing of the training


def test_one_process_decides_alone() -> None:
    import torch

    layout = Layout(torch.device("cpu"), 0, 1, 8, 1)
    assert rank0_agrees(True, layout) is True and rank0_agrees(False, layout) is False
