"""What the service tells about sweeps: the domain models its routes answer and its pages render.

`service.manager` and `service.views` build them from the stored row (`service.store.database.SweepRow`);
the JSON API (`service.api`) answers them as they are and the browser pages render them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.store.database import SweepRow
from service.verdicts import ClusterFit, GpuHoursCaps
from sweeps.cost import FloatRange, SweepCost
from sweeps.plan import cell_key
from sweeps.spec import cell_search_trials, total_trials
from sweeps.status import SweepStatus
from sweeps.study import SweepPrice

Status = SweepStatus


class _Out(BaseModel):
    # The driver's progress may grow fields; the API names the ones it promises and drops the rest.
    model_config = ConfigDict(extra="ignore")


class CellProgress(_Out):
    cell: str
    optimizer: str | None = None
    batch_size: int | None = None
    search_done: int = 0
    search_total: int | None = None
    seeds_done: int = Field(default=0, description="confirmation runs finished at the best lr")
    seeds_total: int | None = Field(default=None, description="confirmation runs planned")
    best_lr: float | None = Field(default=None, description="the lr of the best search trial so far")
    search_best_val_loss: float | None = Field(
        default=None,
        description="the best search trial's own val loss: the minimum of noisy trials, biased low; it only picks the lr",
    )
    confirmed_val_loss_mean: float | None = Field(
        default=None,
        description="mean val loss of the confirmation runs finished so far: what the report's cell mean will be",
    )
    finished: bool = False
    running: int = 0
    chosen: str | None = Field(
        default=None,
        description="why the batch size is tested: listed, or a search's reference, step up, bisect, speculative",
    )
    why: str | None = Field(default=None, description="a search of the batch axis: its decision in words")


class Progress(_Out):
    cells_done: int = 0
    cells_total: int = 0
    trials_done: int = 0
    trials_total: int = 0
    cells: list[CellProgress] = Field(default_factory=list)

    @classmethod
    def initial(cls, spec: dict[str, Any]) -> Progress:
        """Before the driver reports: every cell at zero, totals from the spec."""
        optimizers = [o["name"] for o in spec.get("optimizers", [])]
        given = spec.get("batch_sizes", [])
        # a search of the batch axis starts with its reference cells; it adds the rest as it decides
        batch_sizes = [given["min"]] if isinstance(given, dict) else list(given)
        lr = spec.get("lr", {})
        seeds_spec = spec.get("seeds", 2)  # a number, or adaptive {min, max, step}: the minimum is planned
        # the lr search's trials and one per other warm-up to try (sweeps.spec.SweepSpec.search_trials)
        search = int(lr.get("trials_per_batch_size", 0)) + len(spec.get("schedule", {}).get("warmup_search", []))
        seeds = int(seeds_spec["min"] if isinstance(seeds_spec, dict) else seeds_spec)
        cells = [
            CellProgress(
                cell=cell_key(o, b),
                optimizer=o,
                batch_size=b,
                search_total=cell_search_trials(search, reference=b == min(batch_sizes)),
                seeds_total=seeds,
            )
            for o in optimizers
            for b in batch_sizes
        ]
        return cls(
            cells_total=len(cells),
            trials_total=total_trials(len(optimizers), len(batch_sizes), search, seeds),
            cells=cells,
        )


class TrialCurve(_Out):
    cell: str
    lr: float
    seed: int = Field(description="0: a search trial; 1, 2, ...: confirmation runs")
    role: str = Field(description="search, seed or warmup (another warm-up at the best lr)")
    status: str = Field(description="running, completed, pruned, diverged, failed, ...")
    best: bool = Field(
        default=False, description="the cell's best search trial so far (its lr gets the confirmation runs)"
    )
    points: list[tuple[int, float]] = Field(
        description="(tokens, val loss) at each evaluation, at most 40, evenly spread"
    )


class SweepCurves(_Out):
    id: str
    status: Status
    revision: int
    trials: list[TrialCurve]


class SweepSummary(_Out):
    id: str
    name: str
    status: Status
    progress: Progress
    cancel_requested: bool = Field(description="a cancel was asked for; the status turns final when the driver stops")
    error: str | None = None
    experiment_id: str | None = Field(default=None, description="the MLflow experiment of the sweep's runs")
    mlflow_url: str | None = Field(default=None, description="link to the experiment in the MLflow UI, when configured")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    revision: int = Field(description="increases on every change of the sweep")
    driver_starts: int = Field(
        default=0, description="driver actors started; above 1, a lost driver was relaunched and resumed the sweep"
    )

    @classmethod
    def from_row(cls, row: SweepRow, mlflow_url: str | None) -> SweepSummary:
        return cls.model_validate(_fields(row, mlflow_url))


class SweepDetail(SweepSummary):
    spec: dict[str, Any] = Field(description="the spec as validated (defaults filled in)")

    @classmethod
    def from_row(cls, row: SweepRow, mlflow_url: str | None) -> SweepDetail:
        return cls.model_validate(_fields(row, mlflow_url) | {"spec": row.spec})


ERROR_CHARS = 500  # of a sweep's error, as clients see it


def public_error(error: str | None) -> str | None:
    """What a client sees of a sweep's error: its first line (`Type: message`), cut. The rest (the
    driver's traceback, naming the cluster's files) stays in the store and the logs."""
    if not error:
        return error
    first = error.strip().splitlines()[0] if error.strip() else error
    return first if len(first) <= ERROR_CHARS else first[:ERROR_CHARS] + "..."


def _fields(row: SweepRow, mlflow_url: str | None) -> dict[str, Any]:
    progress = Progress.model_validate(row.progress) if row.progress else Progress.initial(row.spec)
    return {
        "id": row.id,
        "name": row.name,
        "status": row.status,
        "progress": progress,
        "cancel_requested": row.cancel_requested,
        "error": public_error(row.error),
        "experiment_id": row.experiment_id,
        "mlflow_url": mlflow_url,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "revision": row.revision,
        "driver_starts": row.driver_starts,
    }


class SweepPage(_Out):
    items: list[SweepSummary]
    total: int = Field(description="sweeps matching the filter, over all pages")
    limit: int
    offset: int


class StudyDryRunResult(_Out):
    valid: Literal[True] = True
    study: dict[str, Any] = Field(description="the study as given, validated (sweeps/study.py)")
    sweeps: list[SweepPrice] = Field(description="each scale's sweep, in the order the study runs them")
    gpu_hours: FloatRange = Field(description="the scales' sweeps together, on the GPU and MFU asked for")
    target: SweepPrice = Field(description="the sweep at the target scale, which the study replaces")
    ratio: FloatRange = Field(description="the study's GPU-hours against the target sweep's, min to min, max to max")
    caps: GpuHoursCaps | None = Field(
        default=None,
        description="whether its sweeps would pass the GPU-hours caps: each against the cap per sweep, all of them "
        "together against the cap per owner",
    )


class StudyScaleState(_Out):
    scale: int = Field(description="1: the smallest; the study runs them in this order, one at a time")
    sweep_id: str = Field(description="the scale's sweep (GET /sweeps/{id}), once created")
    model: str = Field(description="the model preset, or custom")
    trained_tokens: int = Field(description="tokens every trial of this scale's sweep trains on")
    status: Status | Literal["pending"] = Field(description="the sweep's status; pending: not created yet")


class StudySummary(_Out):
    id: str
    name: str
    status: Status = Field(description="running until every scale's sweep succeeded and the law is recorded")
    cancel_requested: bool
    error: str | None = Field(default=None, description="why it failed or was cancelled (the scale's sweep)")
    scales: list[StudyScaleState]
    laws: list[dict[str, Any]] | None = Field(
        default=None,
        description="per optimizer and reference (baseline, self): the brackets, the law with its intervals, its "
        "prediction at the target, the leave-largest-out check and the lr there (sweeps.law.OptimizerLaw); "
        "once every scale succeeded",
    )
    run_id: str | None = Field(default=None, description="the study's MLflow run: law.json and figures/law.html")
    gpu_hours: float | None = Field(default=None, description="its sweeps' prices together when submitted")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    revision: int


class StudyPage(_Out):
    items: list[StudySummary]
    total: int
    limit: int
    offset: int


class DryRunResult(_Out):
    valid: Literal[True] = True
    spec: dict[str, Any] = Field(description="the normalised spec (defaults filled in)")
    total_trials: int = Field(description="the most trials the sweep runs (a search of the batch axis: at its cap)")
    cells: int = Field(description="optimizers x batch sizes (a search of the batch axis: the most it can test)")
    trained_tokens: int = Field(
        description="tokens every trial trains on: token_budget rounded down once to a multiple of lcm(batch_sizes) x "
        "seq_len (of the lattice, for a search of the batch axis)"
    )
    cost: SweepCost = Field(
        description="what the sweep will cost: trials, tokens, model FLOPs and GPU-hours on the GPU and MFU asked "
        "for (?gpu=, ?mfu=, ?peak_tflops=; default an H100 at 0.4); see sweeps/cost.py"
    )
    caps: GpuHoursCaps | None = Field(default=None, description="whether a submit would pass the GPU-hours caps")
    cluster: ClusterFit | None = Field(
        default=None, description="whether this service's cluster can run the trials; null: no cluster to ask"
    )
