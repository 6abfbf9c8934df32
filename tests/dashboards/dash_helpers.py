"""Hand-made sweeps for the dashboard tests: trial runs with chosen curves, the report built from
them by the real analysis (`sweeps.analysis.build_report`), and a writer that records such a sweep
in MLflow with the recorder's layout (tags, nesting, step = tokens) without Ray.

A hand-made cell is like a real one: search trials (role "search", seed 0) choose the lr, and
confirmation runs (role "confirm", seeds 1..`seeds`, `confirmations`) at that lr give its loss; with
`seeds=2` (the default) a cell is stable only with 2 completed confirmation runs at its best lr.
Every trial run has a run id of its own (`trial(run_id=...)` where two would share the default), and
the report names the runs by these ids, as the driver names MLflow runs."""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from spec_helpers import spec_for

from dashboards.data import SweepData, TrialRun
from sweeps import layout
from sweeps.analysis import TrialResult, build_report, validate_report
from sweeps.plan import cell_key, run_name

Curve = Sequence[tuple[int, float]]


def trial(
    optimizer: str,
    batch_size: int,
    lr: float,
    *,
    seed: int = 0,
    role: str = "search",
    status: str = "completed",
    val: Curve = (),
    train: Curve = (),
    noise: Curve = (),
    attn: Mapping[int, Curve] | None = None,
    run_id: str | None = None,
    number: int | None = None,
) -> TrialRun:
    """A trial run whose `metrics` are the last points of its curves, as MLflow reports them. Its run
    id defaults to its run name and role; `number` (the Optuna trial number) defaults to its place in
    its cell in `make_sweep`."""
    history: dict[str, tuple[tuple[int, float], ...]] = {}
    for key, curve in (("val_loss", val), ("train_loss", train), ("noise_scale", noise)):
        if curve:
            history[key] = tuple((int(s), float(v)) for s, v in curve)
    for layer, curve in (attn or {}).items():
        history[f"attn_logit_max/layer_{layer}"] = tuple((int(s), float(v)) for s, v in curve)
    metrics = {k: c[-1][1] for k, c in history.items()}
    name = run_name(optimizer, batch_size, lr, seed)
    return TrialRun(
        run_id=run_id if run_id is not None else f"{name}/{role}".replace(" ", "_"),
        run_name=name,
        optimizer=optimizer,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        role=role,
        status=status,
        metrics=metrics,
        history=history,
        number=number,
    )


def confirmations(optimizer: str, batch_size: int, lr: float, *vals: Curve, **kwargs: Any) -> list[TrialRun]:
    """The confirmation runs of a cell at `lr`: one completed run (role "confirm") per val curve, seeds
    1, 2, ... in order; `kwargs` go to every `trial` (a `status`, `noise`, `attn`, `train`)."""
    return [trial(optimizer, batch_size, lr, seed=i, role="confirm", val=v, **kwargs) for i, v in enumerate(vals, 1)]


def _numbered(trials: Sequence[TrialRun]) -> tuple[TrialRun, ...]:
    """Each trial without an Optuna number gets the next free one of its cell, in input order (one study
    per cell numbers its search trials and the confirmation runs added to it alike)."""
    taken: dict[tuple[str, int], set[int]] = {}
    for t in trials:
        if t.number is not None:
            taken.setdefault((t.optimizer, t.batch_size), set()).add(t.number)
    nxt: dict[tuple[str, int], int] = {}
    out = []
    for t in trials:
        key = (t.optimizer, t.batch_size)
        if t.number is None:
            n = nxt.get(key, 0)
            while n in taken.get(key, set()):
                n += 1
            nxt[key] = n + 1
            t = replace(t, number=n)
        out.append(t)
    return tuple(out)


