"""Does a study's transfer save tokens without losing accuracy, and how good is the law a study fits? Each
scale's batch-axis search starting where the smaller scales predict (`sweeps.study.transferred`) against the
same scales swept from scratch.

    python benchmarks/study_transfer.py [--problems 30] [--seed 0] [--family noise-scale|cliffs|bowls]
        [--scales 3] [--growth 4] [--growth-min 0.3] [--growth-max 0.7] [--resolution 1.25] [--fixed-axis]
        [--dump scales.jsonl]

Problems: a family of benchmarks/search_efficiency.py on the batch-search lattice of
benchmarks/batch_search.py (8..256 at `--resolution`, the spec's default 1.25; adamw and merit), at `--scales`
token budgets `--growth` x apart; the critical batch grows with the budget: B_noise (the noise-scale family) or
b_crit (cliffs, bowls) x (T / T0)^alpha, alpha drawn per problem in [growth-min, growth-max] (Power Lines,
Zhang et al.: the critical batch is a power law in the data). The truth of each scale is that scale's noise-free answer
(search_efficiency.true_answers) against the baseline. A law is judged against B* itself, the size where the
noise-free loss crosses the tolerance (`boundary`: on a lattice 1.01 apart, continued to 8192), as the law
models it: at the target, 4x past the largest budget, and in the truth's exponent (the slope of ln B* over
ln tokens through every scale's and the target's). Both arms are `sweeps.simulate.simulate_study` on the same
problems and noise: `transfer: false` and `transfer: true`.

Figures: each arm's answers within resolution of the truth and brackets holding it (per scale and
optimizer, with Wilson intervals), and its tokens; per arm, how often a batch law was fitted, its exponent's
90 % and 95 % intervals hold the truth's exponent, its prediction at the target lies within one resolution
step (`--resolution`) of B* there (and of the lattice's answer there) and its 95 % prediction interval holds
B*; the last line gives the tokens of transfer over scratch, all scales and the scales after the first.
`--dump` writes, per problem, arm and optimizer, a JSON line with each scale's B*, bracket, answer and cells
(`scale_record`): what a law's fit can be studied on without running the studies again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import batch_search as bs  # noqa: E402  (the lattice, the problems on it)
import search_efficiency as se  # noqa: E402  (the family and its objective)

SCALES = 3  # default token budgets: SCALES of them, GROWTH x apart from one unit
GROWTH = 4
TARGET_PAST = 4  # the target's budget over the largest scale's
RESOLUTION = 1.25  # the batch axis's default (sweeps.spec_sections.BatchSearchSpec)
TRUTH_MAX = 8192  # the truth's lattice: wide enough for any target's B* (32x the searched top)
EXPONENT_LEVEL = 0.90  # the exponent interval judged, beside the law's own (sweeps.law.LEVEL)
# the sizes B* is read on (`boundary`): 1.01 apart from the lattice's smallest to TRUTH_MAX
DENSE = tuple(sorted({round(bs.MIN * 1.01**k) for k in range(math.ceil(math.log(TRUTH_MAX / bs.MIN, 1.01)) + 1)}))


def budgets_of(scales: int, growth: float) -> list[int]:
    """The scales' token budgets: `scales` of them, `growth` x apart, each a whole number of lattice units."""
    return [bs.TOKEN_BUDGET * round(growth**k) for k in range(scales)]


def study_of(
    transfer: bool,
    tolerance: float,
    budgets: list[int] | None = None,
    grow: bool = True,
    resolution: float = RESOLUTION,
) -> Any:
    from sweeps.study import StudySpec

    budgets = budgets or budgets_of(SCALES, GROWTH)
    return StudySpec.model_validate(
        {
            "name": "transfer",
            "transfer": transfer,
            "grow_batch_axis": grow,
            "optimizers": [{"name": o} for o in se.OPTIMIZERS],
            "batch_sizes": {"min": bs.MIN, "max": bs.MAX, "resolution": resolution},
            "lr": {"min": se.LR_MIN, "max": se.LR_MAX},
            "degradation": {"tolerance": tolerance, "baseline": se.BASELINE},
            "resources": {"max_concurrent_trials": 4},
            "scales": {
                "models": [{"preset": "gpt2-nano", "seq_len": se.SEQ_LEN}],
                "token_budgets": budgets,
            },
            "target": {
                "model": {"preset": "gpt2-nano", "seq_len": se.SEQ_LEN},
                "token_budget": budgets[-1] * TARGET_PAST,
            },
        }
    )


