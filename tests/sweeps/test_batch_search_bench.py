"""benchmarks/batch_search.py on two problems (the search and the full lattice through sweeps.simulate):
its problems put the boundary where it says, its judging rules, and the last line it prints."""

from __future__ import annotations

import math
import re
from types import ModuleType

import pytest
from bench_helpers import load_bench

from sweeps.analysis import Bracket


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("batch_search")


def test_the_problems_move_the_boundary_over_the_whole_range_and_past_it(bench: ModuleType) -> None:
    lattice = bench.make_spec({"min": 8, "max": 256, "resolution": 1.25}, concurrency=1, tolerance=0.01).lattice
    assert len(lattice) == 21 and bench.TOKEN_BUDGET == math.lcm(*lattice) * bench.se.SEQ_LEN
    crits = [
        bench.make_problem("cliffs", i, lattice, base_seed=0, tolerance=0.01).truths["adamw"].b_crit for i in range(60)
    ]
    assert min(crits) < 8 and max(crits) > 256  # beyond both ends
    assert all(4 <= c <= 512 for c in crits)
    truths = {
        bench.se.true_answers(bench.make_problem("cliffs", i, lattice, base_seed=0, tolerance=0.01))["adamw"][
            "baseline"
        ]
        for i in range(60)
    }
    assert {lattice[0], lattice[-1]} <= truths and len(truths) >= 6


def test_judging_rules(bench: ModuleType) -> None:
    lattice = [8, 10, 12, 14, 16]
    assert bench.within(10, 12, lattice, 1.25) and not bench.within(8, 12, lattice, 1.25)
    assert bench.within(None, None, lattice, 1.25) and not bench.within(None, 8, lattice, 1.25)
    assert bench.covers(Bracket(largest_fine=8, smallest_degraded=14), 12)
    assert not bench.covers(Bracket(largest_fine=8, smallest_degraded=12), 12)  # [8, 12): 12 is degraded
    assert bench.covers(Bracket(largest_fine=None, smallest_degraded=12), 10)
    assert bench.covers(Bracket(largest_fine=None, smallest_degraded=None), None)
    assert not bench.covers(Bracket(largest_fine=8, smallest_degraded=None), None)


def test_the_last_line_is_the_token_ratio_and_the_coverage(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    run = bench.run_problem
    monkeypatch.setattr(bench, "run_problem", lambda job: seen.append(run(job)) or seen[-1])
    bench.main(["--problems", "1", "--workers", "1", "--seed", "4"])
    lines = capsys.readouterr().out.strip().splitlines()
    m = re.fullmatch(
        r"tokens search/full lattice = (\d+\.\d\d), bracket coverage ([01]\.\d\d), agreement ([01]\.\d{3}) "
        r"\(the full lattice with itself ([01]\.\d{3})\), family cliffs",
        lines[-1],
    )
    assert m, lines[-1]
    (outcome,) = seen
    ratio = outcome.tokens[0] / outcome.tokens[1]
    assert float(m.group(1)) == pytest.approx(ratio, abs=0.005)
    assert 0 < ratio < 1  # the search trains less than every lattice size
    covered = [bench.covers(outcome.search[opt]["bracket"], outcome.truth[opt]) for opt in outcome.truth]
    assert float(m.group(2)) == pytest.approx(sum(covered) / len(covered), abs=0.005)
    # listing under other noise: the same problem's truth, its own answers
    lattice = bench.make_spec({"min": 8, "max": 256, "resolution": 1.25}, concurrency=1, tolerance=0.01).lattice
    again = [bench.within(outcome.full[o]["answer"], outcome.again[o]["answer"], lattice, 1.25) for o in outcome.truth]
    assert float(m.group(4)) == pytest.approx(sum(again) / len(again), abs=0.0005)


def test_a_search_whose_plan_moves_several_times_without_a_run_still_ends(bench: ModuleType) -> None:
    """Noise-scale problem 46: once merit's sizes are in, the plan drops a speculative size and bisects, more
    looks within one `suggest` than it once took, with no trial running; the sweep must go on to its answer
    (`sweeps.simulate` raises where the searcher suggests nothing and no trial runs, where Tune would wait
    forever)."""
    from sweeps.simulate import simulate

    # the search arm of `run_problem(("noise-scale", 46, 0, 1.25, 0.01, 4))`, without its two listings
    spec = bench.make_spec({"min": bench.MIN, "max": bench.MAX, "resolution": 1.25}, concurrency=4, tolerance=0.01)
    problem = bench.make_problem("noise-scale", 46, spec.lattice, base_seed=0, tolerance=0.01)
    report = simulate(spec, bench.se.objective_of(problem, spec), seed=problem.seed).report
    for opt, r in report.optimizers.items():
        answer = r.largest_degradation_free_batch_size.baseline
        assert answer is None or answer in spec.lattice, opt
    assert len(report.optimizers["merit"].search_steps) >= 3  # the searched sizes, the bisection among them
