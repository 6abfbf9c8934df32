"""The report of a sweep, as pydantic models: what `sweeps.analysis.build_report` returns,
`report_to_json` writes (report.json) and `read_report` reads back, and every page and tool reads."""

from __future__ import annotations

import json
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

Verdict = Literal["fine", "degraded", "undecided"]

T = TypeVar("T")


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ByReference(_Schema, Generic[T]):
    """One value per reference: "self" (the optimizer at the reference batch) and "baseline"."""

    self: T
    baseline: T


class TrialStatusCounts(_Schema):
    completed: int
    pruned: int
    diverged: int
    failed: int


class NoiseCheck(_Schema):
    """d = mean(B) - (1 + tol) x reference mean at one boundary cell, with its Welch 95% interval."""

    batch_size: int
    diff_mean: float
    diff_ci95: tuple[float, float] | None  # None: fewer than 2 samples in B or in the reference cell
    straddles_zero: bool | None


class Bracket(_Schema):
    """The answer with its confidence (`verdict_rule`): the largest degradation-free batch size lies in
    [largest_fine, smallest_degraded); either end None where no tested batch size decided it."""

    largest_fine: int | None = None  # every batch size up to it is fine with confidence
    smallest_degraded: int | None = None  # degraded with confidence, above largest_fine
    contradictions: list[int] = []  # batch sizes found fine above a degraded one: degradation was not monotone
    # smallest_degraded was tried at a second lr too (a check, or a run that diverged above its lr); False: its
    # verdict holds at its chosen lr; None: no smallest_degraded, or a report written before
    lr_checked: bool | None = None


# Every ByReference of the report parametrized here, at module level, where pydantic registers the class as
# a name of this module: a Report then pickles (a process pool's result, a Ray object); a class parametrized
# while pydantic builds a model's fields is registered nowhere, and pickle cannot find it
for _value in (
    float | None,
    int | None,
    bool | None,
    Verdict | None,
    tuple[float, float] | None,
    Bracket,
    list[NoiseCheck],
):
    _parametrized = ByReference[_value]
del _value, _parametrized


class LrCheck(_Schema):
    """A cell's second lr (`sweeps.plan.check_lr`) and the confirmation seeds run there: a verdict the answer
    rests on, or a best lr at a stability cliff (the other of the search's best two), is not left to one
    lr. Of the two, the better judges the cell (`verdict_rule`): where every run at the second lr completed
    with a lower mean on the seeds both ran, the two swap, and best_lr, the runs and the loss are that lr's
    (`searched`: this lr was the search's own pick)."""

    lr: float
    search_val_loss: float  # the search's own run there (seed 0)
    val_losses: list[float]  # its completed confirmation runs, by seed (none: not checked)
    runs: int  # every confirmation run there, any status
    diverged: int
    searched: bool = False  # the search picked this lr; the runs at best_lr read lower, so best_lr judges the cell


