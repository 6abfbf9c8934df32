"""Pure planning of a sweep: cell order, warm-start points, names."""

from __future__ import annotations

import math


def cell_key(optimizer: str, batch_size: int) -> str:
    return f"{optimizer}/bs{batch_size}"


def study_name(sweep_id: str, optimizer: str, batch_size: int) -> str:
    """One Optuna study per cell; the name is stable so a re-run of the same sweep id resumes it."""
    return f"{sweep_id}/{cell_key(optimizer, batch_size)}"


def cell_order(optimizers: list[str], batch_sizes: list[int]) -> list[tuple[str, int]]:
    """Priority in which cells get free trial slots: smaller batches first, optimizers interleaved,
    so every optimizer's warm-start chain advances and no optimizer waits for another to finish."""
    return [(opt, bs) for bs in sorted(batch_sizes) for opt in optimizers]


# ln-lr spacing of a warm-started cell's first three trials (the dense grid of 12 lrs over
# [1e-4, 3e-2] is spaced 0.52): close enough that a parabola through them locates the optimum,
# wide enough that seed noise does not swamp the differences between them
BRACKET_STEP = 0.5


def warm_start_lrs(
    prev_best_lr: float,
    prev_batch_size: int,
    batch_size: int,
    *,
    lr_min: float,
    lr_max: float,
    upper: tuple[float, int] | None = None,
) -> list[float]:
    """First lrs of a cell: a bracket around the smaller batch's best lr sqrt-scaled by the batch ratio
    (the square-root rule for Adam-type optimizers), at that lr and BRACKET_STEP either side in ln lr;
    clipped to the searched range, duplicates dropped. With `upper` ((best lr, batch size) of a searched
    larger batch: a bisection between two searched sizes) the centre is interpolated between the two
    instead, linearly in ln lr over ln batch size: what both measured, not a rule."""
    if not (prev_batch_size > 0 and batch_size > 0 and prev_best_lr > 0):
        raise ValueError(
            f"need positive batch sizes and lr, got prev_batch_size={prev_batch_size}, "
            f"batch_size={batch_size}, prev_best_lr={prev_best_lr}"
        )
    if upper is not None:
        up_lr, up_b = upper
        if not (up_lr > 0 and up_b > batch_size > prev_batch_size):
            raise ValueError(
                f"need upper=(lr > 0, batch size > {batch_size} > prev_batch_size={prev_batch_size}), got {upper}"
            )
        w = math.log(batch_size / prev_batch_size) / math.log(up_b / prev_batch_size)
        centre = math.exp((1 - w) * math.log(prev_best_lr) + w * math.log(up_lr))
    else:
        centre = prev_best_lr * math.sqrt(batch_size / prev_batch_size)
    out: list[float] = []
    for lr in (centre, centre * math.exp(-BRACKET_STEP), centre * math.exp(BRACKET_STEP)):
        lr = min(max(lr, lr_min), lr_max)
        if all(not math.isclose(lr, seen, rel_tol=1e-9) for seen in out):
            out.append(lr)
    return out


def coarse_lrs(lr_min: float, lr_max: float, points: int = 3) -> list[float]:
    """First lrs of a cell with nothing to start from (the smallest batch size): `points` lrs at the
    centres of equal slices of [lr_min, lr_max] in ln lr, so a parabola can be fitted through them."""
    if not (0 < lr_min < lr_max) or points < 1:
        raise ValueError(f"need 0 < lr_min < lr_max and points >= 1, got {lr_min=}, {lr_max=}, {points=}")
    lo, span = math.log(lr_min), math.log(lr_max / lr_min)
    return [math.exp(lo + span * (i + 0.5) / points) for i in range(points)]


# a fitted optimum closer than this (in ln lr) to a tried lr is that lr: the search of the cell has
# converged (a quarter of the dense grid's 0.52 spacing)
VERTEX_MIN_GAP = 0.15
# a parabola chooses a cell's best lr (sweeps.analysis.pick_best) from the runs within this distance in ln lr
# of the lowest: farther out an asymmetric valley is no parabola, and the fit's minimum slides to its
# shallow side
PARABOLA_WINDOW = 1.1
_TIE = 1e-9  # gaps in ln lr that differ by less are equal (float round-off of the coarse start's spacing)
# A cell searched from the coarse start (an optimizer's smallest batch size, the reference every other size
# is compared with) is converged only once its best lr has a tried lr within this distance (in ln lr) on
# each side: the coarse start's lrs are ~1.9 apart, and a parabola through them slides to the shallow side
# of an asymmetric valley. On the cliffs family (benchmarks/search_efficiency.py, 80 problems of series 1)
# the reference's lr cost 0.17 % of loss on average against 0.06 % at the warm-started sizes; refined to
# this width, 0.06 %, and the answer was right 301 times of 320 instead of 288.
REFERENCE_NARROW = 0.75


