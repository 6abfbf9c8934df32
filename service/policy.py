"""What the service accepts: a valid `SweepSpec`, within this deployment's limits and data policy.

`SweepSpec` validates the spec itself (the same rules as `sweeps run`, the same parser:
`sweeps.documents`); on top of it the service caps trials and token budget (settings), allows only the
builtin corpus, files under the configured data roots and the configured HF datasets, and refuses
`data.cache_dir` (it would let a client choose where the cluster writes). Every refusal is a
`{"field", "message", "value"}` problem, as in `sweeps.spec.format_validation_error`; values are cut to
short excerpts, and at most MAX_DETAILS problems are listed.

Cost (`SWEEPS_MAX_GPU_HOURS_PER_SWEEP`, `SWEEPS_MAX_GPU_HOURS_PER_OWNER` over `SWEEPS_GPU_HOURS_WINDOW_S`):
each submit is priced by the dry run's own `sweeps.cost.price`, at its upper bound (`gpu_hours.max`) and at
the dry run's default pricing (`CAP_PRICING`), and the price is stored with the sweep. Over the cap per sweep
is a 422 (`check_sweep_cap`); over the cap per owner, the store refuses the insert (`Store.create`'s budget,
under the same lock as the count of active sweeps) and `over_owner_cap` makes it a 429 with Retry-After.

The cluster (`sweeps.admission`): a spec whose trials no node of the cluster can hold, with the nodes its
autoscaler can add (too little memory for the model, GPUs it has none of, more workers than fit), is a 422
at submit (`check_cluster`), and the dry run says so (`cluster_fit`).

Data roots (`SWEEPS_DATA_ROOTS`): every file a path source would read is resolved (symlinks followed)
and must lie inside a root (worker/sources.py, the rule the worker applies again when it reads). Outside
the roots the answer is the same whether the path exists or not.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from service.errors import Invalid, ServiceError, TooMany, Unsupported, invalid
from service.settings import Settings
from service.store.database import Budget, OverBudget, frees_at, utcnow
from service.verdicts import ClusterFit, GpuHoursCaps
from sweeps.admission import ClusterCapacity, admission_problems, trial_needs
from sweeps.cost import PriceConfig, price
from sweeps.documents import SpecLoadError, parse_document
from sweeps.spec import SweepSpec, format_validation_error
from sweeps.spec import problem as _problem
from sweeps.study import StudySpec, confirm_bound_spec, is_study
from worker.config import corpus_shortfall, split_batch
from worker.messages import excerpt
from worker.sources import OutsideRoots, TooManyEntries, all_files, candidate_files, is_inside, outside

JSON_TYPES = frozenset({"application/json", "text/json"})
YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})

MAX_DETAILS = 20  # problems listed in one answer; the rest are counted
# Entries (files and folders) of one folder source the service walks, a stat each: validation stays
# bounded. A corpus of more files is a job for an HF dataset saved with save_to_disk.
MAX_SOURCE_ENTRIES = 10_000


def parse_body(body: bytes, content_type: str | None) -> Any:
    """The submitted document: JSON by default, YAML when the Content-Type says so."""
    media = (content_type or "application/json").split(";", 1)[0].strip().lower()
    if media not in JSON_TYPES | YAML_TYPES:
        raise Unsupported(
            "unsupported_media_type",
            f"Content-Type {excerpt(media)} is not accepted; send application/json or application/yaml",
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid("the request body is not UTF-8", [_problem("body", "not UTF-8 text")]) from None
    kind = "yaml" if media in YAML_TYPES else "json"
    try:
        data = parse_document(text, kind)
    except SpecLoadError as exc:
        raise invalid(f"the request body is not a valid {kind.upper()} spec", [_problem("body", str(exc))]) from None
    if not isinstance(data, dict):
        raise invalid(
            "a sweep spec is a mapping",
            [_problem("body", f"expected a mapping of spec fields, got {type(data).__name__}", data)],
        )
    return data


def validate_spec(data: dict[str, Any], settings: Settings) -> SweepSpec:
    """The spec, or `Invalid` naming every refused field and its value."""
    try:
        spec = SweepSpec.model_validate(data, context={"max_trials": settings.max_trials})
    except ValidationError as exc:
        raise refused(format_validation_error(exc)) from None
    problems = policy_problems(spec, settings)
    if problems:
        raise refused(problems)
    return spec


def study_sweeps(study: StudySpec) -> list[SweepSpec]:
    """The sweeps `study` may make, as its submit judges and prices them: each scale's, then where it confirms
    its confirmation at most (`sweeps.study.confirm_bound_spec`: the sweep itself comes from the fitted law)."""
    bound = confirm_bound_spec(study)
    return [*study.sweep_specs(), *([bound] if bound is not None else [])]


def study_hours(study: StudySpec) -> list[tuple[str, float]]:
    """Each of `study_sweeps` by name, at the caps' price (`capped_price`)."""
    return [(spec.name, capped_price(spec)) for spec in study_sweeps(study)]