class CellReport(_Schema):
    batch_size: int
    best_lr: float | None  # None: no completed search trial
    # the search's own run at best_lr (seed 0): where it chose the lr, biased low (a minimum); never in the
    # statistics
    search_best_val_loss: float | None
    search_best_run_id: str | None  # MLflow run id of the best search trial
    search_best_trial_number: int | None  # its Optuna trial number in the cell's study
    val_loss_mean: float | None  # mean over the completed confirmation runs
    val_loss_ci95: tuple[float | None, float | None]  # [mean, mean] with one run; [None, None] without a mean
    ci_available: bool  # at least 2 confirmation runs completed
    val_losses: list[float]  # the samples: completed confirmation runs at the best lr, by seed
    seeds: int  # len(val_losses)
    confirmation_run_ids: list[str | None]  # MLflow run ids of every confirmation run at the best lr, by seed
    stable: bool | None  # every planned confirmation run completed; None: no best lr
    unstable_reason: str | None  # what diverged, failed or is missing; None when stable
    tokens_trained: int | None  # tokens each completed confirmation run trained on: equal in every cell
    trials: int  # all trials of the cell, search, warm-up and confirmation, any status
    trial_status: TrialStatusCounts  # sums to trials
    lr_at_edge: bool | None  # at the edge of the lr bounds (the optimum may lie beyond); None: no best lr
    lr_outside_range: bool | None = None  # the search stepped past lr.min or lr.max to find it
    # the cell means fitted non-decreasing in batch size per reference (the reference cell and unstable
    # cells left out: None); degradation_free compares these. None in reports written before
    val_loss_fitted: ByReference[float | None] = ByReference(self=None, baseline=None)
    degradation_free: ByReference[bool | None]
    # fine / degraded / undecided with confidence (`verdict_rule`); None without a reference
    verdict: ByReference[Verdict | None] = ByReference(self=None, baseline=None)
    # the paired interval of loss - (1 + tolerance) x reference the verdict rests on (None: not compared)
    verdict_diff_ci: ByReference[tuple[float, float] | None] = ByReference(self=None, baseline=None)
    # a confirmation run diverged at this lr (the lowest such): the cell retreated to best_lr below it
    retreated_from_lr: float | None = None
    # the warm-up of the confirmation runs, in the spec's unit (schedule.warmup_unit); None: no best lr, or a
    # report written before warm-up was recorded
    warmup: int | float | None = None
    # schedule.warmup_search: (warm-up, final val loss of seed 0; None: diverged or failed) of each warm-up
    # tried at best_lr, the spec's own first; empty when warm-up was not searched
    warmups_tried: list[tuple[int | float | None, float | None]] = []
    steps_to_reference: int | None
    tokens_to_reference: int | None
    # why this size was tested: "listed" (a list sweep), or by a search of the batch axis "reference",
    # "step up", "bisect", "speculative" (sweeps/batch_axis.py); None in reports written before
    chosen: str | None = None
    # the cell's second lr and the confirmation runs there (None: no completed search lr within reach)
    lr_check: LrCheck | None = None


class SearchStep(_Schema):
    """One size a search of the batch axis chose, in order, and why (`order` last: report.json's key order)."""

    batch_size: int
    chosen: str  # reference | step up | bisect | speculative
    why: str  # the decision in words: "1920 is fine, nothing degraded yet: x2", "between 1920 (fine) and ..."
    seeds_added: int = 0  # confirmation runs adaptive confirmation added there beyond the first
    order: int  # 1, 2, ...: the order the search chose the sizes in


class BatchSearchReport(_Schema):
    """The spec's search of the batch axis, its lattice and what the answer assumes."""

    min: int
    max: int
    resolution: float
    step: float
    against: str  # the reference the search narrowed the bracket against: "baseline" or "self"
    # where it went after the reference (batch_sizes.start: a study's prediction, per optimizer); None: x step
    start: int | dict[str, int] | None = None
    # more runs where the bracket's ends rest on undecided sizes (a study's sweeps); False in reports before it
    decide_ends: bool = False
    lattice: list[int]  # every size it could test (the token budget is a multiple of their lcm x seq_len)
    assumption: str


class OptimizerReport(_Schema):
    cells: list[CellReport]  # batch size ascending
    reference_val_loss: ByReference[float | None]
    # (1 + tolerance) x the self reference (`self_reference`): the loss a cell must reach to be degradation-free
    # against itself, and the target of steps_to_reference; None without a reference
    target_loss: float | None
    largest_degradation_free_batch_size: ByReference[int | None]  # the point estimate: walk of the means
    bracket: ByReference[Bracket] = ByReference(self=Bracket(), baseline=Bracket())  # what is decided with confidence
    # the bracket's upper end: the smallest batch size degraded with confidence above largest_fine
    smallest_degraded_batch_size: ByReference[int | None] = ByReference(self=None, baseline=None)
    search_steps: list[SearchStep] = []  # a search of the batch axis: the sizes in the order it chose them
    within_noise: ByReference[bool | None]
    noise_checks: ByReference[list[NoiseCheck]]