def make_sweep(
    trials: Iterable[TrialRun],
    *,
    sweep_id: str = "hand",
    optimizers: Sequence[str] = ("adamw", "merit"),
    batch_sizes: Sequence[int] | Mapping[str, Any] = (4, 8),
    baseline: str = "adamw",
    tolerance: float = 0.05,
    lr_range: tuple[float, float] = (1e-4, 1e-1),
    seeds: int = 2,
    seq_len: int = 8,
    warnings: Sequence[str] = (),
    steps: dict[str, list[dict[str, Any]]] | None = None,
) -> SweepData:
    """A SweepData whose report is what the analysis makes of these trials (as the driver does): each
    TrialResult carries the trial's Optuna number and run id, so the report names these runs. The spec is
    `spec_for`'s of these numbers; `batch_sizes` a list, or a search of the batch axis ({min, max, ...}, as
    the spec gives it) with `steps` its steps."""
    trials = _numbered(tuple(trials))
    ids = [t.run_id for t in trials]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"run ids must be unique (pass trial(run_id=...)), repeated: {dup}")
    results = []
    for t in trials:
        if t.status not in ("completed", "pruned", "diverged", "failed"):
            continue  # cancelled/interrupted trials never reach the analysis
        curve = t.history.get("val_loss", ())
        val = curve[-1][1] if curve and t.status in ("completed", "pruned") else None
        tokens = curve[-1][0] if curve else 0
        results.append(
            TrialResult(
                optimizer=t.optimizer,
                batch_size=t.batch_size,
                lr=t.lr,
                seed=t.seed,
                role=t.role,  # type: ignore[arg-type]
                status=t.status,
                val_loss=val,
                tokens=tokens,  # type: ignore[arg-type]
                steps=tokens // (t.batch_size * seq_len),
                curve=tuple(curve),
                number=t.number,
                run_id=t.run_id,
            )
        )
    report = build_report(
        results,
        spec=spec_for(
            name=sweep_id,
            batch_sizes=batch_sizes,
            optimizers=optimizers,
            baseline=baseline,
            tolerance=tolerance,
            lr=lr_range,
            seeds=seeds,
            seq_len=seq_len,
        ),
        steps=steps,
    )
    return SweepData(
        sweep_id=sweep_id, report=validate_report(report), trials=trials, warnings=tuple(warnings), status="succeeded"
    )


def decay(final: float, start: float, points: Sequence[int] = (1024, 2048, 3072, 4096)) -> list[tuple[int, float]]:
    """A loss curve from `start` down to `final` at the last point (1/tokens shape)."""
    last = points[-1]
    if len(points) == 1:
        return [(last, final)]
    return [(p, final + (start - final) * (last / p - 1) / (last / points[0] - 1)) for p in points]


def rich_sweep(sweep_id: str = "rich") -> SweepData:
    """Two optimizers x four batch sizes with everything the figures must survive: a pruned trial,
    diverged trials (AdamW's largest batch has no completed run: an empty cell), B_simple only at
    B >= 8 for MERIT (accumulation) and never for AdamW, attention runaway in AdamW's diverged run.
    Each other cell: its best search trial (final loss `final` - 0.02), confirmation runs seed 1
    (`final`) and seed 2 (`final` + 0.01) at its lr, a worse search trial at 4x the lr."""
    ts: list[TrialRun] = []
    sizes = (4, 8, 16, 32)
    for opt, base, slope in (("adamw", 3.00, 0.06), ("merit", 3.02, 0.01)):
        for i, bs in enumerate(sizes):
            best_lr = 1e-3 * (bs / 4) ** (0.5 if opt == "adamw" else 0.8)
            final = base + slope * i * i
            growth = 0.002 if opt == "adamw" else 0.0002  # per token: AdamW's logits run away, MERIT's barely move
            attn = {
                layer: [(p, 2.0 + layer + growth * p * (bs / 4)) for p in (1024, 2048, 3072, 4096)]
                for layer in range(3)
            }
            noise = (
                [(p, 6.0 + 4.0 * p / 4096 + i) for p in (1024, 2048, 3072, 4096)] if opt == "merit" and bs >= 8 else []
            )
            if opt == "adamw" and bs == 32:
                # every trial of this cell diverges: no best run, no mean, the chain breaks here
                for lr in (best_lr, best_lr * 3):
                    ts.append(
                        trial(
                            opt,
                            bs,
                            lr,
                            status="diverged",
                            val=decay(4.0, 5.0, (1024, 2048)),
                            attn={layer: [(1024, 5.0 + layer), (2048, 40.0 + 10 * layer)] for layer in range(3)},
                        )
                    )
                continue
            # the search trial that chose the lr: lower than its confirmation runs (the minimum of a
            # noisy search is biased low), so a table that used it instead of them would show it
            ts.append(
                trial(
                    opt,
                    bs,
                    best_lr,
                    val=decay(final - 0.02, final + 0.95),
                    train=decay(final + 0.03, final + 1.15),
                    noise=[(s, v * 3.0) for s, v in noise],  # never drawn: not a confirmation run
                    attn=attn,
                )
            )
            # the confirmation runs at the best lr (seeds 1 and 2): the cell's samples
            ts.append(
                trial(
                    opt,
                    bs,
                    best_lr,
                    seed=1,
                    role="confirm",
                    val=decay(final, final + 1.0),
                    train=decay(final + 0.05, final + 1.2),
                    noise=noise,
                    attn=attn,
                )
            )
            ts.append(
                trial(
                    opt,
                    bs,
                    best_lr,
                    seed=2,
                    role="confirm",
                    val=decay(final + 0.01, final + 1.0),
                    train=decay(final + 0.06, final + 1.2),
                    noise=[(s, v * 1.1) for s, v in noise],
                    attn=attn,
                )
            )
            ts.append(trial(opt, bs, best_lr * 4, val=decay(final + 0.2, final + 1.3)))
            if bs == 8:
                ts.append(
                    trial(opt, bs, best_lr / 8, status="pruned", val=decay(final + 0.6, final + 1.5, (1024, 2048)))
                )
            if bs == 16:
                ts.append(trial(opt, bs, 0.05, status="diverged", val=decay(final + 0.9, final + 1.0, (1024,))))
                ts.append(trial(opt, bs, 0.08, status="failed"))
            if bs == 4:
                ts.append(trial(opt, bs, best_lr * 2, status="cancelled", val=decay(final + 0.3, final + 1.0, (1024,))))
    return make_sweep(
        ts,
        sweep_id=sweep_id,
        batch_sizes=sizes,
        lr_range=(1e-4, 1e-1),
        tolerance=0.03,
        warnings=["token_budget <exceeds> the corpus & repeats data"],
    )


