"""One training run through Ray Train on a real local Ray cluster: a DDP worker that dies mid-run and
resumes from its Ray Train checkpoint, ending where an unbroken single-worker run ends. That DDP on two
workers matches one worker is shown across two nodes, the stronger case, by
tests/cluster/test_service_on_cluster.py::test_a_ddp_trial_spans_both_worker_nodes_and_matches_one_worker
(it ran here on one node as well, the same assertions, 43 s of the suite)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import TINY_DDP_CONFIG, on_workers

from worker.launch import run_training

pytestmark = pytest.mark.ray

CFG = TINY_DDP_CONFIG


def _crash_once_loop(config: dict[str, Any]) -> dict[str, Any]:
    """train_loop_per_worker, but the first attempt's rank 0 dies right after its 2nd checkpoint."""
    import os

    import ray.train

    from worker.config import TrainConfig
    from worker.loop import train
    from worker.session import RayTrainSession

    marker = config.pop("_marker")

    class Crashing(RayTrainSession):
        def report(self, metrics: dict, checkpoint_dir: Path | None = None) -> None:
            super().report(metrics, checkpoint_dir)
            if len(self.history) == 2 and not os.path.exists(marker) and ray.train.get_context().get_world_rank() == 0:
                open(marker, "w").close()
                os._exit(1)  # a killed worker, not an exception

    session = Crashing()
    final = train(TrainConfig.model_validate(config), session)
    return {"final": final, "history": session.history}


def test_killed_worker_resumes_from_checkpoint(ray_session: str, tmp_path: Path) -> None:
    import ray.cloudpickle
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # the worker processes cannot import this test module: ship the crashing loop by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    marker = str(tmp_path / "crashed")
    config = on_workers(CFG, 2).model_dump(mode="json")  # a checkpoint at every evaluation (the default)
    trainer = TorchTrainer(
        _crash_once_loop,
        train_loop_config={**config, "_marker": marker},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            storage_path=str(tmp_path / "storage"),
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
        ),
    )
    out = trainer.fit().return_value
    assert os.path.exists(marker), "the first attempt must have crashed"
    assert out["final"]["status"] == "completed"
    # the second attempt resumed from a reported checkpoint instead of starting over: a restart would
    # report from 2048 tokens again. (Which checkpoint, the 1st or the 2nd, depends on whether Ray
    # registered the 2nd before the worker died.)
    tokens = [m["tokens"] for m in out["history"]]
    assert tokens[0] in (4096, 6144) and tokens[-1] == 8192
    single = run_training(CFG)
    assert out["final"]["val_loss"] == pytest.approx(single.final["val_loss"], rel=1e-3)
