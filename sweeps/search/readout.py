"""What the searcher shows of its cells, from their snapshots (`sweeps.search.state`); pure: the finished
trials as the analysis reads them (`trial_results`), the report (`report_of`), the batch search's steps
and warnings, and the live progress and curves (`progress_of`, models of `sweeps.progress`)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from sweeps.analysis import ROLES, Report, TrialResult, build_report
from sweeps.progress import CURVE_POINTS, CellProgress, DriverProgress, TrialCurve
from sweeps.search.state import CellState, Run, lr_of
from sweeps.spec import SweepSpec
from sweeps.status import TrialStatus


def trial_results(
    cells: Iterable[CellState], run_ids: dict[str, str] | None = None
) -> tuple[list[TrialResult], list[float]]:
    """Every finished trial of every cell, and each one's training time (s); `run_ids` (Tune trial id
    -> MLflow run id) names each trial's MLflow run in the report."""
    results, times = [], []
    for cell in cells:
        for role in ROLES:
            for t in cell.trials(role):
                status = TrialStatus(t.user_attrs.get("status", TrialStatus.failed))
                val = t.value if t.value is not None and math.isfinite(t.value) else None
                if status == "pruned" and t.intermediate_values:
                    val = t.intermediate_values[max(t.intermediate_values)]
                results.append(
                    TrialResult(
                        optimizer=cell.optimizer,
                        batch_size=cell.batch_size,
                        lr=lr_of(t),
                        seed=int(t.user_attrs.get("seed", 0)),
                        role=role,
                        warmup=cell.warmup_of(t),
                        status=status,
                        val_loss=val if status in ("completed", "pruned") else None,
                        tokens=int(t.user_attrs.get("tokens", 0)),
                        steps=int(t.user_attrs.get("steps", 0)),
                        curve=tuple(tuple(p) for p in json.loads(t.user_attrs.get("curve", "[]"))),
                        number=t.number,
                        run_id=(run_ids or {}).get(str(t.user_attrs.get("tune_trial_id"))),
                    )
                )
                times.append(float(t.user_attrs.get("train_time_s", 0.0)))
    return results, times


def search_steps(cells: Sequence[CellState], spec: SweepSpec) -> dict[str, list[dict[str, Any]]]:
    """Per optimizer, the batch sizes a search of the batch axis tested, in the order it chose them."""
    if spec.batch_search is None:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for c in sorted(cells, key=lambda c: c.order):
        out.setdefault(c.optimizer, []).append(
            {
                "batch_size": c.batch_size,
                "chosen": c.chosen,
                "why": c.why,
                "seeds_added": max(0, c.n_seeds - spec.seeds_min),
            }
        )
    return out


def stopped_cells(cells: Iterable[CellState]) -> dict[str, str]:
    """Cell key -> why it stopped without a result (`StudyRead.stop_reason`)."""
    return {c.key: why for c in cells if (why := c.stop_reason) is not None}


def search_warnings(cells: Iterable[CellState], done_why: dict[str, str]) -> list[str]:
    """What a reader of a search's answer must know: an optimizer's search stopped at the cap (`done_why`:
    per optimizer why its batch-axis search stopped); a cell stopped without a result (it ran out of
    memory, or its trials' processes kept dying)."""
    capped = [f"{opt}: the batch search {why}" for opt, why in done_why.items() if "cap" in why]
    return capped + [f"{key}: stopped with no result: {why}" for key, why in stopped_cells(cells).items()]


def report_of(
    cells: Sequence[CellState], spec: SweepSpec, done_why: dict[str, str], run_ids: dict[str, str] | None = None
) -> Report:
    """The report of what has finished so far (`build_report`, with the batch search's steps and warnings)."""
    results, _ = trial_results(cells, run_ids)
    report = build_report(results, spec=spec, steps=search_steps(cells, spec))
    report.warnings = [*report.warnings, *search_warnings(cells, done_why)]
    return report


def progress_of(cells: Sequence[CellState], running: Iterable[tuple[str, Run, list[Any]]]) -> DriverProgress:
    """The sweep's live progress: per cell its trials done and planned, its best lr and losses so far;
    and the curves (`running`: (cell key, run, curve so far) of each running trial, in the order started)."""
    rows = [_progress_row(c) for c in cells]
    # confirmation runs at an lr the cell retreated from count as done and as planned
    retired = sum(len(cell.trials("confirm")) - row.seeds_done for cell, row in zip(cells, rows, strict=True))
    return DriverProgress(
        cells_done=sum(row.finished for row in rows),
        cells_total=len(rows),
        trials_done=sum(row.search_done + row.seeds_done for row in rows) + retired,
        # at most spec.total_trials: adaptive confirmation may add runs at boundary cells
        trials_total=sum((row.search_total or 0) + (row.seeds_total or 0) for row in rows) + retired,
        cells=rows,
        curves=_curves(cells, running),
    )


def _progress_row(c: CellState) -> CellProgress:
    best, warmed = c.best, len(c.trials("warmup"))
    return CellProgress(
        cell=c.key,
        optimizer=c.optimizer,
        batch_size=c.batch_size,
        search_done=c.search_finished + warmed,
        # at most n_search: a search that converged early ends with what it ran; then one run per other warm-up
        search_total=(c.search_finished if c.search_done else c.n_search) + max(warmed, len(c.warmups) - 1),
        seeds_done=len(c.seeds_recorded(lr_of(best), c.best_warmup)) if best else 0,
        seeds_total=c.n_seeds,
        best_lr=lr_of(best) if best else None,
        search_best_val_loss=float(best.value) if best else None,  # type: ignore[arg-type]
        confirmed_val_loss_mean=statistics.fmean(c.confirmed) if c.confirmed else None,
        finished=c.finished,
        stopped=c.stop_reason,
        running=len(c.running),
        chosen=c.chosen,
        why=c.why,
    )


def _curves(cells: Iterable[CellState], running: Iterable[tuple[str, Run, list[Any]]]) -> list[TrialCurve]:
    """Val loss against tokens of every trial so far, finished (from the storage) and running (as
    reported), for the sweep's live page; each curve cut to CURVE_POINTS points, evenly by index."""
    out: list[TrialCurve] = []
    for c in cells:
        best = c.best
        for role in ROLES:
            for t in c.trials(role):
                out.append(
                    TrialCurve(
                        cell=c.key,
                        lr=lr_of(t),
                        seed=int(t.user_attrs.get("seed", 0)),
                        role=role,
                        warmup=c.warmup_of(t),
                        status=str(t.user_attrs.get("status", "failed")),
                        best=best is not None and role == "search" and t.number == best.number,
                        points=_thin(json.loads(t.user_attrs.get("curve", "[]"))),
                    )
                )
    for key, run, curve in running:
        out.append(
            TrialCurve(
                cell=key,
                lr=run.lr,
                seed=run.seed,
                role=run.role,
                warmup=run.warmup,
                status="running",
                best=False,
                points=_thin([list(p) for p in curve]),
            )
        )
    return out


def _thin(points: list[list[float]]) -> list[list[float]]:
    """At most CURVE_POINTS of a curve, evenly by index, keeping the first and the last."""
    if len(points) <= CURVE_POINTS:
        return points
    step = (len(points) - 1) / (CURVE_POINTS - 1)
    return [points[round(i * step)] for i in range(CURVE_POINTS)]
