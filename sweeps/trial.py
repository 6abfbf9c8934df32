"""The function each trial runs in its own Ray actor: one trial, on the light path (1 worker) or
through Ray Train.

A module of its own, importing no more than the trial needs: Ray pickles a function by its module and
name, so the actor imports the function's module, and `sweeps.search` (Optuna, the analysis, the
stores) cost every trial's process ~2 s of imports it never used.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sweeps.layout import VAL_LOSS
from sweeps.status import OUT_OF_MEMORY, TrialStatus, is_memory_error

log = logging.getLogger(__name__)


def failed(error: BaseException | str) -> dict[str, Any]:
    """The last result of a trial whose training failed: a result, not a crash, so Tune's restarts are kept
    for the infrastructure; `failure` says when it ran out of memory (its cell stops after a few)."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    result: dict[str, Any] = {"status": TrialStatus.failed.value, "error": text[:500], VAL_LOSS: math.nan}
    if is_memory_error(error):
        result["failure"] = OUT_OF_MEMORY
    return result


def memory_shortfall(cfg: Any) -> str | None:
    """Why this node cannot hold the trial (worker.memory's estimate over the memory Ray finds on the node, its
    cgroup's limit included, or the GPU's), before anything is allocated: the kernel's OOM killer ends a
    process without a word, and Tune would start it again. None when it fits."""
    from worker.memory import estimate_memory, gib

    need = estimate_memory(cfg)
    if need.on_gpu:
        import torch

        if not torch.cuda.is_available():
            return None
        has = torch.cuda.get_device_properties(0).total_memory
        needed, where = need.device_bytes, "GPU"
    else:
        has, needed, where = node_memory(), need.host_bytes, "node"
    if needed <= has:
        return None
    return f"out of memory: this trial needs {need.describe()}; its {where} has {gib(has)}"


def node_memory() -> int:
    """Bytes of memory this process's node has: Ray's own reading (its cgroup's limit where that is lower than
    the machine's), or the machine's where Ray's private helper has moved."""
    try:
        from ray._common.utils import get_system_memory
    except ImportError:
        import psutil

        return int(psutil.virtual_memory().total)
    return int(get_system_memory())


def run_trial(config: dict[str, Any]) -> None:
    """Tune function trainable: one trial, on the light path (1 worker) or through Ray Train."""
    from ray import tune

    from worker.config import TrainConfig

    cfg = TrainConfig.model_validate(config["train"])
    if cfg.resources.workers_per_trial == 1:
        from worker.loop import train
        from worker.session import TuneSession

        if (short := memory_shortfall(cfg)) is not None:  # this process trains: its node is the one to judge
            log.error("trial not started: %s", short)
            tune.report(failed(short))
            return
        try:
            train(cfg, TuneSession())  # its last report carries the final status
        except Exception as exc:
            # training itself failed (a bad optimizer keyword, out of memory...): a result, not a crash
            log.exception("trial failed in training")
            tune.report(failed(exc))
        return
    from ray.tune.integration.ray_train import TuneReportCallback

    from worker.launch import torch_trainer

    context = tune.get_context()
    trainer = torch_trainer(
        cfg,
        name=f"{config['sweep_id']}-{context.get_trial_id()}",
        storage_path=context.get_trial_dir(),
        max_failures=1,
        callbacks=[TuneReportCallback()],
    )
    try:
        trainer.fit()
    except Exception as exc:  # Ray Train's TrainingFailedError, a worker's error in its text
        if not is_memory_error(str(exc)):
            raise  # the infrastructure's (a lost worker past its restarts): Tune's to restart
        log.exception("trial ran out of memory")
        tune.report(failed(exc))
