"""The critical batch size as a law: a power law in the token budget (and the model size where the scales have
two or more) fitted to the brackets of sweeps at several scales, and its prediction at a scale nobody sweeps.

Each scale's sweep states its answer as a bracket: the largest degradation-free batch size B* lies in
[largest_fine, smallest_degraded). That is interval-censored data; a bracket open at one end is a bound and no
more (right-censored: B* >= largest_fine; left-censored: B* < smallest_degraded), and one open at both ends
says nothing. The model, in natural logs:

    ln B* = a + b ln(tokens) [+ c ln(params)] + e,    e ~ Normal(0, sigma^2),

fitted by maximum likelihood. A scale with its own estimate of B* (`Scale.point`: where its fitted loss crosses
the tolerance line between its answer and the next size it tested, `crossing`) adds the density of ln point,
Normal with the variance of that estimate (`Scale.point_sd`, from the lattice step it spans: `point_sd`) plus
sigma^2. A scale with a bracket alone adds ln(Phi(z_hi) - Phi(z_lo)), z = (ln bound - mean) / sd, its sd the
points' median point_sd and sigma together.
Without any point `sigma` (the scatter of B* about the law) has a floor, the resolution of the brackets
themselves (`sigma_floor`: the sd of a point spread evenly over a typical bracket, ln 2 / sqrt 12 = 0.2 for
brackets a factor 2 wide): such brackets are met by many lines exactly, the likelihood would otherwise grow
without bound as sigma -> 0, and scatter finer than a bracket cannot be seen in them; with points, their own
sd is that floor. Intervals: the exponents' by profile likelihood (the likelihood-ratio test, chi-square with
1 degree of freedom); the prediction's from the profile interval of the mean at the target (as a standard
error) and sigma together.

Hand-written: no library in the dependencies fits an interval-censored regression (statsmodels has none;
scipy's `stats.CensoredData` fits a distribution, not a regression); the likelihood is four lines, the rest is
scipy.optimize. The rules it follows (Zhang et al., ICLR 2025; Bergsma et al., "Power Lines", NeurIPS 2025:
the critical batch size is a power law in the token count) and what it cannot tell: docs/researchers.md,
"The critical batch size as a law".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.special
import scipy.stats
from pydantic import BaseModel, ConfigDict

from sweeps.report import reference_loss, target_loss_of

__all__ = [
    "LOG_EXCESS_MAX",
    "SIGMA_FLOOR",
    "Confirmation",
    "bracket_holds",
    "confirm_laws",
    "crossing",
    "OptimizerLaw",
    "study_laws",
    "lr_points_of",
    "scale_of",
    "BatchLaw",
    "LawPoint",
    "LeaveOneOut",
    "Prediction",
    "Scale",
    "LrLaw",
    "LrPoint",
    "fit_batch_law",
    "fit_lr_law",
    "leave_largest_out",
    "point_sd",
    "sigma_floor",
]

SIGMA_FLOOR = 0.05  # ln units: the floor's floor, for brackets far narrower than a lattice of powers of 2 gives
# ln(sigma - floor) at most, in the likelihood: a scatter of e^30 in ln B* says nothing (every bracket's
# probability is ~0 there), and the optimisers' line searches may step the parameter past a float's range
LOG_EXCESS_MAX = 30.0
LEVEL = 0.95
# how often a sweep's point lies within one lattice step of the true B*: 0.72-0.79 (noise-scale) and 0.89-0.91
# (cliffs) over the scales of benchmarks/study_transfer.py's problems at resolution 1.25, 0.80 of both; its sd
# follows (`point_sd`). At resolution 2 it is 0.92-0.98, so the sd is wider there than the error it stands for
POINT_WITHIN_STEP = 0.80

if TYPE_CHECKING:
    from sweeps.report import Report


@dataclass(frozen=True)
class Scale:
    """One sweep's scale and its bracket of B*, in sequences. `params`: the model's parameter count (None:
    one model size in the study, or unknown); `point`: the sweep's own estimate of B*, between its answer (the
    largest degradation-free batch size) and the next size it tested (`scale_of`; None: no answer, none tested
    above it, or not known), with `point_sd` the sd of ln point as an estimate of ln B* (`point_sd`)."""

    tokens: float
    largest_fine: int | None
    smallest_degraded: int | None
    params: float | None = None
    point: float | None = None
    point_sd: float | None = None

    def __post_init__(self) -> None:
        if not self.tokens > 0:
            raise ValueError(f"tokens must be > 0, got tokens={self.tokens}")
        if self.params is not None and not self.params > 0:
            raise ValueError(f"params must be > 0, got params={self.params}")
        if self.point is not None and not self.point >= 1:
            raise ValueError(f"point must be >= 1, got point={self.point}")
        if (self.point is None) != (self.point_sd is None) or (self.point_sd is not None and not self.point_sd > 0):
            raise ValueError(
                f"a point needs its point_sd > 0 and point_sd a point, got point={self.point}, point_sd={self.point_sd}"
            )
        lo, hi = self.largest_fine, self.smallest_degraded
        if (
            (lo is not None and lo < 1)
            or (hi is not None and hi < 1)
            or (lo is not None and hi is not None and hi <= lo)
        ):
            raise ValueError(f"a bracket needs 1 <= largest_fine < smallest_degraded, got [{lo}, {hi})")

    @property
    def informative(self) -> bool:
        """The bracket bounds B* on at least one side, or the sweep estimated it."""
        return self.largest_fine is not None or self.smallest_degraded is not None or self.point is not None

    @property
    def decided(self) -> bool:
        """The bracket bounds B* on both sides."""
        return self.largest_fine is not None and self.smallest_degraded is not None

    @property
    def located(self) -> bool:
        """B* is bounded on both sides: by the bracket, or by the sweep's estimate and its sd."""
        return self.decided or self.point is not None


