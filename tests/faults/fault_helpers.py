"""Helpers of the fault-injection tests: the token, waiting, what a sweep must have recorded, and what the
machine's other users can reach of a service's data dir."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOKEN = "fault-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# what the README's `sweeps serve` does not set: the embedded defaults stand
EMBEDDED = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "SWEEPS_OPTUNA_STORAGE", "SWEEPS_DATABASE_URL")


def wait(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def describe_runs(runs: list[Any]) -> str:
    """One line per MLflow trial run, oldest first: what a failed count needs to be understood."""
    keys = ("cell", "role", "seed", "status", "tune_trial_id", "restarts", "optuna_number", "node_ids")
    rows = sorted(runs, key=lambda r: r.info.start_time or 0)
    return "\n".join(
        f"{r.info.run_name} {r.info.status} start={r.info.start_time} end={r.info.end_time} "
        + " ".join(f"{k}={r.data.tags.get(f'batchsweep.{k}')}" for k in keys)
        for r in rows
    )


def assert_recorded_once(
    optuna_url: str, tracking_uri: str, sweep_id: str, *, cells: int, search: int, seeds: int
) -> list[Any]:
    """Optuna and MLflow hold every planned trial of the sweep exactly once and agree on them, and
    nothing is left RUNNING in either: `search` trials per cell (`trials_per_batch_size`; an optimizer's
    smallest batch size runs `cell_search_trials` of it, one more), `seeds` confirmation runs. Returns the
    MLflow runs of the kept trials."""
    import optuna
    from mlflow.tracking import MlflowClient

    from sweeps.spec import cell_search_trials
    from sweeps.status import RERUN_STATUSES

    storage = optuna.storages.RDBStorage(optuna_url)
    names = [n for n in optuna.get_all_study_names(storage) if n.startswith(f"{sweep_id}/")]
    assert len(names) == cells
    smallest = min(int(n.rsplit("/bs", 1)[1]) for n in names)  # study names end in <optimizer>/bs<size>
    planned = 0
    optuna_trials: Counter[tuple[str, str, int]] = Counter()
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        states = Counter(t.state.name for t in study.trials)
        assert states["RUNNING"] == 0 and states["WAITING"] == 0, (name, states)
        kept = [t for t in study.trials if t.user_attrs.get("status") not in RERUN_STATUSES]
        roles = Counter(t.user_attrs["role"] for t in kept)
        searched = cell_search_trials(search, reference=int(name.rsplit("/bs", 1)[1]) == smallest)
        assert roles == {"search": searched, "confirm": seeds}, (name, roles)
        planned += searched + seeds
        for t in kept:
            optuna_trials[(name.split("/", 1)[1], t.user_attrs["role"], int(t.user_attrs["seed"]))] += 1

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(sweep_id)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    trial_runs = [r for r in runs if r.data.tags.get("batchsweep.role") in ("search", "confirm")]
    kept_runs = [r for r in trial_runs if r.data.tags.get("batchsweep.status") not in RERUN_STATUSES]
    assert len(kept_runs) == planned, describe_runs(trial_runs)
    # one MLflow run per kept Optuna trial, each Tune trial once (a restarted trial keeps its run)
    assert len({r.data.tags["batchsweep.tune_trial_id"] for r in kept_runs}) == len(kept_runs)
    mlflow_trials = Counter(
        (r.data.tags["batchsweep.cell"], r.data.tags["batchsweep.role"], int(r.data.tags["batchsweep.seed"]))
        for r in kept_runs
    )
    assert mlflow_trials == optuna_trials
    return kept_runs


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# one shell as nobody for every attempt (no Python: the venv's interpreter may be where nobody cannot
# reach); prints what it managed, one line each. Lines in: `f PATH` (a file to read), `d PATH` (a folder).
# `true`, not `:`: a failed redirection of a special builtin ends a POSIX shell
PROBE = r"""
while IFS= read -r line; do
  kind=${line%% *}; path=${line#* }
  if [ "$kind" = f ]; then
    { true < "$path"; } 2>/dev/null && echo "read $path"
  else
    ls -- "$path" >/dev/null 2>&1 && echo "listed $path"
    { true > "$path/.nobody-was-here"; } 2>/dev/null && echo "created a file in $path"
  fi
done
exit 0
"""


def as_nobody(files: list[Path], dirs: list[Path]) -> list[str]:
    """What `nobody` managed to do of reading `files` and listing and writing into `dirs`."""
    lines = "".join(f"f {p}\n" for p in files) + "".join(f"d {p}\n" for p in dirs)
    out = subprocess.run([*NOBODY, "sh", "-c", PROBE], input=lines, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def umask_of(pid: int) -> str | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # it ended meanwhile
        return None
    # a process that has exited and not yet been reaped (a zombie) has no Umask line
    return next((line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), None)


def assert_private(data_dir: Path, parent: Path, api_pid: int, head_pid: int, descendants: list[int]) -> None:
    """`nobody` (setpriv; needs root) reads no file under `data_dir`, lists no folder and creates a file in
    none; the stores and folders the service and its head made are their owner's alone; the API, the head and
    every process below it run with a umask of 077. `parent` (0755) is the folder above the data dir."""
    stores = [data_dir / name for name in ("service.db", "optuna.db", "mlflow.db")]
    files: list[Path] = []
    dirs: list[Path] = [data_dir]
    for root, dirnames, filenames in os.walk(data_dir):
        dirs += [Path(root, d) for d in dirnames if not Path(root, d).is_symlink()]
        files += [Path(root, f) for f in filenames if stat.S_ISREG(Path(root, f).lstat().st_mode)]
    assert set(stores) <= set(files)
    assert as_nobody([], [parent]) == [f"listed {parent}"]  # the probe works
    got = as_nobody(files, dirs)
    assert got == [], f"nobody did {len(got)} of {len(files) + 2 * len(dirs)} things, e.g.\n" + "\n".join(got[::8])
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    # what the service and its head create is their owner's alone, whatever the folder above allows
    for path in [*stores, data_dir / "mlartifacts", data_dir / "ray_results", data_dir / "ray"]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path}: {stat.filemode(path.stat().st_mode)}"
    umasks = {pid: umask_of(pid) for pid in [api_pid, head_pid, *descendants]}
    assert {u for u in umasks.values() if u is not None} == {"0077"}, umasks
    assert umasks[api_pid] == umasks[head_pid] == "0077"  # these two live on: never skipped
