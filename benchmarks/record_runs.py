"""Record dense grids of real training runs: problem families whose truth nobody here wrote.

    python benchmarks/record_runs.py [--grid benchmarks/real_runs/grid.yaml] [--minutes 30] [--config NAME]
    python benchmarks/record_runs.py --status
    python benchmarks/record_runs.py --compact     # one line per run, after two recorders shared a file

Every run is the project's own training loop (`worker.loop.train`, one process, `--threads` torch threads)
on this machine, no Ray: for each configuration of the grid file, each optimizer, batch size, lr and seed,
the val loss at every evaluation and how the run ended (completed or diverged). Phase 1 trains every grid
point at `seeds` seeds; phase 2, once a cell's phase 1 is whole, `best_seeds` seeds at its `best_lrs` lrs
of lowest mean final loss (the noise at the optimum is what decides a boundary); phase 3, `truth_seeds` more
seeds at the same lrs, held out: the truth is judged on them alone and no replayed sweep plays them, so that
neither a sweep nor the noise ceiling shares the truth's noise. Cells go from the smallest
batch size up, so a partial recording is whole cells that a sweep of the sizes recorded can replay.

Resumable: each finished run is one line of `benchmarks/real_runs/<config>.jsonl`, written whole (flushed)
before the next starts; a run already there is never trained again, so recording goes on in pieces
(`--minutes` each) and a killed recorder loses at most the run it was training. The data is curves, not
checkpoints: a few hundred bytes a run. `--status` prints how far each configuration is.

`sweeps.replay.replay_objective` answers any (optimizer, batch size, lr, seed) from these files for
`sweeps.simulate`, and `sweeps.replay.recorded_truth` gives the answer the grid supports.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
DEFAULT_GRID = HERE / "real_runs" / "grid.yaml"


def load_grid(path: Path) -> dict[str, Any]:
    grid = yaml.safe_load(path.read_text())
    for key in ("configs", "optimizers", "batch_sizes", "lrs", "seeds", "best_seeds", "best_lrs"):
        if key not in grid:
            raise SystemExit(f"{path}: missing {key!r}")
    return grid


def lr_grid(spec: dict[str, float]) -> list[float]:
    """`{min, max, points}` -> `points` log-spaced lrs from min to max (rounded to 4 significant digits)."""
    lo, hi, n = float(spec["min"]), float(spec["max"]), int(spec["points"])
    return [float(f"{lo * (hi / lo) ** (i / (n - 1)):.4g}") for i in range(n)]


def run_key(optimizer: str, batch_size: int, lr: float, seed: int) -> tuple[str, int, float, int]:
    return optimizer, int(batch_size), float(f"{lr:.4g}"), int(seed)


def recorded(path: Path) -> dict[tuple[str, int, float, int], dict[str, Any]]:
    """The runs of one file by key; a last line cut short (a killed recorder) is ignored."""
    out: dict[tuple[str, int, float, int], dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            run = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[run_key(run["optimizer"], run["batch_size"], run["lr"], run["seed"])] = run
    return out


def final_loss(run: dict[str, Any]) -> float:
    return float(run["curve"][-1][1]) if run["status"] == "completed" and run["curve"] else math.inf


def planned(grid: dict[str, Any], runs: dict[tuple[str, int, float, int], dict[str, Any]]) -> list[tuple]:
    """Runs still to train, cell by cell (batch sizes from the smallest; the first two optimizers over every size,
    then the others): a cell's phase 1, then its phase 2 once its phase 1 is whole. A partial recording is then
    whole cells from the smallest batch size up, which is what a sweep of the recorded sizes needs
    (`benchmarks/replay_accuracy.py`)."""
    todo = []
    # the first two optimizers (the baseline and the one it is compared with) over every size first, then the rest
    first, rest = grid["optimizers"][:2], grid["optimizers"][2:]
    order = [(b, o) for group in (first, rest) for b in grid["batch_sizes"] for o in group]
    for b, opt in order:
        lrs = lr_grid(grid["lrs"][opt])
        keys = [[run_key(opt, b, lr, s) for s in range(grid["seeds"])] for lr in lrs]
        missing = [k for s in range(grid["seeds"]) for row in keys for k in [row[s]] if k not in runs]
        if missing:
            todo += missing
            continue
        mean = [sum(final_loss(runs[k]) for k in row) / len(row) for row in keys]
        best = sorted(range(len(lrs)), key=lambda i: mean[i])[: grid["best_lrs"]]
        # phase 2's seeds, then phase 3's: `truth_seeds` more at the same lrs, which no replayed sweep plays
        for seed in range(grid["seeds"], grid["best_seeds"] + grid.get("truth_seeds", 0)):
            for i in best:
                if math.isfinite(mean[i]) and (key := run_key(opt, b, lrs[i], seed)) not in runs:
                    todo.append(key)
    return todo


def train_one(config: dict[str, Any], key: tuple[str, int, float, int], threads: int) -> dict[str, Any]:
    from worker.config import TrainConfig
    from worker.loop import train
    from worker.session import LocalSession

    opt, b, lr, seed = key
    cfg = TrainConfig.model_validate(
        {
            **config,
            "optimizer": {"name": opt, "lr": lr},
            "batch_size": b,
            "seed": seed,
            "resources": {"cpus_per_worker": threads},
            "evaluation": {**config.get("evaluation", {}), "probe_attention": False},
            "checkpoints": {"every_tokens": 0},
        }
    )
    session = LocalSession()
    started = time.perf_counter()
    final = train(cfg, session)
    curve = [
        [int(r["tokens"]), float(r["val_loss"])] for r in session.reports if math.isfinite(r.get("val_loss", math.nan))
    ]
    # a diverged run's curve ends at its last good evaluation; `stopped_at` is where it diverged
    return {
        "optimizer": opt, "batch_size": b, "lr": lr, "seed": seed, "status": final["status"],
        "stopped_at": int(final["tokens"]), "curve": curve, "train_time_s": round(time.perf_counter() - started, 2),
    }  # fmt: skip


def status(grid: dict[str, Any], out_dir: Path) -> None:
    for name in grid["configs"]:
        runs = recorded(out_dir / f"{name}.jsonl")
        phase1 = len(grid["seeds"] * [0]) * len(grid["optimizers"]) * len(grid["batch_sizes"])
        phase1 *= max(len(lr_grid(v)) for v in grid["lrs"].values())
        secs = sum(r["train_time_s"] for r in runs.values())
        print(f"{name}: {len(runs)} runs recorded ({phase1} in phase 1), {secs / 3600:.2f} h of training; "
              f"{len(planned(grid, runs))} planned now")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=Path, default=DEFAULT_GRID)
    ap.add_argument("--config", action="append", help="only this configuration (repeatable); default all")
    ap.add_argument("--minutes", type=float, default=30.0, help="stop starting runs after this long")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--status", action="store_true")
    ap.add_argument(
        "--compact", action="store_true", help="rewrite each file with one line per run (no recorder running)"
    )
    args = ap.parse_args()
    grid = load_grid(args.grid)
    out_dir = args.grid.parent
    if args.compact:
        for name in grid["configs"]:
            path = out_dir / f"{name}.jsonl"
            if path.exists():  # two recorders of one file may both have trained a run: one line each is kept
                runs = recorded(path)
                path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in runs.values()))
    if args.status or args.compact:
        status(grid, out_dir)
        return
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    deadline = time.monotonic() + args.minutes * 60
    names = args.config or list(grid["configs"])
    done: dict[str, int] = defaultdict(int)
    while time.monotonic() < deadline:
        progressed = False
        for name in names:  # one run of each configuration in turn: both grow together
            path = out_dir / f"{name}.jsonl"
            todo = planned(grid, recorded(path))
            if not todo or time.monotonic() >= deadline:
                continue
            run = train_one(grid["configs"][name], todo[0], args.threads)
            with path.open("a") as f:
                f.write(json.dumps(run, separators=(",", ":")) + "\n")
                f.flush()
                os.fsync(f.fileno())
            done[name] += 1
            progressed = True
        if not progressed:
            break
    print(", ".join(f"{n}: +{k} runs" for n, k in done.items()) or "nothing to record", file=sys.stderr)
    status(grid, out_dir)


if __name__ == "__main__":
    main()