def validate_study(data: Any, settings: Settings) -> StudySpec:
    """The study (`sweeps.study`), or `Invalid` naming what is refused: the study's own fields, then each
    sweep it may make (`study_sweeps`) as a submit of it would be judged (its problems' fields prefixed with
    the sweep's name). The target's sweep is priced, never run: only the study's own rules apply to it."""
    if not is_study(data):
        raise invalid(
            "not a study: a study has scales and a target (sweeps/study.py); POST /sweeps/dry-run prices a sweep",
            [_problem("scales", "missing: a study lists its scales", None)],
        )
    try:
        study = StudySpec.model_validate(data)
    except ValidationError as exc:
        raise invalid("invalid study", format_validation_error(exc)[:MAX_DETAILS]) from None
    problems: list[dict[str, Any]] = []
    for spec in study_sweeps(study):
        try:
            validate_spec(spec.model_dump(mode="json"), settings)
        except Invalid as exc:
            note = study.axis_note(spec)
            problems += [
                dict(p, field=f"{spec.name}.{p['field']}".rstrip("."), message=p["message"] + note) for p in exc.details
            ]
    if problems:
        raise refused(problems)
    return study


def refused(problems: list[dict[str, Any]]) -> Invalid:
    """422 listing the first MAX_DETAILS problems (a spec of 10,000 unknown keys is not answered in full)."""
    shown = problems[:MAX_DETAILS]
    if len(problems) > MAX_DETAILS:
        shown.append(_problem("", f"{len(problems) - MAX_DETAILS} more problems not listed; fix these first"))
    fields = ", ".join(p["field"] or "(spec)" for p in problems[:MAX_DETAILS])
    more = f" and {len(problems) - MAX_DETAILS} more" if len(problems) > MAX_DETAILS else ""
    return invalid(f"invalid sweep spec: {fields}{more}", shown)


def policy_problems(spec: SweepSpec, settings: Settings) -> list[dict[str, Any]]:
    problems: list[dict[str, Any]] = []
    if spec.token_budget > settings.max_token_budget:
        problems.append(
            _problem(
                "token_budget",
                f"token_budget={spec.token_budget} exceeds this service's limit max_token_budget="
                f"{settings.max_token_budget}",
                spec.token_budget,
            )
        )
    if spec.data.cache_dir is not None:
        problems.append(
            _problem(
                "data.cache_dir",
                "data.cache_dir cannot be set through the service; the cluster's own token cache is used",
                spec.data.cache_dir,
            )
        )
    problem, size = _check_source(spec.data.source, settings)
    if problem is not None:
        problems.append(problem)
    elif size is not None:
        problem = _corpus_problem(spec, size)
        if problem is not None:
            problems.append(problem)
    return problems


# ---- cost: GPU-hours caps per sweep and per owner ------------------------------------------------------------

# The caps price every spec on the dry run's default GPU and MFU, never on what a dry run asks (?gpu=, ?mfu=,
# ?peak_tflops=): a client's peak_tflops=100000 would price any spec at next to nothing.
CAP_PRICING = PriceConfig()
PRICED_AS = f"up to, on one {CAP_PRICING.gpu} at MFU {CAP_PRICING.mfu:g}, as a dry run prices it"


