"""Does a study's transfer save tokens without losing accuracy? Each scale's batch-axis search starting where
the smaller scales predict (`sweeps.study.transferred`) against the same scales swept from scratch.

    python benchmarks/study_transfer.py [--problems 30] [--seed 0] [--growth-min 0.3] [--growth-max 0.7]

Problems: the noise-scale family of benchmarks/search_efficiency.py on the batch-search lattice of
benchmarks/batch_search.py (8..256 at 1.25, adamw and merit), at three token budgets 4x apart; the
critical batch grows with the budget as B_noise x (T / T0)^alpha, alpha drawn per problem in [growth-min,
growth-max] (Power Lines, Zhang et al.: the critical batch is a power law in the data). The truth of each
scale is that scale's noise-free answer (search_efficiency.true_answers) against the baseline. Both arms are
`sweeps.simulate.simulate_study` on the same problems and noise: `transfer: false` and `transfer: true`.

Figures: each arm's answers within resolution of the truth and brackets holding it (per scale and
optimizer, with Wilson intervals), and its tokens; the last line gives the tokens of transfer over
scratch, all scales and the scales after the first.
"""

from __future__ import annotations

import argparse
import dataclasses
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

SCALES = 3
GROWTH = 4  # the token budgets' ratio


def study_of(transfer: bool, tolerance: float) -> Any:
    from sweeps.study import StudySpec

    unit = bs.TOKEN_BUDGET
    return StudySpec.model_validate(
        {
            "name": "transfer",
            "transfer": transfer,
            "optimizers": [{"name": o} for o in se.OPTIMIZERS],
            "batch_sizes": {"min": bs.MIN, "max": bs.MAX, "resolution": 1.25},
            "lr": {"min": se.LR_MIN, "max": se.LR_MAX},
            "degradation": {"tolerance": tolerance, "baseline": se.BASELINE},
            "resources": {"max_concurrent_trials": 4},
            "scales": {
                "models": [{"preset": "gpt2-nano", "seq_len": se.SEQ_LEN}],
                "token_budgets": [unit * GROWTH**k for k in range(SCALES)],
            },
            "target": {"model": {"preset": "gpt2-nano", "seq_len": se.SEQ_LEN}, "token_budget": unit * GROWTH**SCALES},
        }
    )


def scaled(problem: se.Problem, factor: float) -> se.Problem:
    """The same problem with every optimizer's B_noise (and so its critical batch) `factor` x larger."""
    truths = {o: dataclasses.replace(t, noise_scale=t.noise_scale * factor) for o, t in problem.truths.items()}
    return dataclasses.replace(problem, truths=truths)


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


def run_problem(index: int, base_seed: int, growth: tuple[float, float], tolerance: float) -> dict[str, Any]:
    from sweeps.simulate import simulate_study

    lattice = study_of(False, tolerance).sweep_specs()[0].lattice
    base = bs.make_problem("noise-scale", index, lattice, base_seed=base_seed, tolerance=tolerance)
    alpha = float(np.random.default_rng([base_seed, index, 37]).uniform(*growth))
    budgets = [bs.TOKEN_BUDGET * GROWTH**k for k in range(SCALES)]
    problems = {t: scaled(base, (GROWTH**k) ** alpha) for k, t in enumerate(budgets)}
    out: dict[str, Any] = {}
    for arm, transfer in (("scratch", False), ("transfer", True)):
        result = simulate_study(study_of(transfer, tolerance), objective_of(problems), seed=base.seed)
        right, covered, tokens, sizes = [], [], [], []
        for spec, r in result.scales:
            truth = se.true_answers(problems[spec.trained_tokens])
            tokens.append(r.tokens_trained)
            sizes += [len(o.cells) for o in r.report.optimizers.values()]
            for opt in se.OPTIMIZERS:
                want = truth[opt]["baseline"]
                got = r.report.optimizers[opt].largest_degradation_free_batch_size.baseline
                right.append(bs.within(got, want, lattice, 1.25))
                covered.append(bs.covers(r.report.optimizers[opt].bracket.baseline, want))
        out[arm] = {"right": right, "covered": covered, "tokens": tokens, "sizes": sizes}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--growth-min", type=float, default=0.3)
    ap.add_argument("--growth-max", type=float, default=0.7)
    ap.add_argument("--tolerance", type=float, default=0.01)
    args = ap.parse_args()
    started = time.perf_counter()
    outs = [run_problem(i, args.seed, (args.growth_min, args.growth_max), args.tolerance) for i in range(args.problems)]
    for arm in ("scratch", "transfer"):
        right = [x for o in outs for x in o[arm]["right"]]
        covered = [x for o in outs for x in o[arm]["covered"]]
        print(
            f"{arm:>9}: answer within resolution of the truth {bs.share(right)}, bracket holds it {bs.share(covered)}, "
            f"sizes tested {statistics.fmean(x for o in outs for x in o[arm]['sizes']):.1f} per optimizer and scale, "
            f"tokens {sum(sum(o[arm]['tokens']) for o in outs):,}"
        )
    total = [sum(sum(o[a]["tokens"]) for o in outs) for a in ("scratch", "transfer")]
    later = [sum(sum(o[a]["tokens"][1:]) for o in outs) for a in ("scratch", "transfer")]
    paired = [int(a) - int(b) for o in outs for a, b in zip(o["transfer"]["right"], o["scratch"]["right"], strict=True)]
    print(
        f"right, transfer - scratch (paired): {statistics.fmean(paired):+.3f} +- "
        f"{1.96 * statistics.stdev(paired) / math.sqrt(len(paired)):.3f}; {time.perf_counter() - started:.0f} s"
    )
    print(
        f"tokens transfer/scratch = {total[1] / total[0]:.2f} (the scales after the first {later[1] / later[0]:.2f}), "
        f"{args.problems} problems x {SCALES} scales"
    )


if __name__ == "__main__":
    main()
