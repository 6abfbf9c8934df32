"""What a sweep recorded, read back from MLflow, and the tidy tables behind each figure.

`load_sweep` is the only function here that talks to MLflow. Everything else is pure: a
`SweepData` in, frozen dataclass rows out, so the tables are unit-tested on hand-made sweeps and the
figures (`dashboards.figures`) only draw what these tables hold.

Layout read (written by `sweeps.record`): the experiment named by the sweep id holds cell runs
(tag batchsweep.role=cell), trial runs nested under them (role search|confirm|warmup, tags optimizer,
batch_size, lr, seed, status, optuna_number; metrics logged with step = tokens seen) and one summary
run (role=summary) whose artifact report.json is the sweep's answer (`sweeps.analysis.Report`,
schema version 2).

The rules of the tables (which runs each figure draws, and why): docs/researchers.md, "What each
figure draws".
"""

from __future__ import annotations

import json
import logging
import math
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import scipy.stats

from sweeps import layout
from sweeps.analysis import CellReport, Report, read_report
from sweeps.layout import TRIAL_ROLES, Role, Tag
from sweeps.report import self_reference
from sweeps.status import RESULT_STATUSES, TrialStatus

log = logging.getLogger(__name__)

__all__ = [
    "AnswerMark",
    "AttentionPoint",
    "AttentionTable",
    "BestLrPoint",
    "BestLrTable",
    "CriticalBatch",
    "CurvePoint",
    "LrPoint",
    "NoisePoint",
    "NoiseTable",
    "PerfectScaling",
    "PowerLaw",
    "PowerLawFit",
    "ScalingPoint",
    "ScalingRule",
    "ScalingTable",
    "StepsPoint",
    "StepsTable",
    "SweepData",
    "SweepDataError",
    "ToleranceBand",
    "TrialRun",
    "attention_curves",
    "best_lr_fit",
    "best_runs",
    "fit_power_law",
    "load_sweep",
    "loss_curves",
    "lr_points",
    "noise_scale",
    "sample_runs",
    "scaling_points",
    "steps_to_target",
]

# statuses a finished trial can have in the tables; cancelled/interrupted/running are left out (re-run on resume)
SHOWN_STATUSES = RESULT_STATUSES  # sweeps/status.py: what a finished trial can end as
ATTN_PREFIX = "attn_logit_max/layer_"
_LAYER = re.compile(r"^attn_logit_max/layer_(\d+)$")
# metric histories the figures draw (per-layer attention keys are added per run)
CURVE_METRICS = ("val_loss", "train_loss", "noise_scale")

Curve = tuple[tuple[int, float], ...]  # ((tokens seen, value), ...) ascending in tokens


class SweepDataError(LookupError):
    """The sweep cannot be read: no such experiment, no summary run or no report.json (not finished)."""


# --------------------------------------------------------------------------------------------------
# What was recorded
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRun:
    """One trial run. `metrics` holds each metric's last value (at the largest tokens); `history`
    holds full curves ((tokens, value), ...) for the runs the figures draw (see `load_sweep`)."""

    run_id: str
    run_name: str
    optimizer: str
    batch_size: int
    lr: float
    seed: int
    role: str  # search | confirm | warmup (sweeps.layout.Role)
    status: str  # completed | pruned | diverged | failed | cancelled | interrupted | running
    metrics: Mapping[str, float] = field(default_factory=dict)
    history: Mapping[str, Curve] = field(default_factory=dict)
    number: int | None = None  # Optuna trial number in its cell's study (tag optuna_number); None: not recorded

    @property
    def final_val_loss(self) -> float | None:
        """The final val loss: only a completed trial has one."""
        v = self.metrics.get("val_loss")
        if self.status != "completed" or v is None or not math.isfinite(v):
            return None
        return float(v)

    @property
    def last_tokens(self) -> int:
        """Tokens seen at the last recorded point of any loaded curve (0 without curves)."""
        return max((c[-1][0] for c in self.history.values() if c), default=0)

    def layers(self) -> list[int]:
        """Indices of the layers whose max attention logit has a curve, ascending."""
        return sorted(int(m.group(1)) for k in self.history if (m := _LAYER.match(k)) and self.history[k])


