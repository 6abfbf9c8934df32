"""Does the per-cell search find the grid's answer for much less compute?

    python benchmarks/search_efficiency.py [--problems 200] [--concurrency 4] [--sigma 0.01] [--seed 0]
    python benchmarks/search_efficiency.py --real [--spec benchmarks/specs/real_tiny.yaml]

    python benchmarks/search_efficiency.py --family cliffs|noise-scale [--seeds 2]

Targets: the answer equals the truth in >= max(the 12-lr x 2-seed grid's + 0.03, the noise ceiling's -
0.02) of answers on the same problems (the ceiling: 8 completed runs at each cell's true best lr, judged by
the same report builder: what seed noise alone leaves); the report's bracket holds the truth in >= 95% of answers, and of the answers
resting on an edge-bound cell; <= 0.5 of that grid's tokens. The last line gives the three figures. Three
families of problems: "bowls" (below, the
family the search was first tuned on) and "cliffs" (`make_cliff_problem`: valleys 2-4x steeper above
the optimum, a divergence cliff that closes in on the optimum as the batch grows, lr* from B^0 to B^1
or saturating, optima up to 2.5x past lr.max, seed noise that grows with the batch size and near the
cliff and is shared by a seed across cells, 3% of runs ending on a loss spike), and "noise-scale"
(`make_noise_scale_problem`, written from the literature rather than from this method's assumptions:
the loss at the fixed budget from McCandlish et al.'s effective data E / (1 + B / B_noise), Adam's
optimum lr rising as sqrt(B) and falling past B_noise (Li et al. 2024), a stability edge that falls with
the batch so that the larger cells' best lr sits at the edge, with the cliffs' shared seed noise, noise
near the edge and spikes, and the user's lr range a guess). The answers that rest on a cell whose best lr
is the edge are a stratum of their own in the table. Peers on the same
problems and noise: per-cell Optuna TPE (the searcher's trials + confirmation seeds), a 12-lr grid once
+ confirmation seeds, and the 12-lr x seeds grid. Accuracy comes with Wilson 95% intervals and the
paired difference to the grid with its 95% interval.

Simulation (the default). The project's own code does the searching and the judging: `CellSearcher`
and `PerCellASHA` (sweeps/search/, sweeps/scheduler.py) are driven through Tune's calls, as Tune's controller makes them
(`suggest`; per result `PerCellASHA.on_trial_result`, then `CellSearcher.on_trial_result` unless
stopped; a result with `done` stops the trial without asking the scheduler; a stop calls both
`on_trial_complete`s), with `max_concurrent_trials` slots in a discrete-event loop, against an
in-memory Optuna storage; then `sweeps.driver.collect_results` and `sweeps.analysis.build_report`
give the answer. Only training is simulated: each trial's reports are those `worker.loop.train`
would send (an eval every `eval_interval_steps` steps with `tokens`, `step`, `val_loss`, `status`,
`done`; a diverged run's last report carries its last good metrics) from a synthetic objective:

- optimum lr per batch size: lr*(B) = lr0 x (B / B0)^alpha, alpha ~ U[0.3, 0.7] per optimizer, lr0
  log-uniform such that lr*(B) stays inside [3 x lr.min, lr.max / 2] at every batch size;
- final val loss: L(B, lr) = Lmin(B) + k u^2 (1.5 k on the high side), u = ln(lr / lr*(B)),
  k ~ U[0.03, 0.08] per optimizer (a factor 2 off the optimum costs 0.015..0.06);
- Lmin(B) = L0 (1 + drift x log2(B / B0) + growth x max(0, log2(B / Bcrit))^1.5): flat-ish up to a
  critical batch Bcrit, rising beyond it; Bcrit(adamw) log-uniform in [16, 128], Bcrit(merit) =
  2..4 x that (the optimizer with the larger critical batch), growth ~ U[0.02, 0.05], drift ~ U[0, 0.002];
- an instability cliff: lr > c x lr*(B) x exp(0.1 z_seed), c ~ U[2, 5], diverges (earlier the further
  above the cliff); diverged runs stop there and report `diverged`;
- seed noise of sd `sigma` on the final loss: half its variance shared by the runs of one (cell, seed)
  (init and data order), half varying with lr; every draw is a deterministic function of
  (problem, cell, seed, lr), so both methods get the same loss for the same run;
- intermediate losses fall with tokens, Lmin(B) (1 + 0.15 ((t/T)^-0.5 - 1)), and their bowl is centred
  at lr*(B) exp(shift (1 - t/T)), shift ~ U[-0.6, 0] (the short-horizon bias: early in a decaying
  schedule smaller lrs look better), plus eval jitter of sd sigma / 2: ASHA's rungs compare real but
  imperfect evidence.

The sweep of every problem: adamw (baseline) and merit x batch sizes 8..256, lr in [1e-4, 3e-2], the
spec's defaults for the search (6 search trials a cell, 2 confirmation seeds, ASHA grace 0.3 and
reduction factor 3, tolerance 0.01), 4 trials at a time; `--trials`, `--seeds`, `--tolerance`,
`--concurrency` change them, `--sigma` the noise.

The true answer of a problem is the largest degradation-free batch size of the noiseless optimum
losses Lmin(B), with the analysis's rule (walk up from the smallest batch size while
Lmin(B) <= (1 + tolerance) x reference). The grid: 12 log-spaced lrs over the same range per cell,
each trained to the full budget (diverged ones stop where they diverge), then `seeds` confirmation
runs at the grid's best lr (`sweeps.analysis.pick_best`) and the same `build_report`. Tokens are the
tokens each trial trained: pruned trials to the rung where ASHA stopped them, diverged ones to the
step where they diverged. The last line is the ratio against the grid, measured in the same run.

`--real` runs a real sweep (default: benchmarks/specs/real_tiny.yaml, gpt2-nano on the built-in
corpus, 2 optimizers x 2 batch sizes) through `sweeps.driver.run_sweep` on a local Ray cluster (or
$RAY_ADDRESS), then the same dense grid as the simulation (12 lrs x the seeds) through
`worker.launch.run_training` (`max_concurrent_trials` runs at a time), and prints both answers and
the token ratio (~3 minutes on a 2-core machine; measured: 0.22 of the grid's tokens, the same 4
answers).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeps.replay import largest_degradation_free
from worker.local_ray import use_local_ray  # noqa: E402

if TYPE_CHECKING:
    from sweeps.analysis import Report

use_local_ray()  # before anything imports ray: local Ray clusters on loopback only

BATCH_SIZES = (8, 16, 32, 64, 128, 256)
OPTIMIZERS = ("adamw", "merit")  # adamw is the baseline; merit gets the larger critical batch
BASELINE = "adamw"
SEQ_LEN = 64
TOKEN_BUDGET = 40 * 256 * SEQ_LEN  # 655,360: 40 steps at batch 256, 1,280 at batch 8
LR_MIN, LR_MAX = 1e-4, 3e-2
GRID_POINTS = 12
REFERENCES = ("self", "baseline")

# objective constants (see the module docstring)
LOSS_HIGH_SIDE = 1.5  # the bowl is steeper above the optimum lr
CURVE_HEIGHT, CURVE_POWER = 0.15, 0.5  # Lmin (1 + h ((t/T)^-a - 1)) along tokens
EVAL_JITTER = 0.5  # sd of an intermediate eval's own noise, in units of sigma
SHARED_NOISE = 0.5  # share of the seed-noise variance common to the runs of one (cell, seed)
CLIFF_JITTER = 0.1  # sd of ln(cliff) across seeds
# The truth's lr at a stability edge: the edge's 5 % quantile over seeds, where 19 runs in 20 complete (the
# nominal edge diverges in half the seeds, so no method trains there; the recorded runs' truth is likewise
# the best lr at which all 12 recorded seeds completed)
EDGE_Z = 1.645
ORACLE_SEEDS = 8  # the noise ceiling's completed runs a cell, at the true best lr


# --------------------------------------------------------------------------------------------------
# The synthetic objective
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizerTruth:
    """How one optimizer's final val loss depends on (batch size, lr) in one problem."""

    lr0: float  # optimum lr at the smallest batch size
    alpha: float  # lr*(B) = lr0 (B / B0)^alpha
    cliff: float  # diverges above cliff x lr*(B)
    loss0: float  # optimum final loss at the smallest batch size (without drift)
    b_crit: float  # critical batch size: the optimum loss rises beyond it
    growth: float  # relative loss added per log2(B / b_crit)^1.5
    drift: float  # relative loss added per doubling at any batch size
    curvature: float  # k: loss added per (ln lr / lr*)^2 below the optimum
    horizon_shift: float  # ln of the early optimum's offset from lr*(B) at t = 0
    # The "cliffs" family sets these; their defaults are the "bowls" family's
    high_side: float = 1.5  # the bowl is this much steeper above the optimum lr
    saturation: float = math.inf  # lr*(B) / lr0 stops growing here
    cliff_gamma: float = 0.0  # the cliff closes in: cliff(B) = 1 + (cliff - 1) (B / B0)^-gamma
    noise_growth: float = 0.0  # seed noise sd x (1 + noise_growth log2(B / B0))
    cliff_noise: float = 0.0  # seed noise sd x (1 + cliff_noise) at the cliff, fading 5x per ln-unit below
    spike_p: float = 0.0  # chance that a run ends on a loss spike
    spike_size: float = 0.0  # the spike, added to the final loss
    # The "noise-scale" family sets these (> 0): the laws of the literature in place of the forms above
    noise_scale: float = 0.0  # B_noise: the loss at a fixed token budget rises as (1 + B / B_noise)^beta
    data_exponent: float = 0.0  # beta: how the reducible loss falls with effective data
    reducible: float = 0.0  # the reducible share of the loss at the smallest batch size


