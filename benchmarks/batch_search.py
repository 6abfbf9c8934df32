"""Does searching the batch axis find the boundary that training every lattice size finds, for much less?

    python benchmarks/batch_search.py [--problems 100] [--family cliffs|bowls] [--resolution 1.25]
                                      [--concurrency 4] [--workers 2] [--seed 0]

Targets: the same answer, within `resolution`, as a sweep that trains every size of the lattice in >= 95 %
of answers, at <= 0.6 of its tokens; the search's bracket holds the truth in >= 95 % of answers. The last
line gives the token ratio, the coverage and the agreement (beside listing's agreement with itself, the
most any method can reach).

Both methods are the project's own code through `sweeps.simulate.simulate` (the searcher, pruning,
adaptive seeds, the report): the search is a spec with `batch_sizes: {min: 8, max: 256, resolution}`,
the peer the same spec with `batch_sizes:` every size of that lattice (21 sizes at 1.25), fed the same
noise for the same run. Problems are benchmarks/search_efficiency.py's families on the lattice, with the
critical batch size drawn log-uniform in [min / 2, 2 x max] for the baseline (x U[0.5, 4] for the other
optimizer), so the true boundary lies anywhere in the range and beyond both ends. The truth is the
largest degradation-free lattice size of the noiseless losses (search_efficiency.true_answers); an
answer is judged against the search's `against` reference (the baseline, the default).

Figures, each with its 95 % Wilson interval where it is a share of answers:
- answer agrees: the search's answer (the report's point estimate, largest_degradation_free_batch_size)
  is within `resolution` of the full lattice sweep's (the same size, a neighbour, or both none);
- the full lattice against itself: the same sweep on the same problem with every draw of noise new (other
  seeds): how often listing agrees with listing, the most any method can agree with it;
- answer within resolution of the truth, for the search and for the full sweep;
- the bracket [largest_fine, smallest_degraded) holds the truth, for both;
- tokens and simulated wall time (trials `--concurrency` at a time) of the search over the full sweep.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from sweeps.analysis import Bracket, Report

sys.path.insert(0, str(Path(__file__).resolve().parent))

import search_efficiency as se  # noqa: E402  (the problem families and the objective)

MIN, MAX = 8, 256
TOKEN_BUDGET = 1_720_320  # lcm of the 1.25 lattice over 8..256 (26,880) x seq_len 64: one unit


def make_spec(
    batch_sizes: Any, *, concurrency: int, tolerance: float, trials: int = 6, seeds: Any = None, budget: int = 0
) -> Any:
    from sweeps.spec import SweepSpec

    data: dict[str, Any] = {
        "name": "batch-search",
        "model": {"preset": "gpt2-nano", "seq_len": se.SEQ_LEN},
        "optimizers": [{"name": o} for o in se.OPTIMIZERS],
        "batch_sizes": batch_sizes,
        "token_budget": budget or TOKEN_BUDGET,
        "lr": {"min": se.LR_MIN, "max": se.LR_MAX, "trials_per_batch_size": trials},
        "degradation": {"tolerance": tolerance, "baseline": se.BASELINE},
        "resources": {"max_concurrent_trials": concurrency},
    }
    if seeds is not None:
        data["seeds"] = seeds
    return SweepSpec.from_mapping(data, max_trials=10**6)


def make_problem(family: str, index: int, lattice: Sequence[int], *, base_seed: int, tolerance: float) -> se.Problem:
    """A problem of `family` on the lattice, its boundary anywhere in [MIN / 2, 2 x MAX] (module docstring)."""
    p = se.FAMILIES[family](index, base_seed=base_seed, tolerance=tolerance)
    rng = np.random.default_rng([base_seed, index, 31])
    b_crit = math.exp(rng.uniform(math.log(MIN / 2), math.log(2 * MAX)))
    crits = {opt: b_crit if opt == se.BASELINE else b_crit * float(rng.uniform(0.5, 4.0)) for opt in p.truths}
    # the noise-scale family's boundary follows B_noise (b_crit is its nominal twentieth)
    truths = {
        opt: dataclasses.replace(t, b_crit=crits[opt], noise_scale=20.0 * crits[opt] if t.noise_scale else 0.0)
        for opt, t in p.truths.items()
    }
    return dataclasses.replace(p, truths=truths, batch_sizes=tuple(lattice))


@dataclass
class Outcome:
    truth: dict[str, int | None]  # per optimizer, against the reference the search uses
    search: dict[str, Any]  # per optimizer: answer (a batch size or None), bracket (a `Bracket`)
    full: dict[str, Any]
    # the full lattice again on the same problem with other noise (other seeds' draws): how often listing
    # agrees with itself, the most any method can agree with it
    again: dict[str, Any]
    tokens: tuple[int, int]  # search, full
    wall: tuple[int, int]
    sizes: dict[str, int]  # per optimizer: sizes the search tested


def _answers(report: Report, ref: str) -> dict[str, Any]:
    return {
        opt: {"answer": getattr(r.largest_degradation_free_batch_size, ref), "bracket": getattr(r.bracket, ref)}
        for opt, r in report.optimizers.items()
    }


def run_problem(args: tuple[str, int, int, float, float, int]) -> Outcome:
    from sweeps.simulate import simulate

    family, index, base_seed, resolution, tolerance, concurrency = args
    search_spec = make_spec(
        {"min": MIN, "max": MAX, "resolution": resolution}, concurrency=concurrency, tolerance=tolerance
    )
    lattice = search_spec.lattice
    full_spec = make_spec(lattice, concurrency=concurrency, tolerance=tolerance, budget=search_spec.trained_tokens)
    assert full_spec.trained_tokens == search_spec.trained_tokens  # the same tokens per trial
    problem = make_problem(family, index, lattice, base_seed=base_seed, tolerance=tolerance)
    ref = search_spec.batch_search.against
    truth = {opt: t[ref] for opt, t in se.true_answers(problem).items()}
    s = simulate(search_spec, se.objective_of(problem, search_spec), seed=problem.seed)
    f = simulate(full_spec, se.objective_of(problem, full_spec), seed=problem.seed)
    other = dataclasses.replace(problem, seed=problem.seed + 1)  # the same truth, every draw of noise new
    g = simulate(full_spec, se.objective_of(other, full_spec), seed=other.seed)
    return Outcome(
        truth,
        _answers(s.report, ref),
        _answers(f.report, ref),
        _answers(g.report, ref),
        (s.tokens_trained, f.tokens_trained),
        (s.wall_tokens, f.wall_tokens),
        {opt: len(r.search_steps) for opt, r in s.report.optimizers.items()},
    )


def within(a: int | None, b: int | None, lattice: Sequence[int], resolution: float) -> bool:
    """The same answer within `resolution`: both none, or sizes at most `resolution` apart."""
    if a is None or b is None:
        return a is None and b is None
    return max(a, b) / min(a, b) <= resolution + 1e-9


def covers(bracket: Bracket, truth: int | None) -> bool:
    lo, hi = bracket.largest_fine, bracket.smallest_degraded
    if truth is None:
        return lo is None
    return (lo is None or lo <= truth) and (hi is None or truth < hi)


def share(hits: Sequence[bool]) -> str:
    lo, hi = se.wilson(sum(hits), len(hits))
    return f"{statistics.fmean(hits):.3f} [{lo:.2f}, {hi:.2f}]"


def summarize(
    outcomes: Sequence[Outcome], lattice: Sequence[int], resolution: float, family: str, wall_s: float
) -> list[str]:
    answers = [(o, opt) for o in outcomes for opt in o.truth]
    agree = [within(o.search[opt]["answer"], o.full[opt]["answer"], lattice, resolution) for o, opt in answers]
    itself = [within(o.full[opt]["answer"], o.again[opt]["answer"], lattice, resolution) for o, opt in answers]
    right_s = [within(o.search[opt]["answer"], o.truth[opt], lattice, resolution) for o, opt in answers]
    right_f = [within(o.full[opt]["answer"], o.truth[opt], lattice, resolution) for o, opt in answers]
    cover_s = [covers(o.search[opt]["bracket"], o.truth[opt]) for o, opt in answers]
    cover_f = [covers(o.full[opt]["bracket"], o.truth[opt]) for o, opt in answers]
    tokens = sum(o.tokens[0] for o in outcomes) / sum(o.tokens[1] for o in outcomes)
    wall = sum(o.wall[0] for o in outcomes) / sum(o.wall[1] for o in outcomes)
    sizes = [n for o in outcomes for n in o.sizes.values()]
    per_problem = [o.tokens[0] / o.tokens[1] for o in outcomes]
    coverage = statistics.fmean(cover_s)
    met = {
        "agreement >= 0.95": statistics.fmean(agree) >= 0.95,
        "tokens <= 0.6": tokens <= 0.6,
        "coverage >= 0.95": coverage >= 0.95,
    }
    return [
        f"family {family}: {len(outcomes)} problems, {len(answers)} answers (problem x optimizer); lattice of "
        f"{len(lattice)} sizes {lattice[0]}..{lattice[-1]} at resolution {resolution:g}",
        f"  search answer = full lattice's, within resolution   {share(agree)}",
        f"  full lattice = itself under other noise             {share(itself)}",
        f"  answer within resolution of the truth: search      {share(right_s)}",
        f"                                          full lattice {share(right_f)}",
        f"  bracket holds the truth: search                     {share(cover_s)}",
        f"                           full lattice               {share(cover_f)}",
        f"  sizes tested per optimizer: mean {statistics.fmean(sizes):.1f}, range [{min(sizes)}, {max(sizes)}] "
        f"of {len(lattice)}",
        f"  simulated wall time search / full lattice: {wall:.2f}",
        f"  per-problem token ratio: median {statistics.median(per_problem):.3f}, "
        f"range [{min(per_problem):.3f}, {max(per_problem):.3f}]",
        f"wall time {wall_s:.0f} s",
        "targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items()),
        f"tokens search/full lattice = {tokens:.2f}, bracket coverage {coverage:.2f}, agreement "
        f"{statistics.fmean(agree):.3f} (the full lattice with itself {statistics.fmean(itself):.3f}), family {family}",
    ]


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--family", choices=sorted(se.FAMILIES), default="cliffs")
    parser.add_argument("--resolution", type=float, default=1.25)
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--concurrency", type=int, default=4, help="max_concurrent_trials of both sweeps")
    parser.add_argument("--workers", type=int, default=2, help="processes simulating problems at once")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(None if argv is None else list(argv))
    start = time.perf_counter()
    jobs = [
        (args.family, i, args.seed, args.resolution, args.tolerance, args.concurrency) for i in range(args.problems)
    ]
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            outcomes = list(pool.map(run_problem, jobs))
    else:
        outcomes = [run_problem(j) for j in jobs]
    lattice = make_spec(
        {"min": MIN, "max": MAX, "resolution": args.resolution}, concurrency=1, tolerance=args.tolerance
    ).lattice
    for line in summarize(outcomes, lattice, args.resolution, args.family, time.perf_counter() - start):
        print(line)


if __name__ == "__main__":
    main()
