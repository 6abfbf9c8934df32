"""The MLflow layout of a sweep, written down once: names, tags, roles, artifacts, and the queries
that find a sweep's runs. The recorder writes it, the dashboards and the tests read it; nobody else
spells a tag or a filter.

  experiment  <sweep id>                     tags: batchsweep.sweep_id, batchsweep.spec_name, mlflow.experimentKind
    run  "merit bs=64"                       role=cell; its trials nest under it (mlflow.parentRunId)
      run  "merit bs=64 lr=3.1e-03 seed=0"   role=search|confirm|warmup; metrics with step = tokens seen
    run  "summary"                           role=summary: spec.yaml, report.json, cells.csv, figures/

A study (`sweeps study`) keeps its own experiment beside its sweeps' (MLflow nests runs, not experiments):

  experiment  "<study name> (study)"         tags: batchsweep.study, mlflow.experimentKind
    run  "<study name>"                      role=study: study.yaml, law.json; metrics per optimizer
      run  "<sweep id>"                      role=scale, batchsweep.sweep_id: one scale's sweep (its experiment
                                             is named by that id); metrics: its brackets
"""

from __future__ import annotations

import enum
from typing import Any

from sweeps.status import TrialStatus

PREFIX = "batchsweep."
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: nests a trial run under its cell run
# MLflow 3's own experiment kind: model training, so its UI opens the runs table, not the GenAI views
# (its other value is "genai_development")
KIND_TAG, KIND_TRAINING = "mlflow.experimentKind", "custom_model_development"
VAL_LOSS = "val_loss"  # a trial run's evaluations, step = tokens seen (also the Tune metric the search minimises)
# the MLflow run status of a trial run that ended as each TrialStatus
MLFLOW_STATUS = {
    TrialStatus.completed: "FINISHED",
    TrialStatus.diverged: "FINISHED",
    TrialStatus.pruned: "KILLED",
    TrialStatus.failed: "FAILED",
    TrialStatus.cancelled: "KILLED",
    TrialStatus.interrupted: "KILLED",  # lost to the infrastructure: run again
}


class Tag(enum.StrEnum):
    sweep_id = PREFIX + "sweep_id"
    spec_name = PREFIX + "spec_name"
    role = PREFIX + "role"
    cell = PREFIX + "cell"
    optimizer = PREFIX + "optimizer"
    batch_size = PREFIX + "batch_size"
    lr = PREFIX + "lr"  # repr() of the float: exact
    seed = PREFIX + "seed"
    status = PREFIX + "status"  # sweeps.status.TrialStatus of a trial run; SweepStatus of the summary run
    tune_trial_id = PREFIX + "tune_trial_id"
    optuna_number = PREFIX + "optuna_number"
    restarts = PREFIX + "restarts"  # how often Tune restarted the trial after its worker died
    node_id = PREFIX + "node_id"  # the Ray node of the trial's latest report
    node_ids = PREFIX + "node_ids"  # every Ray node it reported from, in order (a restart may move it)
    driver_node_id = PREFIX + "driver_node_id"  # the summary run's: the Ray node of the sweep's driver
    # a cell's and its trials': why its batch size was tested (sweeps.batch_axis.Chosen: listed, reference,
    # step up, bisect, speculative) and the search's decision in words
    chosen = PREFIX + "chosen"
    chosen_why = PREFIX + "chosen_why"
    study = PREFIX + "study"  # a study's experiment and runs: the study's name


class Role(enum.StrEnum):
    cell = "cell"
    search = "search"
    confirm = "confirm"  # a confirmation run at the cell's best lr (its samples)
    warmup = "warmup"  # at the cell's best lr with another warm-up (the spec's schedule.warmup_search)
    summary = "summary"
    study = "study"  # a study's own run: its law
    scale = "scale"  # one scale of a study: its sweep, nested under the study's run


TRIAL_ROLES = (Role.search, Role.confirm, Role.warmup)
# the other value a role has in records (Optuna user attrs, MLflow tags) of sweeps that named the
# confirmation role "seed"; `role_of` reads it as the role, `runs_of` finds it
OLD_VALUES = {Role.confirm: ("seed",)}
SUMMARY_RUN_NAME = "summary"
SPEC_FILE, REPORT_FILE, CELLS_FILE, FIGURES_DIR = "spec.yaml", "report.json", "cells.csv", "figures"
STUDY_FILE, LAW_FILE = "study.yaml", "law.json"


