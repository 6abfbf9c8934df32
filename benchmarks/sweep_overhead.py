"""Does orchestration eat the cluster? Runs a sweep (default: the demo spec) and compares its wall
time with the ideal: the sum of the trials' own training time divided by max_concurrent_trials.

    python benchmarks/sweep_overhead.py [--spec sweeps/examples/demo.yaml]

Target (issue: sweeps): ratio <= 1.25. The Ray cluster is started, and the token cache built,
before the clock starts: they are the cluster's cost, not the sweep's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from worker.local_ray import use_local_ray  # noqa: E402

use_local_ray()  # before anything imports ray: local Ray clusters on loopback only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, default=Path(__file__).parent.parent / "sweeps/examples/demo.yaml")
    args = parser.parse_args()

    from sweeps.driver import run_sweep
    from sweeps.settings import runtime_from_env
    from sweeps.spec import SweepSpec
    from worker.data import prepare_data
    from worker.launch import init_ray

    spec = SweepSpec.load(args.spec)
    init_ray()
    prepare_data(spec.data)
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as d:
        runtime = runtime_from_env(d)
        start = time.perf_counter()
        outcome = run_sweep(spec, sweep_id=f"{spec.name}-bench", runtime=runtime)
        wall = time.perf_counter() - start
    times = outcome.trial_train_time_s
    ideal = sum(times) / spec.resources.max_concurrent_trials
    print(f"sweep {spec.name}: {len(times)} trials, {spec.resources.max_concurrent_trials} at a time")
    print(f"trial training time: total {sum(times):.1f} s, median {statistics.median(times):.1f} s")
    print(f"ideal (sum / concurrency): {ideal:.1f} s")
    print(f"wall time:                 {wall:.1f} s")
    print(f"overhead per trial:        {(wall - ideal) * spec.resources.max_concurrent_trials / len(times):.2f} s")
    print(f"wall / ideal = {wall / ideal:.2f}x (target <= 1.25x)")


if __name__ == "__main__":
    main()
