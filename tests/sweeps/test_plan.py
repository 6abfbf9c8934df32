import math

import pytest

from sweeps.plan import (
    BRACKET_STEP,
    CLIFF_GAP,
    PROBE_STEP,
    REFERENCE_NARROW,
    VERTEX_MIN_GAP,
    cell_key,
    cell_order,
    check_lr,
    cliff_pair,
    coarse_lrs,
    neighbourhood,
    next_search_lr,
    parabola_vertex,
    probe_lr,
    run_name,
    study_name,
    warm_start_lrs,
)


def test_cell_order_puts_small_batches_first_and_interleaves_optimizers() -> None:
    assert cell_order(["adamw", "merit"], [16, 32]) == [("adamw", 16), ("merit", 16), ("adamw", 32), ("merit", 32)]


def test_warm_start_is_a_bracket_around_the_sqrt_scaled_lr() -> None:
    # bs 16 -> 64: ratio 4, the sqrt rule doubles the lr; then BRACKET_STEP either side in ln lr
    lrs = warm_start_lrs(1e-3, 16, 64, lr_min=1e-4, lr_max=1e-1)
    assert lrs == pytest.approx([2e-3, 2e-3 * math.exp(-0.5), 2e-3 * math.exp(0.5)], rel=1e-12)
    assert BRACKET_STEP == 0.5


def test_warm_start_clips_to_range_and_drops_duplicates() -> None:
    # the centre (0.06) and the upper point clip to lr_max: two points, not three
    assert warm_start_lrs(0.03, 8, 32, lr_min=1e-4, lr_max=0.05) == pytest.approx([0.05, 0.06 * math.exp(-0.5)])
    # all three clip to lr_min: one point
    assert warm_start_lrs(1e-6, 8, 32, lr_min=1e-4, lr_max=0.05) == [1e-4]


def test_coarse_lrs_are_slice_centres_in_log_space() -> None:
    lrs = coarse_lrs(1e-4, 1e-1, 3)  # ln-range of 3 decades in 3 slices: centres at 10^-3.5, -2.5, -1.5
    assert lrs == pytest.approx([10**-3.5, 10**-2.5, 10**-1.5], rel=1e-12)
    with pytest.raises(ValueError, match="lr_min=0.1"):
        coarse_lrs(0.1, 0.01)


def bowl(lr: float, centre: float = 1e-3, k: float = 0.05) -> float:
    return 3.0 + k * math.log(lr / centre) ** 2


def test_the_parabola_vertex_of_an_exact_bowl_is_its_centre() -> None:
    points = [(lr, bowl(lr)) for lr in (2e-4, 6e-4, 3e-3, 1e-2)]
    assert parabola_vertex(points) == pytest.approx(1e-3, rel=1e-9)
    # only the lowest point and its 3 nearest neighbours are fitted: a far point off the bowl is ignored
    assert parabola_vertex([*points, (1e-6, 0.0 + 9.0)]) == pytest.approx(1e-3, rel=1e-9)
    # the lowest (6e-4), then by distance in ln lr: 2e-4 (1.10 away), 3e-3 (1.61)
    assert neighbourhood(points, 3) == [(6e-4, bowl(6e-4)), (2e-4, bowl(2e-4)), (3e-3, bowl(3e-3))]


def test_the_parabola_vertex_steps_out_but_not_far_and_needs_a_minimum() -> None:
    # the three points lie below the centre: the vertex (1e-3) is beyond reach 0.2 of the span's top
    points = [(lr, bowl(lr)) for lr in (1e-4, 2e-4, 4e-4)]
    assert parabola_vertex(points, reach=0.2) == pytest.approx(4e-4 * math.exp(0.2), rel=1e-9)
    assert parabola_vertex(points, reach=0.2, lr_max=4.5e-4) == pytest.approx(4.5e-4, rel=1e-9)
    assert parabola_vertex(points[:2]) is None  # two lrs: no parabola
    concave = [(lr, 3.0 - 0.05 * math.log(lr / 1e-3) ** 2) for lr in (1e-4, 1e-3, 1e-2)]
    assert parabola_vertex(concave) is None


