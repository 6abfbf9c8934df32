"""What the sweep routes do, apart from HTTP: validate, price, store, launch, read, cancel.

Store and Ray calls are blocking; each runs in a worker thread so the event loop keeps serving. Reading a
submitted spec is CPU work; it runs in `service.spec_work.SpecWork`'s pool, one at a time per owner.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import anyio.to_thread
from pydantic import ValidationError

from service.cluster.launcher import Launcher
from service.cluster.supervisor import Supervisor
from service.errors import Conflict, Invalid, not_found
from service.models import (
    DryRunResult,
    StudyDryRunResult,
    SweepCurves,
    SweepPage,
    SweepSummary,
    public_error,
)
from service.policy import (
    CAP_PRICING,
    capped_price,
    caps_verdict,
    check_cluster,
    check_sweep_cap,
    cluster_fit,
    over_owner_cap,
    owner_budget,
    parse_body,
    study_caps_verdict,
    study_hours,
    too_many_active,
    validate_spec,
    validate_study,
)
from service.render import PageCache
from service.settings import Settings
from service.spec_work import SpecWork
from service.store.database import (
    Created,
    IdempotencyConflict,
    OverBudget,
    Store,
    SweepRow,
    TooManyActive,
    new_sweep_id,
    utcnow,
)
from sweeps.admission import ClusterCapacity
from sweeps.cost import PriceConfig, SweepCost, price
from sweeps.spec import SweepSpec, json_value
from sweeps.study import price_study, sweep_prices

log = logging.getLogger(__name__)


# A submit waits this long for the cluster's nodes (a GCS round trip, cached for 10 s); past it the spec is not
# judged against the cluster here, and the sweep's driver checks it before any trial
CAPACITY_WAIT_S = 5.0


async def cluster_capacity(launcher: Launcher) -> ClusterCapacity | None:
    """The launcher's reading of the cluster, or None when it does not come within CAPACITY_WAIT_S."""
    with anyio.move_on_after(CAPACITY_WAIT_S):
        return await anyio.to_thread.run_sync(launcher.capacity, abandon_on_cancel=True)
    log.warning("the cluster's nodes did not come within %s s: this submit is not judged against them", CAPACITY_WAIT_S)
    return None


def _validated(body: bytes, content_type: str | None, settings: Settings) -> SweepSpec:
    return validate_spec(parse_body(body, content_type), settings)


def _validated_and_capped(body: bytes, content_type: str | None, settings: Settings) -> tuple[SweepSpec, float]:
    """The spec and its price in GPU-hours (service.policy.capped_price); 422 over the cap per sweep."""
    spec = _validated(body, content_type, settings)
    hours = capped_price(spec)
    check_sweep_cap(hours, settings)
    return spec, hours


def unpriced_submit(**given: Any) -> None:
    """A submit that is not a dry run takes no pricing: 422 naming the pricing parameters given (None: not given)."""
    asked = sorted(k for k, v in given.items() if v is not None)
    if asked:
        raise Invalid(
            "invalid_request",
            f"{', '.join(asked)} price a dry run; add dry_run=true",
            [
                {"field": f"query.{k}", "message": "only with dry_run=true", "value": json_value(given[k])}
                for k in asked
            ],
        )


