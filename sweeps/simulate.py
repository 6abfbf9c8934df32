"""Rehearse a sweep without Ray and without training: the sweep's own decisions against a model of the problem.

    from sweeps.simulate import simulate
    result = simulate(spec, objective, seed=0)   # spec: a SweepSpec
    result.report          # the same Report a real sweep writes
    result.tokens_trained  # every trial's tokens, pruned trials to where they stopped
    result.trials          # how many trials it ran

`objective(run)` is called once per trial. `run` (a `Run`) has `.optimizer`, `.batch_size`, `.lr`,
`.seed` and `.eval_tokens`: the token counts at which the trial evaluates (the loop's evaluation
steps x tokens per step, from the spec's own `TrainConfig`), ending at the trial's budget; and
`.warmup_tokens`, the tokens its lr warm-up spans (a spec with `schedule.warmup_search` tries several
at each batch size's best lr). It returns
the val losses at those counts, in order; `inf` or `nan` means the run diverged there (the trial ends
at that evaluation, status `diverged`; the losses may stop there). A run that diverges at its first
evaluation reports no loss at all, as a real run that diverges before its first evaluation.

What runs is the driver's exact decision code: `sweeps.search.CellSearcher` (the line search, warm
starts, confirmation seeds, adaptive confirmation) and `PerCellASHA` (pruning), called as Ray Tune's
controller calls them (`suggest`; per result Tune's own check that it carries the metric, then
`PerCellASHA.on_trial_result`, then
`CellSearcher.on_trial_result` unless the trial is stopped; a result with `done` ends the trial without
asking the scheduler; an end calls both `on_trial_complete`s), against an in-memory Optuna storage;
then `collect_results` and `build_report` make the report, with the driver's warnings about lrs at the
edge of the range. Only training is replaced: `max_concurrent_trials` trials run at a time in simulated
time, each taking its tokens of time (a trial that reaches an evaluation at tokens t has run t units).

`simulate_study(study, objective, seed)` rehearses a study (`sweeps.study.StudySpec`) the same way, scale by
scale, smallest first; `Run.params` and `Run.eval_tokens[-1]` tell the objective the scale.

This signature is public and stable: benchmarks and outside checks of the method call it.
`objective_trial(spec, objective)` gives the real driver (`run_sweep(..., trial_fn=...)`) the same
objective in place of training; tests/sweeps/test_simulate_vs_tune.py shows the two agree on every trial,
verdict and answer, divergences before the first evaluation included.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweeps.analysis import Report, TrialResult, lr_edge_warnings
from sweeps.layout import VAL_LOSS
from sweeps.spec import SweepSpec
from worker.session import run_result

__all__ = ["Objective", "Run", "SimulationResult", "StudySimulation", "objective_trial", "simulate", "simulate_study"]


@dataclass(frozen=True)
class Run:
    """One trial as the objective sees it."""

    optimizer: str
    batch_size: int
    lr: float
    seed: int  # 0: a search trial; 1, 2, ...: confirmation runs (the same seed has the same init and data order)
    eval_tokens: tuple[int, ...]  # tokens seen at each evaluation, ascending; the last is the trial's budget
    # "search" (chooses the lr), "warmup" (another warm-up at the best lr) or "confirm" (a confirmation run)
    role: str = "search"
    warmup_tokens: int = 0  # tokens of the linear warm-up (worker.schedule.warmup_steps x tokens per step)
    params: int = 0  # the model's parameters at the sweep's vocabulary: a study's scale (with eval_tokens[-1])


Objective = Callable[[Run], Sequence[float]]


@dataclass
class SimulationResult:
    report: Report  # the Report (sweeps.analysis) a real sweep of the spec would write; it also reads by key
    tokens_trained: int  # summed over trials: pruned ones to the evaluation where ASHA stopped them
    trials: int  # trials run
    results: list[TrialResult] = field(default_factory=list)  # what the analysis judged
    # simulated wall time: when the last trial ended, in tokens of one trial's training (a trial that
    # trains t tokens takes t units; `max_concurrent_trials` run at once)
    wall_tokens: int = 0


class _Trial:
    """What Tune's schedulers read of a `ray.tune.experiment.Trial`: its id and config."""

    def __init__(self, trial_id: str, config: dict[str, Any]) -> None:
        self.trial_id = trial_id
        self.config = config

    def __repr__(self) -> str:
        return f"SimulatedTrial({self.trial_id})"


def eval_steps(total_steps: int, every: int) -> list[int]:
    """The steps at which `worker.loop.train` evaluates: every `every` steps, and the last step."""
    return [s for s in range(1, total_steps + 1) if s % every == 0 or s == total_steps]


