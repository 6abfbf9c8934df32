"""Where a sweep keeps its state: one data directory with SQLite stores by default, each overridable.

SWEEPS_DATA_DIR        the directory (default ./.batchsweep)
MLFLOW_TRACKING_URI    MLflow store (default sqlite:///<data dir>/mlflow.db, artifacts in <data dir>/mlartifacts)
SWEEPS_OPTUNA_STORAGE  Optuna RDB storage URL, any SQLAlchemy URL (default sqlite:///<data dir>/optuna.db)
RAY_ADDRESS            Ray cluster to use (default: start a local one on 127.0.0.1)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class SweepRuntime:
    data_dir: Path
    tracking_uri: str
    artifact_root: Path
    optuna_storage: str
    ray_address: str | None = None

    @classmethod
    def from_env(cls, data_dir: str | os.PathLike[str] | None = None) -> SweepRuntime:
        root = Path(data_dir or os.environ.get("SWEEPS_DATA_DIR") or ".batchsweep").resolve()
        return cls(
            data_dir=root,
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / 'mlflow.db'}",
            artifact_root=root / "mlartifacts",
            optuna_storage=os.environ.get("SWEEPS_OPTUNA_STORAGE") or f"sqlite:///{root / 'optuna.db'}",
            ray_address=os.environ.get("RAY_ADDRESS") or None,
        )

    @property
    def ray_results(self) -> Path:
        return self.data_dir / "ray_results"

    def ensure(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.artifact_root.mkdir(parents=True, exist_ok=True)
