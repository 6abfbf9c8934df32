import math

import pytest

from sweeps.plan import cell_key, cell_order, run_name, study_name, warm_start_lrs


def test_cell_order_puts_small_batches_first_and_interleaves_optimizers() -> None:
    assert cell_order(["adamw", "merit"], [16, 32]) == [("adamw", 16), ("merit", 16), ("adamw", 32), ("merit", 32)]


def test_warm_start_is_unscaled_and_sqrt_scaled() -> None:
    # bs 16 -> 64: ratio 4, sqrt rule doubles the lr
    assert warm_start_lrs(1e-3, 16, 64, lr_min=1e-4, lr_max=1e-1) == [1e-3, 2e-3]


def test_warm_start_clips_to_range_and_drops_duplicates() -> None:
    # both candidates clip to lr_max: one point, not two copies
    assert warm_start_lrs(0.05, 8, 32, lr_min=1e-4, lr_max=0.05) == [0.05]
    lrs = warm_start_lrs(0.04, 8, 32, lr_min=1e-4, lr_max=0.05)
    assert lrs == [0.04, 0.05]


def test_warm_start_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="prev_batch_size=0"):
        warm_start_lrs(1e-3, 0, 32, lr_min=1e-4, lr_max=1e-1)


def test_names_are_readable_and_stable() -> None:
    assert cell_key("merit", 64) == "merit/bs64"
    assert study_name("demo", "merit", 64) == "demo/merit/bs64"
    assert run_name("merit", 64, 3.1e-3, 1) == "merit bs=64 lr=3.1e-03 seed=1"
    assert run_name("merit", 64) == "merit bs=64"
    assert math.isclose(float(run_name("adamw", 8, 0.0123, 0).split("lr=")[1].split()[0]), 0.012)
