"""The statistics of the analysis, pure numerics: Student-t intervals of a mean and of differences
(paired by seed, or Welch's), the isotonic fit of cell means in batch size, and cell means adjusted for
what each seed shares across cells. Their rules in words: docs/researchers.md, "How a verdict is reached";
`sweeps.analysis` applies them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import scipy.optimize
import scipy.special

K = TypeVar("K")

CI_LEVEL = 0.95  # of every interval of a mean; the verdicts split 1 - CI_LEVEL over their comparisons


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t with `df` (> 0, real: Welch's degrees of freedom) degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got p={p}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got df={df}")
    # the ufunc behind scipy.stats.t.ppf (its `_ppf`), called directly: the same value, without ~70 us of
    # argument checking per call (every verdict of every look of a simulated sweep asks for one)
    return float(scipy.special.stdtrit(df, p))


def sample_variance(samples: Sequence[float]) -> float:
    """Unbiased sample variance (n - 1 in the denominator) of >= 2 samples, in floats (two passes, fsum):
    `statistics.variance` works in exact fractions, ~30x slower, and every verdict of every look of a
    simulated sweep asks for it. Exactly 0 when the samples are all equal."""
    n = len(samples)
    if n < 2:
        raise ValueError(f"sample_variance needs at least 2 samples, got {n}")
    if min(samples) == max(samples):
        return 0.0
    mean = math.fsum(samples) / n
    return math.fsum((x - mean) ** 2 for x in samples) / (n - 1)


def mean_ci95(samples: Sequence[float]) -> tuple[float, float, float, bool]:
    """(mean, lo, hi, ci_available): Student-t 95% interval of the mean; n = 1 gives (m, m, m, False)."""
    n = len(samples)
    if n == 0:
        raise ValueError("mean_ci95 needs at least one sample")
    mean = statistics.fmean(samples)
    if n == 1:
        return mean, mean, mean, False
    half = t_quantile(0.5 + CI_LEVEL / 2, n - 1) * math.sqrt(sample_variance(samples) / n)
    return mean, mean - half, mean + half, True


def welch_diff_ci95(
    x: Sequence[float], y: Sequence[float], scale: float = 1.0, level: float = CI_LEVEL
) -> tuple[float, float, float] | None:
    """(d, lo, hi) for d = mean(x) - scale x mean(y), Welch interval at `level` (95% by default);
    None with < 2 samples in either."""
    if len(x) < 2 or len(y) < 2:
        return None
    d = statistics.fmean(x) - scale * statistics.fmean(y)
    a = sample_variance(x) / len(x)
    b = scale * scale * sample_variance(y) / len(y)
    var = a + b
    if var == 0.0:
        return d, d, d
    df = var * var / (a * a / (len(x) - 1) + b * b / (len(y) - 1))
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(var)
    return d, d - half, d + half


def monotone_fit(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest `values` in weighted least squares: isotonic regression (scipy's
    pool-adjacent-violators). Cell means in batch-size order, weighted by their samples: one noisy cell
    pooled with its neighbours instead of ending the walk alone."""
    if not values:
        return []
    fit = scipy.optimize.isotonic_regression(list(values), weights=list(weights), increasing=True)
    return [float(v) for v in fit.x]


# Huber's constant, in units of the runs' noise scale: a residual up to this far counts in full (95 %
# efficiency where the noise is normal), one farther (a loss spike) by its distance only
HUBER_K = 1.345


def _seeds_connect(ran: np.ndarray) -> bool:
    """Whether the runs link every cell to every other through shared seeds: the cells x seeds layout
    `ran` (1 where the cell ran the seed) as a bipartite graph is connected. Then mu and alpha of the
    two-way fit are unique up to one shared constant. By hand: scipy's `connected_components` takes
    0.5 ms a call on graphs this small, this search 0.09 ms, once per report."""
    linked = ran > 0  # (cells, seeds)
    reached = linked[:, 0]
    while True:
        seeds = linked[reached].any(axis=0)  # the seeds the reached cells ran
        grown = linked[:, seeds].any(axis=1)  # the cells that ran one of them
        if grown.sum() == reached.sum():
            return bool(grown.all())
        reached = grown


