"""What the analysis reads of each trial: its result (`TrialResult`, as the recorder and the search build
it). The rest it reads of the sweep's `SweepSpec` itself (`sweeps.analysis.build_report`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from sweeps.layout import role_of
from sweeps.status import RESULT_STATUSES

# "search": chooses the lr; "warmup": at the best lr with another warm-up (the spec's schedule.warmup_search);
# "confirm": a confirmation run at the best lr and warm-up
ROLES = ("search", "confirm", "warmup")
STATUSES = tuple(str(s) for s in RESULT_STATUSES)  # the statuses a trial of the analysis may have


@dataclass(frozen=True)
class TrialResult:
    """One finished trial. `val_loss` is the final val loss (required when completed);
    `curve` holds (tokens seen, val loss) at each evaluation."""

    optimizer: str
    batch_size: int
    lr: float
    seed: int
    role: Literal["search", "confirm", "warmup"]
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
        """A result from its dict (`to_dict`), its role as `sweeps.layout.role_of` reads it."""
        fields = {**d, "curve": tuple(tuple(p) for p in d.get("curve", ()))}
        if (role := role_of(d.get("role"))) is not None:
            fields["role"] = str(role)
        return cls(**fields)

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
