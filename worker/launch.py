"""Launch one training run on the current Ray cluster.

Multi-worker runs go through Ray Train (`TorchTrainer`, DDP: gloo on CPU, NCCL on GPU), with
checkpoints and `FailureConfig` so a killed worker resumes from the last report instead of
restarting. A single-worker run may take the light path: the same loop in one Ray task, without a
Train controller, whose start-up costs more than a small run's training.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray._private import ray_constants

from worker.config import TrainConfig
from worker.local_ray import RayImportedTooEarly, is_local, train_env
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from ray.train.torch import TorchTrainer

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    final: dict[str, Any]  # last metrics, with "status": completed | diverged
    history: list[dict[str, Any]] = field(default_factory=list)  # every report, in order

    @property
    def status(self) -> str:
        return str(self.final.get("status"))


def init_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Connect to `address` (or $RAY_ADDRESS), else start a local cluster bound to loopback only
    (`worker.local_ray.use_local_ray()` must have run at the process's entry; checked here)."""
    if ray.is_initialized():
        return
    address = address or WorkerSettings().ray_address
    if is_local(address) and ray_constants.ENABLE_RAY_CLUSTER:
        raise RayImportedTooEarly(
            "a local Ray cluster would listen on every interface: call worker.local_ray.use_local_ray() at "
            "the process's entry, before anything imports ray"
        )
    runtime_env = {"env_vars": train_env()}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        ray.init(
            address="local",  # a new cluster, never one a stale `ray start` left in /tmp/ray
            num_cpus=num_cpus,
            _node_ip_address="127.0.0.1",
            include_dashboard=True,  # Train V2's placement-group cleaner needs the State API
            dashboard_host="127.0.0.1",
            runtime_env=runtime_env,
            log_to_driver=False,
        )


@ray.remote
def _train_light(config: dict[str, Any]) -> dict[str, Any]:
    from worker.loop import train
    from worker.session import LocalSession

    session = LocalSession()
    final = train(TrainConfig.model_validate(config), session)
    return {"final": final, "history": session.reports}


def run_training(
    cfg: TrainConfig,
    *,
    light: bool = True,
    storage_path: str | None = None,
    name: str | None = None,
    max_failures: int = 2,
) -> RunResult:
    """Run `cfg` on the current Ray cluster (starting a local one if none) and wait for it."""
    init_ray()
    cpus = cfg.resources.cpus_per_worker or 1
    if light and cfg.resources.workers_per_trial == 1:
        task = _train_light.options(num_cpus=cpus, num_gpus=1 if cfg.resources.use_gpu else 0)
        out = ray.get(task.remote(cfg.model_dump(mode="json")))
        return RunResult(final=out["final"], history=out["history"])

    trainer = torch_trainer(cfg, name=name, storage_path=storage_path, max_failures=max_failures)
    out = trainer.fit().return_value  # raises TrainingFailedError once max_failures are spent
    return RunResult(final=out["final"], history=out["history"])


def distributed_backend(cfg: TrainConfig) -> str:
    """torch.distributed backend of a multi-worker run: "nccl" with GPUs, else "gloo"."""
    return "nccl" if cfg.resources.use_gpu else "gloo"


def torch_trainer(
    cfg: TrainConfig,
    *,
    name: str | None,
    storage_path: str | None,
    max_failures: int,
    callbacks: Sequence[Any] = (),
) -> TorchTrainer:
    """The one Ray Train `TorchTrainer` of a run (`run_training`'s multi-worker path and a sweep's
    multi-worker trial): `cfg.resources.workers_per_trial` DDP workers of `cfg.resources.cpus_per_worker`
    CPUs (and a GPU each with `cfg.resources.use_gpu`) running `train_loop_per_worker`; a failed worker
    group is restarted from the last reported checkpoint up to `max_failures` times, and only that
    checkpoint is kept. `storage_path` defaults to $TMPDIR/batchsweep-train; `callbacks` are Ray Train
    callbacks (Tune's `TuneReportCallback` inside a trial)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from worker.loop import train_loop_per_worker

    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=cfg.model_dump(mode="json"),
        # the process group DDP all-reduces over: NCCL between GPUs, gloo between CPU workers (Ray's
        # default too, said here so that it cannot change under us); DDP buckets the gradients itself
        torch_config=TorchConfig(backend=distributed_backend(cfg)),
        scaling_config=ScalingConfig(
            num_workers=cfg.resources.workers_per_trial,
            use_gpu=cfg.resources.use_gpu,
            resources_per_worker={"CPU": cfg.resources.cpus_per_worker or 1},
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path or str(Path(tempfile.gettempdir()) / "batchsweep-train"),
            callbacks=list(callbacks),
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
        ),
    )
