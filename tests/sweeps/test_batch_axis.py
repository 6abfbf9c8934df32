"""The search of the batch axis: the lattice, the plan's decisions, its bounds (pure), and the spec's
`batch_sizes: {min, max, ...}` (sweeps/batch_axis.py, sweeps/spec.py)."""

from __future__ import annotations

import math

import pytest
from harness import tiny_spec
from pydantic import ValidationError

from sweeps.batch_axis import Decision, lattice, mantissa_count, plan_for_reference, search_bounds
from sweeps.plan import warm_start_lrs
from sweeps.spec import REFERENCE_EXTRA_TRIALS, SweepSpec, format_validation_error


def test_lattice_is_granule_times_mantissas_times_powers_of_two() -> None:
    # 1.25: mantissas 4..7 of a granule 480 / 4 = 120 (a multiple of the 2 workers)
    sizes = lattice(480, 8192, 1.25, workers=2)
    assert sizes == [480, 600, 720, 840, 960, 1200, 1440, 1680, 1920, 2400, 2880, 3360, 3840, 4800, 5760, 6720, 7680]
    assert all(b / a <= 1.25 + 1e-12 for a, b in zip(sizes, sizes[1:], strict=False))
    assert all(b % 2 == 0 for b in sizes)
    assert math.lcm(*sizes) == 120 * 2**6 * 3 * 5 * 7  # small: the token budget stays close to the one asked
    assert mantissa_count(1.25) == 4 and mantissa_count(1.5) == 2 and mantissa_count(2.0) == 1
    assert mantissa_count(1.2) == 5  # 6/5 = 1.2
    assert lattice(4, 64, 1.5) == [4, 6, 8, 12, 16, 24, 32, 48, 64]


def test_a_min_that_admits_no_granule_is_refused_with_one_that_does() -> None:
    with pytest.raises(ValueError, match=r"min=481 .* multiple of 4 x 2 .* e\.g\. min=480"):
        lattice(481, 4000, 1.25, workers=2)
    # a larger mantissa count still fine grained enough: 6 = 6 x 1 with k in 4..8
    assert lattice(6, 12, 1.25)[:3] == [6, 7, 8]


def run_plan(
    sizes: list[int], truth, passes=None, step: float = 2.0, resolution: float = 1.25, start: int | None = None
) -> list[Decision]:
    verdicts: dict[int, str] = {}
    seen: dict[int, bool] = {}
    out = []
    while True:
        d = plan_for_reference(
            sizes, verdicts, step=step, resolution=resolution, passes=None if passes is None else seen, start=start
        )
        out.append(d)
        if d.kind != "test":
            return out
        verdicts[d.batch_size] = truth(d.batch_size)
        if passes is not None:
            seen[d.batch_size] = passes(d.batch_size)


def test_the_plan_steps_up_until_degraded_then_bisects_to_the_resolution() -> None:
    sizes = lattice(480, 16384, 1.25, workers=2)
    plan = run_plan(sizes, lambda b: "fine" if b <= 3000 else "degraded")
    tested = [(d.batch_size, d.chosen) for d in plan if d.kind == "test"]
    assert tested == [
        (480, "reference"),
        (960, "step up"),
        (1920, "step up"),
        (3840, "step up"),
        (2880, "bisect"),
        (3360, "bisect"),
    ]
    assert plan[-1].kind == "done" and "fine up to 2880, degraded from 3360" in plan[-1].why
    assert 3360 / 2880 <= 1.25  # the bracket is as narrow as asked
    assert "between 1920 (fine) and 3840 (degraded)" in plan[4].why


def test_a_predicted_start_goes_there_after_the_reference_and_on_from_it() -> None:
    sizes = lattice(480, 16384, 1.25, workers=2)
    truth = lambda b: "fine" if b <= 3000 else "degraded"  # noqa: E731
    # a good prediction: the reference, the lattice size nearest 2,900, a step up, then the bisection
    tested = [(d.batch_size, d.chosen) for d in run_plan(sizes, truth, start=2900) if d.kind == "test"]
    assert tested == [(480, "reference"), (2880, "predicted"), (5760, "step up"), (3840, "bisect"), (3360, "bisect")]
    # too high: bisect down from it; fewer sizes than stepping up from 480 either way
    high = [(d.batch_size, d.chosen) for d in run_plan(sizes, truth, start=12000) if d.kind == "test"]
    assert high[:2] == [(480, "reference"), (11520, "predicted")] and all(c == "bisect" for _, c in high[2:])
    ends = [run_plan(sizes, truth, start=s)[-1].why for s in (None, 2900, 12000)]
    assert all("fine up to 2880, degraded from 3360" in why for why in ends)
    # the trial cap counts every outcome from the start too
    fewest, most = search_bounds(tuple(sizes), 2.0, 1.25, 2880)
    assert fewest <= len(tested) <= most


