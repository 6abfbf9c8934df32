"""`SweepSpec`: the public contract of a batch-size sweep (CLI and HTTP service alike).

A sweep asks, for each optimizer, "how large can the global batch get before the validation loss at a
fixed token budget degrades?". The spec names the model, the data, the optimizers, the batch sizes,
the token budget of every trial, the learning-rate search, the number of seeds and the tolerance of
"no degradation". It is validated in full before anything runs; every refusal names the field and the
bad value (see `format_validation_error` for the machine-readable form).

Load with `SweepSpec.from_yaml(text_or_path)`, `SweepSpec.from_json(text_or_path)` or
`SweepSpec.load(path)` (by suffix); `spec.model_dump(mode="json")` validates back to an equal spec.
Text is parsed by `sweeps.documents.parse_document`, the parser the HTTP service uses too (no YAML
aliases, bounded depth and size, finite numbers only).
The cap on the number of trials is a validation context value:
`SweepSpec.model_validate(data, context={"max_trials": N})` (default `DEFAULT_MAX_TRIALS`).

Every number that costs CPU or memory has an upper bound (`worker.config.MAX_*`, `MAX_BATCH_SIZES`,
`MAX_CONCURRENT_TRIALS`), no float is inf or NaN, and validation itself is cheap: it reads no data
and its work grows with the number of cells only (~5 ms for the largest spec the bounds allow).

This module must not import torch: the HTTP service imports it. `worker.config` and `worker.names`
are torch-free.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sweeps.batch_axis import MAX_LATTICE, lattice, search_bounds
from sweeps.documents import SpecLoadError, parse_document
from sweeps.spec_sections import (
    MAX_CONCURRENT_TRIALS,
    MAX_SEEDS,
    AdaptiveSeeds,
    BatchSearchSpec,
    CheckpointSpec,
    DegradationSpec,
    EvaluationSpec,
    LRSearchSpec,
    OptimizerSpec,
    PruningSpec,
    ResourcesSpec,
    ScheduleSpec,
    SpecError,
    _problem,
    _Strict,
)
from worker.config import (
    MAX_BATCH_SIZE,
    MAX_TOKENS,
    CheckpointConfig,
    Compile,
    DataConfig,
    EvalConfig,
    FieldProblem,
    ModelConfig,
    Precision,
    ResourcesConfig,
    TrainConfig,
    builtin_corpus_tokens,
    corpus_shortfall,
    split_batch,
)
from worker.messages import EXCERPT_CHARS, excerpt

__all__ = [
    "DEFAULT_MAX_TRIALS",
    "BatchSearchSpec",
    "CheckpointSpec",
    "EvaluationSpec",
    "FLAT_KEYS",
    "MAX_BATCH_SIZES",
    "MAX_CONCURRENT_TRIALS",
    "NAME_PATTERN",
    "DegradationSpec",
    "FieldProblem",
    "LRSearchSpec",
    "OptimizerSpec",
    "PruningSpec",
    "ResourcesSpec",
    "ScheduleSpec",
    "SpecError",
    "SpecLoadError",
    "SweepSpec",
    "format_validation_error",
    "json_value",
    "problem",
]

# Cap on `total_trials` unless the validation context says otherwise:
# SweepSpec.model_validate(data, context={"max_trials": N}).
DEFAULT_MAX_TRIALS = 1000


# An optimizer's smallest batch size, the reference its other sizes are judged against, searches from the
# coarse start (no smaller size's best lr to warm-start from) and refines its best lr to a narrow bracket
# (sweeps.plan.REFERENCE_NARROW): it may run this many search trials more than the others.
REFERENCE_EXTRA_TRIALS = 1


def cell_search_trials(trials_per_batch_size: int, *, reference: bool) -> int:
    """Search trials one cell runs at most: `trials_per_batch_size`, and REFERENCE_EXTRA_TRIALS more at an
    optimizer's smallest batch size."""
    return trials_per_batch_size + (REFERENCE_EXTRA_TRIALS if reference else 0)