def capped_price(spec: SweepSpec) -> float:
    """The GPU-hours the caps judge `spec` at: the most the dry run says it can cost (`gpu_hours.max`: every trial
    to its whole budget, at the most confirmation runs and batch sizes) at CAP_PRICING."""
    return price(spec, CAP_PRICING).gpu_hours.max


def owner_budget(settings: Settings) -> Budget | None:
    """The cap per owner as the store applies it; None: no cap."""
    cap = settings.max_gpu_hours_per_owner
    return None if cap is None else Budget(cap, timedelta(seconds=settings.gpu_hours_window_s))


def sweep_cap_problem(hours: float, settings: Settings) -> str | None:
    """Why a sweep priced at `hours` is refused whatever its owner spent (over the cap per sweep, or over the
    cap per owner by itself); None when it is not."""
    priced = f"this sweep is priced at {_hours(hours)} GPU-hours ({PRICED_AS})"
    if (cap := settings.max_gpu_hours_per_sweep) is not None and hours > cap:
        return f"{priced}; the cap per sweep is {_hours(cap)} GPU-hours (SWEEPS_MAX_GPU_HOURS_PER_SWEEP)"
    if (cap := settings.max_gpu_hours_per_owner) is not None and hours > cap:
        return (
            f"{priced}; the cap per owner is {_hours(cap)} GPU-hours per {_span(settings.gpu_hours_window_s)} "
            f"(SWEEPS_MAX_GPU_HOURS_PER_OWNER), which this sweep alone passes"
        )
    return None


def check_sweep_cap(hours: float, settings: Settings) -> None:
    """422 when `sweep_cap_problem` says so. 422, not 403 or 429: like the caps on trials and tokens it is this
    spec that this deployment refuses, on every retry; a smaller spec (fewer trials, tokens or parameters) passes."""
    if (problem := sweep_cap_problem(hours, settings)) is not None:
        raise Invalid("gpu_hours_per_sweep", problem)


def owner_cap_problem(owner: str, spent: float, hours: float, settings: Settings) -> str | None:
    """Why `owner`, whose sweeps within the window are priced at `spent`, may not add one priced at `hours`."""
    cap = settings.max_gpu_hours_per_owner
    if cap is None or spent + hours <= cap:
        return None
    span = _span(settings.gpu_hours_window_s)
    return (
        f"{owner}'s sweeps submitted in the last {span} are priced at {_hours(spent)} GPU-hours; this one, priced at "
        f"{_hours(hours)} GPU-hours ({PRICED_AS}), would make {_hours(spent + hours)}: the cap per owner is "
        f"{_hours(cap)} GPU-hours per {span} (SWEEPS_MAX_GPU_HOURS_PER_OWNER)"
    )


def too_many_active(owner: str, active: int, settings: Settings, *, study: bool = False) -> TooMany:
    """429 with Retry-After: the owner has `active` sweeps queued or running, at or over the per-owner limit
    (a study's sweeps count as they run, one at a time)."""
    also = ", and a study runs one at a time" if study else ""
    return TooMany(
        "too_many_sweeps",
        f"{owner} has {active} sweeps queued or running; the limit is {settings.max_concurrent_per_owner}{also}. "
        "Wait for one to finish or cancel one.",
        retry_after_s=max(1, int(settings.poll_interval_s * 5)),
    )


def over_owner_cap(owner: str, exc: OverBudget, settings: Settings) -> ServiceError:
    """429 with Retry-After: the seconds until enough of the owner's sweeps have left the window for this one.
    429, not 403 or 422: the spec is acceptable and the same submit passes later, like too_many_sweeps."""
    message = owner_cap_problem(owner, exc.spent, exc.price, settings) or str(exc)
    if exc.frees_at is None:  # the store's own check said the price alone is over (the caps changed between)
        return Invalid("gpu_hours_per_sweep", message)
    wait = max(1, math.ceil((exc.frees_at - utcnow()).total_seconds()))
    return TooMany("gpu_hours_per_owner", f"{message}; room for it again in {_span(wait)}", retry_after_s=wait)


