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

log = logging.getLogger(__name__)


def run_trial(config: dict[str, Any]) -> None:
    """Tune function trainable: one trial, on the light path (1 worker) or through Ray Train."""
    from ray import tune

    from worker.config import TrainConfig

    cfg = TrainConfig.model_validate(config["train"])
    if cfg.num_workers == 1:
        from worker.loop import train
        from worker.session import TuneSession

        try:
            train(cfg, TuneSession())  # its last report carries the final status
        except Exception as exc:
            # training itself failed (a bad optimizer keyword, out of memory...): a result, not a crash,
            # so Tune's restarts are kept for the infrastructure
            log.exception("trial failed in training")
            tune.report({"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:500], VAL_LOSS: math.nan})
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
    trainer.fit()