def crossing(answer: tuple[int, float], above: tuple[int, float], line: float) -> float:
    """The batch size at which the loss reaches `line` between two tested sizes, linear in ln B: `answer` (size,
    fitted loss at or under the line) and `above` (the next size, its fitted loss over it). crossing((64, 3.0),
    (128, 3.2), 3.1) = 64 x 2^0.5 = 90.5; at the answer's own loss, the answer."""
    (b_lo, f_lo), (b_hi, f_hi) = answer, above
    if not (b_lo < b_hi and f_lo <= line < f_hi):
        raise ValueError(
            f"a crossing needs sizes in order and losses on each side of the line, got {answer}, {above}, {line}"
        )
    return math.exp(math.log(b_lo) + (line - f_lo) / (f_hi - f_lo) * math.log(b_hi / b_lo))


def point_sd(step: float) -> float:
    """The sd of ln B* about a sweep's point (between its answer and the next size tested, `step` x
    larger): a Normal error within one step either way POINT_WITHIN_STEP of the time, ln(step) / z.
    point_sd(1.25) = 0.174, point_sd(2) = 0.541."""
    if not step > 1:
        raise ValueError(f"step must be > 1, got step={step}")
    return math.log(step) / float(scipy.stats.norm.ppf(0.5 + POINT_WITHIN_STEP / 2))


@dataclass(frozen=True)
class Prediction:
    """B* at one scale, in sequences: the law's value and its prediction interval (a new scale's B*, not the
    law's mean: the scatter sigma is in it)."""

    batch_size: float
    low: float
    high: float


@dataclass(frozen=True)
class BatchLaw:
    """ln B* = intercept + tokens_exponent ln(tokens) [+ params_exponent ln(params)], the likelihood's maximum;
    each exponent with its profile-likelihood interval at LEVEL; `sigma` the scatter of a scale's B* about the
    law (`_Data.scatter`)."""

    intercept: float
    tokens_exponent: float
    tokens_interval: tuple[float, float]
    params_exponent: float | None
    params_interval: tuple[float, float] | None
    sigma: float
    scales: int  # the informative scales it was fitted to
    _data: tuple[Scale, ...] = ()
    _theta: tuple[float, ...] = ()  # the fit itself: the coefficients and s (`_Data.sigma`)

    def mean_log(self, tokens: float, params: float | None = None) -> float:
        x = self.intercept + self.tokens_exponent * math.log(tokens)
        if self.params_exponent is not None:
            if params is None:
                raise ValueError("this law has a params exponent: give the target's params")
            x += self.params_exponent * math.log(params)
        return x

    def predict(self, tokens: float, params: float | None = None, level: float = LEVEL) -> Prediction:
        """B* at (tokens, params), with a `level` prediction interval."""
        mean = self.mean_log(tokens, params)
        target = _features(tokens, params if self.params_exponent is not None else None)
        data = _Data.of(self._data, self.params_exponent is not None)
        lo, hi = _profile_interval(data, np.array(self._theta), target, level)
        z = scipy.stats.norm.ppf(0.5 + level / 2)
        se = max(mean - lo, hi - mean) / z  # the mean's profile interval, read as a standard error
        half = z * math.sqrt(se * se + self.sigma * self.sigma)
        return Prediction(math.exp(mean), math.exp(mean - half), math.exp(mean + half))