def total_trials(n_optimizers: int, n_batch_sizes: int, trials_per_batch_size: int, seeds: int) -> int:
    """The most trials a sweep runs: every cell (optimizer x batch size) runs its lr search (up to
    `cell_search_trials`: it may converge early), then `seeds` confirmation runs at the best lr. The one
    formula: the spec's cap and the dry run use it."""
    if n_batch_sizes <= 0:
        return 0
    per_optimizer = n_batch_sizes * (trials_per_batch_size + seeds) + REFERENCE_EXTRA_TRIALS
    return n_optimizers * per_optimizer


def token_unit(batch_sizes: list[int], seq_len: int) -> int:
    """lcm(batch_sizes) x seq_len: a trained-token count every batch size of the sweep reaches in whole steps."""
    return math.lcm(*batch_sizes) * seq_len


# Sweep names become MLflow experiment names, Ray Tune directories and URL path segments.
NAME_PATTERN = re.compile(r"[a-z0-9-]{1,64}")

# Batch sizes per sweep: each is a column of cells (an Optuna study per optimizer).
MAX_BATCH_SIZES = 32

# Top-level keys a spec may give instead of their place in a section (the spec's form before it had the
# evaluation and checkpoints sections): each is moved into its section before validation, with the same
# meaning, and a refusal of its value names it as given. Dumps give the sections only.
FLAT_KEYS: dict[str, tuple[str, str]] = {
    "eval_every_tokens": ("evaluation", "every_tokens"),
    "eval_tokens": ("evaluation", "tokens"),
    "checkpoint_every_tokens": ("checkpoints", "every_tokens"),
    "checkpoint_min_interval_s": ("checkpoints", "min_interval_s"),
}


# --------------------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------------------


