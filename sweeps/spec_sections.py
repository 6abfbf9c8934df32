"""The sections of a sweep spec (`sweeps.spec.SweepSpec`): optimizers, seeds, the batch axis, the lr search,
the schedule, the degradation rule, resources, pruning, evaluation and checkpoints, each a strict pydantic
model validated on its own with errors that name the field. The sections a trial's run has too (optimizer,
schedule, resources, evaluation, checkpoints) subclass worker.config's, so a trial's `TrainConfig` takes
them as they are. Torch-free, like sweeps.spec (the service imports it)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from worker.config import (
    MAX_BATCH_SIZE,
    MAX_LR,
    MAX_THREADS_PER_WORKER,
    MAX_TOKENS,
    CheckpointConfig,
    EvalFields,
    FieldErrors,
    FieldProblem,
    OptimizerConfig,
    OptimizerFields,
    ResourcesConfig,
    ScheduleConfig,
)

MAX_SEEDS = 32  # confirmation runs per cell
MAX_WARMUP_CHOICES = 4  # other warm-ups a cell tries at its best lr (schedule.warmup_search)
# Trials Ray Tune runs at once: each holds its workers' resources on the cluster.
MAX_CONCURRENT_TRIALS = 256


# --------------------------------------------------------------------------------------------------
# Errors that carry the field they are about
# --------------------------------------------------------------------------------------------------


# Raised inside validators; pydantic wraps it, `format_validation_error` unwraps its problems. One class
# with worker.config's FieldErrors: the OptimizerFields validators OptimizerSpec inherits raise that.
SpecError = FieldErrors


def _problem(field: str, message: str, value: Any = None) -> SpecError:
    return SpecError(FieldProblem(field, message, value))


# --------------------------------------------------------------------------------------------------
# Parts
# --------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    # allow_inf_nan=False: no float field takes inf or NaN (JSON's Infinity, YAML's .inf, "nan" strings)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class OptimizerSpec(OptimizerFields):
    """One optimizer of the sweep: `worker.config.OptimizerFields` (OptimizerConfig minus lr: the lr is
    searched), its fields and rules."""

    name: str  # no default here: every entry of a spec names its optimizer

    def to_optimizer_config(self, lr: float) -> OptimizerConfig:
        return OptimizerConfig(lr=lr, **self.model_dump())


class AdaptiveSeeds(_Strict):
    """`seeds: {min: 2, max: 9, step: 2}` (the default): `min` confirmation runs in every cell; then,
    while batch sizes inside the answer's bracket are undecided, `step` more at those the answer rests
    on (the answer and the next size tested) and their reference only, up to `max`. Every verdict's
    interval splits its 5% over the planned looks (Bonferroni; `sweeps.analysis.verdict_level`), so looking
    again cannot raise the error rate above 5%."""

    min: int = Field(ge=2, le=MAX_SEEDS)  # an interval needs two runs
    max: int = Field(ge=2, le=MAX_SEEDS)
    step: int = Field(default=2, ge=1, le=MAX_SEEDS)

    @model_validator(mode="after")
    def _order(self) -> AdaptiveSeeds:
        if self.max < self.min:
            raise _problem("max", f"seeds.max must be >= seeds.min, got min={self.min}, max={self.max}", self.max)
        return self

    @property
    def looks(self) -> int:
        """Planned looks at a boundary verdict: after min runs, then after each step up to max."""
        return 1 + math.ceil((self.max - self.min) / self.step)


MAX_LR_EXTEND = 100.0


class BatchSearchSpec(_Strict):
    """`batch_sizes: {min, max, resolution, step, against, start, decide_ends}`: search the batch axis instead of a list
    (sweeps/batch_axis.py). Per optimizer, from the reference `min` up x `step` until a size is
    degraded against `against` (or `max`), then bisection until the largest fine and the smallest
    degraded size are at most `resolution` apart. Sizes come from a lattice fixed in advance
    (`SweepSpec.lattice`), so every cell trains exactly the same tokens."""

    min: int = Field(ge=1, le=MAX_BATCH_SIZE)  # the reference batch size, in sequences
    max: int = Field(ge=1, le=MAX_BATCH_SIZE)  # the largest size tested (the lattice's largest <= max)
    resolution: float = Field(default=1.25, ge=1.1, le=4.0)  # ratio of the bracket's ends when done
    step: float = Field(default=2.0, gt=1.0, le=16.0)  # ratio of each step up before a degraded size
    # the reference that drives the search: the baseline optimizer at min (the claim "no loss against
    # AdamW at 480"), or the optimizer's own min; the other is judged on the sizes tested
    against: Literal["baseline", "self"] = "baseline"
    # where the search goes after the reference: the lattice size nearest `start` (a prediction: a study's
    # law at this scale), then on from there as from any tested size; one size for every optimizer or one
    # per optimizer name (the others step up from min); None: x step up from min
    start: int | dict[str, int] | None = None
    # once the search is done, more confirmation runs (up to seeds.max, at its levels) where the bracket's
    # ends rest on undecided sizes (`sweeps.analysis.cells_to_decide_ends`), not only where the answer does:
    # a study's law is fitted from the brackets (a study's sweeps set it)
    decide_ends: bool = False

    def start_for(self, optimizer: str) -> int | None:
        return self.start.get(optimizer) if isinstance(self.start, dict) else self.start

    def starts(self) -> set[int | None]:
        """Every start an optimizer's search may have (None: one that steps up from min)."""
        return {self.start} if not isinstance(self.start, dict) else {*self.start.values(), None}

    @model_validator(mode="after")
    def _order(self) -> BatchSearchSpec:
        if not self.max > self.min:
            raise _problem(
                "max", f"batch_sizes.max must be > batch_sizes.min, got min={self.min}, max={self.max}", self.max
            )
        for start in self.starts() - {None}:
            if not self.min < start <= self.max:  # type: ignore[operator]
                raise _problem(
                    "start",
                    f"batch_sizes.start must be > min and <= max, got start={start} (min={self.min}, max={self.max})",
                    start,
                )
        if self.step < self.resolution:
            raise _problem(
                "step",
                f"batch_sizes.step must be >= batch_sizes.resolution, got step={self.step}, "
                f"resolution={self.resolution}",
                self.step,
            )
        return self


