"""Is the answer right on real training? The sweep's own decisions replayed on recorded runs.

    python benchmarks/replay_accuracy.py [--problems 40] [--config nano-t64] [--optimizers adamw,merit]
                                         [--truth held-out|shared]

The problems are `benchmarks/real_runs/<config>.jsonl`, dense grids of real runs of the project's own
training loop (`benchmarks/record_runs.py`): their truth nobody here wrote. Each problem draws what users
differ in: 3 or more consecutive batch sizes of those recorded whole, the lr range given (a log-uniform
sub-range of the recorded one, 1 to 3.5 decades: sometimes missing the optimum), the tolerance (0.5, 1 or
2 %), which recorded seeds play the sweep's (`replay_objective`'s seed offset), and the search's sampler
seed; `sweeps.simulate` sweeps it with the project's default search (2-9 adaptive confirmation seeds).
Against the truth the grid supports (`Recording.truth`: each cell's best stable lr at its most seeds, the
analysis's rule), judged on the seeds held out for it (the recorder's phase 3, `truth_seeds`), which no sweep
or peer plays, so that none of them shares the truth's noise; its own uncertainty is stated: the share of
bootstrap resamples of those seeds (within each lr) that give the same truth. `--truth shared` judges it on
the played seeds instead: the noise ceiling's runs are then 8 of the 12 the truth averages, and share its
noise.

- right: the report's answer equals the truth, per optimizer and reference (self, baseline), with its Wilson
  95 % interval;
- bracket: the report's bracket [largest_fine, smallest_degraded) holds the truth;
- tokens: the sweep's tokens against a 12-lr x 2-seed grid of the same cells trained to their budget;
- the peers on the same problem and the same replayed seeds: the grid itself (`grid_report`), per-cell
  TPE with the search's trials and the first confirmation runs (`tpe_report`), and the noise ceiling: 8
  recorded runs at each cell's true best lr (`ceiling_report`), what seed noise alone leaves of the answer;
- the target per configuration and for all together: right >= max(the grid's + 0.03, the ceiling's - 0.02);
- the stable stratum: the answers whose own truth is the same in >= 90 % of seed resamples, right, the
  ceiling and the bracket there (a bracket judged against a truth that resampling moves misses where the truth
  estimate, not the bracket, is off).

Only batch sizes the recording holds whole (every lr at `seeds` seeds and phases 2 and 3 done, for every
optimizer swept) are drawn from: a partial recording gives smaller problems, said in the output. The last line gives the figures for
every configuration together.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sweeps.replay import Recording, replay_objective  # noqa: E402
from sweeps.spec import SweepSpec  # noqa: E402

GRID = HERE / "real_runs" / "grid.yaml"
TOLERANCES = (0.005, 0.01, 0.02)
REFERENCES = ("self", "baseline")
# per answer (right, covered, tight, grid, tpe, ceiling) or per problem (tokens, truth): what each configuration
# reports
FIGURES = (
    "right",
    "covered",
    "tight",
    "tokens",
    "truth",
    "grid",
    "tpe",
    "ceiling",
    "right_stable",
    "covered_stable",
    "ceiling_stable",
)
# an answer's truth counts as pinned down where this share of seed resamples gives the same (the stable stratum)
STABLE = 0.9


def wilson(hits: int, n: int) -> tuple[float, float]:
    from scipy.stats import binomtest

    if n == 0:
        return math.nan, math.nan
    ci = binomtest(hits, n).proportion_ci(method="wilson")
    return ci.low, ci.high


def whole_cells(rec: Recording, grid: dict[str, Any], optimizers: list[str]) -> list[int]:
    """Batch sizes recorded whole for every optimizer, from the smallest up: every grid lr at `seeds` seeds and
    phases 2 and 3 done (its best lrs at `best_seeds` + `truth_seeds`, none part way), so that each cell's
    truth rests on its many held-out seeds."""
    most = grid["best_seeds"] + grid.get("truth_seeds", 0)

    def whole(by_lr: dict[float, dict[int, Any]], points: int) -> bool:
        counts = [len(s) for s in by_lr.values()]
        return len(counts) >= points and all(c in (grid["seeds"], most) for c in counts) and most in counts

    sizes = []
    for b in grid["batch_sizes"]:
        if not all((o, b) in rec.cells and whole(rec.cells[(o, b)], grid["lrs"][o]["points"]) for o in optimizers):
            break
        sizes.append(b)
    return sizes


@dataclass(frozen=True)
class Drawn:
    """One problem: the sizes, lr range and tolerance a user gives, and which seeds play."""

    sizes: tuple[int, ...]
    lr_min: float
    lr_max: float
    tolerance: float
    seed: int


def draw(k: int, whole: list[int], lo: float, hi: float) -> Drawn:
    rng = random.Random(k)
    n = rng.randint(min(3, len(whole)), len(whole))
    first = rng.randint(0, len(whole) - n)
    decades = rng.uniform(1.0, min(3.5, math.log10(hi / lo)))
    start = rng.uniform(math.log10(lo), math.log10(hi) - decades)
    return Drawn(tuple(whole[first : first + n]), 10**start, 10 ** (start + decades), rng.choice(TOLERANCES), k)


def spec_of(name: str, config: dict[str, Any], optimizers: list[str], d: Drawn) -> SweepSpec:
    keep = ("model", "data", "token_budget", "evaluation")
    return SweepSpec.model_validate(
        {
            "name": f"replay-{name}",
            **{k: v for k, v in config.items() if k in keep},
            "optimizers": [{"name": o} for o in optimizers],
            "batch_sizes": list(d.sizes),
            "lr": {"min": float(f"{d.lr_min:.3g}"), "max": float(f"{d.lr_max:.3g}")},
            "degradation": {"tolerance": d.tolerance, "baseline": optimizers[0]},
            "resources": {"max_concurrent_trials": 4},
        }
    )


def subset(rec: Recording, optimizers: list[str], sizes: tuple[int, ...]) -> Recording:
    return Recording({k: v for k, v in rec.cells.items() if k[0] in optimizers and k[1] in sizes})


def played_and_truth(rec: Recording, grid: dict[str, Any], truth: str = "held-out") -> tuple[Recording, Recording]:
    """(the runs sweeps and peers replay, the runs the truth is judged on): the seeds below phase 3's and the
    held-out ones; with `truth="shared"`, the played seeds both times."""
    played, held = rec.split(grid["best_seeds"])
    return (played, played) if truth == "shared" or not held.cells else (played, held)


GRID_LRS = 12  # the peer: a 12-lr grid over the user's lr range, each lr at 2 seeds


def grid_report(rec: Recording, spec: SweepSpec, seed_offset: int) -> Any:
    """The peer on the same problem and the same replayed seeds: every cell trains GRID_LRS lrs log-spaced over
    the user's range at seeds 1 and 2, to the budget; the lr with the lowest mean of completed runs (both
    completed; `sweeps.analysis.pick_best` over those means) gives the cell's samples; the same report builder
    judges them."""
    import numpy as np

    from sweeps.analysis import TrialResult, build_report, pick_best

    tokens = spec.trained_tokens
    lrs = [float(x) for x in np.geomspace(spec.lr.min, spec.lr.max, GRID_LRS)]
    results: list[TrialResult] = []
    for opt, b in spec.cells():
        means, runs_at = [], {}
        for number, lr in enumerate(lrs):
            runs = []
            for seed in (1, 2):
                final = rec.run(opt, b, lr, seed + seed_offset)(tokens)
                done = math.isfinite(final)
                status = "completed" if done else "diverged"
                runs.append(TrialResult(opt, b, lr, seed, "confirm", status, final if done else None, tokens, 1))
            runs_at[lr] = runs
            done = all(r.status == "completed" for r in runs)
            mean = statistics.fmean(r.val_loss for r in runs) if done else None  # type: ignore[misc]
            means.append(
                TrialResult(opt, b, lr, 0, "search", "completed" if done else "diverged", mean, 0, 0, number=number)
            )
        best = pick_best(means, lambda t: (t.val_loss, t.lr, t.number) if t.val_loss is not None else None)
        results += means + (runs_at[best.lr] if best is not None else [])
    return build_report(results, spec=spec)


def tpe_report(rec: Recording, spec: SweepSpec, seed_offset: int, sampler_seed: int) -> Any:
    """The peer a user of a sweep tool would run, on the same problem and replayed seeds: per cell, Optuna's
    TPE over ln lr in the user's range for the search's trials (seed 0, to the budget), then the sweep's
    first confirmation runs (seeds 1..seeds.min) at its best (`sweeps.analysis.pick_best`), judged by the
    same report builder."""
    import optuna

    from sweeps.analysis import TrialResult, build_report, pick_best

    tokens = spec.trained_tokens
    results: list[TrialResult] = []

    def run(opt: str, b: int, lr: float, seed: int, role: str, number: int | None) -> TrialResult:
        final = rec.run(opt, b, lr, seed + seed_offset)(tokens)
        done = math.isfinite(final)
        status = "completed" if done else "diverged"
        return TrialResult(opt, b, lr, seed, role, status, final if done else None, tokens, 1, number=number)

    for i, (opt, b) in enumerate(spec.cells()):
        sampler = optuna.samplers.TPESampler(seed=sampler_seed + i, n_startup_trials=2)
        study = optuna.create_study(sampler=sampler)
        cell = []
        for number in range(spec.lr.trials_per_batch_size):
            trial = study.ask()
            t = run(opt, b, trial.suggest_float("lr", spec.lr.min, spec.lr.max, log=True), 0, "search", number)
            study.tell(trial, t.val_loss if t.val_loss is not None else math.inf)
            cell.append(t)
        best = pick_best(cell, lambda t: (t.val_loss, t.lr, t.number) if t.val_loss is not None else None)
        if best is not None:
            cell += [run(opt, b, best.lr, s, "confirm", None) for s in range(1, spec.seeds_min + 1)]
        results += cell
    return build_report(results, spec=spec)


ORACLE_SEEDS = 8  # the noise ceiling's runs a cell, at the truth's lr


def ceiling_report(
    rec: Recording, spec: SweepSpec, seed_offset: int, truth: Recording | None = None
) -> tuple[Any, int]:
    """The noise ceiling on the same problem and replayed seeds: every cell trains at the truth's lr
    (`truth.best`, `rec.best` without it: its best stable lr at its most seeds, wherever the user's range lies)
    the sweep's seeds
    1..ORACLE_SEEDS, each played as the sweep's seeds are (seed s: the lr's recorded seed (s + offset) mod n, n
    the seeds recorded there), so ORACLE_SEEDS distinct recorded runs, or all n where the lr has fewer; one
    search entry at that lr (their mean) and the runs as its samples, judged by the same report builder. No
    run there diverged (the truth's lr is one where none did). A cell with no stable lr gets no runs. With
    `truth` the held-out seeds, the ceiling's runs are none of those the truth averages; without it they are
    among them, and the ceiling shares part of the truth's own noise. Returns the report and the number of
    cells given fewer than ORACLE_SEEDS runs."""
    from sweeps.analysis import TrialResult, build_report

    tokens = spec.trained_tokens
    results: list[TrialResult] = []
    short = 0
    for number, (opt, b) in enumerate(spec.cells()):
        lr, _ = (truth or rec).best(opt, b)
        if math.isnan(lr):
            short += 1
            continue
        seeds = range(1, min(ORACLE_SEEDS, len(rec.cells[(opt, b)][lr])) + 1)
        short += len(seeds) < ORACLE_SEEDS
        runs = [
            TrialResult(opt, b, lr, s, "confirm", "completed", rec.run(opt, b, lr, s + seed_offset)(tokens), tokens, 1)
            for s in seeds
        ]
        mean = statistics.fmean(r.val_loss for r in runs)  # type: ignore[misc]
        results += [TrialResult(opt, b, lr, 0, "search", "completed", mean, 0, 0, number=number), *runs]
    return build_report(results, spec=spec), short


def judged(hits: list[float]) -> str:
    """A share of answers and its Wilson 95 % interval."""
    lo, hi = wilson(int(sum(hits)), len(hits))
    return f"{statistics.fmean(hits):.3f} [{lo:.3f}, {hi:.3f}]"


def stratum(out: dict[str, list[float]]) -> str:
    """The answers whose own truth is the same in >= STABLE of seed resamples: right and bracket there."""
    n = len(out["right_stable"])
    if not n:
        return f"no answer's truth is stable in >= {STABLE} of seed resamples"
    return (
        f"where an answer's truth is stable in >= {STABLE} of seed resamples ({n} of {len(out['right'])} answers): "
        f"right {judged(out['right_stable'])} (the noise ceiling {judged(out['ceiling_stable'])}), bracket holds the "
        f"truth {judged(out['covered_stable'])}"
    )


def target_line(out: dict[str, list[float]]) -> str:
    """The issue's target, right >= max(grid + 0.03, ceiling - 0.02), and whether the searcher meets it."""
    right, grid, ceiling = (statistics.fmean(out[k]) for k in ("right", "grid", "ceiling"))
    target = max(grid + 0.03, ceiling - 0.02)
    return f"right >= max(grid + 0.03, ceiling - 0.02) = {target:.3f}: {'met' if right >= target else 'MISSED'}"


def truth_agreement(
    rec: Recording, d: Drawn, optimizers: list[str], resamples: int = 100
) -> tuple[float, dict[tuple[str, str], float]]:
    """Share of bootstrap resamples of the recorded seeds (within each lr) whose truth equals the full data's:
    the whole truth (every optimizer and reference), and each answer's own, by (optimizer, reference)."""
    rng = random.Random(1000 + d.seed)
    full = rec.truth(d.tolerance, optimizers[0], optimizers)
    same = 0
    each = dict.fromkeys(((o, r) for o in optimizers for r in REFERENCES), 0)
    for _ in range(resamples):
        cells = {
            key: {lr: dict(enumerate(rng.choices(list(seeds.values()), k=len(seeds)))) for lr, seeds in by_lr.items()}
            for key, by_lr in rec.cells.items()
        }
        truth = Recording(cells).truth(d.tolerance, optimizers[0], optimizers)
        same += truth == full
        for o, r in each:
            each[(o, r)] += truth[o][r] == full[o][r]
    return same / resamples, {k: v / resamples for k, v in each.items()}


def run_config(
    name: str, grid: dict[str, Any], optimizers: list[str], problems: int, truth_from: str = "held-out"
) -> dict[str, list[float]] | None:
    from sweeps.simulate import simulate

    path = GRID.parent / f"{name}.jsonl"
    if not path.exists():
        print(f"{name}: nothing recorded yet ({path})")
        return None
    rec = Recording.load(path)
    whole = whole_cells(rec, grid, optimizers)
    played, held = played_and_truth(rec, grid, truth_from)
    if len(whole) < 2:
        print(f"{name}: fewer than 2 batch sizes recorded whole for {optimizers}; record more")
        return None
    lo = min(grid["lrs"][o]["min"] for o in optimizers)
    hi = max(grid["lrs"][o]["max"] for o in optimizers)
    out: dict[str, list[float]] = {k: [] for k in FIGURES}
    short = 0
    for k in range(problems):
        d = draw(k, whole, lo, hi)
        spec = spec_of(name, grid["configs"][name], optimizers, d)
        sub, judge = subset(played, optimizers, d.sizes), subset(held, optimizers, d.sizes)
        truth = judge.truth(d.tolerance, optimizers[0], optimizers)
        stable, stable_each = truth_agreement(judge, d, optimizers)
        out["truth"].append(stable)
        result = simulate(spec, replay_objective(sub, seed_offset=d.seed), seed=d.seed)
        ceiling, missing = ceiling_report(sub, spec, d.seed, truth=judge)
        short += missing
        peers = {
            "grid": grid_report(sub, spec, d.seed),
            "tpe": tpe_report(sub, spec, d.seed, d.seed),
            "ceiling": ceiling,
        }
        out["tokens"].append(result.tokens_trained / (len(optimizers) * len(d.sizes) * 12 * 2 * spec.trained_tokens))
        for opt in optimizers:
            report = result.report.optimizers[opt]
            for ref in REFERENCES:
                t = truth[opt][ref]
                out["right"].append(int(getattr(report.largest_degradation_free_batch_size, ref) == t))
                for peer, r in peers.items():
                    out[peer].append(int(getattr(r.optimizers[opt].largest_degradation_free_batch_size, ref) == t))
                b = getattr(report.bracket, ref)
                fine, bad = b.largest_fine, b.smallest_degraded
                covered = fine is None if t is None else (fine is None or fine <= t) and (bad is None or t < bad)
                out["covered"].append(int(covered))
                if stable_each[(opt, ref)] >= STABLE:  # the stratum whose truth the held-out seeds pin down
                    out["right_stable"].append(out["right"][-1])
                    out["covered_stable"].append(int(covered))
                    out["ceiling_stable"].append(out["ceiling"][-1])
                # decided to neighbouring listed sizes (or to an end of the list)
                at_fine = -1 if fine is None else d.sizes.index(fine)
                at_bad = len(d.sizes) if bad is None else d.sizes.index(bad)
                out["tight"].append(int(at_bad == at_fine + 1))
    right = out["right"]
    r_lo, r_hi = wilson(int(sum(right)), len(right))
    print(
        f"{name}: {problems} problems over batch sizes {whole}, the truth judged on "
        f"{'the played' if held is played else 'held-out'} seeds; right {statistics.fmean(right):.3f} "
        f"[{r_lo:.3f}, {r_hi:.3f}] (the 12 x 2 grid {statistics.fmean(out['grid']):.3f}, TPE per cell "
        f"{statistics.fmean(out['tpe']):.3f}), bracket holds the truth {statistics.fmean(out['covered']):.3f} and is tight "
        f"(neighbours) in {statistics.fmean(out['tight']):.3f}, tokens vs the "
        f"12x2 grid {statistics.fmean(out['tokens']):.2f}; the truth itself stable in "
        f"{statistics.fmean(out['truth']):.2f} of seed resamples"
    )
    print(
        f"  {name}: right {judged(right)}, the 12 x 2 grid {judged(out['grid'])}, TPE per cell {judged(out['tpe'])}, "
        f"the {ORACLE_SEEDS}-seed noise ceiling {judged(out['ceiling'])}; {target_line(out)}"
        + (f"; {short} cells had fewer than {ORACLE_SEEDS} recorded seeds at the truth's lr" if short else "")
    )
    print(f"  {name}: {stratum(out)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--config", action="append")
    ap.add_argument("--optimizers", default="adamw,merit", help="comma-separated; the first is the baseline")
    ap.add_argument(
        "--truth", choices=("held-out", "shared"), default="held-out", help="the seeds the truth is judged on"
    )
    args = ap.parse_args()
    grid = yaml.safe_load(GRID.read_text())
    optimizers = args.optimizers.split(",")
    started = time.perf_counter()
    totals: dict[str, list[float]] = {k: [] for k in FIGURES}
    for name in args.config or list(grid["configs"]):
        for key, values in (run_config(name, grid, optimizers, args.problems, args.truth) or {}).items():
            totals[key] += values
    if not totals["right"]:
        raise SystemExit("no configuration is recorded far enough to replay (benchmarks/record_runs.py)")
    print(
        f"replayed real runs ({time.perf_counter() - started:.0f} s): right {judged(totals['right'])}, noise ceiling "
        f"{judged(totals['ceiling'])}, the 12x2 grid {judged(totals['grid'])}, TPE per cell {judged(totals['tpe'])}; "
        f"bracket {statistics.fmean(totals['covered']):.3f} (target >= 0.95), tight {statistics.fmean(totals['tight']):.3f}, "
        f"tokens vs the 12x2 grid {statistics.fmean(totals['tokens']):.2f} (target <= 0.5), truth stable "
        f"{statistics.fmean(totals['truth']):.2f}; {target_line(totals)}; {stratum(totals)}"
    )


if __name__ == "__main__":
    main()