def neighbourhood(points: list[tuple[float, float]], k: int = 4, window: float = math.inf) -> list[tuple[float, float]]:
    """The lowest of `points` ((lr, loss)) and its nearest neighbours in ln lr, `k` in all, none farther
    than `window` in ln lr: where a parabola describes the loss (a bowl is only quadratic near its
    minimum, and a valley steeper on one side only there)."""
    centre = math.log(min(points, key=lambda p: p[1])[0])
    near = sorted(points, key=lambda p: (abs(math.log(p[0]) - centre), p[0]))[:k]
    return [p for p in near if abs(math.log(p[0]) - centre) <= window]


def parabola_vertex(
    points: list[tuple[float, float]],
    *,
    lr_min: float | None = None,
    lr_max: float | None = None,
    k: int = 4,
    reach: float = 0.7,
    window: float = math.inf,
) -> float | None:
    """The lr where a quadratic in ln(lr), fitted by least squares to the `neighbourhood` of the lowest
    of `points` ((lr, final val loss) of a cell's completed trials), has its minimum; None with fewer
    than 3 distinct lrs there or a fit that is not convex (no minimum to step to). The vertex is clipped
    to the fitted lrs' span widened by `reach` on each side (a step out, not a leap) and to
    [lr_min, lr_max] where given."""
    import numpy as np

    if not points:
        return None
    near = neighbourhood(points, k, window)
    x = np.log([lr for lr, _ in near])
    if len(np.unique(np.round(x, 9))) < 3:
        return None
    a, b, _ = np.polyfit(x, [loss for _, loss in near], 2)
    if not a > 0:
        return None
    lo, hi = float(x.min()) - reach, float(x.max()) + reach
    if lr_min is not None:
        lo = max(lo, math.log(lr_min))
    if lr_max is not None:
        hi = min(hi, math.log(lr_max))
    return math.exp(min(max(-b / (2 * a), lo), hi))


def next_search_lr(
    done: list[tuple[float, float]],
    diverged: list[float],
    tried: list[float],
    *,
    lr_min: float,
    lr_max: float,
    narrow: float | None = None,
) -> tuple[str, float | None]:
    """The next lr of a cell's line search in ln lr, from its completed trials `done` ((lr, final val
    loss)), the lrs that `diverged` and every lr `tried` (running ones included):

    - ("vertex", lr): the best completed lr has completed neighbours on both sides: step to the vertex
      of the parabola through the best of them (`parabola_vertex`);
    - ("step", lr): it lacks one on one side: step out past it by 2 x BRACKET_STEP; where a run diverged
      above it, halve (in ln lr) the wider of the gaps to that lr and to its completed neighbour below;
    - ("converged", None): that step lands within VERTEX_MIN_GAP of a tried lr (the optimum is there);
      with `narrow` (in ln lr), only once a tried lr lies within `narrow` of the best on both sides: until
      then ("step", lr) BRACKET_STEP towards the side without one, upwards first;
    - ("step", lr) down: nothing completed and runs diverged: 2 x BRACKET_STEP below the lowest of
      them (a divergence says "lower"; a random draw anywhere in the range would waste the next run on
      an lr the divergence already rules out, or far below the edge where the best lr of a large batch
      sits);
    - ("explore", None): nothing tried to end, or no convex fit: the sampler (TPE) proposes.
    """
    if not done:
        if not diverged:
            return ("explore", None)
        lr = max(min(diverged) * math.exp(-2 * BRACKET_STEP), lr_min)
        if min(abs(math.log(lr / t)) for t in tried) < VERTEX_MIN_GAP:
            return ("explore", None)  # that step was tried (it ended without a loss, or is running)
        return ("step", lr)
    best_lr = min(done, key=lambda p: p[1])[0]
    below = any(lr < best_lr for lr, _ in done)
    above = any(lr > best_lr for lr, _ in done)
    if below and above:
        lr = parabola_vertex(done, lr_min=lr_min, lr_max=lr_max)
        if lr is None:
            return ("explore", None)
        kind = "vertex"
    elif not above:
        cliff = min((d for d in diverged if d > best_lr), default=None)
        lower = max((lr for lr, _ in done if lr < best_lr), default=None)
        if cliff is None:
            lr = best_lr * math.exp(2 * BRACKET_STEP)
        elif lower is not None and math.log(best_lr / lower) > math.log(cliff / best_lr) + _TIE:
            lr = math.sqrt(lower * best_lr)  # the gap below is wider: halve it
        else:
            # towards the divergence, also on a tie (the coarse start's equal gaps): the optimum of a
            # valley that ends in a cliff lies nearer the cliff than its completed neighbour below
            lr = math.sqrt(best_lr * cliff)
        kind = "step"
    else:
        lr, kind = best_lr * math.exp(-2 * BRACKET_STEP), "step"
    lr = min(max(lr, lr_min), lr_max)

    def ending() -> tuple[str, float | None]:
        # where the line search has nowhere left to step: below a lone best under a cliff, else narrowed
        return _below_cliff(best_lr, diverged, tried, lr_min) or _narrowed(
            best_lr, tried, narrow, lr_min=lr_min, lr_max=lr_max
        )

    # Converged only where the step lands on the best lr itself. A step onto another tried lr (a worse
    # one: the fit's minimum is not there) halves the gap between the best and it instead.
    if abs(math.log(lr / best_lr)) < VERTEX_MIN_GAP:
        return ending()
    near = min(tried, key=lambda t: abs(math.log(lr / t)))
    if abs(math.log(lr / near)) < VERTEX_MIN_GAP:
        lr = math.sqrt(best_lr * near)
        if min(abs(math.log(lr / t)) for t in [*tried, best_lr]) < VERTEX_MIN_GAP:
            return ending()
    return (kind, lr)


