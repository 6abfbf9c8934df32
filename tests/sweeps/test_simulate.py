"""sweeps.simulate: the sweep's own decisions against a model of the problem, without Ray or training.

The objectives here are small closed forms whose answer is known, so each test can say what a correct
rehearsal must produce: the report of a real sweep (schema, answer, best lrs), every trial's tokens
counted, divergence where the objective says so, and the same result for the same seed.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from harness import tiny_spec

from sweeps.analysis import validate_report
from sweeps.simulate import Run, reports_of, simulate
from sweeps.spec import SweepSpec

LR_STAR = 3e-3


def spec_of(**overrides: Any) -> SweepSpec:
    values: dict[str, Any] = {
        "optimizers": [{"name": "adamw"}, {"name": "lion"}],
        "batch_sizes": [4, 8, 16, 32],
        "token_budget": 32 * 32 * 8,
        "lr": {"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 6},
        "seeds": 2,
        "degradation": {"tolerance": 0.01, "baseline": "adamw"},
    }
    return SweepSpec.from_mapping(tiny_spec("rehearsal", **(values | overrides)))


def bowl(run: Run, *, critical: int = 8) -> list[float]:
    """A loss bowl in ln lr around LR_STAR, flat up to batch `critical` and 5 % worse per doubling
    beyond; falling with tokens. Noise-free and the same for every optimizer and seed."""
    floor = 3.0 * (1.0 + 0.05 * max(0.0, math.log2(run.batch_size / critical)))
    u = math.log(run.lr / LR_STAR)
    final = floor + 0.05 * u * u
    return [final * (1 + 0.2 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]


def test_a_rehearsal_writes_the_report_a_sweep_writes_with_the_known_answer() -> None:
    spec = spec_of()
    seen: list[Run] = []

    def objective(run: Run) -> list[float]:
        seen.append(run)
        return bowl(run)

    result = simulate(spec, objective, seed=0)
    validate_report(result.report)
    assert result.trials == len(seen) > 0
    for opt in ("adamw", "lion"):
        # flat to 8, 5 % worse at 16: the largest degradation-free batch size is 8 against both references
        assert result.report.optimizers[opt].largest_degradation_free_batch_size.model_dump() == {
            "self": 8,
            "baseline": 8,
        }
        for cell in result.report.optimizers[opt].cells:
            assert abs(math.log(cell.best_lr / LR_STAR)) < 0.3  # the line search found the bowl's centre
            assert cell.seeds == 2 and cell.stable is True
    # every run evaluates at the loop's own steps and ends at the sweep's one token budget
    for run in seen:
        train = spec.train_config(run.optimizer, run.batch_size, run.lr, run.seed)
        assert run.eval_tokens[-1] == spec.trained_tokens
        assert all(t % train.tokens_per_step == 0 for t in run.eval_tokens)
        assert list(run.eval_tokens) == sorted(set(run.eval_tokens))
    assert {r.seed for r in seen if r.role == "confirm"} == {1, 2} and {r.seed for r in seen if r.role == "search"} == {
        0
    }
    # tokens: every trial's, as trained; with pruning some stopped early, none trained past the budget
    assert result.tokens_trained == sum(t.tokens for t in result.results)
    assert result.tokens_trained <= result.trials * spec.trained_tokens


def test_the_same_seed_gives_the_same_rehearsal_and_the_objective_sees_each_trial_once() -> None:
    spec = spec_of(batch_sizes=[4, 8])
    calls: list[Run] = []

    def objective(run: Run) -> list[float]:
        calls.append(run)
        return bowl(run)

    first = simulate(spec, objective, seed=3)
    assert len(calls) == first.trials
    second = simulate(spec, bowl, seed=3)
    assert (second.tokens_trained, second.trials) == (first.tokens_trained, first.trials)
    assert second.report == first.report


def test_divergence_above_a_cliff_is_recorded_and_never_chosen() -> None:
    spec = spec_of(batch_sizes=[4, 8])
    cliff = 2 * LR_STAR

    def objective(run: Run) -> list[float]:
        losses = bowl(run)
        if run.lr > cliff:  # diverges halfway
            half = len(losses) // 2
            return losses[:half] + [math.nan] * (len(losses) - half)
        return losses

    result = simulate(spec, objective)
    diverged = [t for t in result.results if t.status == "diverged"]
    assert diverged and all(t.lr > cliff for t in diverged)
    assert all(t.tokens < spec.trained_tokens for t in diverged)  # stopped where it diverged
    for cell in result.report.optimizers["adamw"].cells:
        assert cell.best_lr <= cliff


def test_an_optimum_above_the_range_is_found_past_it_and_said_so() -> None:
    lr = {"min": 1e-4, "max": 1e-3, "trials_per_batch_size": 6}  # the optimum, 3e-3, lies above lr.max
    stuck = simulate(spec_of(batch_sizes=[4, 8], lr=lr | {"extend": 1.0}), bowl)
    assert any("edge of the searched range" in w for w in stuck.report.warnings)
    assert all(c.lr_at_edge for c in stuck.report.optimizers["adamw"].cells)
    # the line search steps past lr.max (up to lr.extend) and finds the optimum there
    found = simulate(spec_of(batch_sizes=[4, 8], lr=lr | {"extend": 8.0}), bowl)
    assert found.report.lr_bounds == pytest.approx([1.25e-5, 8e-3])
    for cell in found.report.optimizers["adamw"].cells:
        assert abs(math.log(cell.best_lr / LR_STAR)) < 0.3
        assert cell.lr_outside_range is True and cell.lr_at_edge is False
        assert cell.val_loss_mean < min(c.val_loss_mean for c in stuck.report.optimizers["adamw"].cells)
    assert any("outside lr.min/lr.max" in w for w in found.report.warnings)


def test_reports_follow_the_losses_and_stop_at_the_first_non_finite_one() -> None:
    run = Run("adamw", 8, 1e-3, 1, (256, 512, 768))
    done = reports_of(run, [3.0, 2.5, 2.0], tokens_per_step=256)
    assert [(r["tokens"], r["step"], r["val_loss"], r["status"], r["done"]) for r in done] == [
        (256, 1, 3.0, "running", False),
        (512, 2, 2.5, "running", False),
        (768, 3, 2.0, "completed", True),
    ]
    diverged = reports_of(run, [3.0, math.inf, 2.0], tokens_per_step=256)
    assert len(diverged) == 2 and diverged[0]["val_loss"] == 3.0
    # the diverged result carries the metric (Tune's check), NaN: there is no loss where the run stopped
    last = diverged[-1]
    assert (last["tokens"], last["step"], last["status"], last["done"]) == (512, 2, "diverged", True)
    assert math.isnan(last["val_loss"])
    # diverged before the first evaluation: one result, with the metric; the losses may stop there
    for losses, results in (([math.inf, 2.5, 2.0], 1), ([math.nan], 1), ([3.0, math.inf], 2)):
        first = reports_of(run, losses, tokens_per_step=256)
        assert len(first) == results and first[-1]["status"] == "diverged" and math.isnan(first[-1]["val_loss"])
    with pytest.raises(ValueError, match=r"one val loss per evaluation \(3 for.*got 1 ending in 3.0"):
        reports_of(run, [3.0], tokens_per_step=256)
    with pytest.raises(ValueError, match="got 4"):
        reports_of(run, [3.0, 2.5, 2.0, 1.0], tokens_per_step=256)
