"""The searcher on the batch axis, rehearsed through `sweeps.simulate` (the driver's own decision code):
the sizes it tests, why, the bracket it ends with, what it costs against training every lattice size,
speculation while a size confirms, and a resume that rebuilds the search from the Optuna storage."""

from __future__ import annotations

import math
import random
from typing import Any

import optuna
import pytest
from harness import tiny_spec

from sweeps.analysis import validate_report
from sweeps.simulate import Run, simulate
from sweeps.spec import SweepSpec

LR_STAR = 3e-3


def spec_of(batch_sizes: Any = None, **overrides: Any) -> SweepSpec:
    values: dict[str, Any] = {
        "optimizers": [{"name": "adamw"}, {"name": "lion"}],
        "batch_sizes": batch_sizes or {"min": 4, "max": 256, "resolution": 1.5},
        "token_budget": 200_000,
        "lr": {"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 4},
        "seeds": {"min": 2, "max": 4, "step": 2},
        "degradation": {"tolerance": 0.01, "baseline": "adamw"},
        "resources": {"max_concurrent_trials": 1},
    }
    return SweepSpec.from_mapping(tiny_spec("axis", **(values | overrides)), max_trials=10**5)


def objective_of(critical: dict[str, float], noise: float = 0.002):
    """A loss bowl in ln lr around LR_STAR, flat up to each optimizer's `critical` batch size and 5 % worse
    per doubling beyond; seed noise shared by a seed across cells (same init and data order)."""

    def objective(run: Run) -> list[float]:
        floor = 3.0 * (1.0 + 0.05 * max(0.0, math.log2(run.batch_size / critical[run.optimizer])))
        u = math.log(run.lr / LR_STAR)
        rng = random.Random(f"{run.optimizer}/{run.batch_size}/{run.seed}/{run.lr:.6e}")
        shared = random.Random(f"seed/{run.seed}").gauss(0, noise)
        final = floor + 0.05 * u * u + shared + rng.gauss(0, noise / 2)
        return [final * (1 + 0.2 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]

    return objective


def truth_of(spec: SweepSpec, critical: float) -> int:
    """The largest lattice size whose noiseless floor is within the tolerance (of 3.0)."""
    tol = spec.degradation.tolerance
    return max(b for b in spec.lattice if 3.0 * (1 + 0.05 * max(0.0, math.log2(b / critical))) <= 3.0 * (1 + tol))


@pytest.mark.parametrize("critical", [10.0, 40.0, 1000.0])
def test_the_search_brackets_the_boundary_at_the_resolution_for_less_than_the_lattice(critical: float) -> None:
    spec = spec_of()
    objective = objective_of({"adamw": critical, "lion": critical})
    result = simulate(spec, objective, seed=0)
    report = result.report
    validate_report(report)
    assert report.batch_search.lattice == spec.lattice and report.batch_search.against == "baseline"
    assert "monotone" in report.batch_search.assumption
    truth = truth_of(spec, critical)
    for opt, r in report.optimizers.items():
        steps = r.search_steps
        tested = [s.batch_size for s in steps]
        assert steps[0].chosen == "reference" and tested[0] == spec.lattice[0]
        assert [s.order for s in steps] == list(range(1, len(steps) + 1))
        assert set(tested) <= set(spec.lattice) and len(tested) == len(set(tested))
        assert len(tested) <= spec.sizes_per_optimizer[1]
        # the report's cells are the tested sizes, each saying why it was chosen
        assert [c.batch_size for c in r.cells] == sorted(tested)
        assert {c.batch_size: c.chosen for c in r.cells} == {s.batch_size: s.chosen for s in steps}
        bracket = r.bracket.baseline
        lo, hi = bracket.largest_fine, bracket.smallest_degraded
        assert (lo is None or lo <= truth) and (hi is None or truth < hi), (opt, bracket, truth)
        assert r.smallest_degraded_batch_size.baseline == hi
        if lo is not None and hi is not None:
            # as narrow as the resolution, unless undecided sizes were left between the ends
            between = [c for c in r.cells if lo < c.batch_size < hi]
            assert hi / lo <= 1.5 + 1e-9 or all(c.verdict.baseline == "undecided" for c in between)
        # the point estimate is within the resolution of the truth
        estimate = r.largest_degradation_free_batch_size.baseline
        assert estimate is not None and max(estimate, truth) / min(estimate, truth) <= 1.5 + 1e-9
    # every trial trained the same tokens; the search trained fewer than one run per lattice size
    assert {t.tokens for t in result.results if t.status == "completed"} == {spec.trained_tokens}
    full = simulate(spec_of(spec.lattice), objective, seed=0)
    assert result.tokens_trained < 0.8 * full.tokens_trained


def test_the_decisions_read_as_a_researcher_would_make_them() -> None:
    spec = spec_of()
    result = simulate(spec, objective_of({"adamw": 20.0, "lion": 20.0}), seed=0)
    steps = result.report.optimizers["adamw"].search_steps
    chosen = [s.chosen for s in steps]
    assert chosen[:2] == ["reference", "step up"] and "bisect" in chosen
    first_bisect = next(s for s in steps if s.chosen == "bisect")
    assert "degraded" in first_bisect.why and "between" in first_bisect.why
    assert all(s.why for s in steps)


def test_a_list_of_batch_sizes_is_searched_exactly_as_before() -> None:
    spec = spec_of([4, 8, 16])
    result = simulate(spec, objective_of({"adamw": 8.0, "lion": 8.0}), seed=0)
    assert result.report.batch_search is None
    for r in result.report.optimizers.values():
        assert [c.batch_size for c in r.cells] == [4, 8, 16] and r.search_steps == []
        assert {c.chosen for c in r.cells} == {"listed"}


def test_a_free_slot_steps_up_speculatively_and_drops_what_the_verdicts_make_useless() -> None:
    one = simulate(spec_of(), objective_of({"adamw": 12.0, "lion": 12.0}), seed=0)
    assert all(s.chosen != "speculative" for r in one.report.optimizers.values() for s in r.search_steps)
    four = spec_of(resources={"max_concurrent_trials": 4})
    result = simulate(four, objective_of({"adamw": 1000.0, "lion": 1000.0}), seed=0)
    spec_steps = [s for r in result.report.optimizers.values() for s in r.search_steps if s.chosen == "speculative"]
    assert spec_steps, "four slots and a boundary past the top: the next step up runs while a size confirms"
    assert all("while" in s.why for s in spec_steps)
    # a speculative size above one found degraded stops and says so; one that is needed is judged as any
    for r in result.report.optimizers.values():
        for s in r.search_steps:
            cell = next(c for c in r.cells if c.batch_size == s.batch_size)
            if "not needed" in s.why:
                assert s.chosen == "speculative" and cell.seeds < 2


def test_a_resumed_search_rebuilds_its_cells_from_the_storage(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from sweeps.search import CellSearcher

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    monkeypatch.setattr(optuna.storages, "InMemoryStorage", lambda: storage)
    spec = spec_of()
    result = simulate(spec, objective_of({"adamw": 20.0, "lion": 20.0}), seed=0)
    again = CellSearcher(spec, f"{spec.name}-simulated", storage)
    rebuilt = again.search_steps()
    assert {opt: [(s["batch_size"], s["chosen"], s["why"]) for s in steps] for opt, steps in rebuilt.items()} == {
        opt: [(s.batch_size, s.chosen, s.why) for s in r.search_steps] for opt, r in result.report.optimizers.items()
    }
    assert again.all_finished()
    assert again.grow() is False  # nothing left to decide: a resumed, finished search runs nothing
    assert again.report().optimizers == result.report.optimizers
    # the live page's curves: every recorded trial, its val loss against tokens, each cell's best marked
    curves = again.progress().curves
    assert len(curves) == len(result.results)
    assert all(0 < len(c.points) <= 40 and c.points[-1][0] <= spec.trained_tokens for c in curves)
    best = {c.cell for c in curves if c.best}
    assert best == {
        f"{opt}/bs{cell.batch_size}" for opt, r in result.report.optimizers.items() for cell in r.cells if cell.best_lr
    }


def test_a_search_against_each_optimizer_s_own_reference() -> None:
    """`against: self`: each optimizer's boundary against its own smallest batch (lion's lies further out)."""
    spec = spec_of({"min": 4, "max": 256, "resolution": 1.5, "against": "self"})
    result = simulate(spec, objective_of({"adamw": 10.0, "lion": 60.0}), seed=0)
    assert result.report.batch_search.against == "self"
    for opt, critical in (("adamw", 10.0), ("lion", 60.0)):
        r = result.report.optimizers[opt]
        truth = truth_of(spec, critical)
        lo, hi = r.bracket.self.largest_fine, r.bracket.self.smallest_degraded
        assert (lo is None or lo <= truth) and (hi is None or truth < hi), (opt, r.bracket.self, truth)
        assert max(b for b in (s.batch_size for s in r.search_steps)) >= truth
    # each optimizer searched where its own boundary is: lion tested larger sizes than adamw
    tested = {o: max(s.batch_size for s in r.search_steps) for o, r in result.report.optimizers.items()}
    assert tested["lion"] > tested["adamw"]