@dataclass(frozen=True)
class SweepData:
    """A recorded sweep: its report (the answer) and its trial runs. Build by hand in tests."""

    sweep_id: str
    report: Report
    trials: tuple[TrialRun, ...] = ()
    warnings: tuple[str, ...] = ()
    status: str | None = None  # the summary run's batchsweep.status: succeeded | cancelled
    experiment_id: str | None = None
    summary_run_id: str | None = None
    tracking_uri: str | None = None

    @property
    def optimizers(self) -> list[str]:
        """In the spec's order (the report keeps it)."""
        return list(self.report.optimizers)

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({c.batch_size for o in self.report.optimizers.values() for c in o.cells})

    @property
    def tolerance(self) -> float:
        return self.report.tolerance

    def cell(self, optimizer: str, batch_size: int) -> CellReport | None:
        for c in self.report.optimizers[optimizer].cells:
            if c.batch_size == batch_size:
                return c
        return None

    def trials_of(self, optimizer: str, batch_size: int) -> list[TrialRun]:
        return [t for t in self.trials if t.optimizer == optimizer and t.batch_size == batch_size]

    def runs_by_id(self) -> dict[str, TrialRun]:
        """MLflow run id -> trial run: how the runs the report names are found."""
        return {t.run_id: t for t in self.trials}


# --------------------------------------------------------------------------------------------------
# Reading MLflow
# --------------------------------------------------------------------------------------------------


def load_sweep(tracking_uri: str, sweep_id: str, *, client: Any = None) -> SweepData:
    """Read a finished (or cancelled) sweep from MLflow; read-only.

    Metric histories are fetched only for the runs the figures draw: the runs the report names for
    each cell (its best search trial and its completed confirmation runs) and every trial at each
    optimizer's largest batch size (the attention figure's candidates). Raises `SweepDataError`
    without an experiment, summary run or report.json (a sweep that has not finished has no answer
    to draw yet).
    """
    from mlflow.tracking import MlflowClient  # here: the pure tables must not need MLflow

    client = client or MlflowClient(tracking_uri)
    exp = layout.find_experiment(client, sweep_id)
    if exp is None:
        raise SweepDataError(f"no MLflow experiment named {sweep_id!r} at {tracking_uri}")
    runs = layout.runs_of(client, exp.experiment_id)
    summaries = [r for r in runs if r.data.tags.get(Tag.role) == Role.summary]
    if not summaries:
        raise SweepDataError(f"sweep {sweep_id!r} has no summary run yet (figures need a finished sweep)")
    summary = summaries[0]
    report, warnings = _read_report(client, summary.info.run_id, sweep_id)

    trials = tuple(t for r in runs if (t := _trial_of(r)) is not None)
    sweep = SweepData(
        sweep_id=sweep_id,
        report=report,
        trials=trials,
        warnings=tuple(warnings),
        status=summary.data.tags.get(Tag.status),
        experiment_id=exp.experiment_id,
        summary_run_id=summary.info.run_id,
        tracking_uri=tracking_uri,
    )
    wanted = _runs_needing_history(sweep)
    by_id = {r.info.run_id: r for r in runs}
    loaded = []
    for t in trials:
        if t.run_id not in wanted:
            loaded.append(t)
            continue
        keys = [k for k in by_id[t.run_id].data.metrics if k in CURVE_METRICS or _LAYER.match(k)]
        history = {k: _history(client, t.run_id, k) for k in keys}
        loaded.append(replace(t, history=history))
    log.info("loaded sweep %s: %d trial runs, %d curves", sweep_id, len(trials), len(wanted))
    return replace(sweep, trials=tuple(loaded))


def _read_report(client: Any, run_id: str, sweep_id: str) -> tuple[Report, list[str]]:
    with tempfile.TemporaryDirectory() as d:
        try:
            path = client.download_artifacts(run_id, layout.REPORT_FILE, d)
        except Exception as e:  # MLflow raises several types for a missing artifact
            raise SweepDataError(f"sweep {sweep_id!r}: the summary run has no report.json ({e})") from e
        raw = json.loads(Path(path).read_text())
    warnings = [str(w) for w in raw.pop("warnings", []) or []]
    extra = sorted(set(raw) - set(Report.model_fields))
    if extra:
        log.debug("report.json keys outside the schema, ignored: %s", extra)
    return read_report(raw), warnings