@dataclass(frozen=True)
class Problem:
    seed: int  # every random draw of the problem's runs derives from it
    sigma: float  # sd of the seed noise of a final val loss
    tolerance: float
    truths: dict[str, OptimizerTruth]
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    # share of the seed-noise variance that seed s adds to every cell alike (same init, same data order)
    across_cells: float = 0.0
    lr_bounds: tuple[float, float] = (0.0, math.inf)  # the lrs a sweep can reach: the truth's optimum is within
    family: str = "bowls"

    @property
    def b0(self) -> int:
        return self.batch_sizes[0]

    def lr_opt(self, opt: str, b: int) -> float:
        t = self.truths[opt]
        if t.noise_scale:
            # Adam's optimum lr against the batch (Li et al. 2024, "Surge phenomenon"): ~sqrt(B) well below
            # B_noise, highest at B_noise (lr0 there), falling beyond it
            r = math.sqrt(b / t.noise_scale)
            return t.lr0 * 2.0 / (r + 1.0 / r)
        return t.lr0 * min((b / self.b0) ** t.alpha, t.saturation)

    def cliff_lr(self, opt: str, b: int) -> float:
        """Runs above this lr diverge (before each seed's own jitter)."""
        t = self.truths[opt]
        if t.noise_scale:
            # the stability edge falls with the batch, from cliff x lr*(B0): past some size it is the edge,
            # not the bowl, that bounds the lr (the best stable lr sits there)
            return t.cliff * self.lr_opt(opt, self.b0) * (b / self.b0) ** -t.cliff_gamma
        return self.lr_opt(opt, b) * (1.0 + (t.cliff - 1.0) * (b / self.b0) ** -t.cliff_gamma)

    def usable_edge(self, opt: str, b: int) -> float:
        """The highest lr at which 19 runs in 20 complete: the edge's 5 % quantile over seeds (EDGE_Z)."""
        return self.cliff_lr(opt, b) * math.exp(-EDGE_Z * CLIFF_JITTER)

    def best_lr(self, opt: str, b: int) -> float:
        """The noiseless best lr a sweep can use: lr*(B), or the usable edge or lr bound below it."""
        lo, hi = self.lr_bounds
        return min(max(self.lr_opt(opt, b), lo), hi, self.usable_edge(opt, b))

    def edge_bound(self, opt: str, b: int) -> bool:
        """Whether the stability edge (not the bowl or the lr range) sets the cell's best lr."""
        return self.usable_edge(opt, b) < min(self.lr_opt(opt, b), self.lr_bounds[1])

    def noise_sd(self, opt: str, b: int, lr: float, cliff: float) -> float:
        t = self.truths[opt]
        near = math.exp(-5.0 * max(0.0, math.log(cliff / lr)))
        return self.sigma * (1.0 + t.noise_growth * math.log2(b / self.b0)) * (1.0 + t.cliff_noise * near)

    def best_loss(self, opt: str, b: int) -> float:
        """The noiseless final loss at the best lr a sweep can reach (`best_lr`)."""
        return self.loss(opt, b, self.best_lr(opt, b))

    def loss_min(self, opt: str, b: int) -> float:
        """The noiseless final val loss at the optimum lr of batch size b."""
        t = self.truths[opt]
        if t.noise_scale:
            # McCandlish et al. 2018: B tokens a step buy the progress of B / (1 + B / B_noise) noiseless
            # ones, so a fixed budget is worth E / (1 + B / B_noise) tokens; the reducible loss falls as
            # that effective data to the -beta (normalised at B0)
            worth = (1.0 + b / t.noise_scale) / (1.0 + self.b0 / t.noise_scale)
            return t.loss0 * (1.0 - t.reducible + t.reducible * worth**t.data_exponent)
        over = max(0.0, math.log2(b / t.b_crit))
        return t.loss0 * (1.0 + t.drift * math.log2(b / self.b0) + t.growth * over**1.5)

    def loss(self, opt: str, b: int, lr: float, frac: float = 1.0) -> float:
        """Noiseless val loss after a fraction `frac` of the token budget at peak lr `lr`."""
        t = self.truths[opt]
        centre = self.lr_opt(opt, b) * math.exp(t.horizon_shift * (1.0 - frac))
        u = math.log(lr / centre)
        bowl = t.curvature * u * u * (t.high_side if u > 0 else 1.0)
        return self.loss_min(opt, b) * (1.0 + CURVE_HEIGHT * (frac**-CURVE_POWER - 1.0)) + bowl