def test_the_plan_stops_at_the_top_and_at_a_degraded_reference() -> None:
    sizes = lattice(4, 64, 1.5)
    plan = run_plan(sizes, lambda b: "fine")
    assert [d.batch_size for d in plan if d.kind == "test"] == [4, 8, 16, 32, 64]
    assert plan[-1].kind == "done" and "top of the range, 64" in plan[-1].why
    plan = run_plan(sizes, lambda b: "degraded")
    assert [d.batch_size for d in plan if d.kind == "test"] == [4] and plan[-1].kind == "done"


def test_an_undecided_reference_still_finds_the_smallest_degraded_size() -> None:
    # against another optimizer's reference nothing can be fine; the degraded end still narrows
    sizes = lattice(4, 64, 1.5)
    plan = run_plan(sizes, lambda b: "undecided" if b < 24 else "degraded")
    tested = [d.batch_size for d in plan if d.kind == "test"]
    assert tested == [4, 8, 16, 32, 24]
    assert plan[-1].kind == "done"


def test_undecided_sizes_split_the_bracket_and_both_sides_are_searched() -> None:
    sizes = lattice(8, 256, 1.25)
    truth = {b: "fine" if b <= 16 else "undecided" if b < 64 else "degraded" for b in sizes}
    plan = run_plan(sizes, truth.__getitem__)
    tested = [d.batch_size for d in plan if d.kind == "test"]
    assert tested[:4] == [8, 16, 32, 64]
    # the gaps (16, 32) and (32, 64) were both narrowed: a size next to 16 above it, and next to 64 below
    assert 20 in tested and 56 in tested
    assert plan[-1].kind == "done"


def test_the_point_estimate_is_narrowed_where_verdicts_stay_undecided() -> None:
    sizes = lattice(8, 256, 1.25)
    undecided = lambda b: "fine" if b == 8 else "undecided"  # noqa: E731
    without = [d.batch_size for d in run_plan(sizes, undecided) if d.kind == "test"]
    assert without == [8, 16, 32, 64, 128, 256]  # nothing degraded: steps up to the top, bracket [8, -)
    with_means = run_plan(sizes, undecided, passes=lambda b: b <= 100)
    tested = [d.batch_size for d in with_means if d.kind == "test"]
    assert tested[:6] == without
    # 128 and 256 out of tolerance by their means: the gap above 8, the largest fine, is bisected as below a
    # degraded size; then, the means passing up to 100, between 64 and 128 until the point estimate is within 1.25
    assert tested[6:] == [12, 10, 96, 112]
    assert "point estimate: between 64 (within tolerance by its mean) and 128 (not)" in with_means[8].why


def test_two_sizes_out_of_tolerance_end_the_way_up_though_nothing_is_decided() -> None:
    # 2 seeds a size decide nothing at the Bonferroni level: without the means the search climbs to the top
    sizes = lattice(8, 4096, 1.25)
    undecided = lambda b: "fine" if b <= 16 else "undecided"  # noqa: E731
    climb = [d.batch_size for d in run_plan(sizes, undecided) if d.kind == "test"]
    assert climb == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    plan = run_plan(sizes, undecided, passes=lambda b: b <= 40)
    tested = [d.batch_size for d in plan if d.kind == "test"]
    # 64 and 128 are out of tolerance: no higher; the gap above 16 (fine) narrows, then the point estimate
    assert tested[:5] == [8, 16, 32, 64, 128] and max(tested) == 128
    assert tested[5:] == [24, 20, 48, 40]
    assert plan[-1].kind == "done" and "48 and 64 are out of tolerance by their means: no higher" in plan[-1].why
    # one size out of tolerance is what noise or one divergence can make: the way up goes on past it
    lone = run_plan(sizes, undecided, passes=lambda b: b != 64)
    assert 4096 in [d.batch_size for d in lone if d.kind == "test"]
    # the trial cap still bounds every outcome (the plan tests fewer sizes, never more)
    fewest, most = search_bounds(tuple(sizes), 2.0, 1.25)
    assert fewest <= len(tested) <= most and len(climb) <= most


def test_the_plan_waits_for_a_size_still_running() -> None:
    sizes = lattice(4, 64, 1.5)
    assert plan_for_reference(sizes, {4: "fine", 8: None}, step=2, resolution=1.5).kind == "wait"


def brute_force_bounds(sizes: list[int], step: float, resolution: float) -> tuple[int, int]:
    """Every monotone outcome (fine < a <= undecided < c <= degraded, means pass below m) run through the plan."""
    counts = []
    n = len(sizes)
    for a in range(n + 1):
        for c in range(a, n + 1):
            for m in range(a, c + 1):
                truth = {b: "fine" if i < a else "undecided" if i < c else "degraded" for i, b in enumerate(sizes)}
                passes = {b: i < m for i, b in enumerate(sizes)}
                plan = run_plan(sizes, truth.__getitem__, passes=passes.__getitem__, step=step, resolution=resolution)
                counts.append(sum(d.kind == "test" for d in plan))
    return min(counts), max(counts)