class LRSearchSpec(_Strict):
    """Peak lr searched in [min, max], `trials_per_batch_size` trials per cell. The line search may step
    past either end, one step at a time, by up to a factor `extend` ([min / extend, max x extend]) when a
    cell's best lr sits at that end: the optimum lr moves with the batch size, and a cell judged at the
    edge of a fixed range reads worse than it is. 1: never past [min, max]."""

    min: float = Field(gt=0.0, le=MAX_LR)
    max: float = Field(gt=0.0, le=MAX_LR)
    trials_per_batch_size: int = Field(default=6, ge=1)
    extend: float = Field(default=4.0, ge=1.0, le=MAX_LR_EXTEND)

    @property
    def bounds(self) -> tuple[float, float]:
        """The lrs the search may try: [min / extend, max x extend]."""
        return self.min / self.extend, min(self.max * self.extend, MAX_LR)

    @model_validator(mode="after")
    def _order(self) -> LRSearchSpec:
        if not self.min < self.max:
            raise _problem(
                "min",
                f"lr.min must be < lr.max, got min={self.min}, max={self.max}",
                {"min": self.min, "max": self.max},
            )
        return self


class ScheduleSpec(ScheduleConfig):
    """Every trial's `worker.config.ScheduleConfig` (linear warm-up to the peak lr, then cosine decay to
    min_lr_ratio x peak) and the other warm-ups its cells try. Warm-up is one of: a fraction of each trial's
    steps (`warmup_fraction`, the default), a number of tokens (`warmup_tokens`) or a number of steps
    (`warmup_steps`). A fraction or a token count is the same tokens at every batch size and so far fewer
    steps at a large batch (at 48B tokens and 5%: ~1,950 steps at batch 480, ~114 at 8192); a step count is
    the same steps, more tokens at a large batch. Which one confounds a batch-size comparison less depends
    on the optimizer; the report says which was used."""

    # other warm-ups to try at each batch size, in the unit the warm-up is given in (a fraction, tokens or
    # steps): once a cell's lr search ends, each is trained at its best lr (seed 0), and the best of them
    # and the spec's own warm-up gets the confirmation runs (sweeps.analysis.pick_warmup)
    warmup_search: list[int | float] = Field(default_factory=list, max_length=MAX_WARMUP_CHOICES)

    @model_validator(mode="after")
    def _search(self) -> ScheduleSpec:
        # (ScheduleConfig's own check, one way of giving the warm-up, has run: warmup_unit is the one given)
        unit, top = self.warmup_unit, {"fraction": 1.0, "tokens": MAX_TOKENS, "steps": 10**9}[self.warmup_unit]
        seen = [self.warmup]
        for i, v in enumerate(self.warmup_search):
            where, field = f"warmup_search[{i}]", f"warmup_search.{i}"  # field: a dotted path, as pydantic's
            if unit == "fraction" and not 0.0 <= v < 1.0:
                raise _problem(
                    field, f"{where} must be a fraction of the steps in [0, 1) like warmup_fraction, got {v}", v
                )
            if unit != "fraction" and not (float(v).is_integer() and 0 <= v <= top):
                raise _problem(
                    field, f"{where} must be a whole number of {unit} in [0, {top}] like warmup_{unit}, got {v}", v
                )
            if any(v == w for w in seen):
                what = "the spec's own warm-up" if v == self.warmup else "an earlier entry"
                raise _problem(field, f"{where}={v} repeats {what}: each warm-up is tried once", v)
            seen.append(v)
        return self

    @property
    def warmup_choices(self) -> list[int | float]:
        """Every warm-up a cell may train with: the spec's own first, then `warmup_search`'s."""
        return [self.warmup, *self.warmup_search]

    def for_run(self, warmup: int | float | None = None) -> ScheduleConfig:
        """A trial's `ScheduleConfig` with `warmup` (in `warmup_unit`; None: the spec's own)."""
        run = ScheduleConfig.of(self)
        if warmup is None:
            return run
        unit = self.warmup_unit
        value = float(warmup) if unit == "fraction" else int(warmup)
        return ScheduleConfig.model_validate(run.model_dump() | {f"warmup_{unit}": value})

    def describe_warmup(self) -> str:
        if self.warmup_tokens is not None:
            text = (
                f"linear warm-up over {self.warmup_tokens:,} tokens at every batch size (fewer steps at a larger one)"
            )
        elif self.warmup_steps is not None:
            text = f"linear warm-up over {self.warmup_steps:,} steps at every batch size (more tokens at a larger one)"
        else:
            text = (
                f"linear warm-up over {self.warmup_fraction:.0%} of each trial's steps: the same tokens at every batch "
                f"size, fewer steps at a larger one"
            )
        if not self.warmup_search:
            return text + "; only the peak lr is searched"
        tried = ", ".join(self.describe_one(w) for w in self.warmup_choices)
        return (
            f"{text}; warm-up searched with the lr: at each batch size's best lr the warm-ups {tried} were trained "
            f"(seed 0) and the best of them got the confirmation runs (each cell's warmup)"
        )

    def describe_one(self, warmup: int | float) -> str:
        """One warm-up in its unit, in words: "5%", "2,000 steps", "1,048,576 tokens"."""
        if self.warmup_unit == "fraction":
            return f"{100 * warmup:.4g}%"
        return f"{int(warmup):,} {self.warmup_unit}"