def price_config(**given: Any) -> PriceConfig:
    """The dry run's pricing from its query parameters (None: not given, the default); 422 naming the
    bad parameter and value."""
    try:
        return PriceConfig(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        details = [
            {
                "field": f"query.{'.'.join(str(p) for p in e['loc'])}",
                "message": e["msg"].removeprefix("Value error, "),
                "value": json_value(e.get("input")),
            }
            for e in exc.errors()
        ]
        fields = ", ".join(d["field"] for d in details)
        raise Invalid("invalid_request", f"invalid request: {fields}", details) from None


def _validated_and_priced(
    body: bytes, content_type: str | None, settings: Settings, pricing: PriceConfig
) -> tuple[SweepSpec, SweepCost, float]:
    """The spec, its price at `pricing`, and its price in GPU-hours at the caps' pricing (the same function;
    the dry run's own figure when it asked for that pricing)."""
    spec = _validated(body, content_type, settings)
    cost = price(spec, pricing)
    return spec, cost, cost.gpu_hours.max if pricing == CAP_PRICING else capped_price(spec)


async def dry_run(
    body: bytes,
    content_type: str | None,
    settings: Settings,
    pricing: PriceConfig | None = None,
    *,
    owner: str,
    work: SpecWork,
    store: Store | None = None,
    launcher: Launcher | None = None,
) -> DryRunResult:
    """The spec validated and priced, whether a submit would pass the GPU-hours caps (`caps`: the cap per
    owner is judged only given the store, the owner's sweeps within the window) and whether the cluster can
    run it (`cluster`, given the launcher)."""
    pricing = pricing or PriceConfig()
    spec, cost, hours = await work.run(owner, _validated_and_priced, body, content_type, settings, pricing)
    fit = None
    if launcher is not None:
        fit = await work.run(owner, cluster_fit, spec, await cluster_capacity(launcher))
    priced = await _priced_in_window(settings, store, owner)
    return DryRunResult(
        spec=spec.model_dump(mode="json"), total_trials=spec.total_trials,
        cells=len(spec.optimizers) * spec.sizes_per_optimizer[1],
        trained_tokens=spec.trained_tokens, cost=cost, caps=caps_verdict(hours, settings, owner, priced),
        cluster=fit,
    )  # fmt: skip


async def _priced_in_window(settings: Settings, store: Store | None, owner: str) -> list[Any] | None:
    """The owner's priced sweeps within the cap's window (`Store.priced_since`); None without a cap per
    owner or a store: the cap per owner is then not judged."""
    if (budget := owner_budget(settings)) is None or store is None:
        return None
    return await anyio.to_thread.run_sync(store.priced_since, owner, utcnow() - budget.window)


def _study_priced(
    body: bytes, content_type: str | None, settings: Settings, pricing: PriceConfig
) -> tuple[StudyDryRunResult, list[tuple[str, float]]]:
    """The study validated and priced (`sweeps.study.price_study`), and each sweep it may make at the caps'
    pricing (`study_hours`: the scales' and its confirmation at most)."""
    study = validate_study(parse_body(body, content_type), settings)
    cost = price_study(study, pricing)
    scales, target, confirmation = sweep_prices(study, cost)
    result = StudyDryRunResult(
        study=study.model_dump(mode="json"), sweeps=scales, gpu_hours=cost.gpu_hours, target=target, ratio=cost.ratio,
        confirmation=confirmation,
    )  # fmt: skip
    return result, study_hours(study)


async def dry_run_study(
    body: bytes,
    content_type: str | None,
    settings: Settings,
    pricing: PriceConfig | None = None,
    *,
    owner: str,
    work: SpecWork,
    store: Store | None = None,
) -> StudyDryRunResult:
    """A study validated and priced scale by scale beside the target's sweep it replaces, and whether its
    sweeps would pass the GPU-hours caps (the cap per owner judged given the store)."""
    result, hours = await work.run(owner, _study_priced, body, content_type, settings, pricing or PriceConfig())
    priced = await _priced_in_window(settings, store, owner)
    return result.model_copy(update={"caps": study_caps_verdict(hours, settings, owner, priced)})


async def submit(
    *,
    body: bytes,
    content_type: str | None,
    owner: str,
    idempotency_key: str | None,
    settings: Settings,
    store: Store,
    supervisor: Supervisor,
    work: SpecWork,
) -> Created:
    # Over the cap per sweep is a 422 here; over the cap per owner, the store's; a spec the cluster cannot run, 422.
    validated, hours = await work.run(owner, _validated_and_capped, body, content_type, settings)
    await work.run(owner, check_cluster, validated, await cluster_capacity(supervisor.launcher))
    spec = validated.model_dump(mode="json")
    try:
        created = await anyio.to_thread.run_sync(
            lambda: store.create(
                sweep_id=new_sweep_id(spec["name"]),
                owner=owner,
                spec=spec,
                idempotency_key=idempotency_key,
                max_active=settings.max_concurrent_per_owner,
                gpu_hours=hours,  # stored whether or not a cap is set: a cap set later counts these
                budget=owner_budget(settings),
            )
        )
    except IdempotencyConflict as exc:
        # draft-ietf-httpapi-idempotency-key-header: a key reused with another payload is a 422
        raise Invalid(
            "idempotency_key_reused",
            f"Idempotency-Key was already used for sweep {exc.existing.id} with a different spec",
            [{"field": "Idempotency-Key", "message": "reused with a different spec", "value": idempotency_key}],
        ) from None
    except TooManyActive as exc:
        raise too_many_active(owner, exc.active, settings) from None
    except OverBudget as exc:
        raise over_owner_cap(owner, exc, settings) from None
    if not created.replayed:
        log.info("sweep %s submitted by %s", created.row.id, owner)
        supervisor.launch(created.row)
    return created


async def get_row(store: Store, sweep_id: str, owner: str) -> SweepRow:
    row = await anyio.to_thread.run_sync(lambda: store.get(sweep_id, owner=owner))
    if row is None:
        raise not_found(sweep_id)
    return row


async def list_sweeps(
    store: Store, settings: Settings, owner: str, statuses: list[str] | None, limit: int, offset: int
) -> SweepPage:
    result = await anyio.to_thread.run_sync(
        lambda: store.list_sweeps(owner=owner, statuses=statuses, limit=limit, offset=offset)
    )
    items = [SweepSummary.from_row(r, settings.mlflow_link(r.experiment_id)) for r in result.items]
    return SweepPage(items=items, total=result.total, limit=limit, offset=offset)


async def cancel(store: Store, settings: Settings, supervisor: Supervisor, sweep_id: str, owner: str) -> SweepSummary:
    row = await get_row(store, sweep_id, owner)
    if row.final:
        raise Conflict("already_finished", f"sweep {sweep_id!r} is already {row.status}; nothing to cancel")
    updated = await supervisor.cancel(sweep_id)
    row = updated or row
    return SweepSummary.from_row(row, settings.mlflow_link(row.experiment_id))


async def report(store: Store, sweep_id: str, owner: str) -> dict[str, Any]:
    row = await get_row(store, sweep_id, owner)
    if not row.final:
        raise Conflict("not_finished", f"sweep {sweep_id!r} is {row.status}; its report comes when it finishes")
    if row.report is None:
        why = public_error(row.error) or "no error recorded"
        raise Conflict("no_report", f"sweep {sweep_id!r} {row.status} without a report: {why}")
    return row.report


async def curves(store: Store, sweep_id: str, owner: str) -> SweepCurves:
    """Val loss against tokens of every trial the sweep's driver has reported so far (`GET /sweeps/{id}/curves`)."""
    row = await get_row(store, sweep_id, owner)
    trials = (row.progress or {}).get("curves") or []
    return SweepCurves.model_validate({"id": row.id, "status": row.status, "revision": row.revision, "trials": trials})


async def dashboard(
    store: Store,
    settings: Settings,
    cache: PageCache,
    sweep_id: str,
    owner: str,
    *,
    plotlyjs_src: str | None = None,
) -> str:
    """The sweep's dashboard page (dashboards.dashboard_page), drawn once per finished sweep in the render
    process (`cache`, the app's); with `plotlyjs_src` it loads plotly.js from there (the service's
    /static/ copy) instead of inline."""
    from dashboards import SweepDataError, dashboard_page

    row = await get_row(store, sweep_id, owner)
    if not row.final or row.report is None:
        raise Conflict("not_finished", f"sweep {sweep_id!r} is {row.status}; its dashboard comes with its report")
    key = (settings.tracking_uri, sweep_id, str(row.finished_at), plotlyjs_src or "")
    try:
        return await cache.get(key, partial(dashboard_page, settings.tracking_uri, sweep_id, plotlyjs_src=plotlyjs_src))
    except SweepDataError as exc:
        raise Conflict("no_dashboard", f"sweep {sweep_id!r} has no recorded figures yet: {exc}") from exc