def scaled(problem: se.Problem, factor: float) -> se.Problem:
    """The same problem with every optimizer's critical batch `factor` x larger: B_noise in the noise-scale
    family, b_crit (where the loss starts to grow) in the others."""
    truths = {
        o: dataclasses.replace(t, noise_scale=t.noise_scale * factor, b_crit=t.b_crit * factor)
        for o, t in problem.truths.items()
    }
    return dataclasses.replace(problem, truths=truths)


def truth_at(problem: se.Problem, resolution: float = RESOLUTION) -> dict[str, int | None]:
    """Each optimizer's true answer (against the baseline) on the lattice continued to TRUTH_MAX, so a truth
    past the searched lattice's top is a number, not its top."""
    from sweeps.batch_axis import lattice

    return _answers_on(problem, tuple(lattice(bs.MIN, TRUTH_MAX, resolution)))


def boundary(problem: se.Problem) -> dict[str, int | None]:
    """Each optimizer's B* against the baseline, to 1 %: its true answer on sizes 1.01 apart up to TRUTH_MAX."""
    return _answers_on(problem, DENSE)


def _answers_on(problem: se.Problem, sizes: tuple[int, ...]) -> dict[str, int | None]:
    answers = se.true_answers(dataclasses.replace(problem, batch_sizes=sizes))
    return {o: a["baseline"] for o, a in answers.items()}


