"""A study rehearsed (`sweeps.simulate.simulate_study`): every scale's sweep through the sweep's own decisions
against one objective that sees the scale, and the law the objective holds fitted back from the brackets."""

from __future__ import annotations

import math

import numpy as np
from harness import tiny_spec

from sweeps.law import BatchLaw
from sweeps.simulate import Run, simulate_study
from sweeps.study import StudySpec

BUDGETS = (8192, 32768, 131072)  # 4x apart: the critical batch 4, 8, 16 under B* ~ tokens^0.5


def critical(tokens: int) -> float:
    return 4.0 * math.sqrt(tokens / BUDGETS[0]) * 1.4  # between the sizes: 5.6, 11.2, 22.4


def test_a_study_is_rehearsed_scale_by_scale_and_its_law_comes_back() -> None:
    sweep = {k: v for k, v in tiny_spec("rehearse").items() if k not in ("model", "token_budget")}
    study = StudySpec.model_validate(
        {
            **sweep,
            "batch_sizes": [4, 8, 16, 32, 64],
            "eval_every_tokens": None,
            "lr": {"min": 1e-4, "max": 1e-1, "trials_per_batch_size": 4},
            "seeds": 3,
            "degradation": {"tolerance": 0.01, "baseline": "adamw"},
            "scales": {"models": [{"preset": "gpt2-nano", "seq_len": 32}], "token_budgets": list(BUDGETS)},
            "target": {"model": {"preset": "gpt2-nano", "seq_len": 32}, "token_budget": 4 * BUDGETS[-1]},
        }
    )
    seen: set[tuple[int, int]] = set()

    def objective(run: Run) -> list[float]:
        budget = run.eval_tokens[-1]
        seen.add((run.params, budget))
        over = max(0.0, math.log2(run.batch_size / critical(budget)))
        u = math.log(run.lr / 3e-3)
        noise = 1e-4 * np.random.default_rng([run.seed, run.batch_size, budget]).standard_normal()
        final = 3.0 * (1 + 0.05 * over) + 0.05 * u * u + noise
        return [final * (1 + 0.1 * (1 - t / budget)) for t in run.eval_tokens]

    rehearsal = simulate_study(study, objective, seed=1)
    assert [spec.trained_tokens for spec, _ in rehearsal.scales] == list(BUDGETS)  # smallest first
    assert {b for _, b in seen} == set(BUDGETS) and all(p > 0 for p, _ in seen)  # each run saw its scale
    for spec, result in rehearsal.scales:
        bracket = result.report.optimizers["adamw"].bracket.self
        want = max(b for b in spec.batch_sizes if b <= critical(spec.trained_tokens))
        assert bracket.largest_fine == want and bracket.smallest_degraded == 2 * want
    assert rehearsal.tokens_trained == sum(r.tokens_trained for _, r in rehearsal.scales)
    law = rehearsal.law("adamw", "self")
    assert isinstance(law, BatchLaw), law
    lo, hi = law.tokens_interval
    assert lo <= 0.5 <= hi and 0.3 < law.tokens_exponent < 0.7  # the objective's exponent, from 3 brackets


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
    # the second scale starts at the first one's largest fine size, the third where the law of two predicts
    assert s2.batch_search.start == {"adamw": r1.report.optimizers["adamw"].bracket.baseline.largest_fine}
    assert s3.batch_search.start["adamw"] > s2.batch_search.start["adamw"]
    for (_, a), (_, b) in zip(scratch.scales, moved.scales, strict=True):
        assert a.report.optimizers["adamw"].bracket == b.report.optimizers["adamw"].bracket  # the same answer
    assert moved.scales[0][1].tokens_trained == scratch.scales[0][1].tokens_trained
    assert moved.tokens_trained < scratch.tokens_trained  # for less
