"""Recorded real runs as a problem for `sweeps.simulate`: the objective and the truth, from a dense grid.

    rec = Recording.load("benchmarks/real_runs/nano-t64.jsonl")   # benchmarks/record_runs.py made it
    result = simulate(spec, replay_objective(rec), seed=0)        # spec: the recording's configuration
    truth = rec.truth(tolerance=0.01, baseline="adamw")           # {optimizer: {"self": B, "baseline": B}}

A recording holds, per optimizer and batch size, real runs at a grid of lrs and several seeds each: the val
loss at every evaluation and whether the run diverged (`benchmarks/record_runs.py`). `replay_objective`
answers any (optimizer, batch size, lr, seed) a sweep asks for:

- the seed: recorded seed `seed mod n`, n the seeds recorded at both neighbouring lrs (or at the lr), so
  that one seed is one initialisation and data order across lrs (as in real training) and a confirmation
  run's noise is real seed noise;
- the lr: a recorded lr replays its own runs (seed `seed mod n`, n its seeds); another, the curves of that
  seed at the two recorded lrs around it, interpolated linearly in ln lr at each evaluation; outside the
  recorded lrs, the nearest recorded lr's curve;
- divergence: where the recorded run at the nearer of the two lrs (in ln lr) diverged, the run diverges
  at the same evaluation; where only the farther one did, it trains (the edge lies between them).

The truth is the answer the grid supports with the analysis's rule (`largest_degradation_free`): per cell,
the lowest mean final loss over the recorded lrs at which no seed diverged, and of those only lrs with the
cell's most seeds (phase 2's `best_seeds`) where any lr has more than the rest, so that the noise of the
cell's optimum is averaged over many seeds. `Recording.split` separates the seeds a sweep plays from seeds
held out for the truth (the recorder's phase 3): judged on the held-out ones, the truth shares no noise with
the runs a sweep or a peer replays.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Recording", "largest_degradation_free", "replay_objective"]


def largest_degradation_free(
    losses: Sequence[float], reference: float, tolerance: float, *, first_is_reference: bool
) -> int | None:
    """Index of the answer (`sweeps.analysis`'s rule): the last index i such that every cell up to i
    has loss <= (1 + tolerance) x reference; the reference cell itself passes by definition."""
    answer = None
    for i, loss in enumerate(losses):
        if not ((i == 0 and first_is_reference) or loss <= (1.0 + tolerance) * reference):
            break
        answer = i
    return answer


@dataclass(frozen=True)
class Recorded:
    """One recorded run: its val loss at each evaluation, and where it diverged (None: it completed)."""

    curve: tuple[tuple[int, float], ...]  # (tokens, val loss), ascending in tokens
    diverged_at: int | None  # tokens

    @property
    def final(self) -> float:
        return self.curve[-1][1] if self.diverged_at is None and self.curve else math.inf

    def loss_at(self, tokens: int) -> float:
        """The val loss at an evaluation; inf from the first evaluation at or past where it diverged."""
        if self.diverged_at is not None and tokens >= self.diverged_at:
            return math.inf
        for t, loss in self.curve:
            if t == tokens:
                return loss
        raise KeyError(f"no evaluation at {tokens} tokens was recorded (evaluations at {[t for t, _ in self.curve]})")


@dataclass
class Recording:
    """(optimizer, batch size) -> lr -> seed -> Recorded."""

    cells: dict[tuple[str, int], dict[float, dict[int, Recorded]]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        cells: dict[tuple[str, int], dict[float, dict[int, Recorded]]] = defaultdict(lambda: defaultdict(dict))
        for line in Path(path).read_text().splitlines():
            try:
                run = json.loads(line)
            except json.JSONDecodeError:  # a last line cut short by a killed recorder
                continue
            diverged = run["status"] == "diverged"
            rec = Recorded(
                tuple((int(t), float(v)) for t, v in run["curve"]), int(run["stopped_at"]) if diverged else None
            )
            cells[(run["optimizer"], int(run["batch_size"]))][float(run["lr"])][int(run["seed"])] = rec
        return cls({k: dict(v) for k, v in cells.items()})

    def split(self, held_out_from: int) -> tuple[Recording, Recording]:
        """(the runs of seeds below `held_out_from`, the runs of the others): the seeds sweeps play, and those
        held out for the truth. An lr with no run on one side is absent from that side."""
        played: dict[tuple[str, int], dict[float, dict[int, Recorded]]] = {}
        held: dict[tuple[str, int], dict[float, dict[int, Recorded]]] = {}
        for key, by_lr in self.cells.items():
            for lr, by_seed in by_lr.items():
                for seed, run in by_seed.items():
                    side = played if seed < held_out_from else held
                    side.setdefault(key, {}).setdefault(lr, {})[seed] = run
        return Recording(played), Recording(held)

    @property
    def optimizers(self) -> list[str]:
        return sorted({o for o, _ in self.cells})

    def batch_sizes(self, optimizer: str) -> list[int]:
        return sorted(b for o, b in self.cells if o == optimizer)

    def run(self, optimizer: str, batch_size: int, lr: float, seed: int) -> Any:
        """The replayed run's val losses as a function of tokens (`replay_objective`'s rule)."""
        by_lr = self.cells[(optimizer, batch_size)]
        lrs = sorted(by_lr)
        i = bisect.bisect_left(lrs, lr)
        exact = next((x for x in lrs[max(0, i - 1) : i + 1] if math.isclose(x, lr, rel_tol=1e-6)), None)
        if exact is not None or i == 0 or i == len(lrs):
            near = exact if exact is not None else (lrs[0] if i == 0 else lrs[-1])
            seeds = sorted(by_lr[near])  # every seed recorded there: phase 2's many at a cell's best lrs
            return by_lr[near][seeds[seed % len(seeds)]].loss_at
        lo, hi = lrs[i - 1], lrs[i]
        common = sorted(set(by_lr[lo]) & set(by_lr[hi]))
        s = common[seed % len(common)]
        a, b = by_lr[lo][s], by_lr[hi][s]
        w = (math.log(lr) - math.log(lo)) / (math.log(hi) - math.log(lo))  # 0 at lo, 1 at hi
        nearer = a if w < 0.5 else b

        def loss_at(tokens: int) -> float:
            if nearer.diverged_at is not None:
                return nearer.loss_at(tokens)
            la, lb = a.loss_at(tokens), b.loss_at(tokens)
            if not math.isfinite(la):
                return lb
            if not math.isfinite(lb):
                return la
            return (1 - w) * la + w * lb

        return loss_at

    def best(self, optimizer: str, batch_size: int) -> tuple[float, float]:
        """(lr, mean final loss) of the cell's optimum (the module docstring's rule); (nan, inf) if none."""
        by_lr = self.cells[(optimizer, batch_size)]
        most = max(len(s) for s in by_lr.values())
        stable = {
            lr: statistics.fmean(r.final for r in seeds.values())
            for lr, seeds in by_lr.items()
            if len(seeds) == most and all(r.diverged_at is None for r in seeds.values())
        }
        if not stable:
            return math.nan, math.inf
        lr = min(stable, key=lambda k: stable[k])
        return lr, stable[lr]

    def truth(
        self, tolerance: float, baseline: str, optimizers: Sequence[str] | None = None
    ) -> dict[str, dict[str, int | None]]:
        """{optimizer: {"self": B, "baseline": B}}: the answer the grid supports against the optimizer's own
        smallest batch size and against the baseline's."""
        base_sizes = self.batch_sizes(baseline)
        base_ref = self.best(baseline, base_sizes[0])[1]
        out: dict[str, dict[str, int | None]] = {}
        for opt in optimizers or self.optimizers:
            sizes = self.batch_sizes(opt)
            losses = [self.best(opt, b)[1] for b in sizes]
            answers: dict[str, int | None] = {}
            for name, ref, is_ref in (("self", losses[0], True), ("baseline", base_ref, opt == baseline)):
                i = largest_degradation_free(losses, ref, tolerance, first_is_reference=is_ref)
                answers[name] = sizes[i] if i is not None else None
            out[opt] = answers
        return out


def replay_objective(recording: Recording, seed_offset: int = 0) -> Any:
    """An objective for `sweeps.simulate.simulate`: a run's val losses at its evaluations, from the
    recording; it stops after the first inf (the run diverged there). `seed_offset` shifts which recorded
    seed a sweep's seed replays (seed s plays recorded seed (s + offset) mod n): another draw of the same
    problem's noise."""

    def objective(run: Any) -> list[float]:
        loss_at = recording.run(run.optimizer, run.batch_size, run.lr, run.seed + seed_offset)
        out: list[float] = []
        for tokens in run.eval_tokens:
            out.append(loss_at(tokens))
            if not math.isfinite(out[-1]):
                break
        return out

    return objective
