"""What a sweep needs from the environment, typed (pydantic-settings): where it keeps its state and which
Ray cluster it runs on. `sweeps run` reads it; the service's `Settings` extends it; the worker's part
(`worker.settings.WorkerSettings`) is the base. Three keep the names their own tools use, so one
environment serves the service, `sweeps run` and Ray alike: RAY_ADDRESS, MLFLOW_TRACKING_URI (and the
service's MLFLOW_UI_URL).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import SettingsConfigDict

from sweeps.logs import LogFormat
from sweeps.runtime import MLFLOW_OUTAGE_S, SweepRuntime
from worker.settings import WorkerSettings


class SweepSettings(WorkerSettings):
    # hide_input_in_errors: a refused setting may hold a secret (a database URL's password, a token)
    model_config = SettingsConfigDict(
        env_prefix="SWEEPS_",
        extra="ignore",
        populate_by_name=True,
        hide_input_in_errors=True,
        use_attribute_docstrings=True,
    )

    data_dir: Path = Path(".batchsweep")
    """every store of a sweep defaults to a file in this directory (made absolute: drivers run in Ray workers whose
    working directory is not ours)"""
    optuna_storage: str | None = None
    """Optuna's RDB storage, any SQLAlchemy URL; None: sqlite:///<data dir>/optuna.db"""
    mlflow_tracking_uri: str | None = Field(
        default=None, validation_alias=AliasChoices("mlflow_tracking_uri", "MLFLOW_TRACKING_URI")
    )
    """the MLflow store; None: sqlite:///<data dir>/mlflow.db, artifacts in <data dir>/mlartifacts"""
    storage_uri: str | None = None
    """everything Ray Tune/Train write (trial results, checkpoints): None = <data dir>/ray_results; on a multi-node
    cluster a path every node mounts or a URI every node reaches, e.g. s3://bucket/prefix (pyarrow's URIs)"""
    mlflow_outage_s: float = Field(default=MLFLOW_OUTAGE_S, gt=0)
    """seconds a sweep's recorder keeps retrying an MLflow write that did not go through (the server unreachable or
    answering 5xx), on top of the MLflow client's own retries, before it drops the write (logged); training never
    waits for it, the end of a sweep does"""
    log_format: LogFormat = "text"
    """log lines as "text" or "json" (one object a line, with the sweep id and trial: sweeps/logs.py), in the
    service and in every sweep driver"""

    @field_validator("data_dir", mode="after")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    def runtime(self) -> SweepRuntime:
        """Where sweeps keep their state; handed to every sweep driver as it is (never through the environment)."""
        return SweepRuntime.at(
            self.data_dir,
            tracking_uri=self.mlflow_tracking_uri,
            optuna_storage=self.optuna_storage,
            ray_address=self.ray_address,
            storage_uri=self.storage_uri,
            log_format=self.log_format,
            mlflow_outage_s=self.mlflow_outage_s,
        )


def runtime_from_env(data_dir: str | os.PathLike[str] | None = None) -> SweepRuntime:
    """The stores the environment names (`SweepSettings`), in `data_dir` if given."""
    settings = SweepSettings() if data_dir is None else SweepSettings(data_dir=Path(data_dir))
    return settings.runtime()