def _trial_of(run: Any) -> TrialRun | None:
    tags = run.data.tags
    role = layout.role_of(tags.get(Tag.role))
    if role not in TRIAL_ROLES:
        return None
    try:
        return TrialRun(
            run_id=run.info.run_id,
            run_name=run.info.run_name or run.info.run_id,
            optimizer=tags[Tag.optimizer],
            batch_size=int(tags[Tag.batch_size]),
            lr=float(tags[Tag.lr]),
            seed=int(tags.get(Tag.seed, "0")),
            role=str(role),
            status=tags.get(Tag.status, TrialStatus.running),
            metrics={k: float(v) for k, v in run.data.metrics.items()},
            number=_int_or_none(tags.get(Tag.optuna_number)),
        )
    except (KeyError, ValueError) as e:  # a run not written by the recorder: skip it, loudly
        log.warning("run %s lacks the trial tags (%s): left out", run.info.run_id, e)
        return None


def _int_or_none(tag: str | None) -> int | None:
    # the recorder tags confirmation runs "None": their Optuna trial is added to the study when they end
    try:
        return int(tag) if tag is not None else None
    except ValueError:
        return None


def _history(client: Any, run_id: str, key: str) -> Curve:
    logged = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    # one value per step (a metric logged twice at one step keeps the later one); NaN/inf never drawn
    dedup = {int(m.step): float(m.value) for m in logged}
    return tuple((s, v) for s, v in sorted(dedup.items()) if math.isfinite(v))


def _runs_needing_history(sweep: SweepData) -> set[str]:
    ids = {t.run_id for runs in sample_runs(sweep).values() for t in runs}
    ids |= {t.run_id for t in best_runs(sweep).values()}
    for opt in sweep.optimizers:
        sizes = sorted({t.batch_size for t in sweep.trials if t.optimizer == opt})
        if sizes:
            ids |= {t.run_id for t in sweep.trials_of(opt, sizes[-1]) if t.status in SHOWN_STATUSES}
    return ids


# --------------------------------------------------------------------------------------------------
# The runs the report names
# --------------------------------------------------------------------------------------------------


def _named_run(
    by_id: Mapping[str, TrialRun], run_id: str | None, optimizer: str, batch_size: int, what: str
) -> TrialRun | None:
    """The trial run with this MLflow run id, if it is one of this cell's; None (logged) otherwise."""
    if run_id is None:
        log.warning("%s bs=%d: the report has no run id for its %s", optimizer, batch_size, what)
        return None
    run = by_id.get(run_id)
    if run is None:
        log.warning("%s bs=%d: the report's %s %s is not among the recorded runs", optimizer, batch_size, what, run_id)
        return None
    if (run.optimizer, run.batch_size) != (optimizer, batch_size):
        log.warning(
            "%s bs=%d: the report's %s %s is a run of %s bs=%d: left out",
            optimizer,
            batch_size,
            what,
            run_id,
            run.optimizer,
            run.batch_size,
        )
        return None
    return run


def best_runs(sweep: SweepData) -> dict[tuple[str, int], TrialRun]:
    """(optimizer, batch size) -> the run named by the cell's `search_best_run_id` (rules: docs/researchers.md:
    looked up by run id, never re-selected). Cells without a best lr, or whose named run is missing, are
    absent (the latter logged)."""
    by_id = sweep.runs_by_id()
    out: dict[tuple[str, int], TrialRun] = {}
    for opt in sweep.optimizers:
        for cell in sweep.report.optimizers[opt].cells:
            if cell.best_lr is None:
                continue  # no completed search trial: the report names no best run, rightly
            run = _named_run(by_id, cell.search_best_run_id, opt, cell.batch_size, "best search trial")
            if run is not None:
                out[(opt, cell.batch_size)] = run
    return out


