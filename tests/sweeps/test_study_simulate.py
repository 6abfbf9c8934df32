"""A study rehearsed (`sweeps.simulate.simulate_study`): every scale's sweep through the sweep's own decisions
against one objective that sees the scale, and the law the objective holds fitted back from the brackets."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from harness import tiny_spec

from sweeps.law import BatchLaw, bracket_holds, crossing, scale_of
from sweeps.report import reference_loss
from sweeps.simulate import Run, simulate_study
from sweeps.study import StudySpec, confirm_spec, extrapolated_answer

BUDGETS = (8192, 32768, 131072)  # 4x apart: the critical batch 4, 8, 16 under B* ~ tokens^0.5


def critical(tokens: int) -> float:
    return 4.0 * math.sqrt(tokens / BUDGETS[0]) * 1.4  # between the sizes: 5.6, 11.2, 22.4


def law_study(**extra: object) -> StudySpec:
    sweep = {k: v for k, v in tiny_spec("rehearse").items() if k not in ("model", "token_budget")}
    return StudySpec.model_validate(
        {
            **sweep,
            "batch_sizes": [4, 8, 16, 32, 64],
            "eval_every_tokens": None,
            "lr": {"min": 1e-4, "max": 1e-1, "trials_per_batch_size": 4},
            "seeds": 3,
            "degradation": {"tolerance": 0.01, "baseline": "adamw"},
            "scales": {"models": [{"preset": "gpt2-nano", "seq_len": 32}], "token_budgets": list(BUDGETS)},
            "target": {"model": {"preset": "gpt2-nano", "seq_len": 32}, "token_budget": 4 * BUDGETS[-1]},
            **extra,
        }
    )


def law_objective(seen: set[tuple[int, int]]) -> Callable[[Run], list[float]]:
    """B* = critical(tokens) (the law tokens^0.5), the best lr 3e-3 at every size and scale."""

    def objective(run: Run) -> list[float]:
        budget = run.eval_tokens[-1]
        seen.add((run.params, budget))
        over = max(0.0, math.log2(run.batch_size / critical(budget)))
        u = math.log(run.lr / 3e-3)
        noise = 1e-4 * np.random.default_rng([run.seed, run.batch_size, budget]).standard_normal()
        final = 3.0 * (1 + 0.05 * over) + 0.05 * u * u + noise
        return [final * (1 + 0.1 * (1 - t / budget)) for t in run.eval_tokens]

    return objective


def test_a_study_is_rehearsed_scale_by_scale_its_law_comes_back_and_the_target_confirms_it() -> None:
    """One rehearsal, with the confirmation at the target (`confirm: true`; off by default)."""
    assert law_study().confirm is False
    study = law_study(confirm=True)
    seen: set[tuple[int, int]] = set()
    rehearsal = simulate_study(study, law_objective(seen), seed=1)
    assert [spec.trained_tokens for spec, _ in rehearsal.scales] == list(BUDGETS)  # smallest first
    assert {b for _, b in seen} == {*BUDGETS, 4 * BUDGETS[-1]} and all(p > 0 for p, _ in seen)  # each its scale
    for spec, result in rehearsal.scales:
        bracket = result.report.optimizers["adamw"].bracket.self
        want = max(b for b in spec.batch_sizes if b <= critical(spec.trained_tokens))
        assert bracket.largest_fine == want and bracket.smallest_degraded == 2 * want
        # the scale's own estimate: where the fitted losses of its answer and the next size it tested cross the
        # tolerance line, linear in ln B; the objective's loss is flat to critical and rises after, so B* lies
        # past the centre of the two only where the line is crossed late
        cells = {c.batch_size: c.val_loss_fitted.self for c in result.report.optimizers["adamw"].cells}
        line = 1.01 * reference_loss(result.report, "adamw", "self")  # type: ignore[operator]
        point = scale_of(result.report, "adamw", "self").point
        assert point == pytest.approx(crossing((want, cells[want]), (2 * want, cells[2 * want]), line), rel=1e-12)
        assert want < point < 2 * want and point != pytest.approx(math.sqrt(want * 2 * want), rel=1e-3)
        # the baseline's reference is its own: one line for both references
        assert reference_loss(result.report, "adamw", "baseline") == reference_loss(result.report, "adamw", "self")
    with pytest.raises(ValueError, match="against must be 'self' or 'baseline', got against='base'"):
        reference_loss(rehearsal.scales[0][1].report, "adamw", "base")
    assert rehearsal.tokens_trained == sum(r.tokens_trained for _, r in rehearsal.scales)
    law = rehearsal.law("adamw", "self")
    assert isinstance(law, BatchLaw), law
    lo, hi = law.tokens_interval
    assert lo <= 0.5 <= hi and 0.3 < law.tokens_exponent < 0.7  # the objective's exponent, from 3 brackets

    # predict, then confirm: the target's sweep at the reference and the sizes on each side of the prediction
    assert rehearsal.confirmation is not None
    spec, result = rehearsal.confirmation
    (predicted,) = [law for law in rehearsal.laws() if law.optimizer == "adamw"]
    assert predicted.predicted is not None and 32 <= predicted.predicted.value < 64  # critical(target) = 44.8
    assert spec.name == "rehearse-confirm" and spec.trained_tokens == 4 * BUDGETS[-1]
    assert spec.batch_sizes == [4, 32, 64] and result.trials < sum(r.trials for _, r in rehearsal.scales)
    (confirmed,) = rehearsal.confirmed()
    assert confirmed.optimizer == "adamw" and confirmed.tested == [4, 32, 64]
    assert (confirmed.bracket.largest_fine, confirmed.bracket.smallest_degraded) == (32, 64)
    assert confirmed.held is True and confirmed.miss == 1.0 and confirmed.says.startswith("held: B* in [32, 64)")
    # the best lr found at the tested size nearest the prediction (45: 32 and 64 nearly as near), beside the
    # lr law's: both the objective's 3e-3
    assert confirmed.lr_at in (32, 64) and confirmed.lr_found is not None and confirmed.lr_predicted is not None
    assert abs(math.log(confirmed.lr_found / 3e-3)) < math.log(2) and abs(math.log(confirmed.lr_predicted / 3e-3)) < 0.5


def test_a_prediction_outside_the_bracket_misses_by_its_factor() -> None:
    assert bracket_holds(32, 64, 44.8) == (True, 1.0)
    assert bracket_holds(32, 64, 16.0) == (False, 2.0)  # too small: the fine end over the prediction
    assert bracket_holds(32, 64, 128.0) == (False, 2.0)  # too large: the prediction over the degraded end
    assert bracket_holds(32, 64, 64.0) == (False, 1.0)  # the degraded end is outside [32, 64)
    assert bracket_holds(32, None, 44.8) == (None, 1.0)  # open above: not contradicted, not held
    assert bracket_holds(None, 64, 80.0) == (False, 1.25)
    assert bracket_holds(None, None, 10.0) == (None, 1.0)


def test_the_confirmation_spec_needs_a_prediction_inside_the_lattice() -> None:
    from sweeps.law import Band, OptimizerLaw

    study = law_study(confirm=True)

    def law(value: float | None) -> OptimizerLaw:
        predicted = Band(value=value, low=value / 2, high=value * 2) if value is not None else None
        return OptimizerLaw(
            optimizer="adamw", against="baseline", reference="adamw", scales=[], target_tokens=4.0 * BUDGETS[-1],
            predicted=predicted,
        )  # fmt: skip

    assert isinstance(confirm_spec(study, [law(None)]), str)  # no prediction: nothing to confirm
    beyond = confirm_spec(study, [law(1000.0)])  # past the lattice: its largest size, beside the reference
    assert not isinstance(beyond, str) and beyond.batch_sizes == [4, 64]
    between = confirm_spec(study, [law(10.0), law(20.0)])
    assert not isinstance(between, str) and between.batch_sizes == [4, 8, 16, 32]


def test_a_study_searching_the_batch_axis_starts_each_scale_where_the_smaller_ones_predict() -> None:
    sweep = {k: v for k, v in tiny_spec("transfer").items() if k not in ("model", "token_budget")}

    def study(transfer: bool) -> StudySpec:
        return StudySpec.model_validate(
            {
                **sweep,
                "transfer": transfer,
                "batch_sizes": {"min": 4, "max": 128, "resolution": 1.5},
                "eval_every_tokens": None,
                "lr": {"min": 1e-4, "max": 1e-1, "trials_per_batch_size": 4},
                "seeds": 3,
                "degradation": {"tolerance": 0.01, "baseline": "adamw"},
                "scales": {
                    "models": [{"preset": "gpt2-nano", "seq_len": 32}],
                    "token_budgets": [12288 * 4**i for i in range(3)],
                },
                "target": {"model": {"preset": "gpt2-nano", "seq_len": 32}, "token_budget": 4 * 196608},
            }
        )

    def objective(run: Run) -> list[float]:
        budget = run.eval_tokens[-1]
        over = max(0.0, math.log2(run.batch_size / (10 * math.sqrt(budget / 12288))))  # 10, 20, 40
        u = math.log(run.lr / 3e-3)
        noise = 1e-4 * np.random.default_rng([run.seed, run.batch_size, budget]).standard_normal()
        final = 3.0 * (1 + 0.05 * over) + 0.05 * u * u + noise
        return [final * (1 + 0.1 * (1 - t / budget)) for t in run.eval_tokens]

    scratch, moved = simulate_study(study(False), objective, 1), simulate_study(study(True), objective, 1)
    (s1, r1), (s2, _), (s3, _) = moved.scales
    assert all(s.batch_search.start is None for s, _ in scratch.scales) and s1.batch_search.start is None
    # the second scale starts at the first one's answer, the third on the line through the first two's
    # (3 scales make no law: `sweeps.study.extrapolated_answer`)
    answers = [r.report.optimizers["adamw"].largest_degradation_free_batch_size.baseline for _, r in moved.scales]
    assert s2.batch_search.start == {"adamw": answers[0]}
    budgets = [s.trained_tokens for s, _ in moved.scales]
    assert s3.batch_search.start == {
        "adamw": round(extrapolated_answer(list(zip(budgets[:2], answers[:2])), budgets[2]))
    }
    assert s3.batch_search.start["adamw"] > s2.batch_search.start["adamw"]
    for (_, a), (_, b) in zip(scratch.scales, moved.scales, strict=True):
        assert a.report.optimizers["adamw"].bracket == b.report.optimizers["adamw"].bracket  # the same answer
    assert moved.scales[0][1].tokens_trained == scratch.scales[0][1].tokens_trained
    assert moved.tokens_trained < scratch.tokens_trained  # for less