class DegradationSpec(_Strict):
    """Mean val loss at B (fitted non-decreasing in batch size: sweeps.analysis) <= (1 + tolerance) x the
    reference's counts as no degradation."""

    tolerance: float = Field(default=0.01, ge=0.0, lt=1.0)
    baseline: str  # must be one of the spec's optimizers


class ResourcesSpec(ResourcesConfig):
    """Every trial's `worker.config.ResourcesConfig` (a trial is one run), and how many trials run at once.
    Upper bounds: worker.config's; a request larger than any node would leave trials pending on the
    cluster forever."""

    cpus_per_worker: int = Field(default=1, ge=1, le=MAX_THREADS_PER_WORKER)  # also the torch threads of each worker
    max_concurrent_trials: int = Field(default=1, ge=1, le=MAX_CONCURRENT_TRIALS)


class EvaluationSpec(EvalFields):
    """Every trial's evaluations: `worker.config.EvalFields` (every how many tokens, how many held-out tokens
    each scores: a fixed set, the same whatever the micro-batch and workers)."""


class CheckpointSpec(CheckpointConfig):
    """Every trial's checkpoints: `worker.config.CheckpointConfig`, with a floor of 300 s by default. A
    checkpoint (model, optimizer state, data position, step; RNG draws are keyed on the seed and step) goes
    to the trial storage every `every_tokens` tokens, rounded to whole evaluations, so a trial whose worker
    or node is lost resumes there; only the last is kept, and none once the trial ends. None: at every
    evaluation; 0: none (a lost trial starts again from token 0)."""

    # and at most one per this many seconds of training: a checkpoint stops training while it is written
    # (~0.3 s for gpt2-nano into S3 here, far more for GPT-2 medium), so trials shorter than this write
    # none and long ones lose at most this much work to a lost node (benchmarks/cluster_overhead.py)
    min_interval_s: float = Field(default=300.0, ge=0.0)


class PruningSpec(_Strict):
    """ASHA early stopping of search trials (seed re-runs are never pruned)."""

    enabled: bool = True
    grace_fraction: float = Field(default=0.3, gt=0.0, le=1.0)  # of the token budget, before any pruning
    reduction_factor: int = Field(default=3, ge=2, le=64)
