"""Pure planning of a sweep: cell order, warm-start points, names."""

from __future__ import annotations

import math


def cell_key(optimizer: str, batch_size: int) -> str:
    return f"{optimizer}/bs{batch_size}"


def study_name(sweep_id: str, optimizer: str, batch_size: int) -> str:
    """One Optuna study per cell; the name is stable so a re-run of the same sweep id resumes it."""
    return f"{sweep_id}/{cell_key(optimizer, batch_size)}"


def cell_order(optimizers: list[str], batch_sizes: list[int]) -> list[tuple[str, int]]:
    """Priority in which cells get free trial slots: smaller batches first, optimizers interleaved,
    so every optimizer's warm-start chain advances and no optimizer waits for another to finish."""
    return [(opt, bs) for bs in sorted(batch_sizes) for opt in optimizers]


def warm_start_lrs(
    prev_best_lr: float, prev_batch_size: int, batch_size: int, *, lr_min: float, lr_max: float
) -> list[float]:
    """First lrs of a cell: the smaller batch's best lr, unscaled and sqrt-scaled by the batch ratio
    (the square-root rule for Adam-type optimizers), clipped to the searched range, duplicates dropped."""
    if not (prev_batch_size > 0 and batch_size > 0 and prev_best_lr > 0):
        raise ValueError(
            f"need positive batch sizes and lr, got prev_batch_size={prev_batch_size}, "
            f"batch_size={batch_size}, prev_best_lr={prev_best_lr}"
        )
    out: list[float] = []
    for lr in (prev_best_lr, prev_best_lr * math.sqrt(batch_size / prev_batch_size)):
        lr = min(max(lr, lr_min), lr_max)
        if all(not math.isclose(lr, seen, rel_tol=1e-9) for seen in out):
            out.append(lr)
    return out


def run_name(optimizer: str, batch_size: int, lr: float | None = None, seed: int | None = None) -> str:
    """MLflow run names a person can read: `merit bs=64 lr=3.1e-03 seed=1`."""
    name = f"{optimizer} bs={batch_size}"
    if lr is not None:
        name += f" lr={lr:.1e}"
    if seed is not None:
        name += f" seed={seed}"
    return name


class DriverOnly:
    """For objects Tune pickles into its experiment folder (searcher, callbacks, stopper) so that
    `Tuner.restore` could rebuild them. Sweeps never restore a Tuner (a re-run resumes from the
    Optuna storage) and these objects hold locks, threads and database clients: they pickle as an
    inert placeholder instead."""

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (DetachedPlaceholder, (type(self).__name__,))


class DetachedPlaceholder:
    def __init__(self, name: str) -> None:
        self.name = name
