"""A study (`sweeps.study`): one sweep spec at several scales, each scale's sweep built and validated as a
sweep is, smallest first, and priced beside the sweep at the target it replaces."""

from __future__ import annotations

import math
from typing import Any

import pytest
from harness import tiny_spec
from pydantic import ValidationError
from typer.testing import CliRunner

from cli.common import _hours
from cli.main import app
from sweeps.cost import price
from sweeps.spec import SweepSpec
from sweeps.study import StudySpec, confirm_bound_spec, confirm_spec, extrapolated_answer, is_study, price_study

NANO, MICRO = {"preset": "gpt2-nano", "seq_len": 32}, {"preset": "gpt2-micro", "seq_len": 32}


def study(**overrides: Any) -> dict[str, Any]:
    sweep = {k: v for k, v in tiny_spec("law").items() if k not in ("model", "token_budget")}
    return {
        **sweep,
        "scales": {"models": [MICRO, NANO], "token_budgets": [8192, 4096]},
        "target": {"model": MICRO, "token_budget": 65536},
        **overrides,
    }


def test_the_product_of_models_and_budgets_runs_smallest_first() -> None:
    s = StudySpec.model_validate(study())
    specs = s.sweep_specs()
    assert [x.name for x in specs] == ["law-s1", "law-s2", "law-s3", "law-s4"]
    order = [(x.model.preset, x.token_budget) for x in specs]
    assert order == [("gpt2-nano", 4096), ("gpt2-nano", 8192), ("gpt2-micro", 4096), ("gpt2-micro", 8192)]
    # every other field is the sweep spec's own
    assert all(x.optimizer_names == ["adamw"] and x.batch_sizes == [4, 8] for x in specs)
    assert s.target_spec().name == "law-target" and s.target_spec().token_budget == 65536
    # a list of pairs, with token budgets YAML or JSON wrote as floats
    pairs = StudySpec.model_validate(
        study(scales=[{"model": NANO, "token_budget": 8192.0}, {"model": MICRO, "token_budget": 4096}])
    )
    assert [(x.model.preset, x.token_budget) for x in pairs.sweep_specs()] == [
        ("gpt2-nano", 8192),
        ("gpt2-micro", 4096),
    ]
    assert is_study(study()) and not is_study(tiny_spec())


def test_a_study_s_searches_decide_their_brackets_ends_unless_the_file_says_not() -> None:
    searched = {"min": 4, "max": 8, "resolution": 2.0}
    specs = StudySpec.model_validate(study(batch_sizes=searched)).sweep_specs()
    assert all(x.batch_search is not None and x.batch_search.decide_ends for x in specs)
    told = StudySpec.model_validate(study(batch_sizes={**searched, "decide_ends": False})).sweep_specs()
    assert not any(x.batch_search.decide_ends for x in told)  # type: ignore[union-attr]
    # a sweep on its own, and a study's listed sizes, as before
    assert not SweepSpec.from_mapping({**tiny_spec(), "batch_sizes": searched}).batch_search.decide_ends  # type: ignore[union-attr]
    assert all(x.batch_search is None for x in StudySpec.model_validate(study()).sweep_specs())


def test_the_scales_are_ordered_by_parameters_at_the_sweeps_vocabulary() -> None:
    # gpt2-nano at 3x the tokens of gpt2-micro: larger at a vocabulary of 4,096 (micro has 3.6x its
    # parameters), smaller at GPT-2's 50,257 (2.2x), where the embeddings weigh more
    pairs = [{"model": NANO, "token_budget": 12288}, {"model": MICRO, "token_budget": 4096}]
    gpt2 = StudySpec.model_validate(study(scales=pairs, data={"source": "builtin", "vocab_size": 50257}))
    assert [x.model.preset for x in gpt2.sweep_specs()] == ["gpt2-micro", "gpt2-nano"]
    small = StudySpec.model_validate(study(scales=pairs, data={"source": "builtin", "vocab_size": 4096}))
    assert [x.model.preset for x in small.sweep_specs()] == ["gpt2-nano", "gpt2-micro"]