@dataclass(frozen=True)
class LeaveOneOut:
    """The law fitted without the largest scale, against that scale's own bracket: `held` when the bracket
    holds the predicted B* (the point); `miss` how far outside it lies, as a factor (1.0 when held)."""

    left_out: Scale
    prediction: Prediction
    held: bool
    miss: float


def _features(tokens: float, params: float | None) -> np.ndarray:
    row = [1.0, math.log(tokens)]
    if params is not None:
        row.append(math.log(params))
    return np.array(row)


@dataclass(frozen=True)
class _Data:
    """The scales as the likelihood reads them: features x (n, k); ln bounds lo, hi (-inf / +inf where open);
    ln point pt and its sd psd (nan where the scale has none)."""

    x: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    pt: np.ndarray
    psd: np.ndarray

    @classmethod
    def of(cls, scales: Sequence[Scale], with_params: bool) -> _Data:
        def ln(v: float | None, missing: float) -> float:
            return math.log(v) if v is not None else missing

        return cls(
            x=np.array([_features(s.tokens, s.params if with_params else None) for s in scales]),
            lo=np.array([ln(s.largest_fine, -math.inf) for s in scales]),
            hi=np.array([ln(s.smallest_degraded, math.inf) for s in scales]),
            pt=np.array([ln(s.point, math.nan) for s in scales]),
            psd=np.array([s.point_sd if s.point_sd is not None else math.nan for s in scales]),
        )

    @property
    def points(self) -> np.ndarray:
        return np.isfinite(self.pt)

    def floor(self) -> float:
        """What B* varies by beyond the law's scatter where only a bracket says where it is: with points, their
        median sd; without, `sigma_floor` (the scatter the likelihood fits then has it as a floor)."""
        return float(np.median(self.psd[self.points])) if self.points.any() else sigma_floor(self.lo, self.hi)

    def sigma(self, s: float) -> float:
        """The law's scatter in ln B* at the fit's last parameter s (capped at LOG_EXCESS_MAX): exp(s) where
        points carry their own sd, floor + exp(s) where brackets alone say where B* is."""
        excess = math.exp(min(s, LOG_EXCESS_MAX))
        return excess if self.points.any() else self.floor() + excess

    def scatter(self, s: float) -> float:
        """The scatter of B* about the law that a new scale's B* has (`BatchLaw.sigma`, in its prediction
        interval): the fitted scatter, and with points the scatter their own sd could hide."""
        sigma = self.sigma(s)
        return math.hypot(self.floor(), sigma) if self.points.any() else sigma

    def start(self) -> np.ndarray:
        """Each scale's ln B* to start the fit from: its point, else its bracket's centre or its one bound."""
        lo = np.where(np.isfinite(self.lo), self.lo, np.where(np.isfinite(self.hi), self.hi, 0.0))
        hi = np.where(np.isfinite(self.hi), self.hi, lo)
        return np.where(self.points, self.pt, (lo + hi) / 2)


