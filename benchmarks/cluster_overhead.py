"""What running on several nodes, and checkpointing every trial, cost a sweep in wall time.

    python benchmarks/cluster_overhead.py [--repeats 1]

The same small sweep (gpt2-nano, 2 optimizers x 2 batch sizes, 2 search trials + 1 confirmation run a
cell, 2 trials at a time), each time by `sweeps run` (the command line, its own driver process) on a
fresh Ray cluster on this machine with its trial storage in S3 (a moto server on loopback):

- one node: a head with 2 CPUs that also trains;
- 1 + 2 nodes: a head with 0 CPUs (drivers only) and two worker nodes of 1 CPU each, the same CPUs
  for trials (tests/cluster/cluster_helpers.py builds both);
- the 1 + 2 nodes again with `checkpoints: {every_tokens: 0}` (no checkpoints), and with
  `checkpoints: {min_interval_s: 0}` (a checkpoint at every evaluation, 10 a trial, instead of the
  default's at most one per 300 s of training, which in these trials of seconds is none).

Prints each wall time (the median over --repeats), what one checkpoint costs, and the ratios; targets:
multi-node <= 1.15 x one node and checkpoints (the default) <= 1.05 x none. The last line holds both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test harness (tests/harness.py): cluster and S3

import yaml  # noqa: E402

from worker.local_ray import use_local_ray  # noqa: E402

use_local_ray()  # before anything imports ray: local Ray clusters on loopback only

SPEC = {
    "name": "cluster-overhead",
    "model": {"preset": "gpt2-nano", "seq_len": 64},
    "optimizers": [{"name": "adamw"}, {"name": "merit"}],
    "batch_sizes": [8, 16],
    "token_budget": 40960,
    "lr": {"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 2},
    "seeds": 1,
    "degradation": {"tolerance": 0.02, "baseline": "adamw"},
    "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": 2, "max_micro_batch": 16},
    "evaluation": {"every_tokens": 4096, "tokens": 8192},
}


def one_sweep(*, multinode: bool, checkpoints: dict[str, object], s3: object, work: Path, index: int) -> float:
    """Wall time (s) of `sweeps run` on a fresh cluster of the given shape."""
    from harness import AWS_ENV, MultiNodeRay, venv_env

    cache = os.environ.setdefault("BATCHSWEEP_CACHE", str(work / "cache"))
    cluster = MultiNodeRay(
        env={**AWS_ENV, "BATCHSWEEP_CACHE": cache}, workers=2 if multinode else 0, head_cpus=0 if multinode else 2
    ).start()
    try:
        spec = {**SPEC, **checkpoints}
        path = work / f"spec-{index}.yaml"
        path.write_text(yaml.safe_dump(spec))
        env = venv_env(
            {
                **AWS_ENV,
                "RAY_ADDRESS": cluster.address,
                "SWEEPS_DATA_DIR": str(work / f"data-{index}"),
                "SWEEPS_STORAGE_URI": s3.uri(f"run-{index}"),  # type: ignore[attr-defined]
            }
        )
        for key in ("MLFLOW_TRACKING_URI", "SWEEPS_OPTUNA_STORAGE"):
            env.pop(key, None)
        started = time.perf_counter()
        done = subprocess.run(
            [str(Path(sys.executable).parent / "sweeps"), "run", str(path), "--id", f"overhead-{index}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"sweep {index} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return wall
    finally:
        cluster.stop()


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="sweeps per shape (the median is compared)")
    args = parser.parse_args(None if argv is None else list(argv))
    from harness import MotoS3

    shapes: dict[str, tuple[bool, dict[str, object]]] = {
        "one node": (False, {}),
        "1 + 2 nodes": (True, {}),
        "1 + 2 nodes, no checkpoints": (True, {"checkpoints": {"every_tokens": 0}}),
        "1 + 2 nodes, every evaluation": (True, {"checkpoints": {"min_interval_s": 0}}),
    }
    with tempfile.TemporaryDirectory(prefix="cluster-overhead-") as tmp:
        work = Path(tmp)
        s3 = MotoS3(work / "moto.log").start()
        try:
            walls: dict[str, list[float]] = {name: [] for name in shapes}
            index = 0
            for _ in range(args.repeats):
                for name, (multinode, checkpoints) in shapes.items():  # interleaved: drift hits every shape
                    walls[name].append(
                        one_sweep(multinode=multinode, checkpoints=checkpoints, s3=s3, work=work, index=index)
                    )
                    index += 1
        finally:
            s3.stop()
    median = {name: statistics.median(w) for name, w in walls.items()}
    n_trials = (
        len(SPEC["optimizers"]) * len(SPEC["batch_sizes"]) * (SPEC["lr"]["trials_per_batch_size"] + SPEC["seeds"])
    )
    print(f"sweep: {n_trials} trials of {SPEC['token_budget']} tokens, 2 at a time; trial storage in S3 (moto)")
    for name, value in median.items():
        print(f"  {name:30s} {value:7.1f} s  (runs: {', '.join(f'{w:.1f}' for w in walls[name])})")
    multi = median["1 + 2 nodes"] / median["one node"]
    ckpt = median["1 + 2 nodes"] / median["1 + 2 nodes, no checkpoints"]
    every = median["1 + 2 nodes, every evaluation"] / median["1 + 2 nodes, no checkpoints"]
    evals = SPEC["token_budget"] // SPEC["evaluation"]["every_tokens"] - 1  # none at the end: the trial is done
    cost = (median["1 + 2 nodes, every evaluation"] - median["1 + 2 nodes, no checkpoints"]) * 2 / (n_trials * evals)
    print(f"  a checkpoint at every evaluation: {every:.2f} x none, ~{cost:.2f} s of a trial slot per checkpoint")
    print(
        f"targets: multi-node <= 1.15 x one node {'met' if multi <= 1.15 else 'MISSED'}; checkpoints (default) <= 1.05 x none {'met' if ckpt <= 1.05 else 'MISSED'}"
    )
    print(f"multi-node / one node = {multi:.2f}, checkpoints (default) / none = {ckpt:.2f} (targets <= 1.15, <= 1.05)")


if __name__ == "__main__":
    main()