def sample_runs(sweep: SweepData) -> dict[tuple[str, int], list[TrialRun]]:
    """(optimizer, batch size) -> the completed runs named by the cell's `confirmation_run_ids`, in the
    report's order (by seed): the runs whose final val losses are its `val_losses`. Cells without a
    completed one are absent; a named run that is missing, or a count that differs from the report's
    `seeds`, is logged."""
    by_id = sweep.runs_by_id()
    out: dict[tuple[str, int], list[TrialRun]] = {}
    for opt in sweep.optimizers:
        for cell in sweep.report.optimizers[opt].cells:
            named = (_named_run(by_id, i, opt, cell.batch_size, "confirmation run") for i in cell.confirmation_run_ids)
            # diverged or failed confirmation runs are named too (they make the cell unstable): not samples
            runs = [r for r in named if r is not None and r.final_val_loss is not None]
            if len(runs) != cell.seeds:
                log.warning(
                    "%s bs=%d: %d completed confirmation run(s) found, the report has %d samples",
                    opt,
                    cell.batch_size,
                    len(runs),
                    cell.seeds,
                )
            if runs:
                out[(opt, cell.batch_size)] = runs
    return out


# --------------------------------------------------------------------------------------------------
# 1. Scaling: final val loss vs batch size
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalingPoint:
    """One cell: the report's mean and 95% CI over seeds (None: no completed trial)."""

    optimizer: str
    batch_size: int
    val_loss_mean: float | None
    ci_low: float | None
    ci_high: float | None
    ci_available: bool  # False with one seed: the bar is [mean, mean]
    seeds: int
    degradation_free_self: bool | None
    degradation_free_baseline: bool | None


@dataclass(frozen=True)
class ToleranceBand:
    """[reference, (1 + tol) x reference]: cells whose fitted mean (the means fitted non-decreasing in batch
    size, the report's `val_loss_fitted`) lies at or below `upper` are degradation-free; the reference is
    the reference cell's fitted value (never above its mean: `sweeps.analysis`).
    One per optimizer (its own loss at the reference batch size); the baseline's band is the
    reference of every optimizer's "baseline" verdict."""

    optimizer: str
    reference_batch_size: int
    reference: float
    upper: float
    is_baseline: bool


@dataclass(frozen=True)
class AnswerMark:
    """The largest degradation-free batch size of an optimizer against one reference (report)."""

    optimizer: str
    reference: Literal["self", "baseline"]
    batch_size: int | None  # None: even the smallest batch size fails, or no reference
    val_loss_mean: float | None  # the cell's mean at that batch size (where the marker sits)
    within_noise: bool | None


@dataclass(frozen=True)
class ScalingTable:
    points: tuple[ScalingPoint, ...]
    bands: tuple[ToleranceBand, ...]
    marks: tuple[AnswerMark, ...]
    tolerance: float
    baseline: str


def scaling_points(sweep: SweepData) -> ScalingTable:
    """Figure 1's data, straight from the report: every cell (also those without a mean), the
    tolerance band of each optimizer's self reference, and each optimizer's answer vs self and baseline."""
    r = sweep.report
    points, bands, marks = [], [], []
    for opt, o in r.optimizers.items():
        for c in o.cells:
            points.append(
                ScalingPoint(
                    optimizer=opt,
                    batch_size=c.batch_size,
                    val_loss_mean=c.val_loss_mean,
                    ci_low=c.val_loss_ci95[0],
                    ci_high=c.val_loss_ci95[1],
                    ci_available=c.ci_available,
                    seeds=c.seeds,
                    degradation_free_self=c.degradation_free.self,
                    degradation_free_baseline=c.degradation_free.baseline,
                )
            )
        ref, upper = self_reference(o, r.reference_batch_size), o.target_loss
        if ref is not None and upper is not None:
            bands.append(ToleranceBand(opt, r.reference_batch_size, ref, upper, opt == r.baseline))
        for which in ("self", "baseline"):
            bs = getattr(o.largest_degradation_free_batch_size, which)
            cell = next((c for c in o.cells if c.batch_size == bs), None) if bs is not None else None
            marks.append(
                AnswerMark(
                    optimizer=opt,
                    reference=which,
                    batch_size=bs,  # type: ignore[arg-type]
                    val_loss_mean=cell.val_loss_mean if cell else None,
                    within_noise=getattr(o.within_noise, which),
                )
            )
    return ScalingTable(tuple(points), tuple(bands), tuple(marks), r.tolerance, r.baseline)