def caps_verdict(
    hours: float, settings: Settings, owner: str | None = None, priced: Sequence[tuple[datetime, float]] | None = None
) -> GpuHoursCaps:
    """What a dry run says of the caps: the price they judge and what a submit now would be refused with.
    `priced`: the owner's priced sweeps within the window (Store.priced_since); None: not looked up."""
    problems = [p for p in [sweep_cap_problem(hours, settings)] if p is not None]
    budget, spent = owner_budget(settings), None
    if budget is not None and priced is not None:
        spent = math.fsum(h for _, h in priced)
        problem = owner_cap_problem(owner or "you", spent, hours, settings) if not problems else None
        if problem is not None:
            when = frees_at(priced, hours, budget)
            if when is not None:
                problem += f"; room for it again in {_span(max(1, math.ceil((when - utcnow()).total_seconds())))}"
            problems.append(problem)
    return _caps(hours, settings, spent, problems)


def _caps(hours: float, settings: Settings, spent: float | None, problems: list[str]) -> GpuHoursCaps:
    return GpuHoursCaps(
        gpu_hours=hours,
        max_gpu_hours_per_sweep=settings.max_gpu_hours_per_sweep,
        max_gpu_hours_per_owner=settings.max_gpu_hours_per_owner,
        window_s=settings.gpu_hours_window_s,
        owner_gpu_hours=spent,
        passes=not problems,
        problems=problems,
    )


def study_caps_verdict(
    sweeps: Sequence[tuple[str, float]],
    settings: Settings,
    owner: str | None = None,
    priced: Sequence[tuple[datetime, float]] | None = None,
) -> GpuHoursCaps:
    """What a study's dry run says of the caps: each of its sweeps (name, GPU-hours at CAP_PRICING) against
    the cap per sweep, as its submit would be judged, and all of them together against the cap per owner."""
    hours = math.fsum(h for _, h in sweeps)
    problems = [f"{name}: {p}" for name, h in sweeps if (p := sweep_cap_problem(h, settings)) is not None]
    spent = math.fsum(h for _, h in priced) if priced is not None else None
    if spent is not None and not problems and (p := owner_cap_problem(owner or "you", spent, hours, settings)):
        problems.append(f"the study's {len(sweeps)} sweeps together: {p}")
    return _caps(hours, settings, spent, problems)


# ---- the cluster: can it run the trials at all ---------------------------------------------------------------


def cluster_fit(spec: SweepSpec, capacity: ClusterCapacity | None) -> ClusterFit:
    """What a dry run says of the cluster; `capacity` None: it could not be read (nothing judged)."""
    needs = trial_needs(spec)
    host = max(n.host for n in needs)
    device = max(n.device for n in needs)
    if capacity is None:
        return ClusterFit(
            checked=False, passes=True, memory_per_worker_bytes=host, gpu_memory_per_worker_bytes=device, cluster=""
        )
    problems = admission_problems(spec, capacity, needs)  # the estimates above, not worked out again
    return ClusterFit(
        checked=True, passes=not problems, memory_per_worker_bytes=host, gpu_memory_per_worker_bytes=device,
        cluster=capacity.describe(), problems=[p["message"] for p in problems],
    )  # fmt: skip


def check_cluster(spec: SweepSpec, capacity: ClusterCapacity | None) -> None:
    """422 naming the spec's fields the cluster cannot run (`admission_problems`). 422, as for the caps: this
    deployment refuses this spec on every retry until its cluster grows; a smaller model or micro-batch passes."""
    if capacity is None:
        return
    problems = admission_problems(spec, capacity)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        message = f"this service's cluster cannot run this sweep: {problems[0]['message']}{more}"
        raise Invalid("cluster_cannot_run", message, problems[:MAX_DETAILS])


def _hours(h: float) -> str:
    """GPU-hours for people: 420.3, 1,235, 0.0123, 1.23e-07."""
    return f"{h:,.0f}" if h >= 1000 else f"{h:.4g}"