def reports_of(run: Run, losses: Sequence[float], tokens_per_step: int) -> list[dict[str, Any]]:
    """The results `worker.loop.train` would report for these losses, in order, built by the loop's own
    `worker.session.run_result`; the last has `done`. A non-finite loss ends the run there, `diverged`,
    its val loss NaN, as the loop ends it; `losses` may stop at that evaluation (fewer losses than
    evaluations, the last non-finite) but must otherwise hold one per evaluation."""
    finite_end = len(losses) < len(run.eval_tokens) and (not losses or math.isfinite(losses[-1]))
    if len(losses) > len(run.eval_tokens) or finite_end:
        raise ValueError(
            f"the objective must return one val loss per evaluation ({len(run.eval_tokens)} for "
            f"{run.optimizer} bs={run.batch_size} lr={run.lr:.3g} seed={run.seed}), or fewer ending in "
            f"inf or nan (diverged there), got {len(losses)}" + (f" ending in {losses[-1]}" if losses else "")
        )
    out: list[dict[str, Any]] = []
    last: dict[str, Any] = {}
    for tokens, loss in zip(run.eval_tokens, losses, strict=False):
        step = tokens // tokens_per_step
        if not math.isfinite(loss):
            out.append(run_result(last, tokens=tokens, step=step, status="diverged"))
            return out
        last = {VAL_LOSS: float(loss)}
        status = "completed" if tokens == run.eval_tokens[-1] else "running"
        out.append(run_result(last, tokens=tokens, step=step, status=status))
    return out


def run_of(spec: SweepSpec, config: dict[str, Any]) -> tuple[Run, int]:
    """The trial `config` (what `CellSearcher.suggest` gave) as the objective sees it, and its tokens per step."""
    train = spec.train_config(
        config["optimizer"], int(config["batch_size"]), float(config["lr"]), 0, warmup=config["warmup"]
    )
    run = Run(
        optimizer=config["optimizer"],
        batch_size=int(config["batch_size"]),
        lr=float(config["lr"]),
        seed=int(config["seed"]),
        eval_tokens=tuple(s * train.tokens_per_step for s in eval_steps(train.total_steps, train.eval_interval_steps)),
        role=str(config["role"]),
        warmup_tokens=train.warmup_total_steps * train.tokens_per_step,
        params=spec.model.parameters(spec.data.vocab_size),
    )
    return run, train.tokens_per_step


def objective_trial(spec: SweepSpec, objective: Objective) -> Callable[[dict[str, Any]], None]:
    """A Tune function trainable that reports, for each trial, what `objective` says (`reports_of`): the
    real path (`sweeps.driver.run_sweep(..., trial_fn=...)`, Ray Tune, the recorder) with only training
    replaced, so a test can show that it and `simulate` agree on the same objective."""

    def trial(config: dict[str, Any]) -> None:
        from ray import tune

        run, tokens_per_step = run_of(spec, config)
        for result in reports_of(run, objective(run), tokens_per_step):
            tune.report(result)

    return trial


class _ResultChecks:
    """Tune's own check of each result (`TuneController._validate_result_metrics`: the metric that the
    TuneConfig, the scheduler and the searcher name must be in every result, or the whole run ends),
    applied to the simulated results with the controller's own code."""

    def __init__(self, scheduler: Any, searcher: Any) -> None:
        from ray.tune.execution.tune_controller import TuneController
        from ray.tune.utils import flatten_dict

        from sweeps.scheduler import METRIC

        self._metric, self._scheduler_alg, self._search_alg = METRIC, scheduler, searcher
        self._validate, self._flatten = TuneController._validate_result_metrics, flatten_dict

    def __call__(self, result: dict[str, Any]) -> dict[str, Any]:
        flat = self._flatten(result)
        self._validate(self, flat)  # raises ValueError as a real sweep's controller does
        return flat


