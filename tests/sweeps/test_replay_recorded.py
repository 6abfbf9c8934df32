"""The recorded real runs (benchmarks/real_runs/) are what the project's worker trains, and a sweep replays them
end to end: a recorded run trained again gives its recorded curve, and `sweeps.simulate` sweeps the recording
to a report."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeps.replay import Recording, replay_objective
from sweeps.simulate import simulate

RUNS = Path(__file__).resolve().parents[2] / "benchmarks" / "real_runs"
GRID = yaml.safe_load((RUNS / "grid.yaml").read_text())


def benchmark_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, RUNS.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def recorded_lines(config: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (RUNS / f"{config}.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("config", sorted(GRID["configs"]))
def test_a_recorded_run_trained_again_gives_its_recorded_curve(config: str) -> None:
    record = benchmark_module("record_runs")
    runs = recorded_lines(config)
    # the quickest completed run recorded (the largest batch: fewest steps), trained again as the recorder does
    run = max((r for r in runs if r["status"] == "completed"), key=lambda r: (r["batch_size"], -r["lr"]))
    key = record.run_key(run["optimizer"], run["batch_size"], run["lr"], run["seed"])
    again = record.train_one(GRID["configs"][config], key, threads=1)
    assert again["status"] == "completed" and [t for t, _ in again["curve"]] == [t for t, _ in run["curve"]]
    for (_, got), (_, want) in zip(again["curve"], run["curve"], strict=True):
        assert got == pytest.approx(want, rel=1e-4)


def test_the_recording_is_swept_end_to_end() -> None:
    replay = benchmark_module("replay_accuracy")
    config = "nano-t64"
    rec = Recording.load(RUNS / f"{config}.jsonl")
    optimizers = ["adamw", "merit"]
    whole = replay.whole_cells(rec, GRID, optimizers)
    assert len(whole) >= 2, f"record more of {config} first (benchmarks/record_runs.py): whole batch sizes {whole}"
    drawn = replay.Drawn(tuple(whole[:2]), 1e-4, 0.3, 0.01, seed=0)
    spec = replay.spec_of(config, GRID["configs"][config], optimizers, drawn)
    result = simulate(spec, replay_objective(replay.subset(rec, optimizers, drawn.sizes)), seed=0)
    assert result.trials > 0 and result.report.optimizers.keys() == set(optimizers)
    truth = replay.subset(rec, optimizers, drawn.sizes).truth(0.01, "adamw", optimizers)
    for opt in optimizers:
        answer = result.report.optimizers[opt].largest_degradation_free_batch_size.self
        assert answer is None or answer in drawn.sizes
        assert truth[opt]["self"] is None or truth[opt]["self"] in drawn.sizes
        # every cell swept has a best lr among those the replay could answer from
        for cell in result.report.optimizers[opt].cells:
            assert cell.best_lr is None or math.isfinite(cell.best_lr)
    # the grid peer, on the same problem: 12 lrs over the user's range, its best lr's 2 seeds as the samples
    grid = replay.grid_report(replay.subset(rec, optimizers, drawn.sizes), spec, seed_offset=0)
    lrs = [spec.lr.min * (spec.lr.max / spec.lr.min) ** (i / 11) for i in range(12)]
    for opt in optimizers:
        for cell in grid.optimizers[opt].cells:
            assert (
                any(math.isclose(cell.best_lr, lr) for lr in lrs) and cell.seeds == 2 and cell.trials == 14
            )  # 12 means + 2 runs
    # and TPE per cell: the search's trials, then the first confirmation runs at its best
    tpe = replay.tpe_report(replay.subset(rec, optimizers, drawn.sizes), spec, seed_offset=0, sampler_seed=0)
    for opt in optimizers:
        for cell in tpe.optimizers[opt].cells:
            assert spec.lr.min <= cell.best_lr <= spec.lr.max and cell.seeds == spec.seeds_min
            assert cell.trials == spec.lr.trials_per_batch_size + spec.seeds_min


def test_the_noise_ceiling_trains_the_truths_lr_at_the_sweeps_replayed_seeds() -> None:
    replay = benchmark_module("replay_accuracy")
    config, optimizers = "nano-t64", ["adamw", "merit"]
    drawn = replay.Drawn((4, 8), 1e-4, 0.3, 0.01, seed=5)
    spec = replay.spec_of(config, GRID["configs"][config], optimizers, drawn)
    played, held = replay.played_and_truth(Recording.load(RUNS / f"{config}.jsonl"), GRID)
    rec, truth = (replay.subset(r, optimizers, drawn.sizes) for r in (played, held))
    # the truth is judged on the held-out seeds alone, at the played seeds' best lrs
    for key, by_lr in truth.cells.items():
        assert set(by_lr) <= set(rec.cells[key])
        assert all(len(seeds) == GRID["truth_seeds"] and min(seeds) >= GRID["best_seeds"] for seeds in by_lr.values())
    assert all(max(seeds) < GRID["best_seeds"] for by_lr in rec.cells.values() for seeds in by_lr.values())
    # adamw at 4 keeps 3 played seeds at every lr, so 3 at the truth's lr
    rec.cells[("adamw", 4)] = {lr: dict(sorted(by_seed.items())[:3]) for lr, by_seed in rec.cells[("adamw", 4)].items()}
    report, short = replay.ceiling_report(rec, spec, seed_offset=drawn.seed, truth=truth)
    assert short == 1
    for opt in optimizers:
        for cell in report.optimizers[opt].cells:
            lr = truth.best(opt, cell.batch_size)[0]
            recorded = rec.cells[(opt, cell.batch_size)][lr]
            seeds = sorted(recorded)
            # seed s plays recorded seed (s + 5) mod n, as in the sweep: 8 distinct runs, or all 3 kept
            want = [recorded[seeds[(s + 5) % len(seeds)]].final for s in range(1, min(8, len(seeds)) + 1)]
            assert cell.best_lr == lr and cell.val_losses == want and len(set(want)) == len(want)
    assert len(report.optimizers["adamw"].cells[0].val_losses) == 3