def make_problem(index: int, *, base_seed: int = 0, sigma: float = 0.01, tolerance: float = 0.01) -> Problem:
    """Problem `index` of the series `base_seed`: its random optimizers (module docstring)."""
    rng = np.random.default_rng([base_seed, index, 17])
    growth_range = BATCH_SIZES[-1] / BATCH_SIZES[0]
    truths: dict[str, OptimizerTruth] = {}
    loss0 = float(rng.uniform(3.3, 3.6))
    b_crit = math.exp(rng.uniform(math.log(16), math.log(128)))
    for opt in OPTIMIZERS:
        alpha = float(rng.uniform(0.3, 0.7))
        lo, hi = math.log(3 * LR_MIN), math.log(LR_MAX / 2 / growth_range**alpha)
        truths[opt] = OptimizerTruth(
            lr0=math.exp(rng.uniform(lo, hi)),
            alpha=alpha,
            cliff=float(rng.uniform(2.0, 5.0)),
            loss0=loss0 if opt == BASELINE else loss0 * (1.0 + rng.uniform(-0.01, 0.01)),
            b_crit=b_crit if opt == BASELINE else b_crit * float(rng.uniform(2.0, 4.0)),
            growth=float(rng.uniform(0.02, 0.05)),
            drift=float(rng.uniform(0.0, 0.002)),
            curvature=float(rng.uniform(0.03, 0.08)),
            horizon_shift=float(rng.uniform(-0.6, 0.0)),
        )
    return Problem(seed=int(rng.integers(2**31)), sigma=sigma, tolerance=tolerance, truths=truths)


def make_cliff_problem(
    index: int, *, base_seed: int = 0, sigma: float = 0.01, tolerance: float = 0.01, extend: float = 4.0
) -> Problem:
    """Problem `index` of the "cliffs" family: what real lr sweeps of language models have and the bowls
    lack (module docstring)."""
    rng = np.random.default_rng([base_seed, index, 23])
    growth_range = BATCH_SIZES[-1] / BATCH_SIZES[0]
    truths: dict[str, OptimizerTruth] = {}
    loss0 = float(rng.uniform(3.3, 3.6))
    b_crit = math.exp(rng.uniform(math.log(12), math.log(320)))  # the boundary anywhere, beyond both ends too
    for opt in OPTIMIZERS:
        alpha = float(rng.uniform(0.0, 1.0))
        saturation = float(rng.uniform(1.5, 6.0)) if rng.uniform() < 0.3 else math.inf
        # lr* at the largest batch from well inside the range to 2.5x past lr.max (within the bounds)
        top = math.exp(rng.uniform(math.log(LR_MAX / 10), math.log(LR_MAX * 2.5)))
        lr0 = max(1.5 * LR_MIN, top / min(growth_range**alpha, saturation))
        truths[opt] = OptimizerTruth(
            lr0=lr0,
            alpha=alpha,
            cliff=float(rng.uniform(2.5, 5.0)),
            loss0=loss0 if opt == BASELINE else loss0 * (1.0 + rng.uniform(-0.01, 0.01)),
            b_crit=b_crit if opt == BASELINE else b_crit * float(rng.uniform(0.5, 4.0)),
            growth=float(rng.uniform(0.01, 0.05)),
            drift=float(rng.uniform(0.0, 0.002)),
            curvature=float(rng.uniform(0.02, 0.08)),
            horizon_shift=float(rng.uniform(-0.8, 0.0)),
            high_side=float(rng.uniform(2.0, 4.0)),
            saturation=saturation,
            cliff_gamma=float(rng.uniform(0.1, 0.4)),
            noise_growth=float(rng.uniform(0.05, 0.2)),
            cliff_noise=float(rng.uniform(0.5, 2.0)),
            spike_p=0.03,
            spike_size=float(rng.uniform(0.03, 0.1)),
        )
    return _shared_noise_problem(rng, truths, sigma=sigma, tolerance=tolerance, extend=extend, family="cliffs")


def make_noise_scale_problem(
    index: int, *, base_seed: int = 0, sigma: float = 0.01, tolerance: float = 0.01, extend: float = 4.0
) -> Problem:
    """Problem `index` of the "noise-scale" family, written from the literature rather than from this
    method's assumptions: the loss at a fixed budget from McCandlish et al.'s effective data, Adam's
    optimum lr rising as sqrt(B) and falling past B_noise, a stability edge that falls with the batch (so
    the larger cells' best lr sits at the edge, where runs spike and diverge by seed), seed noise shared
    across cells, and the user's lr range a guess (the optimum up to 2.5x past lr.max)."""
    rng = np.random.default_rng([base_seed, index, 29])
    truths: dict[str, OptimizerTruth] = {}
    loss0 = float(rng.uniform(3.3, 3.6))
    reducible = float(rng.uniform(0.3, 0.5))
    beta = float(rng.uniform(0.3, 0.7))
    # 1 % more loss at about B_noise / 20 (reducible 0.4, beta 0.5): boundaries across and past the sizes
    b_noise = math.exp(rng.uniform(math.log(60), math.log(8000)))
    for opt in OPTIMIZERS:
        noise_scale = b_noise if opt == BASELINE else b_noise * float(rng.uniform(0.5, 4.0))
        # lr* at the largest batch from well inside the range to 2.5x past lr.max
        top = math.exp(rng.uniform(math.log(LR_MAX / 10), math.log(LR_MAX * 2.5)))
        r = math.sqrt(BATCH_SIZES[-1] / noise_scale)
        truths[opt] = OptimizerTruth(
            lr0=top * (r + 1.0 / r) / 2.0,
            alpha=0.0,
            cliff=float(rng.uniform(3.0, 8.0)),
            loss0=loss0 if opt == BASELINE else loss0 * (1.0 + rng.uniform(-0.01, 0.01)),
            b_crit=noise_scale / 20.0,  # nominal (the boundary at reducible 0.4, beta 0.5); unused here
            growth=0.0,
            drift=0.0,
            curvature=float(rng.uniform(0.02, 0.08)),
            horizon_shift=float(rng.uniform(-0.8, 0.0)),
            high_side=float(rng.uniform(1.5, 3.0)),
            cliff_gamma=float(rng.uniform(0.0, 0.3)),
            noise_growth=float(rng.uniform(0.0, 0.1)),
            cliff_noise=float(rng.uniform(1.0, 3.0)),
            spike_p=0.03,
            spike_size=float(rng.uniform(0.03, 0.1)),
            noise_scale=noise_scale,
            data_exponent=beta,
            reducible=reducible,
        )
    return _shared_noise_problem(rng, truths, sigma=sigma, tolerance=tolerance, extend=extend, family="noise-scale")


def _shared_noise_problem(
    rng: np.random.Generator,
    truths: dict[str, OptimizerTruth],
    *,
    sigma: float,
    tolerance: float,
    extend: float,
    family: str,
) -> Problem:
    """A problem whose seeds share 60 % of their noise across cells (same init, same data order) and whose
    lrs reach `extend`x past the range, as the cliffs and noise-scale families have."""
    return Problem(
        seed=int(rng.integers(2**31)),
        sigma=sigma,
        tolerance=tolerance,
        truths=truths,
        across_cells=0.6,
        lr_bounds=(LR_MIN / extend, LR_MAX * extend),
        family=family,
    )