class SweepSpec(_Strict):
    """A batch-size x optimizer sweep. See sweeps/examples/demo.yaml for a commented example."""

    name: str
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optimizers: list[OptimizerSpec]
    # global batch in sequences: a list, strictly increasing, every one trained; or {min, max,
    # resolution, step, against, start}: a search of the batch axis for the boundary (BatchSearchSpec)
    batch_sizes: list[int] | BatchSearchSpec
    token_budget: int = Field(gt=0, le=MAX_TOKENS)  # tokens per trial, the same at every batch size
    lr: LRSearchSpec
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    # confirmation runs at each cell's best lr, seeds 1..n (the search runs at seed 0 and only picks the
    # lr); they alone give the cell's mean, interval and verdicts: 1 gives a mean without an interval. Or
    # {min, max, step}: more runs where the answer is undecided (AdaptiveSeeds), the default: with a
    # fixed 2, few verdicts are decided (benchmarks/search_efficiency.py, bowls: right 0.86 of the time,
    # 0.92 with up to 9, at 0.31 and 0.48-0.49 of a 12-lr x 2-seed grid's tokens; cliffs 0.82 and
    # 0.91-0.93 at 0.29 and 0.43; up to 6: 0.91 and 0.88 at 0.41 and 0.37). Up to 9, not 10: with the
    # reference's refined lr (sweeps.plan.REFERENCE_NARROW) as accurate, and bowls 0.49 of the tokens, not 0.50
    # (docs/researchers.md)
    seeds: int | AdaptiveSeeds = Field(default_factory=lambda: AdaptiveSeeds(min=2, max=9, step=2))
    degradation: DegradationSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    pruning: PruningSpec = Field(default_factory=PruningSpec)
    # every trial's evaluations (every_tokens, tokens) and checkpoints (every_tokens, min_interval_s); the
    # flat keys eval_every_tokens, eval_tokens, checkpoint_every_tokens, checkpoint_min_interval_s too (FLAT_KEYS)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    checkpoints: CheckpointSpec = Field(default_factory=CheckpointSpec)
    grad_clip: float | None = Field(default=1.0, gt=0.0)  # None: no clipping
    # every trial's: fp32 or bf16 (autocast); compile: torch.compile the model (worker.config)
    precision: Precision = "fp32"
    compile: Compile = False

    # ---- field checks ---------------------------------------------------------------------------

    @model_validator(mode="wrap")
    @classmethod
    def _flat_keys(cls, data: Any, handler: ModelWrapValidatorHandler[SweepSpec]) -> SweepSpec:
        """The keys of FLAT_KEYS moved into their sections (both forms of one setting at once: refused, naming
        the key); a refusal of a moved value names the key as given."""
        if not isinstance(data, dict) or not data.keys() & FLAT_KEYS.keys():
            return handler(data)
        given = data.keys() & FLAT_KEYS.keys()
        try:
            return handler(_into_sections(data))
        except ValidationError as exc:
            raise _flat_locations(exc, given) from None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_PATTERN.fullmatch(v):
            raise _problem("", f"name must be 1..64 characters of [a-z0-9-], got name={excerpt(v)}", v)
        return v

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_form(cls, v: Any) -> Any:
        """A whole number, or {min, max, step}: one readable refusal instead of one per union branch."""
        if isinstance(v, dict):
            seeds, problems = _part(AdaptiveSeeds, v, "seeds")
            if problems:
                raise ValueError("; ".join(p.message for p in problems))
            return seeds
        if isinstance(v, bool) or not isinstance(v, int | AdaptiveSeeds):
            raise ValueError(f"seeds must be a whole number or {{min, max, step}}, got seeds={excerpt(v)}")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: int | AdaptiveSeeds) -> int | AdaptiveSeeds:
        if isinstance(v, int) and not 1 <= v <= MAX_SEEDS:
            raise ValueError(f"seeds must be in [1, {MAX_SEEDS}], got seeds={v}")
        if isinstance(v, AdaptiveSeeds) and v.min == v.max:
            return v.min  # nothing to adapt: the plain number
        return v

    @property
    def seeds_min(self) -> int:
        """Confirmation runs every cell gets."""
        return self.seeds if isinstance(self.seeds, int) else self.seeds.min

    @property
    def seeds_max(self) -> int:
        """Confirmation runs a boundary cell may get (the trial cap counts these)."""
        return self.seeds if isinstance(self.seeds, int) else self.seeds.max

    @property
    def seeds_step(self) -> int:
        return 0 if isinstance(self.seeds, int) else self.seeds.step

    @property
    def noise_looks(self) -> int:
        return 1 if isinstance(self.seeds, int) else self.seeds.looks

    @field_validator("optimizers")
    @classmethod
    def _optimizers(cls, v: list[OptimizerSpec]) -> list[OptimizerSpec]:
        if not v:
            raise _problem("", "optimizers must not be empty; list at least one, e.g. [{name: adamw}]", [])
        seen: dict[str, int] = {}
        problems = []
        for i, opt in enumerate(v):
            if opt.name in seen:
                problems.append(
                    FieldProblem(
                        f"{i}.name",
                        f"optimizers has a duplicate name {opt.name!r} (entries {seen[opt.name]} and {i})",
                        opt.name,
                    )
                )
            else:
                seen[opt.name] = i
        if problems:
            raise SpecError(problems)
        return v

    @field_validator("batch_sizes", mode="before")
    @classmethod
    def _batch_sizes_form(cls, v: Any) -> Any:
        """A list, or {min, max, ...}: one readable refusal instead of one per union branch."""
        if isinstance(v, dict):
            search, problems = _part(BatchSearchSpec, v, "batch_sizes")
            if problems:
                raise SpecError(problems)
            return search
        if isinstance(v, str | bytes) or not isinstance(v, list | tuple | BatchSearchSpec):
            raise ValueError(
                f"batch_sizes must be a list of batch sizes or {{min, max, resolution}}, got batch_sizes={excerpt(v)}"
            )
        return v

    @field_validator("batch_sizes")
    @classmethod
    def _batch_sizes(cls, v: list[int] | BatchSearchSpec) -> list[int] | BatchSearchSpec:
        if isinstance(v, BatchSearchSpec):
            return v
        if not v:
            raise _problem("", "batch_sizes must not be empty, e.g. [16, 32, 64]", [])
        # the count first: the checks below are quadratic in it, and each batch size is a column of cells
        if len(v) > MAX_BATCH_SIZES:
            raise _problem("", f"batch_sizes holds {len(v)} batch sizes; the limit is {MAX_BATCH_SIZES}", excerpt(v))
        bad = [b for b in v if b <= 0]
        if bad:
            raise _problem("", f"batch_sizes must all be > 0, got {bad} in batch_sizes={v}", v)
        big = [b for b in v if b > MAX_BATCH_SIZE]
        if big:
            raise _problem(
                "", f"batch_sizes must all be <= {MAX_BATCH_SIZE} sequences, got {big} in batch_sizes={v}", v
            )
        dups = sorted({b for b in v if v.count(b) > 1})
        if dups:
            raise _problem("", f"batch_sizes has duplicates {dups}, got batch_sizes={v}", v)
        for i in range(1, len(v)):
            if v[i] <= v[i - 1]:
                raise _problem(
                    "",
                    f"batch_sizes must be strictly increasing, got {v[i - 1]} before {v[i]} "
                    f"(index {i - 1} and {i}) in batch_sizes={v}",
                    v,
                )
        return v

    # ---- cross-field checks ---------------------------------------------------------------------

    @model_validator(mode="after")
    def _cross(self, info: ValidationInfo) -> SweepSpec:
        self._check_batch_search()  # raises: nothing below can be judged without the lattice
        problems = [
            p
            for p in (
                self._baseline_problem(),
                self._budget_problem(),
                *self._split_problems(),
                self._trial_cap_problem(info),
            )
            if p is not None
        ]
        if problems:
            raise SpecError(problems)
        self._check_cells_train()
        return self

    def _baseline_problem(self) -> FieldProblem | None:
        names = [o.name for o in self.optimizers]
        if self.degradation.baseline in names:
            return None
        return FieldProblem(
            "degradation.baseline",
            f"degradation.baseline={excerpt(self.degradation.baseline)} is not among the spec's optimizers "
            f"{names}; add it to optimizers or pick one of them",
            self.degradation.baseline,
        )

    def _check_batch_search(self) -> None:
        """A search of the batch axis must span a lattice of 2 to MAX_LATTICE sizes (SpecError otherwise)."""
        search = self.batch_search
        if search is None:
            return
        if isinstance(search.start, dict) and (unknown := sorted(set(search.start) - set(self.optimizer_names))):
            raise _problem(
                "batch_sizes.start",
                f"batch_sizes.start names {', '.join(unknown)}, not among the optimizers "
                f"({', '.join(self.optimizer_names)})",
                unknown[0],
            )
        workers = self.resources.workers_per_trial
        try:
            sizes = lattice(search.min, search.max, search.resolution, workers)
        except ValueError as exc:
            raise _problem("batch_sizes.min", f"batch_sizes.{exc}", search.min) from None
        if len(sizes) > MAX_LATTICE:
            raise _problem(
                "batch_sizes.resolution",
                f"batch_sizes from {search.min} to {search.max} at resolution={search.resolution} is a lattice of "
                f"more than {MAX_LATTICE} sizes; raise resolution or narrow [min, max]",
                search.resolution,
            )
        if len(sizes) < 2:
            raise _problem(
                "batch_sizes.max",
                f"batch_sizes.max={search.max} leaves nothing to search above min={search.min}: the next lattice "
                f"size is {lattice(search.min, 4 * search.min, search.resolution, workers)[1]}",
                search.max,
            )

    def _budget_problem(self) -> FieldProblem | None:
        """Every cell trains on the same tokens in whole steps: the budget must hold one step of each."""
        if self.trained_tokens >= 1:
            return None
        seq_len = self.model.seq_len
        lcm, unit = math.lcm(*self.lattice), token_unit(self.lattice, seq_len)
        unit_text = str(unit) if unit < 10**15 else f"about 10^{len(str(unit)) - 1}"
        return FieldProblem(
            "token_budget",
            f"token_budget={self.token_budget} is smaller than the least every batch size can train on "
            f"in whole steps: lcm({'the lattice' if self.batch_search else 'batch_sizes'}) = {lcm} x model.seq_len "
            f"{seq_len} = {unit_text} tokens; "
            f"every cell trains on the same tokens, token_budget rounded down to a multiple of that",
            self.token_budget,
        )

    def _split_problems(self) -> list[FieldProblem]:
        """Every batch size split over the workers, and (builtin corpus) enough sequences for a step."""
        workers, max_micro = self.resources.workers_per_trial, self.resources.max_micro_batch
        unsplittable = []
        for b in self.lattice:
            try:
                split_batch(b, workers, max_micro)
            except ValueError:
                unsplittable.append(b)
        if unsplittable:
            return [
                FieldProblem(
                    "resources.workers_per_trial",
                    f"resources.workers_per_trial={workers} must divide every batch size; "
                    f"batch_sizes {unsplittable} cannot be split evenly over {workers} workers",
                    workers,
                )
            ]
        if self.data.source != "builtin":
            return []
        # sequences the corpus cannot hold fail every trial; the builtin corpus's size is known without
        # reading it (worker.names.BUILTIN_CORPUS_TOKENS). The service checks file sources against their
        # sizes (service/policy.py); hf: datasets meet worker.data.TrainBatches' check.
        seq_len = self.model.seq_len
        short = corpus_shortfall(
            builtin_corpus_tokens(self.data.vocab_size),
            seq_len=seq_len,
            micro_batch=max(split_batch(b, workers, max_micro)[0] for b in self.lattice),
            num_workers=workers,
            val_fraction=self.data.val_fraction,
            what=f"the builtin corpus at data.vocab_size={self.data.vocab_size}",
        )
        return [FieldProblem("model.seq_len", short, seq_len)] if short else []

    def _trial_cap_problem(self, info: ValidationInfo) -> FieldProblem | None:
        cap: float = DEFAULT_MAX_TRIALS
        if info.context and info.context.get("stored"):
            cap = math.inf  # validated at submit against the service's own cap (`from_stored`)
        elif info.context and info.context.get("max_trials") is not None:
            cap = int(info.context["max_trials"])
        total = self.total_trials
        if total <= cap:
            return None
        sizes_text = (
            f"{self.sizes_per_optimizer[1]} batch sizes at most"
            if self.batch_search
            else f"{len(self.lattice)} batch sizes"
        )
        n_warmups = len(self.schedule.warmup_search)
        warmups = f"{n_warmups} schedule.warmup_search + " if n_warmups else ""
        return FieldProblem(
            "total_trials",
            f"total trials {total} = {len(self.optimizers)} optimizers x {sizes_text} "
            f"x ({self.lr.trials_per_batch_size} lr.trials_per_batch_size + {warmups}{self.seeds_max} seeds) "
            f"exceeds the cap max_trials={cap}; reduce optimizers, batch_sizes, "
            f"lr.trials_per_batch_size{', schedule.warmup_search' if warmups else ''} or seeds",
            total,
        )

    def _check_cells_train(self) -> None:
        """Last guard: every cell must map onto a valid TrainConfig (the worker's own checks), so a spec
        that passes here cannot fail at launch for a config reason. Both lr ends are tried: at most
        5 optimizers x MAX_LATTICE x 2 TrainConfigs, ~10 ms."""
        for opt, b in self.cells():
            for lr in self.lr.bounds:
                try:
                    self.train_config(opt, b, lr, seed=0)
                except (ValidationError, ValueError) as exc:
                    detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
                    raise _problem(
                        "",
                        f"cell optimizer={opt!r}, batch_size={b}, lr={lr} is not a valid training run: {detail}",
                        {"optimizer": opt, "batch_size": b, "lr": lr},
                    ) from None

    # ---- derived --------------------------------------------------------------------------------

    @property
    def batch_search(self) -> BatchSearchSpec | None:
        """The search of the batch axis, or None for a list of batch sizes."""
        return self.batch_sizes if isinstance(self.batch_sizes, BatchSearchSpec) else None

    @property
    def lattice(self) -> list[int]:
        """Every batch size a trial of this sweep may train at, ascending: the list, or the search's
        lattice (sweeps/batch_axis.py), fixed before anything runs."""
        if (search := self.batch_search) is None:
            return list(self.batch_sizes)  # type: ignore[arg-type]
        return list(_lattice(search.min, search.max, search.resolution, self.resources.workers_per_trial))

    @property
    def reference_batch_size(self) -> int:
        """The smallest batch size of the lattice: every optimizer's own reference, and the baseline's there
        the reference of every optimizer (sweeps.analysis)."""
        return self.lattice[0]

    @property
    def sizes_per_optimizer(self) -> tuple[int, int]:
        """(fewest, most) batch sizes one optimizer tests: the list's length, or the search's bounds."""
        if (search := self.batch_search) is None:
            return len(self.lattice), len(self.lattice)
        bounds = [search_bounds(tuple(self.lattice), search.step, search.resolution, s) for s in search.starts()]
        return min(b[0] for b in bounds), max(b[1] for b in bounds)

    @property
    def total_trials(self) -> int:
        """At most: every cell at seeds_max confirmation runs (adaptive seeds stop earlier where they can),
        at the most batch sizes a search can test."""
        return total_trials(len(self.optimizers), self.sizes_per_optimizer[1], self.search_trials, self.seeds_max)

    @property
    def search_trials(self) -> int:
        """Search trials a cell runs at most: the lr search's, then one per other warm-up to try."""
        return self.lr.trials_per_batch_size + len(self.schedule.warmup_search)

    @property
    def trained_tokens(self) -> int:
        """Tokens every trial of the sweep trains on: `token_budget` rounded down, once for the whole
        sweep, to a multiple of lcm(lattice) x seq_len (lcm(batch_sizes) for a list), so that every batch
        size runs whole steps over exactly the same tokens (a larger batch takes proportionally fewer
        steps). Rounding per batch size instead would train larger batches on fewer tokens and bias
        every verdict."""
        unit = token_unit(self.lattice, self.model.seq_len)
        return self.token_budget // unit * unit

    @property
    def optimizer_names(self) -> list[str]:
        return [o.name for o in self.optimizers]

    def cells(self) -> list[tuple[str, int]]:
        """(optimizer, batch_size) pairs: optimizers in the order given, batch sizes ascending; for a
        search, every cell it may test (the lattice)."""
        return [(o.name, b) for o in self.optimizers for b in self.lattice]

    def optimizer(self, name: str) -> OptimizerSpec:
        for o in self.optimizers:
            if o.name == name:
                return o
        raise KeyError(f"optimizer {name!r} is not in sweep {self.name!r}; its optimizers: {self.optimizer_names}")

    def train_config(
        self, optimizer: str, batch_size: int, lr: float, seed: int, warmup: int | float | None = None
    ) -> TrainConfig:
        """The `TrainConfig` of one trial of this sweep (cell `(optimizer, batch_size)` at `lr`, `seed`), with
        `warmup` (one of `schedule.warmup_choices`; None: the spec's own)."""
        if batch_size not in self.lattice:
            raise ValueError(f"batch_size={batch_size} is not in sweep {self.name!r}; its batch sizes: {self.lattice}")
        return TrainConfig(
            model=self.model,
            data=self.data,
            optimizer=self.optimizer(optimizer).to_optimizer_config(lr),
            schedule=self.schedule.for_run(warmup),
            evaluation=EvalConfig.of(self.evaluation),
            checkpoints=CheckpointConfig.of(self.checkpoints),
            resources=ResourcesConfig.of(self.resources),
            batch_size=batch_size,
            token_budget=self.trained_tokens,
            seed=seed,
            grad_clip=self.grad_clip,
            precision=self.precision,
            compile=self.compile,
        )

    # ---- loading --------------------------------------------------------------------------------

    @classmethod
    def from_stored(cls, data: Any) -> SweepSpec:
        """A spec the service stored after validating it at submit with its own limits (its trial cap
        may exceed the default): rebuilt as it was, not judged again against the default cap."""
        return cls.model_validate(data, context={"stored": True})

    @classmethod
    def from_mapping(cls, data: Any, *, max_trials: int | None = None) -> SweepSpec:
        context = {"max_trials": max_trials} if max_trials is not None else None
        return cls.model_validate(data, context=context)

    @classmethod
    def from_yaml(cls, text_or_path: str | os.PathLike[str], *, max_trials: int | None = None) -> SweepSpec:
        """A `Path` (or a str naming an existing file) is read; any other str is YAML text."""
        return cls._parse(text_or_path, "yaml", max_trials)

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike[str], *, max_trials: int | None = None) -> SweepSpec:
        """A `Path` (or a str naming an existing file) is read; any other str is JSON text."""
        return cls._parse(text_or_path, "json", max_trials)

    @classmethod
    def _parse(cls, text_or_path: str | os.PathLike[str], kind: Any, max_trials: int | None) -> SweepSpec:
        text, where = _read(text_or_path)
        try:
            data = parse_document(text, kind)
        except SpecLoadError as exc:
            raise SpecLoadError(f"{exc}{where}") from None
        return cls.from_mapping(data, max_trials=max_trials)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, max_trials: int | None = None) -> SweepSpec:
        """Read a spec file: .yaml/.yml as YAML, .json as JSON."""
        p = Path(path)
        if not p.is_file():
            raise SpecLoadError(f"spec file not found: {str(p)!r}")
        suffix = p.suffix.lower()
        if suffix in (".yaml", ".yml"):
            return cls.from_yaml(p, max_trials=max_trials)
        if suffix == ".json":
            return cls.from_json(p, max_trials=max_trials)
        raise SpecLoadError(f"unknown spec file type {suffix!r} of {str(p)!r}; use .yaml, .yml or .json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _into_sections(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with each key of FLAT_KEYS moved into its section; SpecError where a setting is given both ways."""
    out = dict(data)
    problems = []
    for key in sorted(data.keys() & FLAT_KEYS.keys()):
        section, field = FLAT_KEYS[key]
        value = out.pop(key)
        part = out.get(section, {})
        if isinstance(part, BaseModel):
            part = part.model_dump(exclude_unset=True)
        if not isinstance(part, dict):
            continue  # the section's own refusal says what it must be
        if field in part:
            problems.append(
                FieldProblem(
                    key,
                    f"{key} and {section}.{field} are one setting, given twice; give {section}.{field} only "
                    f"(the top-level {key} is its older form), got {key}={excerpt(value)}",
                    value,
                )
            )
            continue
        out[section] = {**part, field: value}
    if problems:
        raise SpecError(problems)
    return out


def _flat_locations(exc: ValidationError, keys: set[str]) -> ValidationError:
    """`exc` with each refusal inside a section field moved there from a flat key (`keys`) located at the key."""
    at = {FLAT_KEYS[k]: k for k in keys}
    errors = exc.errors()
    if not any(tuple(e["loc"][:2]) in at for e in errors):
        return exc
    details: list[Any] = [
        {
            "type": e["type"],
            "loc": (at[tuple(e["loc"][:2])], *e["loc"][2:]) if tuple(e["loc"][:2]) in at else e["loc"],
            "input": e["input"],
            **({"ctx": e["ctx"]} if "ctx" in e else {}),
        }
        for e in errors
    ]
    return ValidationError.from_exception_data(exc.title, details)


def _part(model: type[BaseModel], value: dict[str, Any], prefix: str) -> tuple[Any, list[FieldProblem]]:
    """`model` from the mapping given for the spec field `prefix` (one branch of a union: a number or a
    mapping), or its problems, each message naming `prefix.field` (an unknown key: the model's fields)."""
    try:
        return model.model_validate(value), []
    except ValidationError as exc:
        problems = []
        for err, p in zip(exc.errors(), format_validation_error(exc), strict=True):
            message = p["message"]
            if err["type"] == "extra_forbidden":
                message = f"unknown field {p['field']!r}; valid fields: {', '.join(model.model_fields)}"
            if not message.startswith(f"{prefix}."):
                message = f"{prefix}.{p['field']}: {message}"
            problems.append(FieldProblem(p["field"], message, p.get("value")))
        return None, problems


@functools.lru_cache(maxsize=64)
def _lattice(min_size: int, max_size: int, resolution: float, workers: int) -> tuple[int, ...]:
    return tuple(lattice(min_size, max_size, resolution, workers))


def _read(text_or_path: str | os.PathLike[str]) -> tuple[str, str]:
    if isinstance(text_or_path, os.PathLike):
        p = Path(text_or_path)
    elif isinstance(text_or_path, str) and "\n" not in text_or_path and os.path.isfile(text_or_path):
        p = Path(text_or_path)
    elif isinstance(text_or_path, str):
        return text_or_path, ""
    else:
        raise SpecLoadError(f"expected spec text or a path, got {type(text_or_path).__name__}")
    try:
        return p.read_text(encoding="utf-8"), f" in {str(p)!r}"
    except OSError as exc:
        raise SpecLoadError(f"cannot read spec file {str(p)!r}: {exc}") from None


# --------------------------------------------------------------------------------------------------
# Errors for people and machines
# --------------------------------------------------------------------------------------------------


def format_validation_error(exc: ValidationError) -> list[dict[str, Any]]:
    """`[{"field": "lr.min", "message": "...", "value": ...}, ...]`, one entry per refusal.

    `field` is a dotted path into the spec (list items by index: "optimizers.1.name"); "total_trials"
    for the trial cap. `value` is the refused value, made JSON-safe (repr() where it is not) and cut to
    an excerpt of `EXCERPT_CHARS` where long; keys in `field` are cut too. Unknown keys get the closest
    valid field name as a suggestion.
    """
    out: list[dict[str, Any]] = []
    for err in exc.errors():
        loc = ".".join(_key(p) for p in err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SpecError):
            for p in cause.problems:
                field = ".".join(s for s in (loc, ".".join(_key(k) for k in p.field.split("."))) if s)
                out.append(problem(field, p.message, p.value))
            continue
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if err["type"] == "extra_forbidden":
            message = _unknown_field_message(err["loc"])
        out.append(problem(loc, message, err.get("input")))
    return out


_KEY_CHARS = 40  # of one key in a field path: keys are the client's


def _key(part: Any) -> str:
    """One step of a field path; a long key is cut."""
    text = str(part)
    return text if len(text) <= _KEY_CHARS else text[:_KEY_CHARS] + "..."


def _unknown_field_message(loc: tuple[Any, ...]) -> str:
    valid = _fields_at(loc[:-1])
    key = str(loc[-1])
    message = f"unknown field {excerpt(key)}"
    if valid:
        close = difflib.get_close_matches(key, valid, n=1)
        if close:
            message += f"; did you mean {close[0]!r}"
        message += f"; valid fields: {', '.join(valid)}"
    return message


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model at `loc` inside a SweepSpec (list indices skipped); [] if unknown."""
    model: Any = SweepSpec
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = _model_of(field.annotation)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def problem(field: str, message: str, value: Any = None) -> dict[str, Any]:
    """One problem as a 422 names it: the field, what is wrong with it, and the value given (`json_value`)."""
    return {"field": field, "message": message, "value": json_value(value)}


def json_value(value: Any) -> Any:
    """`value` when it is JSON and short; else an excerpt (never the whole of a long value)."""
    if isinstance(value, str):
        return value if len(value) <= EXCERPT_CHARS else f"{value[:EXCERPT_CHARS]}... ({len(value)} characters)"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    try:
        dumped = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return excerpt(value)
    return value if len(dumped) <= EXCERPT_CHARS else excerpt(value)