def _two_way_fit(y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weighted least-squares fit of y[c, s] = mu[c] + alpha[s] with weights w[c, s] (0 where cell c
    did not run seed s), alpha centred on 0, for a layout whose seeds connect every cell (`_seeds_connect`).
    The cells' block of the normal equations is diagonal, so mu is eliminated and a seeds x seeds system
    is left: L alpha = A - W' (Y / d), L = diag(e) - W' diag(1/d) W, d and e the weights' row and column
    sums. L is singular along the constant only, and the right side sums to 0, so (L + 1 1') alpha = the
    same right side has the one solution with sum(alpha) = 0: a plain solve (LAPACK's LU; the least-squares
    solve that finds the same alpha took 1.7x as long in the adaptive-seed test)."""
    d, e = w.sum(axis=1), w.sum(axis=0)  # (cells,), (seeds,)
    wy = w * y
    system = np.diag(e) - w.T @ (w / d[:, None]) + 1.0  # (seeds, seeds)
    rhs = wy.sum(axis=0) - w.T @ (wy.sum(axis=1) / d)
    alpha = np.linalg.solve(system, rhs)
    alpha -= alpha.mean()  # 0 up to round-off
    mu = (wy.sum(axis=1) - w @ alpha) / d
    return mu, alpha


def seed_adjusted_means(samples: dict[K, dict[int, float]]) -> dict[K, float]:
    """Per cell, its mean loss over every seed run in any of the cells, with what a seed shares across
    cells taken out: the fit of loss(c, s) = mu_c + alpha_s (seed s has the same init and data order in
    every cell, the pairing the verdicts use), and mu_c + the mean of alpha_s over those seeds. A cell with
    2 seeds beside cells with 6 is moved by how seeds 3..6 ran in the cells that have them, so that every
    cell is compared on the same seeds.

    The fit is robust (Huber, `HUBER_K` x the noise scale, that scale 1.4826 x the median absolute
    residual, read from the fit before, 3 rounds from least squares): one run that ended on a loss spike
    moves its cell by about HUBER_K x scale / n instead of spike / n, which at 10 seeds is still a few
    tenths of a percent, as much as the margins most answers rest on. Where the runs are too few to tell a
    spike from the noise (fewer than 3 residual degrees of freedom) it is least squares, which gives cells
    that ran the same seeds their plain means. Where the seeds do not connect every cell to the rest (no
    seed in common, never the case for seeds 1..n), all keep their plain means. Where Huber's minimum is not
    unique (a seed whose few runs all lie beyond the threshold, as many above as below), the one the
    reweighting converges to is taken: deterministic, and as good by Huber's criterion. By hand: iteratively
    reweighted least squares on the two-way layout's own normal equations (a seeds x seeds solve), where
    scipy's general `least_squares` on the (runs x cells + seeds) design made the benchmark 1.7x slower."""
    cells = [c for c, by_seed in samples.items() if by_seed]
    seeds = sorted({s for c in cells for s in samples[c]})
    plain = {c: statistics.fmean(samples[c].values()) for c in cells}
    runs = sum(len(samples[c]) for c in cells)
    dof = runs - (len(cells) + len(seeds) - 1)  # mu and alpha are identifiable up to one shared constant
    if len(cells) < 2 or (dof < 3 and all(len(samples[c]) == len(seeds) for c in cells)):
        return plain  # least squares gives exactly these where every cell ran the same seeds
    column = {s: j for j, s in enumerate(seeds)}
    y = np.zeros((len(cells), len(seeds)))  # (cells, seeds), losses
    ran = np.zeros_like(y)  # 1 where the cell ran the seed
    for i, c in enumerate(cells):
        for s, v in samples[c].items():
            y[i, column[s]], ran[i, column[s]] = v, 1.0
    centre = float(y.sum() / runs)  # fitted around the runs' mean: the spike's few thousandths against 3.x
    y = np.where(ran > 0, y - centre, 0.0)
    if not _seeds_connect(ran):
        return plain
    mu, alpha = _two_way_fit(y, ran)
    for _ in range(3 if dof >= 3 else 0):
        residual = np.abs(y - mu[:, None] - alpha[None, :])[ran > 0]  # (runs,)
        scale = 1.4826 * float(np.median(residual)) * math.sqrt(runs / dof)
        if not scale > 0:
            break
        for _ in range(100):  # Huber's weights from the residuals, refitted until the fit stops moving
            r = np.abs(y - mu[:, None] - alpha[None, :])
            w = ran * np.minimum(1.0, HUBER_K * scale / np.maximum(r, 1e-300))
            new_mu, new_alpha = _two_way_fit(y, w)  # w > 0 where ran > 0: connected as `ran` is
            moved = max(float(np.max(np.abs(new_mu - mu))), float(np.max(np.abs(new_alpha - alpha))))
            mu, alpha = new_mu, new_alpha
            if moved <= 1e-13:
                break
    return {c: float(mu[i]) + centre for i, c in enumerate(cells)}


def paired_diff_ci(
    x: dict[int, float], y: dict[int, float], scale: float, level: float
) -> tuple[float, float, float, int] | None:
    """(d, lo, hi, n) for d = mean over the seeds s in both of x[s] - scale x y[s]: the Student-t interval
    at `level` of the mean paired difference (seed s has the same init and data order in both cells, so
    what the seed shares cancels). None with fewer than 2 common seeds."""
    seeds = sorted(set(x) & set(y))
    if len(seeds) < 2:
        return None
    diffs = [x[s] - scale * y[s] for s in seeds]
    d = statistics.fmean(diffs)
    half = t_quantile(0.5 + level / 2, len(diffs) - 1) * math.sqrt(sample_variance(diffs) / len(diffs))
    return d, d - half, d + half, len(diffs)