FAMILIES = {"bowls": make_problem, "cliffs": make_cliff_problem, "noise-scale": make_noise_scale_problem}


def true_answers(problem: Problem, optimizers: Sequence[str] = OPTIMIZERS) -> dict[str, dict[str, int | None]]:
    """{optimizer: {"self": B, "baseline": B}} from the noiseless optimum losses."""
    bs = problem.batch_sizes
    base_ref = problem.best_loss(BASELINE, bs[0])
    out: dict[str, dict[str, int | None]] = {}
    for opt in optimizers:
        losses = [problem.best_loss(opt, b) for b in bs]
        answers: dict[str, int | None] = {}
        for ref_name, ref, is_ref in (("self", losses[0], True), ("baseline", base_ref, opt == BASELINE)):
            i = largest_degradation_free(losses, ref, problem.tolerance, first_is_reference=is_ref)
            answers[ref_name] = bs[i] if i is not None else None
        out[opt] = answers
    return out


@dataclass(frozen=True)
class Schedule:
    """When a trial of batch size b evaluates: worker.loop's steps, from the trial's TrainConfig."""

    total_steps: int
    eval_every: int
    tokens_per_step: int

    @classmethod
    def of(cls, train: Any) -> Schedule:
        return cls(train.total_steps, train.eval_interval_steps, train.tokens_per_step)

    def eval_steps(self) -> list[int]:
        return [s for s in range(1, self.total_steps + 1) if s % self.eval_every == 0 or s == self.total_steps]


def _lr_key(lr: float) -> int:
    return int(round((math.log(lr) + 100.0) * 1e7))


def simulate_run(problem: Problem, opt: str, b: int, lr: float, seed: int, schedule: Schedule) -> list[dict[str, Any]]:
    """The reports `worker.loop.train` would send for this run, in order; the last has `done`."""
    oi = OPTIMIZERS.index(opt)
    shared = np.random.default_rng([problem.seed, oi, b, seed, 0]).standard_normal(2)  # (noise, cliff)
    own = np.random.default_rng([problem.seed, oi, b, seed, 1, _lr_key(lr)])
    seed_effect = np.random.default_rng([problem.seed, seed, 2]).standard_normal()  # the same in every cell
    cliff = problem.cliff_lr(opt, b) * math.exp(CLIFF_JITTER * shared[1])
    rest = 1.0 - problem.across_cells
    offset = problem.noise_sd(opt, b, lr, cliff) * (
        math.sqrt(problem.across_cells) * seed_effect
        + math.sqrt(SHARED_NOISE * rest) * shared[0]
        + math.sqrt((1 - SHARED_NOISE) * rest) * own.standard_normal()
    )
    truth = problem.truths[opt]
    if truth.spike_p and own.uniform() < truth.spike_p:
        offset += truth.spike_size
    total = schedule.total_steps
    diverge_at = None  # steps completed before the diverging step
    if lr > cliff:
        frac = 0.05 + 0.6 * (cliff / lr) ** 4 + 0.05 * own.uniform()
        diverge_at = min(total - 1, max(0, int(frac * total)))
    reports: list[dict[str, Any]] = []
    last: dict[str, Any] = {}
    tps = schedule.tokens_per_step
    for step in schedule.eval_steps():
        if diverge_at is not None and step > diverge_at:
            break
        frac = step / total
        jitter = 0.0 if step == total else EVAL_JITTER * problem.sigma * own.standard_normal()
        last = {
            "tokens": step * tps,
            "step": step,
            "val_loss": problem.loss(opt, b, lr, frac) + offset + jitter,
            "train_time_s": step * tps / 1e5,
        }
        done = step == total
        reports.append({**last, "status": "completed" if done else "running", "done": done})
    if diverge_at is not None:
        reports.append(
            {
                **last,
                "tokens": diverge_at * tps,
                "step": diverge_at,
                "status": "diverged",
                "done": True,
                "train_time_s": diverge_at * tps / 1e5,
            }
        )
    return reports


# --------------------------------------------------------------------------------------------------
# The two methods
# --------------------------------------------------------------------------------------------------


def make_spec(
    *, trials: int = 6, seeds: int | dict[str, int] = 2, concurrency: int = 4, tolerance: float = 0.01
) -> Any:
    from sweeps.spec import SweepSpec

    return SweepSpec.from_mapping(
        {
            "name": "search-efficiency",
            "model": {"preset": "gpt2-nano", "seq_len": SEQ_LEN},
            "optimizers": [{"name": o} for o in OPTIMIZERS],
            "batch_sizes": list(BATCH_SIZES),
            "token_budget": TOKEN_BUDGET,
            "lr": {"min": LR_MIN, "max": LR_MAX, "trials_per_batch_size": trials},
            "seeds": seeds,
            "degradation": {"tolerance": tolerance, "baseline": BASELINE},
            "resources": {"max_concurrent_trials": concurrency},
        }
    )


def schedules(spec: Any) -> dict[int, Schedule]:
    return {b: Schedule.of(spec.train_config(spec.optimizer_names[0], b, spec.lr.min, 0)) for b in spec.lattice}


@dataclass
class MethodOutcome:
    answers: dict[str, dict[str, int | None]]  # {optimizer: {"self": B, "baseline": B}}
    tokens: int  # tokens trained by every trial, as the simulation fed them
    trials: int  # trials run
    results: list[Any]  # the TrialResults the analysis judged
    report: Report
    best_lrs: dict[tuple[str, int], float | None] = field(default_factory=dict)

    @property
    def recorded_tokens(self) -> int:
        """The same count from what the method recorded (the searcher: its Optuna trials)."""
        return sum(t.tokens for t in self.results)


def _answers(report: Report) -> dict[str, dict[str, int | None]]:
    return {opt: r.largest_degradation_free_batch_size.model_dump() for opt, r in report.optimizers.items()}


def _best_lrs(report: Report) -> dict[tuple[str, int], float | None]:
    return {(opt, c.batch_size): c.best_lr for opt, r in report.optimizers.items() for c in r.cells}


def objective_of(problem: Problem, spec: Any) -> Any:
    """`problem` as `sweeps.simulate.simulate`'s objective: the val losses at the run's evaluations,
    `inf` from the evaluation at which `simulate_run` has it diverge."""
    sched = schedules(spec)

    def objective(run: Any) -> list[float]:
        reports = simulate_run(problem, run.optimizer, run.batch_size, run.lr, run.seed, sched[run.batch_size])
        losses = [r["val_loss"] for r in reports if r["status"] != "diverged"]
        return losses + [math.inf] * (len(run.eval_tokens) - len(losses))

    return objective


def run_searcher(problem: Problem, spec: Any) -> MethodOutcome:
    """The project's search on `problem`, through `sweeps.simulate.simulate` (CellSearcher + PerCellASHA
    in a simulated Tune loop, then the report a real sweep writes)."""
    from sweeps.simulate import simulate

    result = simulate(spec, objective_of(problem, spec), seed=problem.seed)
    report = result.report
    return MethodOutcome(
        _answers(report), result.tokens_trained, result.trials, result.results, report, _best_lrs(report)
    )