def _censored_log_p(mean: np.ndarray, sd: float, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """ln(Phi(z_hi) - Phi(z_lo)), z = (bound - mean) / sd, computed in the tail that keeps its digits: the
    upper tail's where both z > 0."""
    z_lo, z_hi = (lo - mean) / sd, (hi - mean) / sd
    upper = z_lo > 0
    a = np.where(upper, -z_hi, z_lo)
    b = np.where(upper, -z_lo, z_hi)
    log_b = scipy.special.log_ndtr(b)
    return log_b + np.log1p(-np.exp(np.minimum(scipy.special.log_ndtr(a) - log_b, -1e-300)))


def sigma_floor(lo: np.ndarray, hi: np.ndarray) -> float:
    """The scatter finer than which brackets cannot see: the sd of a point spread evenly over the median
    bracket's width in ln B* (width / sqrt 12), at least SIGMA_FLOOR; SIGMA_FLOOR with no closed bracket."""
    widths = (hi - lo)[np.isfinite(lo) & np.isfinite(hi)]
    return max(SIGMA_FLOOR, float(np.median(widths)) / math.sqrt(12)) if widths.size else SIGMA_FLOOR


def _neg_log_likelihood(theta: np.ndarray, data: _Data) -> float:
    """theta = (coefficients..., s), the law's scatter `data.sigma(s)`: a point's density with its own sd and
    the scatter together; a bracket's probability with `data.floor()` and the scatter (the floor alone, the
    scatter over it, where no scale has a point)."""
    sigma = data.sigma(float(theta[-1]))
    mean = data.x @ theta[:-1]
    points = data.points
    out = 0.0
    if points.any():
        sd = np.hypot(data.psd[points], sigma)
        out -= float(np.sum(scipy.stats.norm.logpdf(data.pt[points], mean[points], sd)))
        bracket_sd = math.hypot(data.floor(), sigma)
    else:
        bracket_sd = sigma
    rest = ~points
    if rest.any():
        out -= float(np.sum(_censored_log_p(mean[rest], bracket_sd, data.lo[rest], data.hi[rest])))
    return out


def _fit(data: _Data, fixed: tuple[np.ndarray, float] | None = None) -> np.ndarray:
    """Maximum likelihood theta; with `fixed` = (w, v), under the constraint w . coefficients = v (a profile)."""
    k = data.x.shape[1]
    start = np.linalg.lstsq(data.x, data.start(), rcond=None)[0]
    if fixed is None:
        free = np.eye(k)
        offset = np.zeros(k)
    else:  # coefficients = offset + free @ u, every u meeting w . coefficients = v
        w, v = fixed
        offset = w * v / float(w @ w)
        free = scipy.linalg.null_space(w[None, :])
        start = free.T @ (start - offset)

    def nll(u: np.ndarray) -> float:
        return _neg_log_likelihood(np.append(offset + free @ u[:-1], u[-1]), data)

    u0 = np.append(start, math.log(0.3))
    best = None
    tolerances = {"Nelder-Mead": {"xatol": 1e-9, "fatol": 1e-12}, "Powell": {"xtol": 1e-9, "ftol": 1e-12}}
    for method, tol in tolerances.items():
        res = scipy.optimize.minimize(nll, u0, method=method, options={"maxiter": 20000, **tol})
        if best is None or res.fun < best.fun:
            best = res
        u0 = res.x
    assert best is not None
    return np.append(offset + free @ best.x[:-1], best.x[-1])


def _profile_interval(data: _Data, theta: np.ndarray, w: np.ndarray, level: float) -> tuple[float, float]:
    """The profile-likelihood interval of w . coefficients (an exponent: w a unit vector; the mean at a
    target: w its features), about the maximum-likelihood fit `theta` of `data`."""
    best = _neg_log_likelihood(theta, data)
    at = float(w @ theta[:-1])
    drop = scipy.stats.chi2.ppf(level, 1) / 2

    def excess(v: float) -> float:
        return _neg_log_likelihood(_fit(data, (w, v)), data) - best - drop

    ends = []
    for direction in (-1.0, 1.0):
        step = 0.05 * max(1.0, abs(at))
        far = at + direction * step
        for _ in range(60):  # widen until the likelihood has dropped far enough
            if excess(far) > 0:
                break
            step *= 2
            far = at + direction * step
        else:
            ends.append(direction * math.inf)
            continue
        ends.append(scipy.optimize.brentq(excess, *sorted((at, far)), xtol=1e-7) if excess(at) < 0 else at)
    return ends[0], ends[1]


def fit_batch_law(scales: Sequence[Scale], level: float = LEVEL) -> BatchLaw | str:
    """The law from the scales' points and brackets, or why the data cannot support one (a sentence): fewer
    than 3 informative scales, fewer than 2 located (a point, or a bracket bounded on both sides), or one token
    budget only. The model size enters when the informative scales have two or more (and each names it)."""
    used = [s for s in scales if s.informative]
    located = [s for s in used if s.located]
    budgets = {s.tokens for s in used}
    if len(used) < 3:
        return f"{len(used)} scale(s) with a point or a bracket bounded on a side: a law needs 3 or more"
    if len(located) < 2:
        return f"{len(located)} scale(s) with a point or a bracket bounded on both sides: a law needs 2 or more"
    if len(budgets) < 2:
        return "every scale has the same token budget: the tokens exponent cannot be identified"
    sizes = {s.params for s in used}
    with_params = None not in sizes and len(sizes) >= 2
    if with_params and len(used) < 4:
        return f"{len(used)} scales for 3 coefficients (tokens and model size): a law needs 4 or more"
    data = _Data.of(used, with_params)
    theta = _fit(data)
    k = data.x.shape[1]
    tokens_interval = _profile_interval(data, theta, np.eye(k)[1], level)
    params_interval = _profile_interval(data, theta, np.eye(k)[2], level) if with_params else None
    return BatchLaw(
        intercept=float(theta[0]),
        tokens_exponent=float(theta[1]),
        tokens_interval=tokens_interval,
        params_exponent=float(theta[2]) if with_params else None,
        params_interval=params_interval,
        sigma=data.scatter(float(theta[-1])),
        scales=len(used),
        _data=tuple(used),
        _theta=tuple(float(t) for t in theta),
    )


def leave_largest_out(scales: Sequence[Scale], level: float = LEVEL) -> LeaveOneOut | str:
    """Fit without the largest decided scale (by tokens x params), predict its B*, and say whether its own
    bracket holds the prediction; or why it cannot (the rest support no law)."""
    decided = [s for s in scales if s.decided]
    if not decided:
        return "no scale is decided on both sides: nothing to check a prediction against"
    largest = max(decided, key=lambda s: (s.tokens * (s.params or 1.0), s.tokens))
    rest = [s for s in scales if s is not largest]
    law = fit_batch_law(rest, level)
    if isinstance(law, str):
        return f"without the largest scale: {law}"
    pred = law.predict(largest.tokens, largest.params if law.params_exponent is not None else None, level)
    lo, hi = largest.largest_fine, largest.smallest_degraded
    assert lo is not None and hi is not None
    held, miss = bracket_holds(lo, hi, pred.batch_size)
    return LeaveOneOut(left_out=largest, prediction=pred, held=bool(held), miss=miss)


def bracket_holds(largest_fine: int | None, smallest_degraded: int | None, b: float) -> tuple[bool | None, float]:
    """Whether the bracket [largest_fine, smallest_degraded) holds the predicted B* `b`, and how far outside it
    lies as a factor (1.0 inside): False where `b` is below the fine end or at or above the degraded end; None
    where an open end leaves it undecided (the bound it has does not contradict `b`)."""
    if largest_fine is not None and b < largest_fine:
        return False, largest_fine / b
    if smallest_degraded is not None and b >= smallest_degraded:
        return False, b / smallest_degraded
    if largest_fine is None or smallest_degraded is None:
        return None, 1.0
    return True, 1.0


@dataclass(frozen=True)
class LrPoint:
    """One cell's best lr at its scale; `sd`: its uncertainty in ln lr (what the line search leaves: half the
    gap to the nearest lr tried), None where unknown."""

    batch_size: int
    tokens: float
    lr: float
    params: float | None = None
    sd: float | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "tokens", "lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {name}={getattr(self, name)}")
        if self.sd is not None and not self.sd > 0:
            raise ValueError(f"sd must be > 0, got sd={self.sd}")