def test_the_line_search_steps_to_the_vertex_when_the_best_is_bracketed() -> None:
    done = [(lr, bowl(lr, centre=1.3e-3)) for lr in (5e-4, 1e-3, 2e-3)]
    kind, lr = next_search_lr(done, [], [p[0] for p in done], lr_min=1e-4, lr_max=3e-2)
    assert kind == "vertex" and lr == pytest.approx(1.3e-3, rel=1e-9)
    # the vertex within VERTEX_MIN_GAP of the best lr: converged
    near_best = [(lr, bowl(lr, centre=1.05e-3)) for lr in (5e-4, 1e-3, 2e-3)]
    assert next_search_lr(near_best, [], [p[0] for p in near_best], lr_min=1e-4, lr_max=3e-2) == ("converged", None)
    # within VERTEX_MIN_GAP of another tried lr (one that did not complete: pruned, diverged): not where the
    # minimum is known to be, so the step halves the gap between the best lr and it instead
    other = 1.3e-3 * math.exp(VERTEX_MIN_GAP / 2)
    kind, lr = next_search_lr(done, [], [p[0] for p in done] + [other], lr_min=1e-4, lr_max=3e-2)
    assert kind == "vertex" and lr == pytest.approx(math.sqrt(1e-3 * other), rel=1e-9)
    # and where that midpoint is on a tried lr too, the bracket is narrow: converged
    tight = [p[0] for p in done] + [other, math.sqrt(1e-3 * other)]
    assert next_search_lr(done, [], tight, lr_min=1e-4, lr_max=3e-2) == ("converged", None)


def test_a_reference_search_converges_only_with_a_tried_lr_near_its_best_on_both_sides() -> None:
    lo, hi = 1e-4, 3e-2
    # the coarse start's lrs (~1.9 apart in ln lr), then the vertex step that landed next to the middle one
    coarse = coarse_lrs(lo, hi)
    step = coarse[1] * math.exp(0.1)
    done = [(lr, bowl(lr, centre=coarse[1])) for lr in [*coarse, step]]
    tried = [p[0] for p in done]
    # without `narrow` that is converged (the next vertex lands within VERTEX_MIN_GAP of the best lr)
    assert next_search_lr(done, [], tried, lr_min=lo, lr_max=hi) == ("converged", None)
    # with it: the nearest tried lr above the best (coarse[1]) is 0.1 away, the one below ~1.9: a step down
    kind, lr = next_search_lr(done, [], tried, lr_min=lo, lr_max=hi, narrow=REFERENCE_NARROW)
    assert kind == "step" and lr == pytest.approx(coarse[1] * math.exp(-BRACKET_STEP), rel=1e-12)
    # that step tried, both sides have a tried lr within REFERENCE_NARROW: converged
    done.append((lr, bowl(lr, centre=coarse[1])))
    assert next_search_lr(done, [], [*tried, lr], lr_min=lo, lr_max=hi, narrow=REFERENCE_NARROW) == ("converged", None)
    # neither side near (the vertex of the coarse start is its middle lr): upwards first
    far = [(lr, bowl(lr, centre=coarse[1])) for lr in coarse]
    kind, lr = next_search_lr(far, [], coarse, lr_min=lo, lr_max=hi, narrow=REFERENCE_NARROW)
    assert kind == "step" and lr == pytest.approx(coarse[1] * math.exp(BRACKET_STEP), rel=1e-12)
    # the best at the top of the range: nothing can be tried above it, so the step goes below
    at_top = [(hi, 3.4), (hi * math.exp(-1.9), 3.5)]
    assert next_search_lr(at_top, [], [p[0] for p in at_top], lr_min=lo, lr_max=hi) == ("converged", None)
    assert next_search_lr(at_top, [], [p[0] for p in at_top], lr_min=lo, lr_max=hi, narrow=REFERENCE_NARROW) == (
        "step",
        pytest.approx(hi * math.exp(-BRACKET_STEP), rel=1e-12),
    )


