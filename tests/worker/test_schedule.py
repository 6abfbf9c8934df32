import math

import pytest

from worker.schedule import lr_at, warmup_steps


def test_warmup_steps_rounds_and_keeps_at_least_one() -> None:
    assert warmup_steps(100, 0.05) == 5
    assert warmup_steps(10, 0.01) == 1  # any warm-up asked for is at least one step
    assert warmup_steps(100, 0.0) == 0


def test_linear_warmup_exact_values() -> None:
    kw = dict(peak_lr=1.0, total_steps=10, warmup=4, min_lr_ratio=0.1)
    # step 0 gets peak/warmup, never 0: the first update must move the weights
    assert [lr_at(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_cosine_decay_exact_values() -> None:
    kw = dict(peak_lr=2.0, total_steps=7, warmup=2, min_lr_ratio=0.1)
    # decay steps 2..6: progress 0, 1/4, 1/2, 3/4, 1 -> floor + (peak-floor)/2 (1 + cos(pi p))
    expected = [0.2 + 0.9 * (1 + math.cos(math.pi * p)) for p in (0, 0.25, 0.5, 0.75, 1.0)]
    got = [lr_at(s, **kw) for s in range(2, 7)]
    assert got == pytest.approx(expected, abs=1e-15)
    assert got[0] == 2.0 and got[-1] == pytest.approx(0.2)
    assert got[2] == pytest.approx(1.1)


def test_no_warmup_and_single_step() -> None:
    assert lr_at(0, peak_lr=1.0, total_steps=5, warmup=0, min_lr_ratio=0.0) == 1.0
    assert lr_at(4, peak_lr=1.0, total_steps=5, warmup=0, min_lr_ratio=0.0) == pytest.approx(0.0)
    assert lr_at(0, peak_lr=3.0, total_steps=1, warmup=0, min_lr_ratio=0.1) == 3.0


def test_steps_past_the_end_stay_at_floor_and_negative_step_is_refused() -> None:
    assert lr_at(50, peak_lr=1.0, total_steps=10, warmup=2, min_lr_ratio=0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="step=-1"):
        lr_at(-1, peak_lr=1.0, total_steps=10, warmup=2, min_lr_ratio=0.1)


def test_warmup_in_tokens_or_steps_exact_values() -> None:
    # tokens: the same tokens at every batch size, so fewer steps at a larger batch (rounded, >= 1)
    assert warmup_steps(1000, 0.05, tokens=64_000, tokens_per_step=1024) == 62
    assert warmup_steps(1000, 0.05, tokens=64_000, tokens_per_step=16_384) == 4
    assert warmup_steps(1000, 0.05, tokens=10, tokens_per_step=16_384) == 1
    assert warmup_steps(1000, 0.05, tokens=0, tokens_per_step=1024) == 0
    # steps: the same steps at every batch size; never the whole run (the peak lr is reached)
    assert warmup_steps(1000, 0.05, steps=100) == 100
    assert warmup_steps(50, 0.05, steps=100) == 49
    assert warmup_steps(1, 0.5) == 0  # a one-step run has no room for warm-up