def _below_cliff(best_lr: float, diverged: list[float], tried: list[float], lr_min: float) -> tuple[str, float] | None:
    """("step", lr) PROBE_STEP under `best_lr` where a run diverged above it and no lr was tried below it; None
    where either is not so, or that step falls below `lr_min`.

    A search that would end there has one completed lr, at a stability edge that varies by seed: one step down
    gives the cell the best two lrs a cliff's confirmation seeds run at (`cliff_pair`), and a lower lr to
    retreat to where a seed diverges at the best, near the edge where the best loss is."""
    if not any(d > best_lr * (1.0 + _TIE) for d in diverged):
        return None
    if any(t < best_lr * (1.0 - _TIE) for t in tried):
        return None
    lr = best_lr * math.exp(-PROBE_STEP)
    return ("step", lr) if lr >= lr_min * (1.0 - _TIE) else None


# A probe below a diverged confirmation run: this far below (in ln lr) the lowest lr at which a run of the
# cell diverged. Near a stability edge that varies by seed, the search's own lrs below it may be a whole
# step (2 x BRACKET_STEP) away or absent; a quarter of that keeps the cell near the edge, where its best
# loss is, while clearing the seed-to-seed spread of the edge
PROBE_STEP = 0.25


def probe_lr(
    confirmations_diverged: list[float], completed: list[float], diverged: list[float], *, lr_min: float
) -> float | None:
    """The lr at which a cell probes below a diverged confirmation run, or None.

    `confirmations_diverged`: the lrs of the cell's diverged confirmation runs; `completed`: of its search
    trials trained to the end; `diverged`: of its search trials that diverged. Where a confirmation run
    diverged at c (the lowest such) and no search trial below c trained to the end (nothing for the
    retreat to go to: `sweeps.analysis.pick_stable`), PROBE_STEP below the lowest lr that diverged there (c,
    or a probe below it that diverged too), clipped to `lr_min`; None where a completed search lr lies
    below c, no confirmation run diverged, or `lr_min` itself diverged."""
    if not confirmations_diverged:
        return None
    ceiling = min(confirmations_diverged)
    if any(ceiling * math.exp(-2 * PROBE_STEP) * (1.0 - _TIE) <= lr < ceiling * (1.0 - _TIE) for lr in completed):
        return None
    low = min([ceiling, *diverged])
    if low <= lr_min * (1.0 + _TIE):
        return None
    return max(low * math.exp(-PROBE_STEP), lr_min)


def _narrowed(
    best_lr: float, tried: list[float], narrow: float | None, *, lr_min: float, lr_max: float
) -> tuple[str, float | None]:
    """A converged search, or its step BRACKET_STEP out from the best lr towards a side with no tried lr
    within `narrow` (in ln lr; upwards first), where that step is inside the range and off the best lr."""
    if narrow is not None:
        centre = math.log(best_lr)
        for side in (1.0, -1.0):
            gaps = [side * (math.log(t) - centre) for t in tried]
            if min((g for g in gaps if g > _TIE), default=math.inf) > narrow:
                lr = min(max(best_lr * math.exp(side * BRACKET_STEP), lr_min), lr_max)
                if abs(math.log(lr / best_lr)) >= VERTEX_MIN_GAP:
                    return ("step", lr)
    return ("converged", None)