def test_a_bad_study_names_the_scale_or_the_field() -> None:
    with pytest.raises(ValidationError, match=r"scale 1 \(gpt2-nano, seq_len 32, 4.1e\+03 tokens\): lr"):
        StudySpec.model_validate(study(lr={"min": -1.0, "max": 1e-2}))
    with pytest.raises(ValidationError, match="a study sets model per scale"):
        StudySpec.model_validate(study(model=NANO))
    with pytest.raises(ValidationError, match="2 to 24 scales, got 1"):
        StudySpec.model_validate(study(scales=[{"model": NANO, "token_budget": 8192}]))
    with pytest.raises(ValidationError, match="target"):
        StudySpec.model_validate(study(target={"model": {"preset": "gpt2-huge"}, "token_budget": 8192}))


def test_the_price_is_each_scale_s_sweep_beside_the_target_s() -> None:
    s = StudySpec.model_validate(study())
    cost = price_study(s)
    each = [price(x).gpu_hours.max for x in s.sweep_specs()]
    assert [c.gpu_hours.max for _, c in cost.scales] == each
    assert cost.gpu_hours.max == pytest.approx(sum(each))
    assert cost.target == price(s.target_spec())
    assert cost.ratio.max == pytest.approx(sum(each) / cost.target.gpu_hours.max)
    assert 0 < cost.ratio.max < 1  # four small sweeps against one at 8x the largest budget


def test_a_confirming_study_is_priced_at_the_most_its_confirmation_can_cost() -> None:
    from sweeps.law import Band, OptimizerLaw

    two = [{"name": "adamw"}, {"name": "lion"}]
    sizes = [4, 8, 16, 32, 64, 128]
    s = StudySpec.model_validate(study(confirm=True, optimizers=two, batch_sizes=sizes))
    assert confirm_bound_spec(StudySpec.model_validate(study())) is None and price_study(s).confirmation is not None
    bound = confirm_bound_spec(s)
    assert bound is not None and bound.name == "law-confirm"
    # the reference and the 2 x 2 costliest others, on the target's own tokens: a trial evaluates every 1,536
    # tokens and at most once a step, 43 times at 4, 8 and 16, 32 at 32 and 64, 16 at 128 (its 16 steps)
    assert bound.batch_sizes == [4, 8, 16, 32, 64] and bound.trained_tokens == s.target_spec().trained_tokens
    assert price_study(s).confirmation == price(bound)
    assert price_study(s).gpu_hours == price_study(s.model_copy(update={"confirm": False})).gpu_hours  # apart

    def law(optimizer: str, value: float) -> OptimizerLaw:
        return OptimizerLaw(
            optimizer=optimizer, against="baseline", reference="adamw", scales=[], target_tokens=65536.0,
            predicted=Band(value=value, low=value / 2, high=value * 2),
        )  # fmt: skip

    # every confirmation one law per optimizer can make costs at most the bound, on the same tokens
    predictions = [3.0, 5.0, 6.0, 12.0, 24.0, 48.0, 96.0, 100.0, 1000.0]
    most = price(bound).gpu_hours.max
    for a in predictions:
        for b in predictions:
            spec = confirm_spec(s, [law("adamw", a), law("lion", b)])
            if isinstance(spec, str):  # both below the reference: no sweep
                assert max(a, b) < sizes[0]
                continue
            assert spec.trained_tokens == bound.trained_tokens
            assert price(spec).gpu_hours.max <= most * (1 + 1e-12), (a, b, spec.batch_sizes)
    widest = confirm_spec(s, [law("adamw", 12.0), law("lion", 48.0)])  # and one reaches it
    assert not isinstance(widest, str) and price(widest).gpu_hours == price(bound).gpu_hours


