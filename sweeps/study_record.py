"""A study in MLflow: its own run, with each scale's sweep as a run nested under it (the layout:
`sweeps.layout`). Written once the study's sweeps have their reports and the law is fitted; written again,
the same runs are updated (a study run again after more scales, or refitted)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml
from mlflow.tracking import MlflowClient

from sweeps import layout
from sweeps.layout import Role, Tag
from sweeps.record import ensure_store

if TYPE_CHECKING:
    from sweeps.law import Confirmation, OptimizerLaw
    from sweeps.report import Report
    from sweeps.study import StudySpec

__all__ = ["record_study"]


def record_study(
    tracking_uri: str,
    study: StudySpec,
    scales: Sequence[tuple[str, Report]],
    laws: Sequence[OptimizerLaw],
    confirmations: Sequence[Confirmation] = (),
) -> str:
    """Record `study` (its scales' sweep ids and reports, smallest first; the laws fitted to them) and return
    the id of its run. The study's run keeps study.yaml and law.json (`sweeps.law.OptimizerLaw`, one per
    optimizer; `confirmations`, where the study confirmed at its target) and, per optimizer, the law's exponent
    and its prediction at the target (and whether the confirmation held it) as metrics; each
    scale's run names its sweep (`batchsweep.sweep_id`, whose experiment holds its trials) and keeps each
    optimizer's bracket as metrics."""
    ensure_store(tracking_uri)
    client = MlflowClient(tracking_uri)
    name = layout.study_experiment(study.name)
    found = client.get_experiment_by_name(name)
    experiment_id = (
        found.experiment_id
        if found is not None
        else client.create_experiment(name, tags=layout.study_experiment_tags(study.name))
    )
    runs = layout.runs_of(client, experiment_id, Role.study)
    parent = runs[0].info.run_id if runs else _new_run(client, experiment_id, study.name, layout.study_tags(study.name))
    client.log_text(parent, yaml.safe_dump(study.model_dump(mode="json"), sort_keys=False), layout.STUDY_FILE)
    recorded: dict[str, Any] = {"laws": [law.model_dump(mode="json") for law in laws]}
    if confirmations:  # the confirmation sweep at the target (`confirm: true`): a scale's run like the others
        recorded["confirmations"] = [c.model_dump(mode="json") for c in confirmations]
    client.log_dict(parent, recorded, layout.LAW_FILE)
    for c in confirmations:
        if c.held is not None:
            client.log_metric(parent, f"{c.optimizer}.{c.against}.confirmation_held", float(c.held))
    for law in laws:
        key = f"{law.optimizer}.{law.against}"
        if law.tokens_exponent is not None:
            client.log_metric(parent, f"{key}.tokens_exponent", law.tokens_exponent)
        if law.predicted is not None:
            client.log_metric(parent, f"{key}.predicted_batch_size", law.predicted.value)
            client.log_metric(parent, f"{key}.predicted_low", law.predicted.low)
            client.log_metric(parent, f"{key}.predicted_high", law.predicted.high)
        if law.lr is not None:
            client.log_metric(parent, f"{key}.predicted_lr", law.lr.value)
    nested = {r.data.tags.get(Tag.sweep_id): r.info.run_id for r in layout.runs_of(client, experiment_id, Role.scale)}
    for step, (sweep_id, report) in enumerate(scales):
        run = nested.get(sweep_id) or _new_run(
            client, experiment_id, sweep_id, layout.scale_tags(study.name, sweep_id, parent)
        )
        client.log_param(run, "trained_tokens", report.trained_tokens)
        for opt, o in report.optimizers.items():
            for ref in ("self", "baseline"):
                bracket = getattr(o.bracket, ref)
                for end in ("largest_fine", "smallest_degraded"):
                    if (value := getattr(bracket, end)) is not None:
                        client.log_metric(run, f"{opt}.{ref}.{end}", value, step=step)
        client.set_terminated(run)
    client.set_terminated(parent)
    return parent


def _new_run(client: MlflowClient, experiment_id: str, run_name: str, tags: dict[str, str]) -> str:
    return str(client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id)