def _trial_result(opt: str, b: int, lr: float, seed: int, role: str, reports: list[dict[str, Any]], number: int | None):
    from sweeps.analysis import TrialResult

    final = reports[-1]
    status = final["status"]
    return TrialResult(
        optimizer=opt,
        batch_size=b,
        lr=lr,
        seed=seed,
        role=role,  # type: ignore[arg-type]
        status=status,
        val_loss=final.get("val_loss") if status == "completed" else None,
        tokens=int(final["tokens"]),
        steps=int(final["step"]),
        curve=tuple((r["tokens"], r["val_loss"]) for r in reports if "val_loss" in r and r["status"] != "diverged"),
        number=number,
    )


def grid_lrs(lr_min: float, lr_max: float, points: int = GRID_POINTS) -> list[float]:
    return [float(x) for x in np.geomspace(lr_min, lr_max, points)]


def _grid_score(t: Any) -> tuple[float, float, int] | None:
    """`pick_best`'s key, as the analysis documents it: (final val loss, lr, trial number), completed only."""
    if t.role != "search" or t.status != "completed" or t.val_loss is None:
        return None
    return (t.val_loss, t.lr, t.number)


def run_grid(problem: Problem, spec: Any) -> MethodOutcome:
    """The dense grid with the searcher's number of seeds: every cell trains GRID_POINTS lrs, each with
    seeds 1..`seeds` to the full budget (diverged runs stop where they diverge). The best lr is the one
    with the lowest mean over its seeds, all completed (`sweeps.analysis.pick_best` over those means);
    its runs are the cell's samples."""
    from sweeps.analysis import build_report, pick_best

    sched = schedules(spec)
    lrs = grid_lrs(spec.lr.min, spec.lr.max)
    results, runs = [], 0
    tokens = 0
    for opt, b in spec.cells():
        by_lr = []
        for lr in lrs:
            seeds = [
                _trial_result(opt, b, lr, seed, "confirm", simulate_run(problem, opt, b, lr, seed, sched[b]), None)
                for seed in range(1, spec.seeds_min + 1)
            ]
            tokens += sum(t.tokens for t in seeds)
            runs += len(seeds)
            by_lr.append(seeds)
        means = [
            _mean_result(opt, b, lr, number, seeds) for number, (lr, seeds) in enumerate(zip(lrs, by_lr, strict=True))
        ]
        best = pick_best(means, _grid_score)
        # the report: one "search" entry per lr (its seed mean), the best lr's runs as the samples
        results += means
        if best is not None:
            results += by_lr[lrs.index(best.lr)]
    report = build_report(results, spec=spec)
    return MethodOutcome(_answers(report), tokens, runs, results, report, _best_lrs(report))


def _mean_result(opt: str, b: int, lr: float, number: int, seeds: list[Any]) -> Any:
    """One lr of the grid as a search entry: the mean over its seeds when all completed."""
    from sweeps.analysis import TrialResult

    done = [t.val_loss for t in seeds if t.status == "completed" and t.val_loss is not None]
    status = "completed" if len(done) == len(seeds) else next(t.status for t in seeds if t.status != "completed")
    return TrialResult(
        optimizer=opt,
        batch_size=b,
        lr=lr,
        seed=0,
        role="search",
        status=status,
        val_loss=statistics.fmean(done) if status == "completed" else None,
        tokens=sum(t.tokens for t in seeds),  # every run at this lr (the best lr's runs appear again as samples)
        steps=0,
        number=number,
    )


def run_grid_once(problem: Problem, spec: Any) -> MethodOutcome:
    """A cheaper grid, for comparison: GRID_POINTS lrs once each (seed 0) to the full budget, then
    `seeds` confirmation runs at the best (`sweeps.analysis.pick_best`)."""
    from sweeps.analysis import build_report, pick_best

    sched = schedules(spec)
    lrs = grid_lrs(spec.lr.min, spec.lr.max)
    results, tokens = [], 0
    for opt, b in spec.cells():
        cell = []
        for number, lr in enumerate(lrs):
            cell.append(_trial_result(opt, b, lr, 0, "search", simulate_run(problem, opt, b, lr, 0, sched[b]), number))
        best = pick_best(cell, _grid_score)
        if best is not None:
            for seed in range(1, spec.seeds_min + 1):
                reports = simulate_run(problem, opt, b, best.lr, seed, sched[b])
                cell.append(_trial_result(opt, b, best.lr, seed, "confirm", reports, None))
        tokens += sum(t.tokens for t in cell)
        results += cell
    report = build_report(results, spec=spec)
    return MethodOutcome(_answers(report), tokens, len(results), results, report, _best_lrs(report))


def run_tpe(problem: Problem, spec: Any) -> MethodOutcome:
    """What a user of a sweep tool would run: per cell, Optuna's TPE over ln lr in [lr.min, lr.max] for
    the searcher's trials_per_batch_size trials (each to the full budget, seed 0), then `seeds`
    confirmation runs at the best (`sweeps.analysis.pick_best`)."""
    import optuna

    from sweeps.analysis import build_report, pick_best

    sched = schedules(spec)
    results, tokens = [], 0
    for ci, (opt, b) in enumerate(spec.cells()):
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=problem.seed + ci, n_startup_trials=2))
        cell = []
        for number in range(spec.lr.trials_per_batch_size):
            trial = study.ask()
            lr = trial.suggest_float("lr", spec.lr.min, spec.lr.max, log=True)
            run = _trial_result(opt, b, lr, 0, "search", simulate_run(problem, opt, b, lr, 0, sched[b]), number)
            study.tell(trial, run.val_loss if run.status == "completed" else math.inf)
            cell.append(run)
        best = pick_best(cell, _grid_score)
        if best is not None:
            for seed in range(1, spec.seeds_min + 1):
                cell.append(
                    _trial_result(
                        opt, b, best.lr, seed, "confirm", simulate_run(problem, opt, b, best.lr, seed, sched[b]), None
                    )
                )
        tokens += sum(t.tokens for t in cell)
        results += cell
    report = build_report(results, spec=spec)
    return MethodOutcome(_answers(report), tokens, len(results), results, report, _best_lrs(report))


def run_oracle(problem: Problem, spec: Any) -> MethodOutcome:
    """The noise ceiling: what seed noise alone leaves of the answer. Every cell trains at its true best lr
    (`Problem.best_lr`) until ORACLE_SEEDS runs completed (a run past its seed's edge is replaced by the
    next seed: divergence is not what this measures), judged by the same report builder. Its tokens are
    not a cost anyone could pay: it knows the truth's lr."""
    from sweeps.analysis import build_report

    sched = schedules(spec)
    results, tokens = [], 0
    for number, (opt, b) in enumerate(spec.cells()):
        lr, seed, done = problem.best_lr(opt, b), 1, []
        while len(done) < ORACLE_SEEDS and seed <= 10 * ORACLE_SEEDS:
            run = _trial_result(opt, b, lr, seed, "confirm", simulate_run(problem, opt, b, lr, seed, sched[b]), None)
            tokens += run.tokens
            if run.status == "completed":
                done.append(run)
            seed += 1
        results += [_mean_result(opt, b, lr, number, done), *done]
    report = build_report(results, spec=spec)
    return MethodOutcome(_answers(report), tokens, len(results), results, report, _best_lrs(report))