# --------------------------------------------------------------------------------------------------
# 2. LR sensitivity
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LrPoint:
    """One trial. `val_loss`: the final val loss (completed), the loss when stopped (pruned), or None
    (diverged, failed). `is_best`: the cell's best run (the report's `search_best_run_id`)."""

    optimizer: str
    batch_size: int
    lr: float
    seed: int
    role: str
    status: str
    val_loss: float | None
    is_best: bool
    run_name: str


@dataclass(frozen=True)
class LrTable:
    points: tuple[LrPoint, ...]
    lr_range: tuple[float, float]

    def count(self, optimizer: str, status: str) -> int:
        return sum(1 for p in self.points if p.optimizer == optimizer and p.status == status)


def lr_points(sweep: SweepData) -> LrTable:
    """Figure 2's data: every shown trial (rules: docs/researchers.md), ordered by optimizer, batch size, lr, seed;
    the report's best search trial of each cell marked (`is_best`, by run id)."""
    best_ids = {t.run_id for t in best_runs(sweep).values()}
    order = {o: i for i, o in enumerate(sweep.optimizers)}
    pts = []
    for t in sweep.trials:
        if t.status not in SHOWN_STATUSES or t.optimizer not in order:
            continue
        if t.status == "completed":
            loss = t.final_val_loss
        elif t.status == "pruned":
            v = t.metrics.get("val_loss")
            loss = float(v) if v is not None and math.isfinite(v) else None
        else:
            loss = None
        pts.append(
            LrPoint(t.optimizer, t.batch_size, t.lr, t.seed, t.role, t.status, loss, t.run_id in best_ids, t.run_name)
        )
    pts.sort(key=lambda p: (order[p.optimizer], p.batch_size, p.lr, p.seed, p.role))
    lo, hi = sweep.report.lr_range
    return LrTable(tuple(pts), (lo, hi))


# --------------------------------------------------------------------------------------------------
# 3. Best lr vs batch size, with a power law
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerLaw:
    """y = prefactor x x^exponent, fitted by least squares on (ln x, ln y). `r2` is the coefficient
    of determination in log space (1.0 for two points or an exact law; None when every y is equal)."""

    exponent: float
    prefactor: float
    r2: float | None
    n: int

    def __call__(self, x: float) -> float:
        return self.prefactor * x**self.exponent


def fit_power_law(points: Iterable[tuple[float, float]]) -> PowerLaw | None:
    """Least-squares fit of ln y = ln a + k ln x. None with fewer than two distinct x (no slope);
    points with x <= 0 or y <= 0 (no logarithm) are refused (ValueError)."""
    pts = [(float(x), float(y)) for x, y in points]
    bad = [(x, y) for x, y in pts if not (x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y))]
    if bad:
        raise ValueError(f"a power law needs finite x > 0 and y > 0, got {bad}")
    if len({x for x, _ in pts}) < 2:
        return None
    # scipy's least squares on the logs (slope, intercept, r); r is nan when every y is equal
    fit = scipy.stats.linregress([math.log(x) for x, _ in pts], [math.log(y) for _, y in pts])
    k, ln_a = float(fit.slope), float(fit.intercept)
    r2 = float(fit.rvalue) ** 2 if math.isfinite(fit.rvalue) and len({y for _, y in pts}) > 1 else None
    n = len(pts)
    return PowerLaw(exponent=k, prefactor=math.exp(ln_a), r2=r2, n=n)


@dataclass(frozen=True)
class BestLrPoint:
    optimizer: str
    batch_size: int
    best_lr: float
    lr_at_edge: bool | None  # the optimum may lie outside the searched range: drawn hollow


@dataclass(frozen=True)
class PowerLawFit:
    optimizer: str
    law: PowerLaw


