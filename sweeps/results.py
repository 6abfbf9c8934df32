"""What the analysis reads: each trial's result (`TrialResult`, as the recorder and the search build
them) and the spec's numbers it judges by (`AnalysisInput`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from sweeps.status import RESULT_STATUSES

# "search": chooses the lr; "warmup": at the best lr with another warm-up (the spec's schedule.warmup_search);
# "seed": a confirmation run at the best lr and warm-up
ROLES = ("search", "seed", "warmup")
STATUSES = tuple(str(s) for s in RESULT_STATUSES)  # the statuses a trial of the analysis may have


@dataclass(frozen=True)
class TrialResult:
    """One finished trial. `val_loss` is the final val loss (required when completed);
    `curve` holds (tokens seen, val loss) at each evaluation."""

    optimizer: str
    batch_size: int
    lr: float
    seed: int
    role: Literal["search", "seed", "warmup"]
    status: Literal["completed", "pruned", "diverged", "failed"]
    val_loss: float | None
    tokens: int
    steps: int
    curve: tuple[tuple[int, float], ...] = field(default=())
    number: int | None = None  # Optuna trial number in its cell's study: tie-breaks, and the report names it
    run_id: str | None = None  # MLflow run id: the report names it
    # the warm-up it trained with, in the spec's unit (schedule.warmup_unit); None: the spec's own
    warmup: int | float | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got role={self.role!r}")
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got status={self.status!r}")
        if not self.batch_size > 0:
            raise ValueError(f"batch_size must be > 0, got batch_size={self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got lr={self.lr}")
        if self.status == "completed" and (self.val_loss is None or not math.isfinite(self.val_loss)):
            raise ValueError(f"a completed trial needs a finite val_loss, got val_loss={self.val_loss}")
        object.__setattr__(self, "curve", tuple((int(t), float(v)) for t, v in self.curve))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        return cls(**{**d, "curve": tuple(tuple(p) for p in d.get("curve", ()))})

    def to_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "seed": self.seed,
            "role": self.role,
            "status": self.status,
            "val_loss": self.val_loss,
            "tokens": self.tokens,
            "steps": self.steps,
            "curve": [list(p) for p in self.curve],
            "number": self.number,
            "run_id": self.run_id,
            "warmup": self.warmup,
        }


@dataclass(frozen=True)
class AnalysisInput:
    """The spec's numbers the analysis needs (`from_spec` takes them from a `SweepSpec`)."""

    sweep: str
    batch_sizes: tuple[int, ...]
    optimizers: tuple[str, ...]
    baseline: str
    tolerance: float
    lr_min: float
    lr_max: float
    seeds: int  # confirmation runs planned per cell
    seq_len: int
    trained_tokens: int | None = None  # tokens every trial trains on (the spec's token_budget, rounded once)
    # planned looks at each boundary verdict (adaptive confirmation: 1 + (max - min) / step); each
    # noise check is a Welch interval at 1 - 0.05 / noise_looks (Bonferroni)
    noise_looks: int = 1
    lr_extend: float = 1.0  # the search may step past [lr_min, lr_max] by this factor (the spec's lr.extend)
    warmup: str = ""  # how the lr warms up (the spec's schedule, in words): reported
    # a search of the batch axis (the spec's BatchSearchSpec, as a dict, with its "lattice"): batch_sizes is
    # then the lattice, each optimizer's cells are the sizes it tested, and every verdict is made at the
    # level that holds for all the lattice's sizes (the search chooses which to test from the verdicts)
    batch_search: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_sizes", tuple(int(b) for b in self.batch_sizes))
        object.__setattr__(self, "optimizers", tuple(self.optimizers))
        b = self.batch_sizes
        if not b or any(x <= 0 for x in b) or any(b[i] <= b[i - 1] for i in range(1, len(b))):
            raise ValueError(f"batch_sizes must be non-empty, > 0 and strictly increasing, got {list(b)}")
        if not self.optimizers or len(set(self.optimizers)) != len(self.optimizers):
            raise ValueError(f"optimizers must be non-empty and distinct, got {list(self.optimizers)}")
        if self.baseline not in self.optimizers:
            raise ValueError(f"baseline={self.baseline!r} is not among optimizers {list(self.optimizers)}")
        if not self.tolerance >= 0:
            raise ValueError(f"tolerance must be >= 0, got tolerance={self.tolerance}")
        if not 0 < self.lr_min < self.lr_max:
            raise ValueError(f"need 0 < lr_min < lr_max, got lr_min={self.lr_min}, lr_max={self.lr_max}")
        if not self.lr_extend >= 1.0:
            raise ValueError(f"lr_extend must be >= 1, got lr_extend={self.lr_extend}")
        if self.seeds < 1 or self.seq_len < 1:
            raise ValueError(f"seeds and seq_len must be >= 1, got seeds={self.seeds}, seq_len={self.seq_len}")

    @classmethod
    def from_spec(cls, spec: Any) -> AnalysisInput:
        """From a `sweeps.spec.SweepSpec` (duck-typed: this module does not import the spec)."""
        return cls(
            sweep=spec.name,
            optimizers=tuple(o.name for o in spec.optimizers),
            baseline=spec.degradation.baseline,
            tolerance=spec.degradation.tolerance,
            lr_min=spec.lr.min,
            lr_max=spec.lr.max,
            seeds=spec.seeds_min,
            seq_len=spec.model.seq_len,
            trained_tokens=spec.trained_tokens,
            noise_looks=spec.noise_looks,
            lr_extend=spec.lr.extend,
            warmup=spec.schedule.describe_warmup(),
            batch_sizes=tuple(spec.lattice),
            batch_search=None
            if spec.batch_search is None
            else {**spec.batch_search.model_dump(mode="json"), "lattice": list(spec.lattice)},
        )

    @property
    def lr_bounds(self) -> tuple[float, float]:
        """The lrs the search could reach: [lr_min / lr_extend, lr_max x lr_extend]."""
        return self.lr_min / self.lr_extend, self.lr_max * self.lr_extend


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------