def objective_of(problems: dict[int, se.Problem]) -> Any:
    """One objective for every scale: the scale from the run's budget, the run from `se.simulate_run`."""

    def objective(run: Any) -> list[float]:
        tps = run.batch_size * se.SEQ_LEN
        total = run.eval_tokens[-1] // tps
        sched = se.Schedule(total, run.eval_tokens[0] // tps, tps)
        reports = se.simulate_run(problems[run.eval_tokens[-1]], run.optimizer, run.batch_size, run.lr, run.seed, sched)
        losses = [r["val_loss"] for r in reports if r["status"] != "diverged"]
        return losses + [math.inf] * (len(run.eval_tokens) - len(losses))

    return objective


def run_problem(
    index: int,
    base_seed: int,
    growth: tuple[float, float],
    tolerance: float,
    family: str,
    budgets: list[int],
    grow: bool = True,
    resolution: float = RESOLUTION,
) -> dict[str, Any]:
    from sweeps.simulate import simulate_study

    lattice = study_of(False, tolerance, resolution=resolution).sweep_specs()[0].lattice
    base = bs.make_problem(family, index, lattice, base_seed=base_seed, tolerance=tolerance)
    alpha = float(np.random.default_rng([base_seed, index, 37]).uniform(*growth))
    target = budgets[-1] * TARGET_PAST
    problems = {t: scaled(base, (t / budgets[0]) ** alpha) for t in budgets}
    target_problem = scaled(base, (target / budgets[0]) ** alpha)
    target_truth = {"lattice": truth_at(target_problem, resolution), "boundary": boundary(target_problem)}
    # the truth's own exponent: the slope of ln B* over ln tokens through every scale's and the target's (the
    # family's alpha scales B_noise or b_crit; the stability edge can hold B* back from it)
    b_stars = {t: boundary(problems[t]) for t in budgets}  # each scale's B*, per optimizer
    truths = [*b_stars.values(), target_truth["boundary"]]
    slopes = {
        o: float(np.polyfit(np.log([*budgets, target]), np.log([t[o] for t in truths]), 1)[0])
        for o in se.OPTIMIZERS
        if all(t[o] for t in truths)
    }
    out: dict[str, Any] = {"records": []}
    for arm, transfer in (("scratch", False), ("transfer", True)):
        result = simulate_study(
            study_of(transfer, tolerance, budgets, grow, resolution), objective_of(problems), seed=base.seed
        )
        right, covered, tokens, sizes = [], [], [], []
        for spec, r in result.scales:
            # the scale's truth on the lattice it searched (its axis grows with the budget unless `grow` is off)
            truth = _answers_on(problems[spec.trained_tokens], tuple(spec.lattice))
            tokens.append(r.tokens_trained)
            sizes += [len(o.cells) for o in r.report.optimizers.values()]
            for opt in se.OPTIMIZERS:
                want = truth[opt]
                got = r.report.optimizers[opt].largest_degradation_free_batch_size.baseline
                right.append(bs.within(got, want, spec.lattice, resolution))
                covered.append(bs.covers(r.report.optimizers[opt].bracket.baseline, want))
        law = law_outcomes(result, slopes, target_truth, resolution)
        for opt in se.OPTIMIZERS:
            out["records"].append(
                {
                    "problem": index,
                    "arm": arm,
                    "optimizer": opt,
                    "slope": slopes.get(opt),
                    "target": {"tokens": target, "b_star": target_truth["boundary"][opt]},
                    "scales": [
                        scale_record(r.report, opt, b_stars[spec.trained_tokens][opt]) for spec, r in result.scales
                    ],
                }
            )
        out[arm] = {"right": right, "covered": covered, "tokens": tokens, "sizes": sizes, "law": law}
    return out


def scale_record(report: Any, optimizer: str, b_star: int | None) -> dict[str, Any]:
    """One scale of a study as `--dump` writes it: its B* against the baseline, its bracket and answer, the
    noise checks at its boundary, and each tested cell's fitted mean, seeds and paired verdict interval."""
    o = report.optimizers[optimizer]
    return {
        "tokens": report.trained_tokens,
        "b_star": b_star,
        "largest_fine": o.bracket.baseline.largest_fine,
        "smallest_degraded": o.bracket.baseline.smallest_degraded,
        "answer": o.largest_degradation_free_batch_size.baseline,
        "within_noise": o.within_noise.baseline,
        "noise_checks": [c.model_dump(mode="json") for c in o.noise_checks.baseline],
        "cells": [
            {
                "batch_size": c.batch_size,
                "fitted": c.val_loss_fitted.baseline,
                "seeds": c.seeds,
                "verdict": c.verdict.baseline,
                "diff_ci": c.verdict_diff_ci.baseline,
            }
            for c in o.cells
        ],
    }


def law_outcomes(
    result: Any, slopes: dict[str, float], truth: dict[str, dict[str, int | None]], resolution: float = RESOLUTION
) -> list[dict[str, Any]]:
    """Per optimizer, the law an arm's study fitted against the truth: whether it was fitted, whether its
    exponent's interval (the law's, at sweeps.law.LEVEL, and the same scales' at EXPONENT_LEVEL) holds the
    truth's exponent (`slopes`), whether its prediction at the target lies within one resolution step
    (`resolution`) of B* there (`truth["boundary"]`) and of the lattice's answer (`truth["lattice"]`), and
    whether its prediction interval holds B*."""
    from sweeps.law import BatchLaw, fit_batch_law, scale_of

    out = []
    for law in result.laws():
        row: dict[str, Any] = {"fitted": law.tokens_interval is not None}
        if law.tokens_interval is not None and law.optimizer in slopes:
            scales = [scale_of(r.report, law.optimizer, law.against) for _, r in result.scales]
            refit = fit_batch_law(scales, EXPONENT_LEVEL)
            assert isinstance(refit, BatchLaw)
            for key, (lo, hi) in (
                ("exponent_held", law.tokens_interval),
                ("exponent_level_held", refit.tokens_interval),
            ):
                row[key] = lo <= slopes[law.optimizer] <= hi
            row["exponent_width"] = refit.tokens_interval[1] - refit.tokens_interval[0]
        want, lattice_want = truth["boundary"].get(law.optimizer), truth["lattice"].get(law.optimizer)
        if law.predicted is not None and want is not None and lattice_want is not None:
            step = math.log(resolution) + 1e-9
            row["within_step"] = abs(math.log(law.predicted.value / want)) <= step
            row["within_lattice_step"] = abs(math.log(law.predicted.value / lattice_want)) <= step
            row["band_held"] = law.predicted.low <= want <= law.predicted.high
        out.append(row)
    return out


def share(hits: list[bool]) -> str:
    return bs.share(hits) if hits else "(none)"


def print_laws(arm: str, laws: list[dict[str, Any]]) -> None:
    from sweeps.law import LEVEL

    fitted = [r for r in laws if r["fitted"]]
    held = [r["exponent_level_held"] for r in fitted if "exponent_level_held" in r]
    width = statistics.fmean(r["exponent_width"] for r in fitted if "exponent_width" in r) if held else math.nan
    print(
        f"{arm:>9} law, at a target {TARGET_PAST}x past the largest scale: fitted {share([r['fitted'] for r in laws])}; "
        f"the exponent's {EXPONENT_LEVEL:.0%} interval holds the truth's {share(held)} (width {width:.2f}), "
        f"its {LEVEL:.0%} interval {share([r['exponent_held'] for r in fitted if 'exponent_held' in r])}; "
        f"the prediction within one step of B* there {share([r['within_step'] for r in laws if 'within_step' in r])} "
        f"(of the lattice's answer {share([r['within_lattice_step'] for r in laws if 'within_step' in r])}), "
        f"its {LEVEL:.0%} band holds B* {share([r['band_held'] for r in laws if 'band_held' in r])}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--growth-min", type=float, default=0.3)
    ap.add_argument("--growth-max", type=float, default=0.7)
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--family", choices=sorted(se.FAMILIES), default="noise-scale")
    ap.add_argument("--scales", type=int, default=SCALES, help="token budgets swept")
    ap.add_argument("--growth", type=float, default=GROWTH, help="ratio of consecutive token budgets")
    ap.add_argument("--resolution", type=float, default=RESOLUTION, help="the batch axis's resolution")
    ap.add_argument("--dump", type=Path, help="write each arm's scales, per problem and optimizer, as JSON lines")
    ap.add_argument("--fixed-axis", action="store_true", help="every scale searches 8..256 (grow_batch_axis: false)")
    args = ap.parse_args()
    started = time.perf_counter()
    growth = (args.growth_min, args.growth_max)
    budgets = budgets_of(args.scales, args.growth)
    outs = [
        run_problem(i, args.seed, growth, args.tolerance, args.family, budgets, not args.fixed_axis, args.resolution)
        for i in range(args.problems)
    ]
    if args.dump:
        args.dump.write_text("".join(json.dumps(r) + "\n" for o in outs for r in o["records"]))
    for arm in ("scratch", "transfer"):
        right = [x for o in outs for x in o[arm]["right"]]
        covered = [x for o in outs for x in o[arm]["covered"]]
        print(
            f"{arm:>9}: answer within resolution of the truth {bs.share(right)}, bracket holds it {bs.share(covered)}, "
            f"sizes tested {statistics.fmean(x for o in outs for x in o[arm]['sizes']):.1f} per optimizer and scale, "
            f"tokens {sum(sum(o[arm]['tokens']) for o in outs):,}"
        )
    for arm in ("scratch", "transfer"):
        print_laws(arm, [row for o in outs for row in o[arm]["law"]])
    total = [sum(sum(o[a]["tokens"]) for o in outs) for a in ("scratch", "transfer")]
    later = [sum(sum(o[a]["tokens"][1:]) for o in outs) for a in ("scratch", "transfer")]
    paired = [int(a) - int(b) for o in outs for a, b in zip(o["transfer"]["right"], o["scratch"]["right"], strict=True)]
    print(
        f"right, transfer - scratch (paired): {statistics.fmean(paired):+.3f} +- "
        f"{1.96 * statistics.stdev(paired) / math.sqrt(len(paired)):.3f}; {time.perf_counter() - started:.0f} s"
    )
    print(
        f"tokens transfer/scratch = {total[1] / total[0]:.2f} (the scales after the first {later[1] / later[0]:.2f}), "
        f"{args.problems} {args.family} problems x {args.scales} scales {args.growth:g}x apart, "
        f"resolution {args.resolution:g}"
    )


if __name__ == "__main__":
    main()
