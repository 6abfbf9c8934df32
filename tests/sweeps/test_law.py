"""The critical batch size as a law (`sweeps.law`): the likelihood with exact values, and the fit on brackets
made from known laws on a lattice of powers of 2, as sweeps report them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from sweeps.law import (
    LOG_EXCESS_MAX,
    SIGMA_FLOOR,
    BatchLaw,
    LeaveOneOut,
    LrLaw,
    LrPoint,
    Scale,
    _Data,
    _neg_log_likelihood,
    crossing,
    fit_batch_law,
    fit_lr_law,
    leave_largest_out,
    point_sd,
    sigma_floor,
)

BUDGETS = (1e7, 3e7, 1e8, 3e8, 1e9)


def bracket(b: float) -> tuple[int, int]:
    """The bracket a sweep over the batch sizes 1, 2, 4, ... would decide for a true B* of `b`."""
    k = math.floor(math.log2(b))
    return 2**k, 2 ** (k + 1)


def law_b(tokens: float, params: float = 1e8) -> float:
    return 64 * (tokens / 1e8) ** 0.5 * (params / 1e8) ** 0.0


def scales(**kw: float) -> list[Scale]:
    return [Scale(d, *bracket(law_b(d)), **kw) for d in BUDGETS]


def brackets(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> _Data:
    """Scales with a bracket and no point."""
    return _Data(x, lo, hi, np.full(len(lo), math.nan), np.full(len(lo), math.nan))


def test_the_likelihood_of_a_bracket_exact_values() -> None:
    # the floor of sigma: a point spread evenly over the median bracket, ln 2 / sqrt 12 for [32, 64)
    lo, hi = np.array([math.log(32)]), np.array([math.log(64)])
    assert sigma_floor(lo, hi) == pytest.approx(math.log(2) / math.sqrt(12), rel=1e-12)
    assert sigma_floor(np.array([math.log(32)]), np.array([math.inf])) == SIGMA_FLOOR  # no closed bracket
    # one scale, mean ln B = ln 40, sigma = floor + e^s: the probability that B* falls in [32, 64)
    theta = np.array([math.log(40.0), math.log(0.2)])
    x = np.array([[1.0]])
    sigma = math.log(2) / math.sqrt(12) + 0.2
    want = scipy.stats.norm.cdf((math.log(64) - math.log(40)) / sigma) - scipy.stats.norm.cdf(
        (math.log(32) - math.log(40)) / sigma
    )
    nll = _neg_log_likelihood(theta, brackets(x, np.array([math.log(32)]), np.array([math.log(64)])))
    assert nll == pytest.approx(-math.log(want), rel=1e-12)
    # open at the top (right-censored): P(B* >= 32) alone, at the floor's floor
    nll = _neg_log_likelihood(theta, brackets(x, np.array([math.log(32)]), np.array([math.inf])))
    open_sigma = SIGMA_FLOOR + 0.2
    assert nll == pytest.approx(-math.log(scipy.stats.norm.sf((math.log(32) - math.log(40)) / open_sigma)), rel=1e-12)
    # far in the upper tail it keeps its digits (a bracket a factor e wide)
    far = _neg_log_likelihood(
        theta, brackets(x, np.array([math.log(40 * math.e**6)]), np.array([math.log(40 * math.e**7)]))
    )
    sigma = 1 / math.sqrt(12) + 0.2
    z = (6.0 / sigma, 7.0 / sigma)
    assert far == pytest.approx(-math.log(scipy.stats.norm.sf(z[0]) - scipy.stats.norm.sf(z[1])), rel=1e-9)
    # a line search that steps ln(sigma - floor) past a float's range reads the scatter at its cap, e^30: the
    # open bracket's probability, 1/2 - Phi((ln 32 - ln 40) / sigma) below it, no OverflowError
    huge = _neg_log_likelihood(
        np.array([math.log(40.0), 1000.0]), brackets(x, np.array([math.log(32)]), np.array([math.inf]))
    )
    capped = SIGMA_FLOOR + math.exp(LOG_EXCESS_MAX)
    assert huge == pytest.approx(-math.log(scipy.stats.norm.sf((math.log(32) - math.log(40)) / capped)), rel=1e-12)


def test_a_scale_s_point_is_where_its_two_sizes_cross_the_line_exact_values() -> None:
    assert crossing((64, 3.0), (128, 3.2), 3.1) == pytest.approx(64 * math.sqrt(2), rel=1e-12)  # halfway in ln B
    assert crossing((64, 3.0), (128, 3.2), 3.0) == pytest.approx(64, rel=1e-12)  # the answer on the line
    assert crossing((80, 3.0), (100, 3.4), 3.1) == pytest.approx(80 * 1.25**0.25, rel=1e-12)
    for bad in (((64, 3.0), (128, 3.2), 3.2), ((64, 3.05), (128, 3.2), 3.0), ((128, 3.0), (64, 3.2), 3.1)):
        with pytest.raises(ValueError, match="a crossing needs sizes in order and losses on each side"):
            crossing(*bad)


def test_the_likelihood_of_a_point_exact_values() -> None:
    # a point's sd: within one lattice step either way POINT_WITHIN_STEP (0.80) of the time, ln(step) / z_0.90
    assert point_sd(1.25) == pytest.approx(math.log(1.25) / 1.2815515655446004, rel=1e-9)
    assert point_sd(2.0) == pytest.approx(0.540866, rel=1e-6)
    with pytest.raises(ValueError, match="step must be > 1, got step=1.0"):
        point_sd(1.0)
    # two scales at the same features, mean ln B = ln 40, the law's scatter e^s = 0.1 (no floor: points carry
    # their own sd): a point 50 with sd 0.2, and a bracket [32, 64) read with the points' median sd and the scatter
    x = np.array([[1.0], [1.0]])
    data = _Data(x, np.array([math.log(45), math.log(32)]), np.array([math.log(56), math.log(64)]),
                 np.array([math.log(50), math.nan]), np.array([0.2, math.nan]))  # fmt: skip
    theta = np.array([math.log(40.0), math.log(0.1)])
    point = scipy.stats.norm.logpdf(math.log(50), math.log(40), math.hypot(0.2, 0.1))
    sd = math.hypot(0.2, 0.1)
    bracket_p = scipy.stats.norm.cdf(math.log(64 / 40) / sd) - scipy.stats.norm.cdf(math.log(32 / 40) / sd)
    assert _neg_log_likelihood(theta, data) == pytest.approx(-(point + math.log(bracket_p)), rel=1e-12)
    # a point's bracket is not read twice: the point alone stands for its scale
    assert data.floor() == 0.2 and data.sigma(math.log(0.1)) == pytest.approx(0.1, rel=1e-12)
    assert data.scatter(math.log(0.1)) == pytest.approx(math.hypot(0.2, 0.1), rel=1e-12)
    with pytest.raises(ValueError, match="point=40, point_sd=None"):
        Scale(1e8, 32, 64, point=40)


def test_a_known_law_is_recovered_and_predicts_the_paper_s_scale() -> None:
    law = fit_batch_law(scales())
    assert isinstance(law, BatchLaw) and law.params_exponent is None and law.scales == 5
    lo, hi = law.tokens_interval
    assert lo < 0.5 < hi and hi - lo < 0.6  # brackets a factor 2 wide, over two decades of tokens
    # every bracket holds the law's value at its own scale
    for s in scales():
        assert s.largest_fine <= math.exp(law.mean_log(s.tokens)) < s.smallest_degraded  # type: ignore[operator]
    # 48B tokens, 48x past the largest scale swept: the prediction interval holds the true B*
    pred = law.predict(4.8e10)
    assert pred.low < law_b(4.8e10) < pred.high and pred.low < pred.batch_size < pred.high


def test_an_open_bracket_counts_for_what_it_says() -> None:
    base = scales()
    without = fit_batch_law(base[:-1] + [Scale(1e9, None, None)])  # open at both ends: dropped
    assert isinstance(without, BatchLaw) and without.scales == 4
    # a lower bound the others' law already meets says little; one far above it pulls the law up
    met = fit_batch_law(base[:-1] + [Scale(1e9, 32, None)])
    pulled = fit_batch_law(base[:-1] + [Scale(1e9, 2048, None)])
    assert isinstance(met, BatchLaw) and isinstance(pulled, BatchLaw)
    assert met.tokens_exponent == pytest.approx(without.tokens_exponent, abs=0.02)
    assert pulled.tokens_exponent > without.tokens_exponent + 0.2
    assert math.exp(pulled.mean_log(1e9)) > 0.5 * 2048


def test_the_model_size_enters_where_the_scales_have_two() -> None:
    grid = [Scale(d, *bracket(law_b(d, n)), params=n) for d in BUDGETS for n in (1e8, 3.5e8)]
    law = fit_batch_law(grid)
    assert isinstance(law, BatchLaw) and law.params_exponent is not None and law.params_interval is not None
    assert law.params_interval[0] < 0.0 < law.params_interval[1]  # the truth: no dependence on the model size
    assert law.tokens_interval[0] < 0.5 < law.tokens_interval[1]
    with pytest.raises(ValueError, match="params"):
        law.predict(1e10)


def test_it_says_when_the_data_cannot_support_a_law() -> None:
    assert "3 or more" in str(fit_batch_law(scales()[:2]))
    assert "2 or more" in str(fit_batch_law([Scale(d, 16, None) for d in BUDGETS[:3]] + [Scale(1e9, 64, 128)]))
    assert "cannot be identified" in str(fit_batch_law([Scale(1e8, 32, 64)] * 3))
    with pytest.raises(ValueError, match="tokens=0"):
        Scale(0, 16, 32)
    with pytest.raises(ValueError, match=r"\[32, 16\)"):
        Scale(1e8, 32, 16)


def test_leaving_the_largest_scale_out_checks_the_prediction() -> None:
    check = leave_largest_out(scales())
    assert isinstance(check, LeaveOneOut) and check.held and check.miss == 1.0
    assert check.left_out.tokens == 1e9
    # the largest scale breaks the law (its B* 8x below it): the others' prediction misses its bracket
    broken = scales()[:-1] + [Scale(1e9, *bracket(law_b(1e9) / 8))]
    check = leave_largest_out(broken)
    assert isinstance(check, LeaveOneOut) and not check.held and check.miss >= 2.0
    assert "without the largest scale" in str(leave_largest_out(scales()[:3]))


def test_the_lr_law_recovers_exact_exponents_and_covers_noisy_ones() -> None:
    def lr(b: float, d: float) -> float:
        return 3e-3 * (b / 64) ** 0.5 * (d / 1e8) ** -0.3

    exact = [LrPoint(b, d, lr(b, d)) for b in (16, 64, 256) for d in BUDGETS]
    law = fit_lr_law(exact)
    assert isinstance(law, LrLaw)
    assert law.batch_exponent == pytest.approx(0.5, abs=1e-9) and law.tokens_exponent == pytest.approx(-0.3, abs=1e-9)
    assert law.predict(1024, 4.8e10).batch_size == pytest.approx(lr(1024, 4.8e10), rel=1e-6)
    rng = np.random.default_rng(3)
    noisy = [LrPoint(p.batch_size, p.tokens, p.lr * math.exp(rng.normal(0, 0.2)), sd=0.2) for p in exact]
    law = fit_lr_law(noisy)
    assert isinstance(law, LrLaw) and law.df == len(noisy) - 3
    assert law.interval(1)[0] < 0.5 < law.interval(1)[1] and law.interval(2)[0] < -0.3 < law.interval(2)[1]
    pred = law.predict(1024, 4.8e10)
    assert pred.low < lr(1024, 4.8e10) < pred.high
    assert "2 or more" in str(fit_lr_law([LrPoint(64, d, 1e-3) for d in BUDGETS]))
    assert "4 or more" in str(fit_lr_law(exact[:2] + exact[5:6]))


def test_the_scales_points_draw_the_law_and_narrow_it() -> None:
    # the same brackets; each scale's point the true B* the sweep estimated, off the brackets' centres, its sd a
    # lattice step of 1.25's
    sd = point_sd(1.25)
    with_points = [Scale(d, *bracket(law_b(d)), point=law_b(d), point_sd=sd) for d in BUDGETS]
    law, brackets_only = fit_batch_law(with_points), fit_batch_law(scales())
    assert isinstance(law, BatchLaw) and isinstance(brackets_only, BatchLaw)
    # points on a line: the maximum goes through them, the true law (64 x (tokens / 1e8)^0.5)
    assert law.tokens_exponent == pytest.approx(0.5, abs=1e-4)
    assert math.exp(law.mean_log(4.8e10)) == pytest.approx(law_b(4.8e10), rel=1e-3)
    # points a step's sd apart say more than brackets a factor 2 wide: a narrower interval, still holding 0.5
    lo, hi = law.tokens_interval
    assert lo < 0.5 < hi and hi - lo < 0.6 * (brackets_only.tokens_interval[1] - brackets_only.tokens_interval[0])
    pred = law.predict(4.8e10)
    assert pred.low <= law_b(4.8e10) <= pred.high
    assert law.sigma >= sd  # scatter finer than the points' own sd cannot be seen in them
    # one scale's point off the line pulls the law towards it, by its share of five
    pulled = fit_batch_law([*with_points[:-1], Scale(1e9, *bracket(law_b(1e9)), point=4 * law_b(1e9), point_sd=sd)])
    assert isinstance(pulled, BatchLaw) and 0.5 < pulled.tokens_exponent < 0.5 + math.log(4) / math.log(100)
    # points make a scale count where its bracket is open: three points, brackets bounded on one side
    open_ = [Scale(d, bracket(law_b(d))[0], None, point=law_b(d), point_sd=sd) for d in BUDGETS[:3]]
    assert "2 or more" in str(fit_batch_law([Scale(s.tokens, s.largest_fine, None) for s in open_]))
    three = fit_batch_law(open_)
    assert isinstance(three, BatchLaw) and three.tokens_exponent == pytest.approx(0.5, abs=1e-3)
    with pytest.raises(ValueError, match="point must be >= 1, got point=0.5"):
        Scale(1e7, 8, 16, point=0.5)