# --------------------------------------------------------------------------------------------------
# Recording a hand-made sweep in MLflow (the recorder's layout, without Ray)
# --------------------------------------------------------------------------------------------------


def with_run_ids(sweep: SweepData, run_ids: Mapping[str, str]) -> SweepData:
    """`sweep` with each run id replaced by `run_ids[run id]`, in its trial runs and in the runs its
    report names (`search_best_run_id`, `confirmation_run_ids`)."""
    report: dict[str, Any] = sweep.report.model_dump(mode="json")
    for o in report["optimizers"].values():
        for c in o["cells"]:
            if c["search_best_run_id"] is not None:
                c["search_best_run_id"] = run_ids[c["search_best_run_id"]]
            c["confirmation_run_ids"] = [run_ids[i] if i is not None else None for i in c["confirmation_run_ids"]]
    trials = tuple(replace(t, run_id=run_ids[t.run_id]) for t in sweep.trials)
    return replace(sweep, report=validate_report(report), trials=trials)


def record_sweep(tracking_uri: str, sweep: SweepData, artifact_root: Path) -> tuple[str, str, SweepData]:
    """Write `sweep` as sweeps.record would: experiment, cell runs, nested trial runs with metrics at
    step = tokens, a summary run with report.json (plus the driver's "warnings"). MLflow chooses the run
    ids, so the report written names the runs by them, as the driver's does. Returns (experiment id,
    summary run id, `sweep` as recorded: with those run ids)."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp_id = client.create_experiment(
        sweep.sweep_id,
        artifact_location=(artifact_root / sweep.sweep_id).as_uri(),
        tags=layout.experiment_tags(sweep.sweep_id, sweep.sweep_id),
    )
    cells = {}
    for opt in sweep.optimizers:
        for bs in sweep.batch_sizes:
            run = client.create_run(
                exp_id,
                run_name=run_name(opt, bs),
                tags=layout.cell_tags(sweep.sweep_id, cell_key(opt, bs), opt, bs),
            )
            cells[(opt, bs)] = run.info.run_id
    now = int(time.time() * 1000)
    run_ids: dict[str, str] = {}  # hand-made run id -> MLflow's
    for t in sweep.trials:
        run = client.create_run(
            exp_id,
            run_name=t.run_name,
            tags=layout.trial_tags(
                sweep_id=sweep.sweep_id,
                parent_run_id=cells[(t.optimizer, t.batch_size)],
                role=t.role,
                cell=cell_key(t.optimizer, t.batch_size),
                optimizer=t.optimizer,
                batch_size=t.batch_size,
                lr=t.lr,
                seed=t.seed,
                status=t.status,
                optuna_number=t.number,
            ),  # fmt: skip
        )
        run_ids[t.run_id] = run.info.run_id
        metrics = [Metric(k, v, now, s) for k, curve in t.history.items() for s, v in curve if math.isfinite(v)]
        for i in range(0, len(metrics), 500):
            client.log_batch(run.info.run_id, metrics=metrics[i : i + 500])
        client.set_terminated(run.info.run_id, layout.MLFLOW_STATUS.get(t.status, "FINISHED"))
    recorded = with_run_ids(sweep, run_ids)
    summary = client.create_run(
        exp_id,
        run_name=layout.SUMMARY_RUN_NAME,
        tags=layout.summary_tags(sweep.sweep_id) | {layout.Tag.status: "succeeded"},
    )
    report: dict[str, Any] = recorded.report.model_dump(mode="json")
    report["warnings"] = list(recorded.warnings)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / layout.REPORT_FILE).write_text(json.dumps(report, indent=2))
        client.log_artifacts(summary.info.run_id, d)
    client.set_terminated(summary.info.run_id, "FINISHED")
    return exp_id, summary.info.run_id, recorded