def role_of(value: object) -> Role | None:
    """The role a record gives (an Optuna trial's user attr "role", an MLflow run's tag), None for none
    or an unknown one: the one reading of a recorded role, where "seed" is the confirmation role."""
    if not isinstance(value, str):
        return None
    for role, old in OLD_VALUES.items():
        if value in old:
            return role
    return Role(value) if value in Role.__members__.values() else None


def role_filter(value: str) -> str:
    """MLflow's search filter for the runs tagged with one role value (its filter language has no IN for tags)."""
    return f"tags.`{Tag.role}` = '{value}'"


def experiment_tags(sweep_id: str, spec_name: str) -> dict[str, str]:
    return {Tag.sweep_id: sweep_id, Tag.spec_name: spec_name, KIND_TAG: KIND_TRAINING}


def cell_tags(
    sweep_id: str, cell: str, optimizer: str, batch_size: int, chosen: str = "listed", why: str = ""
) -> dict[str, str]:
    return {
        Tag.sweep_id: sweep_id, Tag.role: Role.cell, Tag.cell: cell, Tag.optimizer: optimizer,
        Tag.batch_size: str(batch_size), Tag.chosen: chosen, Tag.chosen_why: why[:5000],
    }  # fmt: skip


def trial_tags(
    *,
    sweep_id: str,
    parent_run_id: str,
    role: str,
    cell: str,
    optimizer: str,
    batch_size: int,
    lr: float,
    seed: int,
    status: str,
    optuna_number: int | None,
    tune_trial_id: str | None = None,
    chosen: str = "listed",
) -> dict[str, str]:
    tags = {
        PARENT_TAG: parent_run_id, Tag.sweep_id: sweep_id, Tag.role: str(role), Tag.cell: cell,
        Tag.optimizer: optimizer, Tag.batch_size: str(batch_size), Tag.lr: repr(lr), Tag.seed: str(seed),
        Tag.status: str(status), Tag.optuna_number: str(optuna_number), Tag.chosen: chosen,
    }  # fmt: skip
    if tune_trial_id is not None:
        tags[Tag.tune_trial_id] = tune_trial_id
    return tags


def summary_tags(sweep_id: str) -> dict[str, str]:
    return {Tag.sweep_id: sweep_id, Tag.role: Role.summary}


def study_experiment(study: str) -> str:
    """The name of a study's experiment: not a sweep id (those have no spaces), so never one of its sweeps'."""
    return f"{study} (study)"


def study_experiment_tags(study: str) -> dict[str, str]:
    return {Tag.study: study, KIND_TAG: KIND_TRAINING}


def study_tags(study: str) -> dict[str, str]:
    return {Tag.study: study, Tag.role: Role.study}


def scale_tags(study: str, sweep_id: str, parent_run_id: str) -> dict[str, str]:
    return {PARENT_TAG: parent_run_id, Tag.study: study, Tag.role: Role.scale, Tag.sweep_id: sweep_id}


# ---- finding a sweep's runs (an MlflowClient in, MLflow entities out) ----------------------------------


def find_experiment(client: Any, sweep_id: str) -> Any | None:
    """The sweep's experiment (named by the sweep id), None when there is none."""
    return client.get_experiment_by_name(sweep_id)


def runs_of(client: Any, experiment_id: str, role: Role | None = None) -> list[Any]:
    """Every run of the experiment (of one role when given: tagged with any of its values, `OLD_VALUES`
    too), all pages."""
    filters = [role_filter(v) for v in (role, *OLD_VALUES.get(role, ()))] if role else [""]
    out: list[Any] = []
    for query in filters:
        token = None
        while True:
            page = client.search_runs([experiment_id], query, max_results=1000, page_token=token)
            out.extend(page)
            token = page.token
            if not token:
                break
    return out


def trial_runs(client: Any, experiment_id: str) -> list[Any]:
    return [run for role in TRIAL_ROLES for run in runs_of(client, experiment_id, role)]


def running_trial_runs(client: Any, experiment_id: str) -> list[Any]:
    """The trial runs still tagged running (their driver may be gone)."""
    return client.search_runs([experiment_id], f"tags.`{Tag.status}` = '{TrialStatus.running}'", max_results=1000)


def open_runs(client: Any, experiment_id: str) -> list[Any]:
    """Every run of the experiment MLflow still holds RUNNING (trial, cell or summary)."""
    return client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000)


def summary_run(client: Any, experiment_id: str) -> Any | None:
    runs = client.search_runs([experiment_id], role_filter(Role.summary), max_results=1)
    return runs[0] if runs else None
