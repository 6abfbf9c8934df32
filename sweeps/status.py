"""The statuses of a sweep and of a trial: one enum per kind, used by the driver, the service, the
CLI, the Optuna and MLflow records and the dashboards alike (each is a `str`, so it is stored and
sent as its plain value)."""

from __future__ import annotations

import enum
from typing import Any


class SweepStatus(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def final(self) -> bool:
        return self in FINAL_SWEEP_STATUSES


FINAL_SWEEP_STATUSES = frozenset({SweepStatus.succeeded, SweepStatus.failed, SweepStatus.cancelled})
ACTIVE_SWEEP_STATUSES = frozenset({SweepStatus.queued, SweepStatus.running})


class TrialStatus(enum.StrEnum):
    running = "running"  # in MLflow while it trains
    completed = "completed"  # trained on its whole budget
    pruned = "pruned"  # stopped early by ASHA: its last val loss is kept
    diverged = "diverged"  # NaN/inf or a loss above 3x the initial one: a result (a bad lr)
    failed = "failed"  # training itself raised an error: a result
    cancelled = "cancelled"  # cut short by a cancel of the sweep: run again on resume
    interrupted = "interrupted"  # lost to the infrastructure (worker, node or driver gone): run again


# what a trial can end as and count in a cell (the report's trial_status counts these)
RESULT_STATUSES = (TrialStatus.completed, TrialStatus.pruned, TrialStatus.diverged, TrialStatus.failed)
# cut short by the sweep or the infrastructure: no result, the trial is run again
RERUN_STATUSES = (TrialStatus.interrupted, TrialStatus.cancelled)


def trial_status(result: dict[str, Any] | None, error: bool, *, cancelling: bool = False) -> TrialStatus:
    """How a trial ended, from its last result: the one rule, for the Optuna record (the searcher)
    and the MLflow record (the recorder) alike, so the two always agree.

    - An error that reaches Tune is the infrastructure's (the trial's process died: `run_trial` turns
      every exception of training itself into a `failed` result), and once Tune's restarts are spent
      the trial is `interrupted`: no result, run again.
    - A trial that reported its end is `completed`, `diverged` or `failed`, also while the sweep is
      being cancelled: those are results.
    - One cut short before its end was stopped by ASHA (`pruned`, a result) or, while the sweep is
      being cancelled, by the cancel (`cancelled`, run again on resume).
    """
    if error:
        return TrialStatus.interrupted
    status = (result or {}).get("status")
    if status in (TrialStatus.completed, TrialStatus.diverged, TrialStatus.failed):
        return TrialStatus(status)
    return TrialStatus.cancelled if cancelling else TrialStatus.pruned


# A failed trial's `failure` when training ran out of host or GPU memory (or its trial refused to start, its
# estimate over what its node holds): no lr fixes that, so a cell stops after a few (sweeps.search)
OUT_OF_MEMORY = "out_of_memory"
# how torch and Ray word it: torch.cuda.OutOfMemoryError ("CUDA out of memory"), the CPU allocator
# ("DefaultCPUAllocator: can't allocate memory"), MemoryError, Ray's memory monitor ("... low on memory")
_MEMORY_WORDS = ("out of memory", "outofmemory", "allocate memory", "memoryerror", "low on memory")


def is_memory_error(error: BaseException | str) -> bool:
    """Whether an exception (or its text) says the process ran out of memory."""
    if isinstance(error, MemoryError):
        return True
    low = (error if isinstance(error, str) else f"{type(error).__name__}: {error}").lower()
    return any(word in low or word in low.replace(" ", "") for word in _MEMORY_WORDS)