class Report(_Schema):
    """The sweep's report, as `build_report` makes it and report.json holds it (rules: the module docstring)."""

    schema_version: Literal[3]
    sweep: str
    reference_batch_size: int  # the smallest batch size of the spec (a search's min)
    baseline: str
    tolerance: float
    seq_len: int
    lr_range: tuple[float, float]  # the spec's lr.min, lr.max: where every search starts
    # where the line search could step to past an edge (lr.extend); None in reports written before it
    lr_bounds: tuple[float, float] | None = None
    seeds_planned: int  # confirmation runs planned per cell
    # tokens every trial trains on: the spec's token_budget rounded down once for the whole sweep (the spec's
    # `trained_tokens`)
    trained_tokens: int | None
    noise_rule: str  # how the noise checks are made, and at what level (repeated looks included)
    verdict_rule: str = ""  # how each verdict and the bracket are decided, and what they assume
    warmup: str = ""  # how the lr warmed up, and whether warm-up was searched with it (each cell's warmup)
    batch_search: BatchSearchReport | None = None  # None: the spec listed its batch sizes
    optimizers: dict[str, OptimizerReport]  # in the spec's order
    warnings: list[str] = []  # things a reader must know before trusting the answer


def validate_report(report: dict[str, Any] | Report) -> Report:
    """A report dict of this schema, or a `Report` again (the driver adds its warnings after `build_report`),
    checked against the schema (pydantic ValidationError if it does not match)."""
    return Report.model_validate(report.model_dump(warnings=False) if isinstance(report, Report) else report)


def read_report(raw: dict[str, Any] | Report) -> Report:
    """A report as a reader gets it (report.json, the HTTP API; or a `Report` already): schema 3, or schema 2
    through `upgrade_report`; top-level keys outside the schema, a newer writer's additions, are left out;
    anything else that does not match is refused (pydantic ValidationError)."""
    if isinstance(raw, dict):
        current = upgrade_report(raw) if raw.get("schema_version") == 2 else raw
        return validate_report({k: v for k, v in current.items() if k in Report.model_fields})
    return validate_report(raw)


def upgrade_report(raw: dict[str, Any]) -> dict[str, Any]:
    """A report of schema 2 as the JSON of schema 3: `token_budget` gives way to `trained_tokens` (the same
    value; reports written before that name hold only `token_budget`), and each optimizer gains its
    `target_loss` from its self reference as the report holds it (`self_reference`). Top-level keys outside
    the schema are left out; a report that does not match is refused (pydantic ValidationError)."""
    old = {k: v for k, v in raw.items() if k in Report.model_fields}
    if old.get("trained_tokens") is None:
        old["trained_tokens"] = raw.get("token_budget")
    if isinstance(old.get("optimizers"), dict):
        old["optimizers"] = {
            name: {**opt, "target_loss": None} if isinstance(opt, dict) else opt
            for name, opt in old["optimizers"].items()
        }
    report = Report.model_validate({**old, "schema_version": 3})
    for opt in report.optimizers.values():
        opt.target_loss = target_loss_of(self_reference(opt, report.reference_batch_size), report.tolerance)
    return report.model_dump(mode="json")


def report_to_json(report: dict[str, Any] | Report, *, indent: int | None = 2) -> str:
    """Strict JSON (no NaN/Infinity) of a validated report: what report.json holds."""
    return json.dumps(validate_report(report).model_dump(mode="json"), indent=indent, allow_nan=False)


# ---- quantities read off the report ----------------------------------------------------------------


def target_loss_of(reference: float | None, tolerance: float) -> float | None:
    """(1 + tolerance) x a reference loss: the loss a cell must reach to be degradation-free against it (the
    thresholds of the verdicts, the target of steps_to_reference). None without a reference."""
    return (1.0 + tolerance) * reference if reference is not None else None