def simulate(spec: SweepSpec, objective: Objective, seed: int = 0) -> SimulationResult:
    """Run the sweep of `spec` against `objective` (see the module); `seed` seeds the search's sampler."""
    import optuna
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler
    from ray.tune.search import Searcher

    from sweeps.scheduler import METRIC, MODE, make_scheduler
    from sweeps.search import CellSearcher, collect_results

    searcher = CellSearcher(spec, f"{spec.name}-simulated", optuna.storages.InMemoryStorage(), seed=seed)
    scheduler = make_scheduler(spec) or FIFOScheduler()  # as sweeps.driver.run_sweep builds it
    # as Tune's controller sets both up from the TuneConfig's metric and mode
    searcher.set_search_properties(METRIC, MODE, {})
    scheduler.set_search_properties(METRIC, MODE)
    checked = _ResultChecks(scheduler, searcher)
    slots = spec.resources.max_concurrent_trials
    order = itertools.count()  # ties in time go to the trial started (or reporting) first
    events: list[tuple[int, int, str, int]] = []  # (simulated time, tie, trial id, report index)
    live: dict[str, tuple[_Trial, list[dict[str, Any]], int]] = {}  # id -> (trial, its reports, start time)
    clock, tokens, launched, finished = 0, 0, 0, False
    while True:
        while not finished and len(live) < slots:
            trial_id = f"trial_{launched:05d}"
            config = searcher.suggest(trial_id)
            if config is None:
                break  # waiting: Tune asks again after the next event
            if config == Searcher.FINISHED:
                finished = True
                break
            run, tokens_per_step = run_of(spec, config)
            reports = reports_of(run, objective(run), tokens_per_step)
            trial = _Trial(trial_id, config)
            scheduler.on_trial_add(None, trial)
            live[trial_id] = (trial, reports, clock)
            heapq.heappush(events, (clock + reports[0]["tokens"], next(order), trial_id, 0))
            launched += 1
        if not events:
            if finished:
                break
            raise RuntimeError(f"the searcher suggests nothing and no trial runs ({launched} trials so far)")
        clock, _, trial_id, i = heapq.heappop(events)
        trial, reports, started = live[trial_id]
        result = checked(dict(reports[i], trial_id=trial_id))
        decision = TrialScheduler.STOP if result["done"] else scheduler.on_trial_result(None, trial, result)
        if decision == TrialScheduler.STOP:
            scheduler.on_trial_complete(None, trial, result)
            searcher.on_trial_complete(trial_id, result)
            tokens += int(result["tokens"])
            del live[trial_id]
        else:
            searcher.on_trial_result(trial_id, result)
            heapq.heappush(events, (started + reports[i + 1]["tokens"], next(order), trial_id, i + 1))
    results, _ = collect_results(searcher)
    report = searcher.report()
    report.warnings = [*report.warnings, *lr_edge_warnings(report)]
    return SimulationResult(report=report, tokens_trained=tokens, trials=launched, results=results, wall_tokens=clock)


@dataclass
class StudySimulation:
    """A study rehearsed (`simulate_study`): each scale's sweep spec and its `SimulationResult`, smallest first."""

    scales: list[tuple[SweepSpec, SimulationResult]]
    target: SweepSpec | None = None  # the study's target spec: where `laws` predicts
    # `confirm: true`: the confirmation sweep at the target (`sweeps.study.confirm_spec`, from the laws
    # against `confirm_against`) and its result; None without one
    confirmation: tuple[SweepSpec, SimulationResult] | None = None

    @property
    def tokens_trained(self) -> int:
        return sum(r.tokens_trained for _, r in self.scales)

    def laws(self, against: str = "baseline") -> list[Any]:
        """The study's laws (`sweeps.law.study_laws`) at its target, as `sweeps study` fits them."""
        from sweeps.study import fit_laws

        if self.target is None:
            raise ValueError("a StudySimulation without its target has no laws: simulate_study sets it")
        return fit_laws(self.target, [(spec, r.report) for spec, r in self.scales], against)

    def confirmed(self, against: str = "baseline") -> list[Any]:
        """The laws judged against the confirmation sweep (`sweeps.law.confirm_laws`); [] without one."""
        from sweeps.law import confirm_laws

        if self.confirmation is None:
            return []
        return confirm_laws(self.laws(against), self.confirmation[1].report)

    def law(self, optimizer: str, against: str = "baseline") -> Any:
        """`optimizer`'s batch law from the scales' brackets (`sweeps.law.fit_batch_law`: a `BatchLaw`, or why
        none), in the model size too where the scales have two or more."""
        from sweeps.law import fit_batch_law, scale_of
        from sweeps.study import law_params

        params = law_params([spec for spec, _ in self.scales])
        return fit_batch_law(
            [scale_of(r.report, optimizer, against, p) for (_, r), p in zip(self.scales, params, strict=True)]
        )


def simulate_study(
    study: Any, objective: Objective, seed: int = 0, confirm_against: str = "baseline"
) -> StudySimulation:
    """Rehearse a study (a `sweeps.study.StudySpec`) as `sweeps study` runs it: each scale's sweep, smallest
    first, through `simulate` against one `objective` for every scale (its `Run` says the scale: the model's
    `params` and the budget, `eval_tokens[-1]`), so that a law the objective holds can be fitted back
    (`StudySimulation.law`); with the study's `transfer`, each scale starts where the smaller ones predict
    (`sweeps.study.transferred`); with its `confirm`, the confirmation sweep at the target follows
    (`StudySimulation.confirmed`). `seed` seeds the first scale's sampler, the next scales' seed + 1, ..."""
    from sweeps.study import confirm_spec, transferred

    scales: list[tuple[SweepSpec, SimulationResult]] = []
    for i, spec in enumerate(study.sweep_specs()):
        if study.transfer:
            spec = transferred(spec, [(s, r.report) for s, r in scales])
        scales.append((spec, simulate(spec, objective, seed + i)))
    rehearsed = StudySimulation(scales, target=study.target_spec())
    if study.confirm:
        confirm = confirm_spec(study, rehearsed.laws(confirm_against))
        if not isinstance(confirm, str):
            rehearsed.confirmation = (confirm, simulate(confirm, objective, seed + len(scales)))
    return rehearsed