@dataclass(frozen=True)
class LrLaw:
    """ln lr = coef[0] + coef[1] ln B + coef[2] ln tokens [+ coef[3] ln params], by weighted least squares
    (weights 1 / sd^2 where every point has one); `cov` the coefficients' covariance (residual scale from the
    fit), `df` the residual degrees of freedom."""

    coef: tuple[float, ...]
    cov: tuple[tuple[float, ...], ...]
    scale: float
    df: int

    @property
    def batch_exponent(self) -> float:
        return self.coef[1]

    @property
    def tokens_exponent(self) -> float:
        return self.coef[2]

    def interval(self, index: int, level: float = LEVEL) -> tuple[float, float]:
        t = scipy.stats.t.ppf(0.5 + level / 2, self.df)
        half = t * math.sqrt(self.cov[index][index])
        return self.coef[index] - half, self.coef[index] + half

    def predict(
        self, batch_size: float, tokens: float, params: float | None = None, level: float = LEVEL
    ) -> Prediction:
        """The lr at (batch_size, tokens, params), with a `level` prediction interval."""
        row = [1.0, math.log(batch_size), math.log(tokens)]
        if len(self.coef) == 4:
            if params is None:
                raise ValueError("this law has a params exponent: give the target's params")
            row.append(math.log(params))
        x = np.array(row)
        mean = float(x @ np.array(self.coef))
        var = float(x @ np.array(self.cov) @ x) + self.scale**2
        half = scipy.stats.t.ppf(0.5 + level / 2, self.df) * math.sqrt(var)
        return Prediction(math.exp(mean), math.exp(mean - half), math.exp(mean + half))


