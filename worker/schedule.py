"""Learning-rate schedule: linear warm-up, then cosine decay to a floor. Pure functions."""

from __future__ import annotations

import math


def warmup_steps(
    total_steps: int,
    warmup_fraction: float,
    *,
    tokens: int | None = None,
    steps: int | None = None,
    tokens_per_step: int = 1,
) -> int:
    """Warm-up length in steps: `steps`, else `tokens` / tokens_per_step (the same tokens at every batch
    size: fewer steps at a larger batch), else warmup_fraction of the run's steps; at least one step
    whenever warm-up is asked for, and never the whole run (the peak lr is reached)."""
    if steps is not None:
        wanted = steps
    elif tokens is not None:
        wanted = max(1, round(tokens / tokens_per_step)) if tokens > 0 else 0
    elif warmup_fraction > 0:
        wanted = max(1, round(total_steps * warmup_fraction))
    else:
        return 0
    return min(wanted, max(0, total_steps - 1))


def lr_at(step: int, *, peak_lr: float, total_steps: int, warmup: int, min_lr_ratio: float) -> float:
    """lr for optimizer step `step` (0-based) of `total_steps`.

    Steps 0..warmup-1 ramp linearly up to peak_lr (step 0 gets peak/warmup, never 0, so the first
    update counts); after that a half cosine falls from peak_lr to min_lr_ratio*peak_lr, reached at
    the last step.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got step={step}")
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    floor = peak_lr * min_lr_ratio
    decay_steps = total_steps - warmup - 1
    if decay_steps <= 0:
        return peak_lr
    progress = min(1.0, (step - warmup) / decay_steps)  # 0 at the first decay step, 1 at the last
    return floor + 0.5 * (peak_lr - floor) * (1.0 + math.cos(math.pi * progress))
