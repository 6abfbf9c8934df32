"""A sweep's live progress, one model family: the searcher builds it (`sweeps.search.readout.progress_of`),
the driver passes it to `on_progress`, the service stores it as JSON and answers it (`service.models`), and
the CLI shows it.

`Progress` is per cell the trials done and planned and the losses so far; `DriverProgress` adds every
trial's curve, which the service answers apart (`GET /sweeps/{id}/curves`). Before the driver reports,
`Progress.planned` gives the plan of a validated spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sweeps.layout import role_of
from sweeps.plan import cell_key

if TYPE_CHECKING:
    from sweeps.spec import SweepSpec

CURVE_POINTS = 40  # per trial on the live page: a few KB a sweep, at any number of evaluations


class _Read(BaseModel):
    # A driver of another version may send more fields, and the store keeps the progress of older ones:
    # a reader takes the fields it knows and drops the rest.
    model_config = ConfigDict(extra="ignore")


class CellProgress(_Read):
    cell: str
    optimizer: str | None = None
    batch_size: int | None = None
    search_done: int = Field(
        default=0, description="search trials finished, and runs of the other warm-ups at the best lr"
    )
    search_total: int | None = Field(
        default=None,
        description="search trials planned (lr.trials_per_batch_size, one more at the reference batch size; a search "
        "that converged early: the trials it ran), and one run per other warm-up",
    )
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
    stopped: str | None = Field(
        default=None,
        description="why the cell stopped without a result (out of memory, its trials' processes kept dying); "
        "null: it did not",
    )


class Progress(_Read):
    """Per cell the trials done and planned and the losses so far; the totals over the cells."""

    cells_done: int = 0
    cells_total: int = 0
    trials_done: int = 0
    trials_total: int = Field(
        default=0,
        description="the current plan: adaptive confirmation and a search of the batch axis may add runs and cells",
    )
    cells: list[CellProgress] = Field(default_factory=list)

    @classmethod
    def planned(cls, spec: SweepSpec) -> Progress:
        """Before the driver reports: every cell the sweep starts with at zero, its trials as planned (the
        searcher's first plan: confirmation at `seeds_min`)."""
        from sweeps.spec import cell_search_trials  # here: the CLI reads progress without the spec's ~0.2 s import

        # a search of the batch axis starts with each optimizer's reference cell (the lattice's smallest)
        # and adds the others as it decides
        sizes = spec.lattice[:1] if spec.batch_search is not None else spec.lattice
        cells = [
            CellProgress(
                cell=cell_key(o, b),
                optimizer=o,
                batch_size=b,
                # the lr search's trials, then one per other warm-up to try (`SweepSpec.search_trials`)
                search_total=cell_search_trials(spec.search_trials, reference=b == sizes[0]),
                seeds_total=spec.seeds_min,
            )
            for o in spec.optimizer_names
            for b in sizes
        ]
        return cls(
            cells_total=len(cells),
            trials_total=sum((c.search_total or 0) + (c.seeds_total or 0) for c in cells),
            cells=cells,
        )


class TrialCurve(_Read):
    """One trial's val loss against tokens, for the sweep's live page."""

    cell: str
    lr: float
    seed: int = Field(description="0: a search trial; 1, 2, ...: confirmation runs")
    role: str = Field(description="search, confirm or warmup (another warm-up at the best lr)")
    status: str = Field(description="running, completed, pruned, diverged, failed, ...")
    best: bool = Field(
        default=False, description="the cell's best search trial so far (its lr gets the confirmation runs)"
    )
    points: list[tuple[int, float]] = Field(
        description=f"(tokens, val loss) at each evaluation, at most {CURVE_POINTS}, evenly spread"
    )
    warmup: int | float | None = Field(
        default=None, description="the warm-up it trained with, in the spec's unit (schedule.warmup_unit)"
    )

    @field_validator("role", mode="before")
    @classmethod
    def _role(cls, value: object) -> object:
        """The progress the store keeps names roles as `sweeps.layout.role_of` reads them."""
        role = role_of(value)
        return str(role) if role is not None else value


class DriverProgress(Progress):
    """What the driver reports as the sweep moves: the progress and every trial's curve so far, finished
    and running. The service stores it whole and answers the curves apart from the progress."""

    curves: list[TrialCurve] = Field(default_factory=list)