def fit_lr_law(points: Sequence[LrPoint]) -> LrLaw | str:
    """The lr law from the cells' best lrs, or why the data cannot support one: the batch size and the token
    budget must each take 2 or more values, and there must be more points than coefficients. The model size
    enters where every point names one and they take 2 or more values."""
    sizes = {p.params for p in points}
    with_params = None not in sizes and len(sizes) >= 2
    k = 4 if with_params else 3
    if len({p.batch_size for p in points}) < 2 or len({p.tokens for p in points}) < 2:
        return "the batch size and the token budget must each take 2 or more values"
    if len(points) <= k:
        return f"{len(points)} best lrs for {k} coefficients: the law needs {k + 1} or more"
    x = np.array(
        [
            [1.0, math.log(p.batch_size), math.log(p.tokens)] + ([math.log(p.params)] if with_params else [])  # type: ignore[arg-type]
            for p in points
        ]
    )
    y = np.array([math.log(p.lr) for p in points])
    w = np.array([1.0 / p.sd**2 for p in points]) if all(p.sd is not None for p in points) else np.ones(len(points))  # type: ignore[operator]
    xw = x * np.sqrt(w)[:, None]
    yw = y * np.sqrt(w)
    if np.linalg.matrix_rank(xw) < k:
        return "the scales do not separate the exponents (the design is singular)"
    coef, *_ = np.linalg.lstsq(xw, yw, rcond=None)
    df = len(points) - k
    residual = yw - xw @ coef
    s2 = float(residual @ residual) / df
    cov = s2 * np.linalg.inv(xw.T @ xw)
    # the scatter of a new cell's best lr about the law, in ln lr (unweighted: a new point has no sd yet)
    scale = math.sqrt(float(np.mean((y - x @ coef) ** 2)) * len(points) / df)
    return LrLaw(tuple(float(c) for c in coef), tuple(tuple(float(v) for v in r) for r in cov), scale, df)


def _tokens_of(report: Report) -> float:
    tokens = report.trained_tokens
    if not tokens:
        raise ValueError(f"report of {report.sweep} names no token budget")
    return float(tokens)


def scale_of(report: Report, optimizer: str, against: str = "baseline", params: float | None = None) -> Scale:
    """One finished sweep as a scale of the law: its token budget, `optimizer`'s bracket against `against`
    ("self" or "baseline") and its point with that point's sd (`point_sd` of the step between its answer and
    the next size it tested). The point is where the two sizes' fitted losses cross the tolerance line
    (`crossing`); the geometric centre of the two where they do not straddle it (the next size unstable: no
    fitted loss). Why the crossing: B* lies nearer the size whose loss lies nearer the line, and
    the centre is off by up to half a step where it need not be (the study table in docs/researchers.md)."""
    if optimizer not in report.optimizers:
        raise ValueError(
            f"report of {report.sweep} has no optimizer {optimizer!r}; it has {', '.join(report.optimizers)}"
        )
    opt = report.optimizers[optimizer]
    b = getattr(opt.bracket, against)
    answer = getattr(opt.largest_degradation_free_batch_size, against)
    above = [c for c in opt.cells if answer is not None and c.batch_size > answer]
    if answer is None or not above:
        return Scale(_tokens_of(report), b.largest_fine, b.smallest_degraded, params)
    nxt = min(above, key=lambda c: c.batch_size)
    at = next(c for c in opt.cells if c.batch_size == answer)
    f_lo, f_hi = getattr(at.val_loss_fitted, against), getattr(nxt.val_loss_fitted, against)
    line = target_loss_of(reference_loss(report, optimizer, against), report.tolerance)
    if line is not None and f_lo is not None and f_hi is not None and f_lo <= line < f_hi:
        point = crossing((answer, f_lo), (nxt.batch_size, f_hi), line)
    else:
        point = math.sqrt(answer * nxt.batch_size)
    return Scale(
        _tokens_of(report), b.largest_fine, b.smallest_degraded, params, point, point_sd(nxt.batch_size / answer)
    )