# --------------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------------


@dataclass
class ProblemOutcome:
    problem: Problem
    truth: dict[str, dict[str, int | None]]
    searcher: MethodOutcome
    grid: MethodOutcome  # GRID_POINTS lrs x `seeds` seeds (the benchmark's baseline)
    grid_once: MethodOutcome  # GRID_POINTS lrs once + `seeds` confirmation runs (a cheaper baseline)
    tpe: MethodOutcome  # per-cell TPE, the searcher's trials + `seeds` confirmation runs
    oracle: MethodOutcome  # the noise ceiling: ORACLE_SEEDS runs at each cell's true best lr


def run_problem(problem: Problem, spec: Any) -> ProblemOutcome:
    return ProblemOutcome(
        problem,
        true_answers(problem, spec.optimizer_names),
        run_searcher(problem, spec),
        run_grid(problem, spec),
        run_grid_once(problem, spec),
        run_tpe(problem, spec),
        run_oracle(problem, spec),
    )


def _lr_error(o: ProblemOutcome, m: MethodOutcome) -> list[float]:
    """|log(best lr / lr*)| over the cells with a best lr."""
    return [abs(math.log(lr / o.problem.best_lr(opt, b))) for (opt, b), lr in m.best_lrs.items() if lr is not None]


def _accuracy(outcomes: Sequence[ProblemOutcome], method: str, opt: str | None, ref: str = "self") -> float:
    hits = [
        getattr(o, method).answers[name][ref] == o.truth[name][ref]
        for o in outcomes
        for name in o.truth
        if opt is None or name == opt
    ]
    return sum(hits) / len(hits)