@dataclass(frozen=True)
class ScalingRule:
    """A reference rule lr(B) = anchor_lr x (B / anchor_batch)^exponent, anchored at the optimizer's
    smallest batch size with a best lr: "sqrt" (exponent 1/2, Adam-type) and "linear" (exponent 1, SGD)."""

    optimizer: str
    rule: Literal["sqrt", "linear"]
    exponent: float
    anchor_batch: int
    anchor_lr: float

    def __call__(self, batch_size: float) -> float:
        return self.anchor_lr * (batch_size / self.anchor_batch) ** self.exponent


@dataclass(frozen=True)
class BestLrTable:
    points: tuple[BestLrPoint, ...]
    fits: tuple[PowerLawFit, ...]  # optimizers with best lrs at >= 2 batch sizes
    rules: tuple[ScalingRule, ...]


def best_lr_fit(sweep: SweepData) -> BestLrTable:
    """Figure 3's data: the report's best lr per cell, a power law per optimizer, and the sqrt and
    linear rules from its smallest batch size. Cells at the lr edge are fitted too (flagged)."""
    points, fits, rules = [], [], []
    for opt, o in sweep.report.optimizers.items():
        mine = [BestLrPoint(opt, c.batch_size, c.best_lr, c.lr_at_edge) for c in o.cells if c.best_lr is not None]
        points.extend(mine)
        law = fit_power_law((p.batch_size, p.best_lr) for p in mine)
        if law is not None:
            fits.append(PowerLawFit(opt, law))
        if mine:
            anchor = min(mine, key=lambda p: p.batch_size)
            rules.append(ScalingRule(opt, "sqrt", 0.5, anchor.batch_size, anchor.best_lr))
            rules.append(ScalingRule(opt, "linear", 1.0, anchor.batch_size, anchor.best_lr))
    return BestLrTable(tuple(points), tuple(fits), tuple(rules))


# --------------------------------------------------------------------------------------------------
# 4. Loss vs tokens of each cell's first confirmation run
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurvePoint:
    optimizer: str
    batch_size: int
    run_name: str
    metric: str  # val_loss | train_loss
    tokens: int
    value: float


def loss_curves(sweep: SweepData, metrics: Sequence[str] = ("val_loss", "train_loss")) -> tuple[CurvePoint, ...]:
    """Figure 4's data: per cell, the curves of its first sample run (the first completed confirmation
    run, the one the report's steps_to_reference is read from; rules: docs/researchers.md), by optimizer, batch
    size, metric, tokens. Cells without a completed confirmation run draw none."""
    out: list[CurvePoint] = []
    for (opt, bs), runs in sample_runs(sweep).items():
        run = runs[0]
        for metric in metrics:
            out.extend(CurvePoint(opt, bs, run.run_name, metric, s, v) for s, v in run.history.get(metric, ()))
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# 5. Max attention logit per layer at the largest batch size
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionPoint:
    optimizer: str
    batch_size: int
    run_name: str
    status: str
    layer: int
    tokens: int
    value: float  # max pre-softmax attention logit q.k/sqrt(d) on the probe batch


@dataclass(frozen=True)
class AttentionTable:
    points: tuple[AttentionPoint, ...]
    runs: Mapping[str, tuple[int, str, str]]  # optimizer -> (batch size, run name, status) drawn
    missing: tuple[str, ...]  # optimizers without any attention probe


def attention_curves(sweep: SweepData) -> AttentionTable:
    """Figure 5's data: per optimizer, one run's per-layer max attention logit (rules: docs/researchers.md)."""
    best = best_runs(sweep)
    points: list[AttentionPoint] = []
    runs: dict[str, tuple[int, str, str]] = {}
    missing = []
    for opt in sweep.optimizers:
        chosen: TrialRun | None = None
        for bs in sorted({t.batch_size for t in sweep.trials if t.optimizer == opt}, reverse=True):
            probed = [t for t in sweep.trials_of(opt, bs) if t.status in SHOWN_STATUSES and t.layers()]
            if not probed:
                continue
            b = best.get((opt, bs))
            chosen = b if b is not None and b.layers() else min(probed, key=lambda t: (-t.last_tokens, t.lr, t.seed))
            break
        if chosen is None:
            missing.append(opt)
            continue
        runs[opt] = (chosen.batch_size, chosen.run_name, chosen.status)
        for layer in chosen.layers():
            points.extend(
                AttentionPoint(opt, chosen.batch_size, chosen.run_name, chosen.status, layer, s, v)
                for s, v in chosen.history[f"{ATTN_PREFIX}{layer}"]
            )
    return AttentionTable(tuple(points), runs, tuple(missing))