def lr_points_of(report: Report, optimizer: str, params: float | None = None) -> list[LrPoint]:
    """`optimizer`'s stable cells of a finished sweep as points of the lr law (their best lr)."""
    tokens = _tokens_of(report)
    return [
        LrPoint(c.batch_size, tokens, c.best_lr, params)
        for c in report.optimizers[optimizer].cells
        if c.best_lr is not None and c.unstable_reason is None
    ]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Band(_Out):
    """A value with its prediction interval (`Prediction` as JSON)."""

    value: float
    low: float
    high: float


class LawPoint(Band):
    """The law's B* and its prediction interval at `tokens` (and the target's model size): what a figure draws
    as the law's line and band."""

    tokens: float


class Bracket(_Out):
    """One scale's bracket of B*, in sequences, and its point with that point's sd in ln B* (`Scale` as JSON)."""

    tokens: float
    params: float | None
    largest_fine: int | None
    smallest_degraded: int | None
    point: float | None = None
    point_sd: float | None = None


class Check(_Out):
    """`LeaveOneOut` as JSON: the law without the largest scale, against that scale's bracket."""

    left_out: Bracket
    predicted: Band
    held: bool
    miss: float


class OptimizerLaw(_Out):
    """One optimizer's law from a study's sweeps, against one reference: what `sweeps law` and `sweeps study`
    print and what a study's MLflow run keeps (law.json). Each part says why it is missing where it is."""

    optimizer: str
    against: str  # "self" or "baseline"
    reference: str  # the optimizer whose smallest batch size the brackets compare against
    scales: list[Bracket]  # by tokens, then model size
    tokens_exponent: float | None = None
    tokens_interval: tuple[float, float] | None = None
    params_exponent: float | None = None
    params_interval: tuple[float, float] | None = None
    sigma: float | None = None  # the scatter of B* about the law, in ln B*
    fitted_scales: int = 0  # the informative scales the law was fitted to
    no_law: str | None = None  # why no law
    target_tokens: float
    target_params: float | None = None
    predicted: Band | None = None  # B* at the target
    no_prediction: str | None = None
    check: Check | None = None
    no_check: str | None = None
    lr: Band | None = None  # the lr law's lr at the predicted B* and the target
    no_lr: str | None = None
    # the law at each scale's token budget and the target's (at the target's model size), by tokens: its line
    # and band (a prediction interval costs a profile fit, ~0.3 s: a few points, not a dense curve)
    line: list[LawPoint] = []


class Confirmation(_Out):
    """One law's prediction against the confirmation sweep at the target (`confirm_laws`): that sweep's bracket
    of B* from the sizes it tested around the prediction, whether it holds the predicted B* (None: an open end
    leaves it undecided) and by what factor it misses; the lr law's lr at the predicted B* beside the best lr
    the sweep found at the tested size nearest it."""

    optimizer: str
    against: str
    predicted: Band
    tested: list[int]  # the batch sizes the confirmation sweep trained, the reference's first
    bracket: Bracket  # at the target's tokens (and model size)
    held: bool | None
    miss: float
    lr_predicted: float | None = None
    lr_found: float | None = None  # at `lr_at`, the tested size nearest the predicted B* (in log)
    lr_at: int | None = None
    says: str  # the outcome in words


def _bracket(s: Scale) -> Bracket:
    return Bracket(**dataclasses.asdict(s))  # the same fields


def _band(p: Prediction) -> Band:
    return Band(value=p.batch_size, low=p.low, high=p.high)


def _point(tokens: float, p: Prediction) -> LawPoint:
    return LawPoint(tokens=tokens, value=p.batch_size, low=p.low, high=p.high)