@pytest.mark.parametrize(("lo", "hi", "res"), [(4, 64, 1.5), (8, 256, 1.25), (480, 8192, 1.25), (16, 4096, 2.0)])
def test_search_bounds_are_the_fewest_and_most_sizes_of_every_monotone_outcome(lo: int, hi: int, res: float) -> None:
    sizes = lattice(lo, hi, res)
    assert search_bounds(tuple(sizes), 2.0, res) == brute_force_bounds(sizes, 2.0, res)


def test_a_bisection_warm_starts_between_its_searched_neighbours() -> None:
    # 16 -> lr 1e-3, 64 -> lr 4e-3: at 32 (half way in ln B) the centre is 2e-3 (half way in ln lr)
    lrs = warm_start_lrs(1e-3, 16, 32, lr_min=1e-5, lr_max=1.0, upper=(4e-3, 64))
    assert lrs == pytest.approx([2e-3, 2e-3 * math.exp(-0.5), 2e-3 * math.exp(0.5)], rel=1e-12)
    with pytest.raises(ValueError, match="upper"):
        warm_start_lrs(1e-3, 16, 32, lr_min=1e-5, lr_max=1.0, upper=(4e-3, 24))


# ---- the spec --------------------------------------------------------------------------------------


def search_spec(**batch: object) -> SweepSpec:
    return SweepSpec.from_mapping(tiny_spec("search", batch_sizes={"min": 4, "max": 64, **batch}, token_budget=10**6))


def test_a_search_spec_has_a_lattice_equal_tokens_and_a_trial_cap() -> None:
    spec = search_spec(resolution=1.5)
    assert spec.batch_search is not None and spec.batch_search.against == "baseline"
    assert spec.lattice == [4, 6, 8, 12, 16, 24, 32, 48, 64]
    unit = math.lcm(*spec.lattice) * spec.model.seq_len
    assert spec.trained_tokens % unit == 0 and spec.trained_tokens > spec.token_budget - unit
    fewest, most = spec.sizes_per_optimizer
    assert (fewest, most) == search_bounds(tuple(spec.lattice), 2.0, 1.5)
    # every size at seeds_max, and one more search trial at each optimizer's reference (the lattice's first)
    per_optimizer = most * (spec.lr.trials_per_batch_size + spec.seeds_max) + REFERENCE_EXTRA_TRIALS
    assert spec.total_trials == len(spec.optimizers) * per_optimizer
    for b in spec.lattice:  # every lattice size trains the same tokens in whole steps
        cfg = spec.train_config(spec.optimizer_names[0], b, spec.lr.min, 0)
        assert cfg.total_steps * cfg.tokens_per_step == spec.trained_tokens
    with pytest.raises(ValueError, match=r"batch_size=5 is not in sweep"):
        spec.train_config(spec.optimizer_names[0], 5, spec.lr.min, 0)
    assert SweepSpec.from_mapping(spec.model_dump(mode="json")) == spec  # round trip
    assert search_spec().lattice[:4] == [4, 5, 6, 7]  # the default resolution, 1.25


@pytest.mark.parametrize(
    ("batch", "field", "says"),
    [
        ({"max": 2}, "batch_sizes.max", "must be > batch_sizes.min"),
        ({"max": 7, "resolution": 2.0}, "batch_sizes.max", "leaves nothing to search"),
        ({"resolution": 1.01}, "batch_sizes.resolution", "greater than or equal to 1.1"),
        ({"step": 1.2}, "batch_sizes.step", "must be >= batch_sizes.resolution"),
        ({"against": "them"}, "batch_sizes.against", "'baseline' or 'self'"),
        ({"bogus": 1}, "batch_sizes.bogus", "valid fields: min, max, resolution, step, against, start"),
        ({"start": 4}, "batch_sizes.start", "got start=4 (min=4, max=64)"),
        ({"start": {"adamw": 128}}, "batch_sizes.start", "got start=128"),
        ({"start": {"lion": 16}}, "batch_sizes.start", "names lion, not among the optimizers (adamw)"),
        ({"min": 5, "resolution": 1.5}, "batch_sizes.min", "min=5 cannot start a lattice"),
    ],
)
def test_a_bad_search_names_its_field_and_value(batch: dict, field: str, says: str) -> None:
    with pytest.raises(ValidationError) as exc:
        search_spec(**batch)
    problems = format_validation_error(exc.value)
    assert [p["field"] for p in problems] == [field], problems
    assert says in problems[0]["message"]


def test_batch_sizes_of_another_shape_are_refused_in_one_line() -> None:
    with pytest.raises(ValidationError) as exc:
        SweepSpec.from_mapping(tiny_spec("search", batch_sizes="4..64"))
    (problem,) = format_validation_error(exc.value)
    assert problem["field"] == "batch_sizes" and "a list of batch sizes or {min, max, resolution}" in problem["message"]
