"""Where a sweep keeps its state: one data directory with SQLite stores by default, each overridable
(the settings that name them: `sweeps.settings.SweepSettings`)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# seconds a sweep's recorder retries an MLflow call that did not go through before it gives it up (sweeps/record.py)
MLFLOW_OUTAGE_S = 3600.0


@dataclass(frozen=True, kw_only=True)
class SweepRuntime:
    data_dir: Path
    tracking_uri: str
    artifact_root: Path
    optuna_storage: str
    ray_address: str | None = None
    # where Ray Tune/Train write trial results (and checkpoints): None = <data dir>/ray_results, or any
    # URI pyarrow understands, e.g. s3://bucket/prefix?endpoint_override=host:port&scheme=http
    storage_uri: str | None = None
    log_format: str = "text"  # the drivers' log lines: "text" or "json" (sweeps/logs.py)
    mlflow_outage_s: float = MLFLOW_OUTAGE_S

    @classmethod
    def at(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        tracking_uri: str | None = None,
        optuna_storage: str | None = None,
        ray_address: str | None = None,
        storage_uri: str | None = None,
        log_format: str = "text",
        mlflow_outage_s: float = MLFLOW_OUTAGE_S,
    ) -> SweepRuntime:
        """The stores of `data_dir`, each defaulting to SQLite (and a local artifact folder) inside it."""
        root = Path(data_dir).expanduser().resolve()
        return cls(
            data_dir=root,
            tracking_uri=tracking_uri or f"sqlite:///{root / 'mlflow.db'}",
            artifact_root=root / "mlartifacts",
            optuna_storage=optuna_storage or f"sqlite:///{root / 'optuna.db'}",
            ray_address=ray_address,
            storage_uri=storage_uri,
            log_format=log_format,
            mlflow_outage_s=mlflow_outage_s,
        )

    @property
    def ray_results(self) -> Path:
        return self.data_dir / "ray_results"

    @property
    def trial_storage(self) -> str:
        """What Ray Tune's RunConfig.storage_path gets: the storage URI, else the local folder."""
        return self.storage_uri or str(self.ray_results)

    @property
    def storage_is_local(self) -> bool:
        """A path on this machine only: fine on one node, silently loses results on several."""
        return self.storage_uri is None or self.storage_uri.startswith(("/", "file:", "local:"))

    def ensure(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.artifact_root.mkdir(parents=True, exist_ok=True)


class StorageNotShared(RuntimeError):
    """Trial storage that some node of the cluster cannot see."""


def check_storage(runtime: SweepRuntime, *, nodes: int, unseen: Callable[[Path], list[str]] | None = None) -> None:
    """Refuse trial storage that some node cannot see: trials there would write results and checkpoints
    where the driver never finds them (and a trial moved to another node would find no checkpoint).

    Decided by what is true, not by the URI's form: a URI (s3://, gs://, ...) is shared storage; a local
    path on a one-node cluster is right; on several nodes a local path is shared when every alive node
    reads back a marker the driver wrote there (an NFS, EFS or Lustre mount), else refused, naming the
    nodes that did not. `unseen(path)` lists those nodes (default: `nodes_not_seeing`, a Ray task pinned
    to each alive node)."""
    if nodes <= 1 or not runtime.storage_is_local:
        return
    path = Path(runtime.trial_storage.removeprefix("file://").removeprefix("local://"))
    missing = (unseen or nodes_not_seeing)(path)
    if missing:
        raise StorageNotShared(
            f"the Ray cluster has {nodes} nodes and trial storage is the local path {path}, which "
            f"{len(missing)} of them cannot see ({', '.join(missing)}): mount it on every node, or set "
            f"SWEEPS_STORAGE_URI to storage every node reaches (e.g. s3://bucket/prefix)"
        )


def nodes_not_seeing(path: Path, timeout_s: float = 120.0) -> list[str]:
    """The alive Ray nodes (`<node id> (<address>)`) on which a task cannot read a marker this process
    writes into `path`: a random token in a file of a random name, removed after."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    path.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    marker = path / f".batchsweep-shared-{token[:12]}"
    marker.write_text(token)

    @ray.remote(num_cpus=0, max_retries=0)
    def read(where: str) -> str | None:
        try:
            return Path(where).read_text()
        except OSError:
            return None

    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        refs = {
            f"{n['NodeID'][:12]} ({n.get('NodeManagerAddress', '?')})": read.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(str(marker))
            for n in alive
        }
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        return [name for name, ref in refs.items() if ref not in done or ray.get(ref) != token]
    finally:
        marker.unlink(missing_ok=True)


def alive_nodes() -> int:
    """Nodes of the connected Ray cluster that are alive."""
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))