def test_sweeps_price_prices_a_study_file(tmp_path: Any) -> None:
    import json

    import yaml

    def written(data: dict[str, Any]) -> str:  # distinct objects: no YAML aliases, which specs refuse
        return yaml.safe_dump(json.loads(json.dumps(data)))

    path = tmp_path / "study.yaml"
    path.write_text(written(study()))
    out = CliRunner().invoke(app, ["price", str(path)], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "a study of 4 sweeps" in text and "law-target" in text and "replaces" in text
    assert f"{price_study(StudySpec.model_validate(study())).ratio.max:.2f} of the sweep at the target" in text
    assert "confirmation" not in text
    path.write_text(written(study(confirm=True)))
    out = CliRunner().invoke(app, ["price", str(path)], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    bound = price_study(StudySpec.model_validate(study(confirm=True))).confirmation
    assert bound is not None and "law-confirm" in text and "(confirmation, at most)" in text
    assert f"confirmation (at most): {_hours(bound.gpu_hours.max)} GPU-hours more" in text
    path.write_text(written(study(model=NANO)))
    out = CliRunner().invoke(app, ["price", str(path)], catch_exceptions=False)
    assert out.exit_code == 2 and "a study sets model per scale" in " ".join(out.output.split())


def test_a_start_without_a_law_extrapolates_the_answers_in_ln_b_over_ln_tokens() -> None:
    # two budgets 4x apart, answers 16 and 32: slope 0.5, so 64 at 4x past the second
    assert extrapolated_answer([(1e6, 16), (4e6, 32)], 16e6) == pytest.approx(64.0)
    # three budgets 2x apart, answers 8, 16, 16: in units of ln 2 the points are (0, 3), (1, 4), (2, 4), the
    # least-squares slope 1/2 through their mean (1, 11/3): at 8 (3 units) 2^(11/3 + 1)
    got = extrapolated_answer([(1.0, 8), (2.0, 16), (4.0, 16)], 8.0)
    assert got == pytest.approx(2 ** (11 / 3 + 1))
    # the slope held to [0, 1]: answers that shrink with the data start at their mean, ones that grow faster
    # than the data grow in proportion
    assert extrapolated_answer([(1e6, 64), (4e6, 16)], 16e6) == pytest.approx(32.0)
    assert extrapolated_answer([(1e6, 8), (2e6, 64)], 4e6) == pytest.approx(math.sqrt(8 * 64) * 2 * math.sqrt(2))
    # one budget answered: that answer; none: nothing to start from
    assert extrapolated_answer([(1e6, 16), (4e6, None)], 16e6) == pytest.approx(16.0)
    assert extrapolated_answer([(1e6, None)], 4e6) is None


def test_a_larger_budget_s_search_reaches_higher_adding_sizes_at_the_top_only(tmp_path: Any) -> None:
    import json

    import yaml

    def lattices(budgets: list[int], target: int, **overrides: Any) -> list[list[int]]:
        s = StudySpec.model_validate(
            study(
                batch_sizes={"min": 4, "max": 16, "resolution": 2.0},
                scales={"models": [NANO], "token_budgets": budgets},
                target={"model": NANO, "token_budget": target},
                **overrides,
            )
        )
        specs = [*s.sweep_specs(), s.target_spec()]
        # growing changes nothing but the sizes past max: the budget is trained whole at every scale
        assert [x.trained_tokens for x in specs] == [*budgets, target]
        return [x.lattice for x in specs]

    # max x (tokens / the smallest scale's): 16 at 4,096 tokens, 64 at 4x them, 256 at 16x
    assert lattices([4096, 16384], 65536) == [[4, 8, 16], [4, 8, 16, 32, 64], [4, 8, 16, 32, 64, 128, 256]]
    assert lattices([4096, 16384], 65536, grow_batch_axis=False) == [[4, 8, 16]] * 3
    # `sweeps price` shows each sweep's sizes
    grown = study(
        batch_sizes={"min": 4, "max": 16, "resolution": 2.0},
        scales={"models": [NANO], "token_budgets": [4096, 16384]},
        target={"model": NANO, "token_budget": 65536},
    )
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(grown))))
    out = CliRunner().invoke(app, ["price", str(path)], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "batch sizes: law-s1 4..16, law-s2 4..64, law-target 4..256" in " ".join(out.output.split())
    # 1.5x the tokens reaches no further lattice size
    assert lattices([4096, 6144], 65536)[1] == [4, 8, 16]
    # 32 would make the lattice's lcm x seq_len 1,024 tokens, rounding 12,800 down to 12,288: not grown
    assert lattices([4096, 12800], 65536)[1] == [4, 8, 16]
    # a lattice holds at most MAX_LATTICE sizes: 8..256 at 1.25 has 21, and the target 64x past it stops at 4,096
    from sweeps.batch_axis import MAX_LATTICE

    s = StudySpec.model_validate(
        study(
            batch_sizes={"min": 8, "max": 256, "resolution": 1.25},
            scales={"models": [NANO], "token_budgets": [1720320 * 4**k for k in range(3)]},
            target={"model": NANO, "token_budget": 1720320 * 64},
        )
    )
    tops = [x.lattice[-1] for x in [*s.sweep_specs(), s.target_spec()]]
    assert tops == [256, 1024, 4096, 4096] and len(s.target_spec().lattice) <= MAX_LATTICE
    assert s.sweep_specs()[2].lattice[:21] == s.sweep_specs()[0].lattice