def _span(seconds: float) -> str:
    """7 days, 36 hours, 90 minutes, 45 s."""
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def data_source_problem(source: str, settings: Settings) -> dict[str, Any] | None:
    """None when `source` is allowed: "builtin", a configured HF dataset, or a path inside a data root."""
    return _check_source(source, settings)[0]


def _check_source(source: str, settings: Settings) -> tuple[dict[str, Any] | None, int | None]:
    """(problem or None, bytes of text a local file or folder source holds, else None)."""
    if source == "builtin":
        return None, None
    if source.startswith("hf:"):
        rest = source[len("hf:") :]
        if rest in settings.hf_datasets:  # exactly as configured: "name" or "name:config"
            return None, None
        # a dataset saved with save_to_disk: the path rules apply. Decided by the text alone: asking the
        # file system would tell a client whether some relative path exists on the server.
        if rest.startswith(("/", "~", ".")):
            return _path_problem(rest, source, settings, dataset=True)
        allowed = ", ".join(f"hf:{name}" for name in settings.hf_datasets) or "none"
        return _problem(
            "data.source",
            f"HF dataset {excerpt(rest)} is not allowed on this service; allowed HF datasets: {allowed}",
            source,
        ), None
    return _path_problem(source, source, settings, dataset=False)


def _path_problem(
    path_text: str, source: str, settings: Settings, *, dataset: bool
) -> tuple[dict[str, Any] | None, int | None]:
    roots = settings.data_roots or []  # unset on the service: no local path (only "builtin" and HF names)
    allowed = ", ".join(str(r) for r in roots) or "none configured (SWEEPS_DATA_ROOTS)"

    def refuse(message: str) -> tuple[dict[str, Any], None]:
        return _problem("data.source", message, source), None

    # the syntactic rules and the roots come before anything that asks whether the path exists
    if ".." in PurePosixPath(path_text).parts:
        return refuse(f"data.source must not contain '..' components; data roots: {allowed}")
    if not os.path.isabs(path_text):
        # the driver runs in a Ray worker with another working directory: relative paths are ambiguous
        return refuse(f"data.source must be an absolute path inside a data root: {allowed}")
    # realpath follows symlinks: a link inside a root that points outside it is refused too, with the
    # same message whether its target exists or not
    if not is_inside(path_text, roots):
        return refuse(f"data.source {excerpt(path_text)} is outside the allowed data roots: {allowed}")
    real = Path(os.path.realpath(path_text))
    if not real.exists():
        return refuse(f"data.source {excerpt(path_text)} does not exist")
    if real.is_file():
        return None, real.stat().st_size
    # a folder: every file it would be read through must resolve inside the roots too
    entries = all_files(real, MAX_SOURCE_ENTRIES) if dataset else candidate_files(real, MAX_SOURCE_ENTRIES)
    size = 0
    try:
        for entry in entries:
            if not is_inside(entry, roots):
                raise outside(entry, real)
            if entry.is_file():
                size += entry.stat().st_size
    except (OutsideRoots, TooManyEntries) as exc:
        return refuse(f"data.source: {exc}")
    except OSError:
        return refuse(f"data.source {excerpt(path_text)} cannot be read")
    if dataset:
        return None, None  # arrow files: their size says little about the text's
    if size == 0:
        return refuse(f"data.source {excerpt(path_text)} holds no *.txt or *.md text")
    return None, size


def _corpus_problem(spec: SweepSpec, size: int) -> dict[str, Any] | None:
    """A local corpus too short for the spec's sequences: byte-level BPE makes at most one token per
    byte (three for an invalid UTF-8 byte, which becomes U+FFFD), so 3 x bytes bounds the tokens."""
    workers = spec.resources.workers_per_trial
    micro = max(split_batch(b, workers, spec.resources.max_micro_batch)[0] for b in spec.lattice)
    short = corpus_shortfall(
        3 * size,
        seq_len=spec.model.seq_len,
        micro_batch=micro,
        num_workers=workers,
        val_fraction=spec.data.val_fraction,
        what=f"data.source ({size:,} bytes of text)",
    )
    return _problem("model.seq_len", short, spec.model.seq_len) if short else None
