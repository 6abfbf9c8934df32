"""Run by tests/cluster/test_service_on_cluster.py in a process of its own (a Ray driver of the test's
cluster): one training run on 1 worker, then the same on 2 DDP workers (gloo); prints JSON with both
histories and the nodes the DDP workers ran on (Ray's State API)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from worker.local_ray import use_local_ray

use_local_ray()  # before ray is imported: loopback only
from worker.launch import init_ray, run_training  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, for the harness (run as a script)
from harness import TINY_DDP_CONFIG as CFG  # noqa: E402
from harness import on_workers  # noqa: E402


def main(address: str) -> None:
    import ray
    from ray.util.state import list_actors

    init_ray(address)
    single = run_training(CFG)
    ddp = run_training(on_workers(CFG, 2))
    workers = list_actors(filters=[("class_name", "=", "RayTrainWorker")], detail=True, limit=1000)
    print(
        json.dumps(
            {
                "single": single.history,
                "ddp": ddp.history,
                "ddp_final": ddp.final,
                "statuses": [single.status, ddp.status],
                "worker_nodes": sorted({a.node_id for a in workers}),
            }
        )
    )
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