def study_laws(
    loaded: Sequence[tuple[Report, float | None]], target_tokens: float, target_params: float | None, against: str
) -> list[OptimizerLaw]:
    """Per optimizer every report has, against `against`: the scales' brackets, the batch law, its prediction
    at the target, the leave-largest-out check and the lr law's lr there. `loaded`: (report, model size or
    None: one model size in the study)."""
    names = [n for n in loaded[0][0].optimizers if all(n in r.optimizers for r, _ in loaded)]
    out = []
    for name in names:
        scales = [scale_of(r, name, against, params) for r, params in loaded]
        part: dict[str, object] = {
            "optimizer": name,
            "against": against,
            "reference": name if against == "self" else loaded[0][0].baseline,
            "scales": [_bracket(s) for s in sorted(scales, key=lambda s: (s.tokens, s.params or 0))],
            "target_tokens": target_tokens,
            "target_params": target_params,
        }
        fitted = fit_batch_law(scales)
        if not isinstance(fitted, BatchLaw):
            out.append(OptimizerLaw.model_validate(part | {"no_law": fitted}))
            continue
        part |= {
            "tokens_exponent": fitted.tokens_exponent,
            "tokens_interval": fitted.tokens_interval,
            "params_exponent": fitted.params_exponent,
            "params_interval": fitted.params_interval,
            "sigma": fitted.sigma,
            "fitted_scales": fitted.scales,
        }
        check = leave_largest_out(scales)
        if isinstance(check, LeaveOneOut):
            part["check"] = Check(
                left_out=_bracket(check.left_out), predicted=_band(check.prediction), held=check.held, miss=check.miss
            )
        else:
            part["no_check"] = check
        if fitted.params_exponent is not None and target_params is None:
            part["no_prediction"] = "the law has a model-size exponent: give the target's model size"
            out.append(OptimizerLaw.model_validate(part))
            continue
        pred = fitted.predict(target_tokens, target_params)
        part["predicted"] = _band(pred)
        part["line"] = [
            _point(t, pred if t == target_tokens else fitted.predict(t, target_params))
            for t in sorted({s.tokens for s in scales if s.informative} | {target_tokens})
        ]
        lr_law = fit_lr_law([p for r, params in loaded for p in lr_points_of(r, name, params)])
        if isinstance(lr_law, LrLaw):
            at = target_params if len(lr_law.coef) == 4 else None
            part["lr"] = _band(lr_law.predict(pred.batch_size, target_tokens, at))
        else:
            part["no_lr"] = lr_law
        out.append(OptimizerLaw.model_validate(part))
    return out


def confirm_laws(laws: Sequence[OptimizerLaw], report: Report) -> list[Confirmation]:
    """Each law with a prediction against the confirmation sweep's `report` (at the target scale, trained at
    the reference and the sizes on each side of the predictions: `sweeps.study.confirm_spec`); laws of an
    optimizer the report lacks are left out."""
    out = []
    for law in laws:
        if law.predicted is None or law.optimizer not in report.optimizers:
            continue
        opt = report.optimizers[law.optimizer]
        bracket = getattr(opt.bracket, law.against)
        b = law.predicted.value
        held, miss = bracket_holds(bracket.largest_fine, bracket.smallest_degraded, b)
        lo, hi = bracket.largest_fine, bracket.smallest_degraded
        found = f"[{lo if lo is not None else '?'}, {hi if hi is not None else '?'})"
        if held:
            says = f"held: B* in {found} holds the predicted {b:.0f}"
        elif held is None:
            says = f"undecided: the sweep's bracket {found} neither holds nor contradicts the predicted {b:.0f}"
        else:
            side = "too large" if hi is not None and b >= hi else "too small"
            says = f"missed: B* in {found}, the predicted {b:.0f} {side} by a factor {miss:.2f}"
        cells = [c for c in opt.cells if c.best_lr is not None]
        near = min(cells, key=lambda c: abs(math.log(c.batch_size / b)), default=None)
        out.append(
            Confirmation(
                optimizer=law.optimizer,
                against=law.against,
                predicted=law.predicted,
                tested=[c.batch_size for c in opt.cells],
                bracket=Bracket(
                    tokens=float(report.trained_tokens or law.target_tokens),
                    params=law.target_params,
                    largest_fine=lo,
                    smallest_degraded=hi,
                ),
                held=held,
                miss=miss,
                lr_predicted=law.lr.value if law.lr is not None else None,
                lr_found=near.best_lr if near is not None else None,
                lr_at=near.batch_size if near is not None else None,
                says=says,
            )
        )
    return out
