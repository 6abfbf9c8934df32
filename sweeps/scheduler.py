"""Ray Tune's trial scheduler of a sweep: ASHA within each cell (`PerCellASHA`), so that a search trial
is stopped early only against trials of its own (optimizer, batch size), at equal tokens."""

from __future__ import annotations

import math
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler

from sweeps.detached import DriverOnly
from sweeps.layout import VAL_LOSS
from sweeps.spec import SweepSpec

# what every trial reports and Tune, the searcher and the scheduler judge by: val loss (lower is better)
# against tokens seen
METRIC, MODE, TIME_ATTR = VAL_LOSS, "min", "tokens"


def make_scheduler(spec: SweepSpec) -> PerCellASHA | None:
    """The trial scheduler of a sweep: per-cell ASHA when the spec prunes, else Tune's FIFO (None)."""
    if not spec.pruning.enabled:
        return None
    return PerCellASHA(
        max_t=spec.trained_tokens,
        grace_period=max(1, int(spec.pruning.grace_fraction * spec.trained_tokens)),
        reduction_factor=spec.pruning.reduction_factor,
    )


class PerCellASHA(DriverOnly, FIFOScheduler):
    """ASHA per cell: a search trial is compared only with trials of its own cell, at equal tokens
    seen (`tokens` is the time attribute). Seed re-runs are never stopped."""

    def __init__(self, *, max_t: int, grace_period: int, reduction_factor: int) -> None:
        super().__init__()
        self._kw = dict(
            time_attr=TIME_ATTR,
            metric=METRIC,
            mode=MODE,
            max_t=max_t,
            grace_period=grace_period,
            reduction_factor=reduction_factor,
            brackets=1,
        )
        self._asha: dict[str, AsyncHyperBandScheduler] = {}
        self._cell_of: dict[str, str] = {}

    def _for(self, trial: Trial) -> AsyncHyperBandScheduler | None:
        if trial.config.get("role") != "search" or not trial.config.get("prunable", True):
            return None
        cell = trial.config["cell"]
        if cell not in self._asha:
            self._asha[cell] = AsyncHyperBandScheduler(**self._kw)  # type: ignore[arg-type]
        return self._asha[cell]

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        if (asha := self._for(trial)) is not None:
            asha.on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        if (asha := self._for(trial)) is None or not math.isfinite(result.get(METRIC, math.inf)):
            return TrialScheduler.CONTINUE
        return asha.on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> None:
        if (asha := self._for(trial)) is not None and trial.trial_id in asha._trial_info:
            if METRIC in result and TIME_ATTR in result and math.isfinite(result[METRIC]):
                asha.on_trial_complete(tune_controller, trial, result)
            else:
                asha.on_trial_remove(tune_controller, trial)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        if (asha := self._for(trial)) is not None and trial.trial_id in asha._trial_info:
            asha.on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        self.on_trial_remove(tune_controller, trial)
