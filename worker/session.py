"""Where a training loop reports to: Ray Train, a Ray Tune function trainable, or plain Python.

The loop in `worker.loop` is the same on every path; only reporting, checkpoints and ranks differ.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

Metrics = dict[str, Any]

VAL_LOSS = "val_loss"  # the metric every result carries: Tune's TuneConfig(metric=...) and the search minimise it
RUN_STATUSES = ("running", "completed", "diverged")  # what `train` reports; `failed` comes from the trial function


def run_result(last: Metrics, *, tokens: int, step: int, status: str, train_time_s: float | None = None) -> Metrics:
    """Every report and the final result of a run, built one way (the training loop and `sweeps.simulate`
    both call it): the last evaluation's metrics `last`, where the run stands now (a diverged run stops
    between evaluations), and its status; `done` unless the run is still running.

    Every result carries `val_loss`: Tune checks each result for its metric and a result without it ends
    the whole sweep (a run that diverges before its first evaluation has none). A diverged run's is NaN:
    it has no loss where it stopped, and its evaluations are in its earlier reports."""
    if status not in RUN_STATUSES:
        raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)}, got status={status!r}")
    out: Metrics = {**last, "tokens": tokens, "step": step, "status": status, "done": status != "running"}
    if train_time_s is not None:
        out["train_time_s"] = train_time_s  # wall time of the run so far, setup included
    if status == "diverged" or VAL_LOSS not in out:
        out[VAL_LOSS] = math.nan
    return out


class Session(Protocol):
    world_rank: int
    world_size: int
    local_rank: int

    def report(self, metrics: Metrics, checkpoint_dir: Path | None = None) -> None: ...

    def restored_checkpoint(self) -> contextlib.AbstractContextManager[Path | None]: ...


class LocalSession:
    """In-process: reports go to a list (and an optional callback); checkpoints to `checkpoint_root`."""

    def __init__(
        self,
        on_report: Callable[[Metrics], None] | None = None,
        *,
        checkpoint_root: Path | None = None,
        resume_from: Path | None = None,
    ) -> None:
        self.world_rank, self.world_size, self.local_rank = 0, 1, 0
        self.reports: list[Metrics] = []
        self._on_report = on_report
        self._root = checkpoint_root
        self._resume_from = resume_from
        self.checkpoints: list[Path] = []

    def report(self, metrics: Metrics, checkpoint_dir: Path | None = None) -> None:
        self.reports.append(dict(metrics))
        if checkpoint_dir is not None and self._root is not None:
            import shutil

            dest = self._root / f"checkpoint_{len(self.checkpoints):06d}"
            shutil.copytree(checkpoint_dir, dest)
            self.checkpoints.append(dest)
        if self._on_report is not None:
            self._on_report(dict(metrics))

    @contextlib.contextmanager
    def restored_checkpoint(self) -> Iterator[Path | None]:
        yield self._resume_from


# the Ray node a report came from (rank 0's in Ray Train): the sweep records where each trial ran
NODE_ID = "node_id"


def node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


class RayTrainSession:
    """Inside a Ray Train worker (`TorchTrainer`): every rank reports; rank 0 attaches the checkpoint."""

    def __init__(self) -> None:
        import ray.train

        ctx = ray.train.get_context()
        self.world_rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.local_rank = ctx.get_local_rank()
        self.history: list[Metrics] = []

    def report(self, metrics: Metrics, checkpoint_dir: Path | None = None) -> None:
        import ray.train

        self.history.append(dict(metrics))
        checkpoint = ray.train.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir else None
        ray.train.report({**metrics, NODE_ID: node_id()}, checkpoint=checkpoint)

    def restored_checkpoint(self) -> contextlib.AbstractContextManager[Path | None]:
        import ray.train

        return _restored(ray.train.get_checkpoint)


class TuneSession:
    """Inside a Tune function trainable, the light single-worker path: no Train controller."""

    def __init__(self) -> None:
        self.world_rank, self.world_size, self.local_rank = 0, 1, 0

    def report(self, metrics: Metrics, checkpoint_dir: Path | None = None) -> None:
        from ray import tune

        if VAL_LOSS not in metrics:
            # Tune would end the whole sweep on this result; raised here it fails this trial only
            raise ValueError(f"a result must carry {VAL_LOSS} (`run_result` builds one), got keys {sorted(metrics)}")
        checkpoint = tune.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir else None
        tune.report({**metrics, NODE_ID: node_id()}, checkpoint=checkpoint)

    def restored_checkpoint(self) -> contextlib.AbstractContextManager[Path | None]:
        from ray import tune

        return _restored(tune.get_checkpoint)


@contextlib.contextmanager
def _restored(get_checkpoint: Callable[[], Any]) -> Iterator[Path | None]:
    """The checkpoint `get_checkpoint()` returns (a Ray `Checkpoint`, or None on a fresh start) as a local
    directory for the block, or None. Ray Train and Tune differ only in which `get_checkpoint` they call."""
    checkpoint = get_checkpoint()
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as path:
        yield Path(path)


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="batchsweep-ckpt-") as d:
        yield Path(d)
