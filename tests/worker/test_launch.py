"""worker.launch.torch_trainer: the one `TorchTrainer` builder, and both of its callers (`run_training`'s
multi-worker path, a sweep's multi-worker trial in `sweeps.trial.run_trial`). Nothing is fitted and no Ray
cluster starts: building a trainer only records its configuration, and the callers get a fake builder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from worker.config import ResourcesConfig, TrainConfig
from worker.loop import train_loop_per_worker

CFG = TrainConfig(resources=ResourcesConfig(workers_per_trial=2, cpus_per_worker=3), batch_size=16)


def with_resources(**fields: object) -> TrainConfig:
    return CFG.model_copy(update={"resources": CFG.resources.model_copy(update=fields)})


def test_the_builder_runs_the_loop_on_the_configured_workers(tmp_path: Path) -> None:
    from ray.train import UserCallback

    from worker.launch import torch_trainer

    callback = UserCallback()
    trainer = torch_trainer(CFG, name="run", storage_path=str(tmp_path), max_failures=3, callbacks=[callback])
    assert trainer.train_loop_per_worker is train_loop_per_worker
    assert TrainConfig.model_validate(trainer.train_loop_config) == CFG
    scaling = trainer.scaling_config
    assert (scaling.num_workers, scaling.use_gpu, scaling.resources_per_worker) == (2, False, {"CPU": 3})
    run = trainer.run_config
    assert (run.name, run.storage_path, run.failure_config.max_failures) == ("run", str(tmp_path), 3)
    assert run.checkpoint_config.num_to_keep == 1  # resuming needs the last checkpoint only
    assert run.callbacks == [callback]


@pytest.mark.parametrize(("use_gpu", "backend"), [(False, "gloo"), (True, "nccl")])
def test_ddp_runs_over_nccl_between_gpus_and_gloo_between_cpus(use_gpu: bool, backend: str) -> None:
    from worker.launch import torch_trainer

    trainer = torch_trainer(
        with_resources(gpus_per_worker=float(use_gpu)), name=None, storage_path=None, max_failures=0
    )
    assert trainer.scaling_config.use_gpu is use_gpu
    assert trainer.backend_config.backend == backend


def test_the_builder_defaults() -> None:
    from worker.launch import torch_trainer

    trainer = torch_trainer(with_resources(cpus_per_worker=None), name=None, storage_path=None, max_failures=0)
    assert trainer.scaling_config.resources_per_worker == {"CPU": 1}
    assert Path(trainer.run_config.storage_path).name == "batchsweep-train"
    assert trainer.run_config.callbacks == []


class FakeBuilder:
    """Records how it was called; its trainer's fit() returns what a Ray Train run would."""

    def __init__(self) -> None:
        self.calls: list[tuple[TrainConfig, dict[str, Any]]] = []

    def __call__(self, cfg: TrainConfig, **kw: Any) -> SimpleNamespace:
        self.calls.append((cfg, kw))
        result = SimpleNamespace(return_value={"final": {"status": "completed"}, "history": [{"tokens": 1}]})
        return SimpleNamespace(fit=lambda: result)


def test_run_training_builds_its_trainer_with_the_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    import worker.launch

    fake = FakeBuilder()
    monkeypatch.setattr(worker.launch, "init_ray", lambda: None)
    monkeypatch.setattr(worker.launch, "torch_trainer", fake)
    out = worker.launch.run_training(CFG, name="n", storage_path="/s", max_failures=4)
    assert fake.calls == [(CFG, {"name": "n", "storage_path": "/s", "max_failures": 4})]
    assert out.final == {"status": "completed"} and out.history == [{"tokens": 1}]


def test_a_multi_worker_sweep_trial_builds_its_trainer_with_the_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray.tune
    import ray.tune.integration.ray_train

    import worker.launch
    from sweeps.trial import run_trial

    fake = FakeBuilder()
    monkeypatch.setattr(worker.launch, "torch_trainer", fake)
    context = SimpleNamespace(get_trial_id=lambda: "t01", get_trial_dir=lambda: "/trials/t01")
    monkeypatch.setattr(ray.tune, "get_context", lambda: context)
    monkeypatch.setattr(ray.tune.integration.ray_train, "TuneReportCallback", lambda: "tune-report-callback")
    run_trial({"train": CFG.model_dump(mode="json"), "sweep_id": "sw"})
    assert fake.calls == [
        (
            CFG,
            {
                "name": "sw-t01",
                "storage_path": "/trials/t01",
                "max_failures": 1,
                "callbacks": ["tune-report-callback"],
            },
        )
    ]
