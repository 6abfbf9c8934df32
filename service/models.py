"""What the service tells about sweeps: the domain models its routes answer and its pages render.

`service.manager` and `service.views` build them from the stored row (`service.store.database.SweepRow`);
the JSON API (`service.api`) answers them as they are and the browser pages render them. A sweep's live
progress and curves are the driver's models (`sweeps.progress`: `Progress`, `CellProgress`, `TrialCurve`),
stored as the driver sent them and read back here.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.store.database import SweepRow
from service.verdicts import ClusterFit, GpuHoursCaps
from sweeps.cost import FloatRange, SweepCost
from sweeps.progress import CellProgress as CellProgress  # the progress's models: importable from here too
from sweeps.progress import Progress, TrialCurve
from sweeps.spec import SweepSpec
from sweeps.status import SweepStatus
from sweeps.study import SweepPrice

Status = SweepStatus


class _Out(BaseModel):
    # What the service reads back may hold fields it does not know; the API names the ones it promises.
    model_config = ConfigDict(extra="ignore")


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
    progress = Progress.model_validate(row.progress) if row.progress else planned(row.spec)
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


@functools.lru_cache(maxsize=1024)
def _planned(spec_json: str) -> Progress:
    try:
        spec = SweepSpec.from_stored(json.loads(spec_json))
    except ValidationError:  # stored by another version, and not a spec this one reads: no plan to show
        return Progress()
    return Progress.planned(spec)


def planned(spec: dict[str, Any]) -> Progress:
    """The progress of a stored spec before its driver reports (`Progress.planned`). Kept per spec: a
    list page reads every queued sweep's, and validating a spec takes up to ~10 ms (every cell's
    TrainConfig); a stored spec never changes."""
    return _planned(json.dumps(spec, sort_keys=True))


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
    ratio: FloatRange = Field(description="the scales' GPU-hours against the target sweep's, min to min, max to max")
    confirmation: SweepPrice | None = Field(
        default=None,
        description="with confirm: true, the confirmation sweep at the target at most (its sweep comes from the "
        "fitted law: the target's spec at the reference and the 2 x optimizers costliest other sizes of its lattice, "
        "sweeps.study.confirm_bound_spec); null: the study does not confirm",
    )
    caps: GpuHoursCaps | None = Field(
        default=None,
        description="whether its sweeps (the confirmation at most among them) would pass the GPU-hours caps: each "
        "against the cap per sweep, all of them together against the cap per owner",
    )


class StudyScaleState(_Out):
    scale: int = Field(description="1: the smallest; the study runs them in this order, one at a time")
    sweep_id: str = Field(description="the scale's sweep (GET /sweeps/{id}), once created")
    model: str = Field(description="the model preset, or custom")
    trained_tokens: int = Field(description="tokens every trial of this scale's sweep trains on")
    status: Status | Literal["pending"] = Field(description="the sweep's status; pending: not created yet")


class LawConfirmation(_Out):
    """One law's prediction judged by the confirmation sweep at the target (`sweeps.law.Confirmation`)."""

    optimizer: str
    against: str = Field(description="the law's reference: baseline or self")
    outcome: Literal["held", "missed", "undecided"] = Field(
        description="held: the sweep's bracket holds the predicted B*; missed: it does not (by `miss`); "
        "undecided: an open end neither holds nor contradicts it"
    )
    predicted: dict[str, float] = Field(description="the law's B* at the target: value, low, high")
    tested: list[int] = Field(description="the batch sizes the confirmation sweep trained, the reference's first")
    largest_fine: int | None = Field(description="the sweep's bracket of B*: the largest size decided fine")
    smallest_degraded: int | None = Field(description="the smallest size decided degraded above it")
    miss: float = Field(description="the factor the prediction lies outside the bracket by; 1: inside or undecided")
    lr_predicted: float | None = Field(default=None, description="the lr law's lr at the predicted B*")
    lr_found: float | None = Field(default=None, description="the best lr the sweep found at lr_at")
    lr_at: int | None = Field(default=None, description="the tested size nearest the predicted B*")
    says: str = Field(description="the outcome in words")

    @classmethod
    def from_stored(cls, c: dict[str, Any]) -> LawConfirmation:
        """From a `sweeps.law.Confirmation` as JSON (what the study's row keeps)."""
        held = c.get("held")
        bracket = c.get("bracket") or {}
        return cls.model_validate(
            c
            | {
                "outcome": "undecided" if held is None else "held" if held else "missed",
                "largest_fine": bracket.get("largest_fine"),
                "smallest_degraded": bracket.get("smallest_degraded"),
            }
        )


class StudyConfirmation(_Out):
    """The confirmation at the target of a study with confirm: true: one more sweep after the law, at the
    reference and the sizes on each side of each prediction (`sweeps.study.confirm_spec`)."""

    sweep_id: str = Field(description="its sweep (GET /sweeps/{id}), the study's after its scales, once created")
    status: Status | Literal["pending", "not_run"] = Field(
        description="the sweep's status; pending: not created yet (it comes once the laws are fitted); not_run: "
        "no law predicted a B* it could test (note says why)"
    )
    note: str | None = Field(default=None, description="why no confirmation sweep ran")
    laws: list[LawConfirmation] | None = Field(
        default=None, description="each law with a prediction judged by the sweep; once it succeeded"
    )


class StudySummary(_Out):
    id: str
    name: str
    status: Status = Field(
        description="running until every scale's sweep succeeded (and with confirm: true, its confirmation) and the "
        "law is recorded"
    )
    cancel_requested: bool
    error: str | None = Field(default=None, description="why it failed or was cancelled (the scale's sweep)")
    scales: list[StudyScaleState]
    laws: list[dict[str, Any]] | None = Field(
        default=None,
        description="per optimizer and reference (baseline, self): the brackets, the law with its intervals, its "
        "prediction at the target, the leave-largest-out check and the lr there (sweeps.law.OptimizerLaw); "
        "once every scale succeeded",
    )
    confirmation: StudyConfirmation | None = Field(
        default=None, description="the confirmation at the target (confirm: true); null: the study does not confirm"
    )
    run_id: str | None = Field(default=None, description="the study's MLflow run: law.json and figures/law.html")
    gpu_hours: float | None = Field(
        default=None, description="its sweeps' prices together when submitted (its confirmation at most among them)"
    )
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
