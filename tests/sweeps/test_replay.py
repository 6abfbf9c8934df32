"""Recorded runs replayed (sweeps/replay.py): interpolation in ln lr, one seed across lrs, divergence from the
nearer recorded run, and the truth the grid supports. Exact values on a small hand-written recording."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sweeps.replay import Recording, largest_degradation_free, replay_objective
from sweeps.simulate import Run


def run(opt: str, b: int, lr: float, seed: int, losses: list[float], diverged_at: int | None = None) -> dict:
    curve = [[1000 * (i + 1), v] for i, v in enumerate(losses)]
    status = "diverged" if diverged_at is not None else "completed"
    return {"optimizer": opt, "batch_size": b, "lr": lr, "seed": seed, "status": status,
            "stopped_at": diverged_at or 1000 * len(losses), "curve": curve, "train_time_s": 1.0}  # fmt: skip


@pytest.fixture
def rec(tmp_path: Path) -> Recording:
    runs = [
        run("adamw", 4, 0.001, 0, [5.0, 4.0]),
        run("adamw", 4, 0.001, 1, [5.2, 4.2]),
        run("adamw", 4, 0.01, 0, [4.0, 3.0]),
        run("adamw", 4, 0.01, 1, [4.4, 3.2]),
        run("adamw", 4, 0.01, 2, [4.2, 3.1]),
        run("adamw", 4, 0.1, 0, [4.5], diverged_at=1500),
        run("adamw", 4, 0.1, 1, [4.6, 3.9]),
        run("adamw", 8, 0.001, 0, [5.5, 4.5]),
        run("adamw", 8, 0.01, 0, [4.1, 3.3]),
        run("adamw", 8, 0.1, 0, [4.0, 3.05]),
    ]
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in runs) + '\n{"cut short')  # a killed recorder's last line
    return Recording.load(path)


def test_an_lr_between_two_recorded_ones_interpolates_their_curves_in_ln_lr(rec: Recording) -> None:
    lr = math.sqrt(0.001 * 0.01)  # halfway in ln lr
    loss = rec.run("adamw", 4, lr, 0)
    assert loss(1000) == pytest.approx(4.5) and loss(2000) == pytest.approx(3.5)
    # a seed is the same recorded seed at both lrs: seed 1 -> 1, seed 2 -> 0 (seeds 0, 1 recorded at both)
    assert rec.run("adamw", 4, lr, 1)(2000) == pytest.approx(3.7)
    assert rec.run("adamw", 4, lr, 2)(2000) == pytest.approx(3.5)
    assert rec.run("adamw", 4, 0.0001, 0)(2000) == 4.0  # below the grid: its lowest lr


def test_divergence_follows_the_nearer_recorded_run(rec: Recording) -> None:
    near_edge = 0.1 * 0.8  # nearer 0.1, where seed 0 diverged at 1500 tokens
    assert rec.run("adamw", 4, near_edge, 0)(1000) == 4.5 and rec.run("adamw", 4, near_edge, 0)(2000) == math.inf
    assert math.isfinite(rec.run("adamw", 4, near_edge, 1)(2000))  # seed 1 did not diverge there
    farther = 0.01 * 1.3  # nearer 0.01: trains, on 0.01's curve alone where 0.1's has no loss
    assert rec.run("adamw", 4, farther, 0)(2000) == 3.0


def test_the_objective_stops_at_the_first_divergence(rec: Recording) -> None:
    objective = replay_objective(rec)
    r = Run(optimizer="adamw", batch_size=4, lr=0.1, seed=0, eval_tokens=(1000, 2000))
    assert objective(r) == [4.5, math.inf]
    assert objective(Run("adamw", 4, 0.01, 1, eval_tokens=(1000, 2000))) == [4.4, 3.2]


def test_the_truth_takes_each_cells_best_stable_lr_at_its_most_seeds(rec: Recording) -> None:
    # bs4: 0.01 has 3 seeds (the most), mean 3.1; 0.1 had a divergence and fewer seeds anyway
    assert rec.best("adamw", 4) == (0.01, pytest.approx(3.1))
    assert rec.best("adamw", 8) == (0.1, 3.05)  # one seed each: all count
    assert rec.truth(tolerance=0.0, baseline="adamw") == {"adamw": {"self": 8, "baseline": 8}}
    assert largest_degradation_free([3.1, 3.2], 3.1, 0.01, first_is_reference=True) == 0


def test_a_seed_offset_replays_another_recorded_seed(rec: Recording) -> None:
    r = Run("adamw", 4, 0.01, 0, eval_tokens=(1000, 2000))
    assert replay_objective(rec, seed_offset=1)(r) == [4.4, 3.2]  # seed 0 plays recorded seed 1
    assert replay_objective(rec, seed_offset=2)(r) == [4.2, 3.1]  # and recorded seed 2 where 0.01 is exact


def test_a_split_keeps_the_truths_held_out_seeds_from_what_a_sweep_replays(rec: Recording) -> None:
    played, held = rec.split(2)
    assert sorted(played.cells[("adamw", 4)][0.01]) == [0, 1] and sorted(held.cells[("adamw", 4)][0.01]) == [2]
    assert sorted(held.cells[("adamw", 4)]) == [0.01]  # only 0.01 has a seed >= 2
    assert ("adamw", 8) not in held.cells
    # a sweep's seed 2 plays recorded seed 0 (2 mod the 2 played seeds), never the held-out seed 2
    assert replay_objective(played)(Run("adamw", 4, 0.01, 2, eval_tokens=(1000, 2000))) == [4.0, 3.0]
    assert held.best("adamw", 4) == (0.01, 3.1)
    assert played.best("adamw", 4) == (0.01, pytest.approx(3.1))  # (3.0 + 3.2) / 2 at its 2 seeds