def test_the_line_search_steps_out_or_halves_the_gap_below_a_divergence() -> None:
    lo, hi = 1e-4, 3e-2
    # the best is the highest completed lr and nothing diverged: step out by 2 x BRACKET_STEP
    done = [(1e-4, 3.5), (3e-4, 3.4)]
    assert next_search_lr(done, [], [1e-4, 3e-4], lr_min=lo, lr_max=hi) == ("step", pytest.approx(3e-4 * math.e))
    # a divergence above, nearer than the completed neighbour below: halve the wider gap, the one below
    done = [(1e-4, 3.5), (1e-3, 3.4)]
    kind, lr = next_search_lr(done, [2e-3], [1e-4, 1e-3, 2e-3], lr_min=lo, lr_max=hi)
    assert kind == "step" and lr == pytest.approx(math.sqrt(1e-4 * 1e-3))
    # the divergence is farther: halve the gap towards it
    kind, lr = next_search_lr(done, [1e-1], [1e-4, 1e-3, 1e-1], lr_min=lo, lr_max=hi)
    assert kind == "step" and lr == pytest.approx(math.sqrt(1e-3 * 1e-1))
    # the best is the lowest completed lr: step down, clipped to the range; onto a tried lr that did not
    # complete, halve the gap to it instead; onto the best lr itself (at the end of the range): converged
    done = [(2e-4, 3.4), (1e-3, 3.5)]
    assert next_search_lr(done, [], [2e-4, 1e-3], lr_min=lo, lr_max=hi) == ("step", pytest.approx(lo))
    assert next_search_lr(done, [], [1e-4, 2e-4, 1e-3], lr_min=lo, lr_max=hi) == (
        "step",
        pytest.approx(math.sqrt(1e-4 * 2e-4)),
    )
    assert next_search_lr([(1e-4, 3.4), (1e-3, 3.5)], [], [1e-4, 1e-3], lr_min=lo, lr_max=hi) == ("converged", None)
    # the first divergence of the coarse start: equal gaps below and up to it (in ln lr, up to round-off);
    # the step goes up, towards the cliff, not back below the best lr
    coarse = [1e-4 * math.exp(0.5 + k) for k in range(3)]
    kind, lr = next_search_lr([(coarse[0], 3.5), (coarse[1], 3.4)], [coarse[2]], coarse, lr_min=lo, lr_max=hi)
    assert kind == "step" and lr == pytest.approx(math.sqrt(coarse[1] * coarse[2]))
    # nothing completed: step down from the lowest divergence (clipped to the range); once that step was
    # tried without a loss, the sampler proposes; with nothing diverged either, it does from the start
    assert next_search_lr([], [1e-2, 3e-2], [1e-2, 3e-2], lr_min=lo, lr_max=hi) == (
        "step",
        pytest.approx(1e-2 / math.e),
    )
    assert next_search_lr([], [2e-4], [2e-4], lr_min=lo, lr_max=hi) == ("step", pytest.approx(lo))
    assert next_search_lr([], [1e-2], [1e-2, 1e-2 / math.e], lr_min=lo, lr_max=hi) == ("explore", None)
    assert next_search_lr([], [], [1e-2], lr_min=lo, lr_max=hi) == ("explore", None)


def test_a_search_with_one_completed_lr_under_a_cliff_steps_just_below_it_before_it_ends() -> None:
    lo, hi = 1e-4, 3e-2
    # the only completed lr, 1.8e-2, under divergences at 2.33e-2 and 3e-2: the step towards the cliff
    # (their geometric mean, 0.13 ln-units up) lands on the best lr, so the search would end with nothing
    # below it; it steps PROBE_STEP (0.25) down instead
    best, diverged = 1.8e-2, [2.33e-2, 3e-2]
    tried = [best, *diverged]
    assert next_search_lr([(best, 3.38)], diverged, tried, lr_min=lo, lr_max=hi) == (
        "step",
        pytest.approx(best * math.exp(-0.25)),
    )
    # once an lr below it was tried (completed or not), it ends as before
    below = best * math.exp(-0.25)
    assert next_search_lr([(best, 3.38), (below, 3.39)], diverged, [*tried, below], lr_min=lo, lr_max=hi) == (
        "converged",
        None,
    )
    assert next_search_lr([(best, 3.38)], [*diverged, below], [*tried, below], lr_min=lo, lr_max=hi) == (
        "converged",
        None,
    )
    # nothing diverged above it (a search at the top of its range): it ends there
    assert next_search_lr([(hi, 3.38)], [], [hi], lr_min=lo, lr_max=hi) == ("converged", None)
    # that step would fall below lr.min: it ends there
    assert next_search_lr([(1.1e-4, 3.38)], [1.3e-4], [1.1e-4, 1.3e-4], lr_min=lo, lr_max=hi) == ("converged", None)