def self_reference(opt: OptimizerReport, reference_batch_size: int) -> float | None:
    """The optimizer's "self" reference loss (nats/token) its verdicts compare with: the reference cell's
    fitted value (never above its mean: `sweeps.analysis`), or its mean where the cell has none (an unstable
    reference, a report written before the reference was fitted). None without one."""
    first = next((c for c in opt.cells if c.batch_size == reference_batch_size), None)
    fitted = first.val_loss_fitted.self if first is not None else None
    return fitted if fitted is not None else opt.reference_val_loss.self


def reference_loss(report: Report, optimizer: str, against: str) -> float | None:
    """The reference loss `optimizer`'s verdicts against `against` ("self" or "baseline") compare with: its own
    self reference, or the baseline optimizer's (`self_reference`). None without one."""
    if against not in ("self", "baseline"):
        raise ValueError(f"against must be 'self' or 'baseline', got against={against!r}")
    name = optimizer if against == "self" else report.baseline
    if name not in report.optimizers:
        return None
    return self_reference(report.optimizers[name], report.reference_batch_size)


# ---- the report in words ----------------------------------------------------------------------


def describe_bracket(bracket: Bracket | dict[str, Any]) -> str:
    """The bracket in words, as the CLI, the pages and the dashboard lead with it."""
    b = bracket if isinstance(bracket, Bracket) else Bracket.model_validate(bracket)
    lo, hi = b.largest_fine, b.smallest_degraded
    if lo is not None and hi is not None:
        text = f"fine up to {lo}, degraded from {hi}"
    elif lo is not None:
        text = f"fine up to {lo}; nothing larger decided degraded"
    elif hi is not None:
        text = f"degraded from {hi}; nothing decided fine"
    else:
        text = "undecided: more seeds would decide it"
    if hi is not None and b.lr_checked is False:
        text += " (at its chosen lr; no second lr tried)"
    if b.contradictions:
        text += f" (not monotone: fine again at {', '.join(map(str, b.contradictions))})"
    return text


def lr_edge_warnings(report: Report) -> list[str]:
    """One line per cell whose best lr is at the edge of what the search could reach (`lr_at_edge`: the
    optimum may lie beyond, the cell reads worse than it is), or past lr.min/lr.max (`lr_outside_range`)."""
    out = []
    lo, hi = report.lr_bounds or report.lr_range
    for name, opt in report.optimizers.items():
        for cell in opt.cells:
            where = f"{name} bs={cell.batch_size}: best lr {cell.best_lr:.2e}" if cell.best_lr else ""
            if cell.lr_at_edge:
                out.append(
                    f"{where} is at the edge of the searched range [{lo:.2e}, {hi:.2e}]; widen lr.min/lr.max "
                    f"or lr.extend"
                )
            elif cell.lr_outside_range:
                out.append(f"{where} lies outside lr.min/lr.max: the search stepped past the range to find it")
    return out


def noise_allows(opt: OptimizerReport, ref: str) -> list[int] | None:
    """The batch sizes the seeds cannot tell apart as the answer against `ref` ("self" or "baseline"), where a
    noise check at the boundary straddles zero (`within_noise`): the point estimate; the next size tested
    above it, where its own check straddles (it may be fine too); the size below it, where the estimate's
    check straddles (it may be degraded). None where the boundary is not within noise."""
    if getattr(opt.within_noise, ref) is not True:
        return None
    answer = getattr(opt.largest_degradation_free_batch_size, ref)
    tested = [c.batch_size for c in opt.cells]
    sizes = {answer} if answer is not None else set()
    for check in getattr(opt.noise_checks, ref):
        if not check.straddles_zero:
            continue
        if answer is not None and check.batch_size > answer:
            sizes.add(check.batch_size)
        elif (i := tested.index(check.batch_size)) > 0:
            sizes.add(tested[i - 1])
    return sorted(sizes)


def describe_noise(opt: OptimizerReport, ref: str) -> str | None:
    """`noise_allows` in words, as the CLI and the pages put it beside the bracket: "32 or 64, within noise"."""
    sizes = noise_allows(opt, ref)
    if not sizes:
        return None
    return f"{' or '.join(map(str, sizes))}, within noise"
