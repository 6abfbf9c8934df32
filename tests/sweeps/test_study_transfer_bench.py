"""benchmarks/study_transfer.py's truths, without a study: B* to 1 % (what a law is judged against) lies between
the lattice's answer and the lattice's next size, and a problem scaled up moves it up."""

from __future__ import annotations

import math
from types import ModuleType

import pytest
from bench_helpers import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("study_transfer")


@pytest.mark.parametrize("family", ["cliffs", "noise-scale"])
def test_b_star_lies_between_the_lattice_s_answer_and_its_next_size(bench: ModuleType, family: str) -> None:
    from sweeps.batch_axis import lattice

    wide = lattice(bench.bs.MIN, bench.TRUTH_MAX, 1.25)
    searched = bench.study_of(False, 0.01).sweep_specs()[0].lattice
    checked, finer = 0, 0
    for index in range(6):
        problem = bench.bs.make_problem(family, index, searched, base_seed=0, tolerance=0.01)
        for factor in (1.0, 4.0):
            scaled = bench.scaled(problem, factor)
            on_lattice, exact = bench.truth_at(scaled), bench.boundary(scaled)
            for opt, b in on_lattice.items():
                if b is None or exact[opt] is None or b == wide[-1]:
                    continue
                above = wide[wide.index(b) + 1]
                # to 1 %: the dense sizes are 1.01 apart, and the lattice's size need not be one of them
                assert b / 1.0101 <= exact[opt] < above, (family, index, factor, opt, b, exact[opt])
                checked += 1
                finer += exact[opt] > b * 1.0101  # B* past the lattice's answer, which a lattice cannot say
        # the critical batch 4x larger: B* no smaller for any optimizer
        base, up = bench.boundary(problem), bench.boundary(bench.scaled(problem, 4.0))
        assert all(up[o] >= base[o] for o in base if base[o] is not None and up[o] is not None)
    assert checked >= 12 and finer >= checked // 3


def test_the_budgets_are_whole_lattice_units_growth_apart(bench: ModuleType) -> None:
    budgets = bench.budgets_of(3, 4)
    assert budgets == [bench.bs.TOKEN_BUDGET * g for g in (1, 4, 16)]
    assert all(b % bench.bs.TOKEN_BUDGET == 0 for b in bench.budgets_of(4, 2.5))
    assert math.isclose(bench.EXPONENT_LEVEL, 0.90)


def test_a_coarser_resolution_searches_and_judges_on_its_own_lattice(bench: ModuleType) -> None:
    study = bench.study_of(False, 0.01, bench.budgets_of(3, 4), resolution=2.0)
    axes = [spec.lattice for spec in study.sweep_specs()]
    assert axes[0] == [8, 16, 32, 64, 128, 256]
    assert axes[-1][-1] == 4096 and all(b == 2 * a for a, b in zip(axes[-1], axes[-1][1:], strict=False))
    problem = bench.bs.make_problem("cliffs", 0, axes[0], base_seed=0, tolerance=0.01)
    coarse, fine = bench.truth_at(problem, 2.0), bench.truth_at(problem)
    for opt, b in coarse.items():
        # the coarse lattice's answer: a power of 2, at most the fine lattice's and within a factor 2 of it
        assert b is not None and fine[opt] is not None and b & (b - 1) == 0
        assert b <= fine[opt] < 2 * b, (opt, b, fine[opt])


@pytest.mark.slow  # ~18 s: three scales' sweeps, simulated
def test_a_grown_study_whose_speculation_meets_a_dropped_size_ends(bench: ModuleType) -> None:
    """Noise-scale problem 2, a study on the grown axis with transfer: a speculative size is dropped above the
    second size out of tolerance, and a later speculation's plan (its confirming sizes taken as fine) points at
    it again. Opened again, its study's running trial was failed and the search stalled (`sweeps.simulate`
    raises where the searcher suggests nothing and no trial runs, where Tune would wait forever): speculation
    opens no size that has a cell."""
    import numpy as np

    from sweeps.simulate import simulate_study

    budgets = bench.budgets_of(bench.SCALES, bench.GROWTH)
    study = bench.study_of(True, 0.01, budgets)
    base = bench.bs.make_problem("noise-scale", 2, study.sweep_specs()[0].lattice, base_seed=0, tolerance=0.01)
    alpha = float(np.random.default_rng([0, 2, 37]).uniform(0.3, 0.7))  # as run_problem draws it
    problems = {t: bench.scaled(base, (t / budgets[0]) ** alpha) for t in budgets}
    result = simulate_study(study, bench.objective_of(problems), seed=base.seed)
    assert len(result.scales) == len(budgets)
    for spec, r in result.scales:
        for opt, o in r.report.optimizers.items():
            dropped = [s for s in o.search_steps if "not needed" in s.why]
            assert len({s.batch_size for s in o.search_steps}) == len(o.search_steps), (spec.name, opt)
            assert all(s.chosen == "speculative" for s in dropped)