METHODS = ("searcher", "tpe", "grid_once", "grid", "oracle")
LABELS = {"searcher": "searcher", "tpe": "TPE/cell", "grid_once": "grid once", "grid": "grid", "oracle": "ceiling"}


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of a proportion (scipy.stats.binomtest's, without the test)."""
    from scipy.stats import binomtest

    ci = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def _hits(outcomes: Sequence[ProblemOutcome], method: str) -> list[int]:
    """1 per answer (problem x optimizer x reference) equal to the truth, else 0."""
    return [
        int(getattr(o, method).answers[name][ref] == o.truth[name][ref])
        for o in outcomes
        for name in o.truth
        for ref in REFERENCES
    ]


# a truth decided by less than this (relative loss at the boundary batch sizes) is within the seed noise of
# 6 seeds: the answers are split by it, to show where the misses are
NEAR_LINE = 0.002


def _near_line(outcomes: Sequence[ProblemOutcome]) -> list[bool]:
    """Per answer (in `_hits`' order): does the truth rest on a batch size whose noise-free loss is within
    NEAR_LINE (relative) of the tolerance line? (The truth's last degradation-free size and the next.)"""
    out = []
    for o in outcomes:
        p, bs = o.problem, list(o.problem.batch_sizes)
        for name in o.truth:
            for ref in REFERENCES:
                line = (1 + p.tolerance) * p.best_loss(name if ref == "self" else BASELINE, bs[0])
                near = _deciding(o, name, ref)
                out.append(any(abs(p.best_loss(name, bs[j]) / line - 1) < NEAR_LINE for j in near))
    return out


def _deciding(o: ProblemOutcome, name: str, ref: str) -> list[int]:
    """Indices of the batch sizes the truth of one answer rests on: its last degradation-free size and the
    next (the reference cell of an answer against itself decides nothing)."""
    bs = list(o.problem.batch_sizes)
    truth = o.truth[name][ref]
    i = -1 if truth is None else bs.index(truth)
    return [j for j in (i, i + 1) if 0 <= j < len(bs) and not (j == 0 and ref == "self")]


def _edge_bound(outcomes: Sequence[ProblemOutcome]) -> list[bool]:
    """Per answer (in `_hits`' order): does the truth rest on a cell whose best lr sits at the stability
    edge (`Problem.edge_bound`)? The noise-scale family has such cells; the others none."""
    return [
        any(o.problem.edge_bound(name, o.problem.batch_sizes[j]) for j in _deciding(o, name, ref))
        for o in outcomes
        for name in o.truth
        for ref in REFERENCES
    ]


def _covered(outcomes: Sequence[ProblemOutcome], method: str) -> list[int]:
    """1 per answer whose bracket [largest_fine, smallest_degraded) holds the true answer, else 0."""
    out = []
    for o in outcomes:
        report = getattr(o, method).report
        bs = list(o.problem.batch_sizes)
        for name in o.truth:
            for ref in REFERENCES:
                truth, bracket = o.truth[name][ref], getattr(report.optimizers[name].bracket, ref)
                lo, hi = bracket.largest_fine, bracket.smallest_degraded
                if truth is None:
                    out.append(int(lo is None))
                else:
                    out.append(int((lo is None or lo <= truth) and (hi is None or bs.index(truth) < bs.index(hi))))
    return out


def _tight(outcomes: Sequence[ProblemOutcome], method: str) -> float:
    """Share of brackets decided to neighbouring tested batch sizes (or to an end of the list)."""
    tight = []
    for o in outcomes:
        bs = list(o.problem.batch_sizes)
        for name in o.truth:
            for ref in REFERENCES:
                br = getattr(getattr(o, method).report.optimizers[name].bracket, ref)
                lo = -1 if br.largest_fine is None else bs.index(br.largest_fine)
                hi = len(bs) if br.smallest_degraded is None else bs.index(br.smallest_degraded)
                tight.append(hi == lo + 1)
    return statistics.fmean(tight)


def summarize(outcomes: Sequence[ProblemOutcome], spec: Any, wall_s: float) -> list[str]:
    """The printed lines; the last one holds the targets' figures (the searcher against the 12 x seeds grid)."""
    n = len(outcomes)
    family = outcomes[0].problem.family
    tokens = {m: sum(getattr(o, m).tokens for o in outcomes) for m in METHODS}
    ratio = tokens["searcher"] / tokens["grid"]
    per_problem = [o.searcher.tokens / o.grid.tokens for o in outcomes]
    hits = {m: _hits(outcomes, m) for m in METHODS}
    cover = {m: _covered(outcomes, m) for m in METHODS}
    answers = len(hits["searcher"])

    def cell(values: Sequence[float], f: str = ".3f") -> str:
        return "".join(f"{v:>12{f}}" for v in values)

    lines = [
        f"family {family}: {n} problems, {len(spec.optimizer_names)} optimizers x batch sizes {spec.batch_sizes}; "
        f"lr in [{spec.lr.min:g}, {spec.lr.max:g}] (the searcher may step {spec.lr.extend:g}x past), tolerance "
        f"{spec.degradation.tolerance:g}, seed noise sd {outcomes[0].problem.sigma:g}, "
        f"{spec.resources.max_concurrent_trials} trials at a time; {answers} answers (problem x optimizer x reference)",
        f"searcher: up to {spec.lr.trials_per_batch_size} search trials per cell (line search, warm start, TPE + "
        f"ASHA grace {spec.pruning.grace_fraction:g} rf {spec.pruning.reduction_factor} where those do not locate a "
        f"minimum) + {spec.seeds_min} seeds; TPE/cell: {spec.lr.trials_per_batch_size} TPE trials + "
        f"{spec.seeds_min} seeds; grid once: {GRID_POINTS} lrs + {spec.seeds_min} seeds; grid: {GRID_POINTS} lrs x "
        f"{spec.seeds_min} seeds",
        f"{'':34s}" + "".join(f"{LABELS[m]:>12s}" for m in METHODS),
        "  tokens (12 x seeds grid = 1)    " + cell([tokens[m] / tokens["grid"] for m in METHODS]),
    ]
    for ref in REFERENCES:
        for opt in spec.optimizer_names:
            lines.append(
                f"  answer = truth {opt:>6s} {ref:>8s} " + cell([_accuracy(outcomes, m, opt, ref) for m in METHODS])
            )
    lines.append("  answer = truth, all             " + cell([statistics.fmean(hits[m]) for m in METHODS]))
    lines.append(
        "    95% interval (Wilson)         "
        + "".join(f"{'[{:.2f}, {:.2f}]'.format(*wilson(sum(hits[m]), answers)):>12s}" for m in METHODS)
    )
    near = _near_line(outcomes)
    for label, keep in ((f"within {NEAR_LINE:.1%} of the line", True), (f"farther than {NEAR_LINE:.1%}", False)):
        n_keep = sum(1 for x in near if x == keep)
        lines.append(
            f"    truth {label}".ljust(34)
            + cell(
                [statistics.fmean([h for h, x in zip(hits[m], near, strict=True) if x == keep] or [0]) for m in METHODS]
            )
            + f"   ({n_keep} answers)"
        )
    edge = _edge_bound(outcomes)
    n_edge = sum(edge)
    for label, keep in (("on an edge-bound cell", True), ("on no edge-bound cell", False)):
        kept = {m: [h for h, x in zip(hits[m], edge, strict=True) if x == keep] for m in METHODS}
        covered = [c for c, x in zip(cover["searcher"], edge, strict=True) if x == keep]
        lines.append(
            f"    truth {label}".ljust(34)
            + cell([statistics.fmean(kept[m] or [0]) for m in METHODS])
            + f"   ({len(kept['searcher'])} answers; searcher's bracket holds it "
            + (f"{statistics.fmean(covered):.3f})" if covered else "-)")
        )
    diffs = {m: [a - g for a, g in zip(hits[m], hits["grid"], strict=True)] for m in METHODS}
    lines.append(
        "  paired difference to the grid  "
        + "".join(
            f"{f'{statistics.fmean(d):+.2f}+-{1.96 * statistics.stdev(d) / math.sqrt(len(d)):.2f}':>12s}"
            for d in diffs.values()
        )
    )
    lines.append("  bracket holds the truth        " + cell([statistics.fmean(cover[m]) for m in METHODS]))
    lines.append("  bracket tight (neighbours)     " + cell([_tight(outcomes, m) for m in METHODS]))
    err = {m: statistics.median(e for o in outcomes for e in _lr_error(o, getattr(o, m))) for m in METHODS}
    lines += [
        "  median |ln(best lr / lr*)|     " + cell([err[m] for m in METHODS]),
        "  trials per problem             "
        + cell([statistics.fmean(getattr(o, m).trials for o in outcomes) for m in METHODS], ".1f"),
        f"  per-problem token ratio searcher/grid: median {statistics.median(per_problem):.3f}, "
        f"range [{min(per_problem):.3f}, {max(per_problem):.3f}]",
        f"wall time {wall_s:.1f} s ({wall_s / n * 1e3:.0f} ms a problem)",
    ]
    acc_s, acc_g = statistics.fmean(hits["searcher"]), statistics.fmean(hits["grid"])
    ceiling = statistics.fmean(hits["oracle"])
    lo, hi = wilson(sum(hits["searcher"]), answers)
    coverage = statistics.fmean(cover["searcher"])
    target = max(acc_g + 0.03, ceiling - 0.02)
    met = {
        f"accuracy >= max(grid + 0.03, ceiling - 0.02) = {target:.3f}": acc_s >= target,
        "coverage >= 0.95": coverage >= 0.95,
        "edge-bound coverage >= 0.95": n_edge == 0
        or statistics.fmean(c for c, x in zip(cover["searcher"], edge, strict=True) if x) >= 0.95,
        "tokens <= 0.5": ratio <= 0.5,
    }
    lines += [
        "targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items()),
        f"tokens searcher/grid = {ratio:.2f}, accuracy searcher {acc_s:.3f} vs grid {acc_g:.3f} and ceiling "
        f"{ceiling:.3f} "
        f"(searcher 95% [{lo:.2f}, {hi:.2f}]), bracket coverage {coverage:.2f}, family {family}",
    ]
    return lines


def simulate(
    problems: int,
    *,
    base_seed: int = 0,
    sigma: float = 0.01,
    tolerance: float = 0.01,
    trials: int = 6,
    seeds: int | dict[str, int] = 2,
    concurrency: int = 4,
    family: str = "bowls",
) -> tuple[list[ProblemOutcome], Any]:
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; the families: {', '.join(FAMILIES)}")
    spec = make_spec(trials=trials, seeds=seeds, concurrency=concurrency, tolerance=tolerance)
    make = FAMILIES[family]
    outcomes = [
        run_problem(make(i, base_seed=base_seed, sigma=sigma, tolerance=tolerance), spec) for i in range(problems)
    ]
    return outcomes, spec


# --------------------------------------------------------------------------------------------------
# --real: a real sweep against a real grid
# --------------------------------------------------------------------------------------------------


def _real(spec_path: Path, concurrency: int | None, data_dir: Path | None) -> list[str]:
    """A real sweep (`run_sweep`) and the real dense grid of the same spec (`run_training` per run)."""
    import os
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from sweeps.analysis import TrialResult, build_report, pick_best
    from sweeps.driver import collect_results, run_sweep
    from sweeps.runtime import SweepRuntime
    from sweeps.search import CellSearcher
    from sweeps.spec import SweepSpec
    from sweeps.stores import open_storage
    from worker.data import prepare_data
    from worker.launch import init_ray, run_training

    spec = SweepSpec.load(spec_path)
    # adaptive confirmation ({min, max, step}) adds runs at boundary cells; the grid gets the minimum
    n_seeds = int(getattr(spec, "seeds_min", spec.seeds))
    if concurrency is not None:
        resources = {**spec.resources.model_dump(mode="json"), "max_concurrent_trials": concurrency}
        spec = SweepSpec.from_mapping({**spec.model_dump(mode="json"), "resources": resources})
    ray_address = os.environ.get("RAY_ADDRESS") or None
    init_ray(ray_address)
    prepare_data(spec.data)  # the token cache is built once, before either clock starts
    sweep_id = f"{spec.name}-efficiency-{int(time.time())}"  # a new sweep, never the resume of an old one

    with tempfile.TemporaryDirectory(prefix="search-efficiency-") as tmp:
        # every store in one fresh folder (not $MLFLOW_TRACKING_URI / $SWEEPS_OPTUNA_STORAGE): nothing to resume
        runtime = SweepRuntime.at(data_dir or tmp, ray_address=ray_address)
        start = time.perf_counter()
        outcome = run_sweep(spec, sweep_id=sweep_id, runtime=runtime)
        sweep_wall = time.perf_counter() - start
        # each trial's tokens, as the sweep recorded them (pruned ones: where ASHA stopped them)
        searched, _ = collect_results(CellSearcher(spec, sweep_id, open_storage(runtime.optuna_storage)))
    sweep_tokens = sum(t.tokens for t in searched)

    def run(opt: str, b: int, lr: float, seed: int, role: str, number: int | None) -> TrialResult:
        cfg = spec.train_config(opt, b, lr, seed)
        cfg = cfg.model_copy(update={"checkpoints": cfg.checkpoints.model_copy(update={"every_tokens": 0})})
        common: dict[str, Any] = dict(optimizer=opt, batch_size=b, lr=lr, seed=seed, role=role, number=number)
        try:
            res = run_training(cfg)
        except Exception as exc:  # training raised (or its worker died): failed, tokens unknown
            print(f"grid run {opt} bs={b} lr={lr:.2e} seed={seed} failed: {type(exc).__name__}", file=sys.stderr)
            return TrialResult(**common, status="failed", val_loss=None, tokens=0, steps=0)
        final = res.final
        status = str(final.get("status"))
        val = final.get("val_loss")
        if status == "completed" and (val is None or not math.isfinite(val)):
            status = "failed"
        curve = tuple((int(r["tokens"]), float(r["val_loss"])) for r in res.history if "val_loss" in r)
        return TrialResult(
            **common,
            status=status,
            val_loss=float(val) if status == "completed" else None,
            tokens=int(final.get("tokens", 0)),
            steps=int(final.get("step", 0)),
            curve=curve,
        )

    lrs = grid_lrs(spec.lr.min, spec.lr.max)
    start = time.perf_counter()
    # the simulation's grid (`run_grid`): every lr with seeds 1..n, judged by its seed mean
    with ThreadPoolExecutor(max_workers=spec.resources.max_concurrent_trials) as pool:
        jobs = [
            (opt, b, lr, s, "confirm", None) for opt, b in spec.cells() for lr in lrs for s in range(1, n_seeds + 1)
        ]
        runs = list(pool.map(lambda job: run(*job), jobs))
    grid_wall = time.perf_counter() - start
    grid_tokens = sum(t.tokens for t in runs)
    grid: list[TrialResult] = []
    for opt, b in spec.cells():
        by_lr = [[t for t in runs if (t.optimizer, t.batch_size, t.lr) == (opt, b, lr)] for lr in lrs]
        means = [_mean_result(opt, b, lr, i, seeds) for i, (lr, seeds) in enumerate(zip(lrs, by_lr, strict=True))]
        best = pick_best(means, _grid_score)
        grid += means + (by_lr[lrs.index(best.lr)] if best is not None else [])
    grid_report = build_report(grid, spec=spec)

    lines = [
        f"real sweep {spec.name}: {len(spec.optimizer_names)} optimizers x batch sizes {spec.batch_sizes}, "
        f"{spec.trained_tokens} tokens a trial, {spec.resources.max_concurrent_trials} trials at a time",
        f"searcher: {len(searched)} trials, {sweep_tokens} tokens, {sweep_wall:.0f} s (run_sweep)",
        f"grid:     {len(runs)} trials, {grid_tokens} tokens, {grid_wall:.0f} s "
        f"({GRID_POINTS} lrs x {n_seeds} seeds per cell, run_training)",
        "best lr and mean val loss per cell, searcher vs grid:",
    ]
    for opt in spec.optimizer_names:
        s_cells = {c.batch_size: c for c in outcome.report.optimizers[opt].cells}
        g_cells = {c.batch_size: c for c in grid_report.optimizers[opt].cells}
        for b in spec.batch_sizes:
            s, g = s_cells[b], g_cells[b]
            lines.append(
                f"  {opt} bs={b}: lr {_fmt(s.best_lr, '.2e')} vs {_fmt(g.best_lr, '.2e')}, "
                f"loss {_fmt(s.val_loss_mean, '.4f')} vs {_fmt(g.val_loss_mean, '.4f')}"
            )
    s_ans, g_ans = _answers(outcome.report), _answers(grid_report)
    for opt in spec.optimizer_names:
        lines.append(f"answer {opt}: searcher {s_ans[opt]} vs grid {g_ans[opt]}")
    same = sum(s_ans[o][r] == g_ans[o][r] for o in s_ans for r in REFERENCES)
    lines.append(
        f"tokens searcher/grid = {sweep_tokens / grid_tokens:.2f}, answers equal {same} of "
        f"{len(REFERENCES) * len(s_ans)} (target <= 0.33)"
    )
    return lines


def _fmt(x: float | None, f: str) -> str:
    return "-" if x is None else format(x, f)


def _spec_seeds() -> int | dict[str, int]:
    """The spec's default confirmation runs, as `make_spec` takes them."""
    from sweeps.spec import SweepSpec

    seeds = SweepSpec.model_fields["seeds"].get_default(call_default_factory=True)
    return seeds if isinstance(seeds, int) else seeds.model_dump()


def _seeds_arg(text: str) -> int | dict[str, int]:
    parts = [int(p) for p in text.split(",")]
    return parts[0] if len(parts) == 1 else dict(zip(("min", "max", "step"), parts, strict=True))


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=200, help="random problems to simulate (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the series of problems")
    parser.add_argument("--sigma", type=float, default=0.01, help="seed noise sd of a final val loss")
    parser.add_argument("--tolerance", type=float, default=0.01, help="degradation tolerance (spec default 0.01)")
    parser.add_argument("--trials", type=int, default=6, help="lr.trials_per_batch_size (spec default 6)")
    parser.add_argument(
        "--seeds",
        default=None,
        help="confirmation runs per cell: MIN,MAX,STEP (adaptive) or N (default: the spec's, 2,10,2)",
    )
    parser.add_argument("--family", choices=sorted(FAMILIES), default="bowls", help="the problem family")
    parser.add_argument("--concurrency", type=int, default=None, help="max_concurrent_trials (simulation: 4)")
    parser.add_argument("--real", action="store_true", help="run a real sweep and a real grid (needs Ray)")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="--real: keep the stores here (default: a temp dir)"
    )
    parser.add_argument("--spec", type=Path, default=Path(__file__).resolve().parent / "specs/real_tiny.yaml")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.real:
        lines = _real(args.spec, args.concurrency, args.data_dir)
    else:
        start = time.perf_counter()
        outcomes, spec = simulate(
            args.problems,
            base_seed=args.seed,
            sigma=args.sigma,
            tolerance=args.tolerance,
            trials=args.trials,
            seeds=_seeds_arg(args.seeds) if args.seeds else _spec_seeds(),
            concurrency=args.concurrency or 4,
            family=args.family,
        )
        lines = summarize(outcomes, spec, time.perf_counter() - start)
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
