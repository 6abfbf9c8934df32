"""Is the answer right on real training? The sweep's own decisions replayed on recorded runs.

    python benchmarks/replay_accuracy.py [--problems 40] [--config nano-t64] [--optimizers adamw,merit]

The problems are `benchmarks/real_runs/<config>.jsonl`, dense grids of real runs of the project's own
training loop (`benchmarks/record_runs.py`): their truth nobody here wrote. Each problem is the recording
with another draw of its seed noise (`replay_objective`'s seed offset) and of the search's own sampler
seed, swept by `sweeps.simulate` at the recording's configuration with the project's default search (an lr
range that spans the recorded one, 2-9 adaptive confirmation seeds, tolerance 1 %). Against the truth the
grid supports (`Recording.truth`: each cell's best stable lr at its most seeds, the analysis's rule):

- right: the report's answer equals the truth, per optimizer and reference (self, baseline), with its Wilson
  95 % interval;
- bracket: the report's bracket [largest_fine, smallest_degraded) holds the truth;
- tokens: the sweep's tokens against a 12-lr x 2-seed grid of the same cells trained to their budget.

Only the cells the recording holds whole (every lr at `seeds` seeds) are swept: a partial recording gives a
smaller problem, said in the output. The last line gives the figures for every configuration together.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sweeps.replay import Recording, replay_objective  # noqa: E402
from sweeps.spec import SweepSpec  # noqa: E402

GRID = HERE / "real_runs" / "grid.yaml"
TOLERANCE = 0.01
REFERENCES = ("self", "baseline")


def wilson(hits: int, n: int) -> tuple[float, float]:
    from scipy.stats import binomtest

    if n == 0:
        return math.nan, math.nan
    ci = binomtest(hits, n).proportion_ci(method="wilson")
    return ci.low, ci.high


def whole_cells(rec: Recording, grid: dict[str, Any], optimizers: list[str]) -> list[int]:
    """Batch sizes recorded whole (every grid lr at `seeds` seeds) for every optimizer, from the smallest up."""
    sizes = []
    for b in grid["batch_sizes"]:
        ok = all(
            (o, b) in rec.cells
            and len(rec.cells[(o, b)]) >= grid["lrs"][o]["points"]
            and all(len(s) >= grid["seeds"] for s in rec.cells[(o, b)].values())
            for o in optimizers
        )
        if not ok:
            break
        sizes.append(b)
    return sizes


def spec_of(
    name: str, config: dict[str, Any], grid: dict[str, Any], optimizers: list[str], sizes: list[int]
) -> SweepSpec:
    lo = min(grid["lrs"][o]["min"] for o in optimizers)
    hi = max(grid["lrs"][o]["max"] for o in optimizers)
    return SweepSpec.model_validate(
        {
            "name": f"replay-{name}",
            **{
                k: v
                for k, v in config.items()
                if k in ("model", "data", "token_budget", "eval_every_tokens", "eval_tokens")
            },
            "optimizers": [{"name": o} for o in optimizers],
            "batch_sizes": sizes,
            "lr": {"min": lo, "max": hi},
            "degradation": {"tolerance": TOLERANCE, "baseline": optimizers[0]},
            "resources": {"max_concurrent_trials": 4},
        }
    )


def run_config(name: str, grid: dict[str, Any], optimizers: list[str], problems: int) -> dict[str, list[int]] | None:
    from sweeps.simulate import simulate

    path = GRID.parent / f"{name}.jsonl"
    if not path.exists():
        print(f"{name}: nothing recorded yet ({path})")
        return None
    rec = Recording.load(path)
    sizes = whole_cells(rec, grid, optimizers)
    if len(sizes) < 2:
        print(f"{name}: fewer than 2 batch sizes recorded whole for {optimizers}; record more")
        return None
    spec = spec_of(name, grid["configs"][name], grid, optimizers, sizes)
    sub = Recording({k: v for k, v in rec.cells.items() if k[0] in optimizers and k[1] in sizes})
    truth = sub.truth(TOLERANCE, optimizers[0], optimizers)
    grid_tokens = len(optimizers) * len(sizes) * 12 * 2 * spec.trained_tokens
    right: list[int] = []
    covered: list[int] = []
    tokens: list[float] = []
    for k in range(problems):
        result = simulate(spec, replay_objective(sub, seed_offset=k), seed=k)
        tokens.append(result.tokens_trained / grid_tokens)
        for opt in optimizers:
            report = result.report.optimizers[opt]
            for ref in REFERENCES:
                t = truth[opt][ref]
                right.append(int(getattr(report.largest_degradation_free_batch_size, ref) == t))
                b = getattr(report.bracket, ref)
                lo, hi = b.largest_fine, b.smallest_degraded
                if t is None:
                    covered.append(int(lo is None))
                else:
                    covered.append(int((lo is None or lo <= t) and (hi is None or t < hi)))
    r_lo, r_hi = wilson(sum(right), len(right))
    print(
        f"{name}: batch sizes {sizes}, truth {truth}; right {sum(right) / len(right):.3f} [{r_lo:.3f}, {r_hi:.3f}], "
        f"bracket holds the truth {sum(covered) / len(covered):.3f}, tokens vs the 12x2 grid "
        f"{sum(tokens) / len(tokens):.2f} ({problems} problems)"
    )
    return {"right": right, "covered": covered, "tokens": [round(1000 * t) for t in tokens]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--config", action="append")
    ap.add_argument("--optimizers", default="adamw,merit", help="comma-separated; the first is the baseline")
    args = ap.parse_args()
    grid = yaml.safe_load(GRID.read_text())
    optimizers = args.optimizers.split(",")
    started = time.perf_counter()
    totals: dict[str, list[int]] = {"right": [], "covered": [], "tokens": []}
    for name in args.config or list(grid["configs"]):
        out = run_config(name, grid, optimizers, args.problems)
        for key, values in (out or {}).items():
            totals[key] += values
    if not totals["right"]:
        raise SystemExit("no configuration is recorded far enough to replay (benchmarks/record_runs.py)")
    n = len(totals["right"])
    print(
        f"replayed real runs ({time.perf_counter() - started:.0f} s): right {sum(totals['right']) / n:.3f} "
        f"(target >= 0.90), bracket {sum(totals['covered']) / len(totals['covered']):.3f} (target >= 0.95), "
        f"tokens vs the 12x2 grid {sum(totals['tokens']) / len(totals['tokens']) / 1000:.2f} (target <= 0.5)"
    )


if __name__ == "__main__":
    main()