def run_name(
    optimizer: str, batch_size: int, lr: float | None = None, seed: int | None = None, warmup: float | None = None
) -> str:
    """MLflow run names a person can read: `merit bs=64 lr=3.1e-03 seed=1`, with `warmup=0.02` where the
    sweep searches the warm-up (in the spec's unit)."""
    name = f"{optimizer} bs={batch_size}"
    if lr is not None:
        name += f" lr={lr:.1e}"
    if seed is not None:
        name += f" seed={seed}"
    if warmup is not None:
        name += f" warmup={warmup:g}"
    return name


# A cell's best search lr sits at a cliff where a search trial above it diverged within this distance (in
# ln lr), or at the next lr the search tried above it: the stability edge varies by seed, and one confirmation
# run diverging there would move the cell to a lower lr with the seeds' budget partly spent
CLIFF_GAP = 2 * PROBE_STEP


def cliff_pair(best_lr: float, done: list[tuple[float, float]], diverged: list[float]) -> tuple[float, float] | None:
    """The best two lrs of a search whose best lr sits at a cliff, or None.

    `best_lr`: the search's best (`sweeps.cells.pick_best` of its completed trials); `done`: (lr, final val
    loss) of its search trials trained to the end; `diverged`: the lrs of those that diverged. At a cliff
    (the lowest diverged lr above `best_lr` is within CLIFF_GAP of it in ln lr, or no completed lr lies
    between them), (`best_lr`, the completed lr other than it with the lowest loss: ties to the smaller lr);
    None where no search trial diverged above it, or no other lr completed."""
    cliff = min((d for d in diverged if d > best_lr * (1.0 + _TIE)), default=None)
    if cliff is None:
        return None
    between = any(best_lr * (1.0 + _TIE) < lr < cliff * (1.0 - _TIE) for lr, _ in done)
    if between and math.log(cliff / best_lr) > CLIFF_GAP + _TIE:
        return None
    others = [(loss, lr) for lr, loss in done if not math.isclose(lr, best_lr, rel_tol=_TIE)]
    return (best_lr, min(others)[1]) if others else None


def check_lr(
    best_lr: float,
    completed: list[tuple[float, float]],
    confirmations_diverged: list[float],
    pair: tuple[float, float] | None = None,
) -> float | None:
    """The second lr at which a cell's confirmation seeds run again, or None.

    A verdict tests the loss at one lr, and the search chose it from one seed's runs: where the optimum is
    sharp and seed noise large, it is often the wrong one of two neighbours (on the recorded real runs,
    0.5-3.5x off the best lr in every miss of benchmarks/replay_accuracy.py), and a batch size reads
    degraded, or a reference too good, because of it. Where the cell's lr `best_lr` is one of the search's
    best two at a cliff (`pair`, `cliff_pair`), the other of them, below any lr at which a confirmation run
    diverged (that lr is known unstable for some seed). Else, of the nearest completed search lr on each
    side of `best_lr` within 2 x PROBE_STEP (the reach in which the probe counts a lower lr as near) and
    below any lr at which a confirmation run diverged, the one whose search run read lower (a tie: the one
    above, where a stability edge the search stayed shy of would be). `completed`: (lr, final val loss) of
    the cell's search trials trained to the end."""
    ceiling = min(confirmations_diverged, default=math.inf) * (1.0 - _TIE)
    if pair is not None and (other := cliff_other(best_lr, pair)) is not None and other < ceiling:
        return other
    reach = math.exp(2 * PROBE_STEP) * (1.0 + _TIE)
    above = [(loss, lr) for lr, loss in completed if best_lr * (1.0 + _TIE) < lr < ceiling and lr <= best_lr * reach]
    below = [(loss, lr) for lr, loss in completed if best_lr / reach <= lr < best_lr * (1.0 - _TIE)]
    sides = [min(above, key=lambda x: x[1])] if above else []
    sides += [max(below, key=lambda x: x[1])] if below else []
    return min(sides, key=lambda x: x[0])[1] if sides else None  # min keeps the first of a tie: above


def cliff_other(best_lr: float, pair: tuple[float, float]) -> float | None:
    """The lr of `pair` (`cliff_pair`) other than `best_lr`; None where `best_lr` is neither of them."""
    first, second = pair
    if math.isclose(best_lr, first, rel_tol=_TIE):
        return second
    return first if math.isclose(best_lr, second, rel_tol=_TIE) else None