def test_a_probe_goes_just_below_a_diverged_confirmation_lr_with_nothing_near_below_it() -> None:
    assert PROBE_STEP == 0.25
    # confirmation runs diverged at 1e-2; the nearest completed search lr is 1.9 ln-units below: a probe
    assert probe_lr([1e-2, 2e-2], [1.7e-3, 1e-2, 2e-2], [4e-2], lr_min=1e-4) == pytest.approx(1e-2 * math.exp(-0.25))
    # a completed search lr within 2 x PROBE_STEP below: the retreat goes there, no probe
    assert probe_lr([1e-2], [1e-2 * math.exp(-0.45), 1e-2], [], lr_min=1e-4) is None
    assert probe_lr([1e-2], [1e-2 * math.exp(-0.55), 1e-2], [], lr_min=1e-4) == pytest.approx(7.788e-3, rel=1e-3)
    # a probe that diverged too: the next one below it
    low = 1e-2 * math.exp(-0.25)
    assert probe_lr([1e-2], [1e-2], [low], lr_min=1e-4) == pytest.approx(1e-2 * math.exp(-0.5))
    # nothing diverged in confirmation: nothing to probe
    assert probe_lr([], [1e-2], [2e-2], lr_min=1e-4) is None
    # at the lower bound: clipped to it, and once it diverged there, no probe
    assert probe_lr([1.1e-4], [1.1e-4], [], lr_min=1e-4) == pytest.approx(1e-4)
    assert probe_lr([1.1e-4], [1.1e-4], [1e-4], lr_min=1e-4) is None


def test_the_second_lr_is_the_better_read_of_the_nearest_completed_lr_on_each_side_within_reach() -> None:
    # of the nearest completed lr on each side within 2 x PROBE_STEP (ln-units), the one whose search run read lower
    done = [(5e-4, 3.30), (7e-4, 3.12), (1e-3, 3.10), (1.4e-3, 3.15), (1.6e-3, 3.11)]
    assert check_lr(1e-3, done, []) == pytest.approx(7e-4)  # 3.12 below against 3.15 above: 1.6e-3 is not nearest
    assert check_lr(1e-3, [(7e-4, 3.16), (1e-3, 3.10), (1.4e-3, 3.15)], []) == pytest.approx(1.4e-3)
    assert check_lr(1e-3, [(7e-4, 3.15), (1e-3, 3.10), (1.4e-3, 3.15)], []) == pytest.approx(1.4e-3)  # a tie: above
    # the reach, on both sides
    far, near = 1e-3 * math.exp(0.51), 1e-3 * math.exp(0.49)
    assert check_lr(1e-3, [(1e-3, 3.1), (near, 3.2)], []) == pytest.approx(near)
    assert check_lr(1e-3, [(1e-3, 3.1), (far, 3.2)], []) is None  # too far: a different loss, not a check
    assert check_lr(1e-3, [(1e-3, 3.1), (1e-3 / math.exp(0.49), 3.2)], []) == pytest.approx(1e-3 / math.exp(0.49))
    assert check_lr(1e-3, [(1e-3, 3.1), (1e-3 / math.exp(0.51), 3.2)], []) is None
    # not at or above an lr where a confirmation run diverged (known unstable for some seed)
    assert check_lr(1e-3, [(1e-3, 3.1), (1.4e-3, 3.0)], [1.4e-3]) is None
    assert check_lr(1e-3, [(1e-3, 3.1), (1.2e-3, 3.2), (1.4e-3, 3.0)], [1.4e-3]) == pytest.approx(1.2e-3)
    assert check_lr(1e-3, [(8e-4, 3.3), (1e-3, 3.1), (1.4e-3, 3.0)], [1.4e-3]) == pytest.approx(8e-4)
    # nothing else completed: no check
    assert check_lr(1e-3, [(1e-3, 3.1)], []) is None


def test_a_best_lr_at_a_cliff_pairs_with_the_next_best_completed_lr() -> None:
    assert CLIFF_GAP == 0.5
    done = [(1e-3, 3.2), (2e-3, 3.1), (4e-3, 3.05)]
    # the next lr tried above the best diverged: the best and the completed lr with the next lowest loss
    assert cliff_pair(4e-3, done, [8e-3]) == (4e-3, 2e-3)
    assert cliff_pair(4e-3, done, [8e-3, 1.6e-2, 5e-4]) == (4e-3, 2e-3)
    # a completed lr between the best and the divergence: a cliff only within CLIFF_GAP of the best
    near, step = 4e-3 * math.exp(0.2), [*done, (4e-3 * math.exp(0.2), 3.07)]
    assert cliff_pair(4e-3, step, [4e-3 * math.exp(0.49)]) == (4e-3, near)  # 3.07 < 3.1: the nearer one
    assert cliff_pair(4e-3, step, [4e-3 * math.exp(0.51)]) is None
    # nothing diverged above the best, or nothing else completed: no pair
    assert cliff_pair(4e-3, done, []) is None
    assert cliff_pair(4e-3, done, [5e-4]) is None
    assert cliff_pair(4e-3, [(4e-3, 3.05)], [8e-3]) is None
    # a tie in loss goes to the smaller lr
    assert cliff_pair(4e-3, [(1e-3, 3.1), (2e-3, 3.1), (4e-3, 3.0)], [8e-3]) == (4e-3, 1e-3)