# --------------------------------------------------------------------------------------------------
# 6. Steps to target loss, and the gradient noise scale
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepsPoint:
    optimizer: str
    batch_size: int
    target_loss: float | None  # the report's target_loss: (1 + tol) x the optimizer's self reference (nats/token)
    tokens: int | None  # the report's tokens_to_reference; None: not reached, no confirmation run or no reference
    steps: int | None  # the report's steps_to_reference (optimizer steps)


@dataclass(frozen=True)
class PerfectScaling:
    """steps(B) = anchor_steps x anchor_batch / B: doubling the batch halves the steps."""

    optimizer: str
    anchor_batch: int
    anchor_steps: int

    def __call__(self, batch_size: float) -> float:
        return self.anchor_steps * self.anchor_batch / batch_size


@dataclass(frozen=True)
class StepsTable:
    points: tuple[StepsPoint, ...]
    perfect: tuple[PerfectScaling, ...]
    seq_len: int


def steps_to_target(sweep: SweepData) -> StepsTable:
    """Figure 6a's data: every cell's steps_to_reference and tokens_to_reference as the report holds
    them (never recomputed from curves), the target line, and perfect scaling (rules: docs/researchers.md)."""
    r = sweep.report
    points, perfect = [], []
    for opt, o in r.optimizers.items():
        mine = [
            StepsPoint(opt, c.batch_size, o.target_loss, c.tokens_to_reference, c.steps_to_reference) for c in o.cells
        ]
        points.extend(mine)
        reached = [p for p in mine if p.steps]  # steps 0 cannot anchor a line in log-log
        if reached:
            a = min(reached, key=lambda p: p.batch_size)
            perfect.append(PerfectScaling(opt, a.batch_size, a.steps))  # type: ignore[arg-type]
    return StepsTable(tuple(points), tuple(perfect), r.seq_len)


@dataclass(frozen=True)
class NoisePoint:
    optimizer: str
    batch_size: int
    run_name: str
    seed: int
    tokens: int
    b_simple: float  # sequences


@dataclass(frozen=True)
class CriticalBatch:
    """B_crit ~ the final B_simple (rules: docs/researchers.md): mean over `runs` sample runs at `batch_size`."""

    optimizer: str
    batch_size: int
    b_crit: float
    runs: int


@dataclass(frozen=True)
class NoiseTable:
    points: tuple[NoisePoint, ...]
    critical: tuple[CriticalBatch, ...]
    missing: tuple[str, ...]  # optimizers whose sample runs logged no B_simple


def noise_scale(sweep: SweepData) -> NoiseTable:
    """Figure 6b's data: B_simple over tokens of every sample run (the report's completed confirmation
    runs), and each optimizer's B_crit."""
    samples = sample_runs(sweep)
    points: list[NoisePoint] = []
    critical, missing = [], []
    for opt in sweep.optimizers:
        finals_by_bs: dict[int, list[float]] = {}
        for bs in sweep.batch_sizes:
            for run in samples.get((opt, bs), []):
                curve = run.history.get("noise_scale", ())
                points.extend(NoisePoint(opt, bs, run.run_name, run.seed, s, v) for s, v in curve)
                if curve:
                    finals_by_bs.setdefault(bs, []).append(curve[-1][1])
        if not finals_by_bs:
            missing.append(opt)
            continue
        bs = min(finals_by_bs)
        finals = finals_by_bs[bs]
        critical.append(CriticalBatch(opt, bs, sum(finals) / len(finals), len(finals)))
    return NoiseTable(tuple(points), tuple(critical), tuple(missing))