def test_a_cell_at_a_cliff_checks_the_other_of_its_pair_below_any_diverged_confirmation() -> None:
    completed, pair = [(1e-3, 3.2), (2e-3, 3.1), (4e-3, 3.05)], (4e-3, 2e-3)
    # at the search's best: the other of the pair, whatever a degraded check would take (nothing above)
    assert check_lr(4e-3, completed, [], pair) == 2e-3
    # a confirmation run diverged at the best and the cell retreated to the other: the best is known
    # unstable, and the nearest-neighbour rule applies below it (1e-3 is out of reach of 2e-3)
    assert check_lr(2e-3, completed, [4e-3], pair) is None
    assert check_lr(2e-3, [(1.4e-3, 3.3), *completed], [4e-3], pair) == pytest.approx(1.4e-3)
    assert check_lr(2e-3, completed, [], pair) == 4e-3  # no divergence: the pair's other, above
    # a cell whose lr is neither of the pair (retreated past both): the nearest-neighbour rule
    assert check_lr(1e-3, [(1e-3, 3.2), (1.4e-3, 3.15), (2e-3, 3.1)], [2e-3], pair) == pytest.approx(1.4e-3)


def test_warm_start_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="prev_batch_size=0"):
        warm_start_lrs(1e-3, 0, 32, lr_min=1e-4, lr_max=1e-1)


def test_names_are_readable_and_stable() -> None:
    assert cell_key("merit", 64) == "merit/bs64"
    assert study_name("demo", "merit", 64) == "demo/merit/bs64"
    assert run_name("merit", 64, 3.1e-3, 1) == "merit bs=64 lr=3.1e-03 seed=1"
    assert run_name("merit", 64) == "merit bs=64"
    assert math.isclose(float(run_name("adamw", 8, 0.0123, 0).split("lr=")[1].split()[0]), 0.012)


def test_pick_best_trusts_the_parabola_of_the_neighbours_over_one_low_run() -> None:
    from sweeps.analysis import pick_best

    def key(t: tuple[float, float, int]) -> tuple[float, float, int]:
        return t

    # (loss, lr, number): a bowl centred at 1e-3, sampled 0.5 apart in ln lr; the run at 1.65e-3 is
    # 0.02 below its bowl (seed noise) and the lowest, but the parabola through it and its 3 nearest
    # neighbours has its minimum at 1.105e-3, nearest the run at 1e-3
    trials = [(bowl(lr), lr, i) for i, lr in enumerate((3.68e-4, 6.07e-4, 1e-3, 2.72e-3))]
    trials.append((bowl(1.65e-3) - 0.02, 1.65e-3, 4))
    assert min(trials)[1] == 1.65e-3
    assert pick_best(trials, key)[1] == 1e-3
    # two trials: no parabola, the lowest loss; an exact tie goes to the smaller lr, then the earlier trial
    assert pick_best([(3.5, 2e-3, 0), (3.4, 1e-3, 1)], key) == (3.4, 1e-3, 1)
    assert pick_best([(3.5, 2e-3, 0), (3.5, 1e-3, 1)], key) == (3.5, 1e-3, 1)
    assert pick_best([(3.5, 1e-3, 2), (3.5, 1e-3, 1)], key) == (3.5, 1e-3, 1)
    assert pick_best([(math.inf, 1e-3, 0)], key) is None


def test_pick_best_keeps_the_minimum_of_a_noise_free_asymmetric_valley() -> None:
    """A valley 4x steeper above its optimum, runs up to 3.2 ln-units apart: a parabola through all four
    slides to the shallow side, nearest a strictly worse run; fitted only within PARABOLA_WINDOW of the
    lowest run, it leaves the lowest run the best."""
    from sweeps.analysis import pick_best

    def valley(u: float) -> float:
        return 3.0 + 0.05 * u * u * (4.0 if u > 0 else 1.0)

    trials = [(valley(u), 1e-3 * math.exp(u), i) for i, u in enumerate((-2.0, -1.0, 0.2, 1.2))]
    lowest = min(trials)
    wide = parabola_vertex([(lr, loss) for loss, lr, _ in trials], reach=0.0)
    assert wide is not None and abs(math.log(wide / 1e-3 / math.exp(-1.0))) < abs(math.log(wide / lowest[1]))
    assert pick_best(trials, lambda t: t) == lowest
