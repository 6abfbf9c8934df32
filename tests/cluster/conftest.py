"""Fixtures of the multi-node suite: one S3 server and one 1-head + 2-worker-node Ray cluster for the whole
package (starting a cluster takes ~9 s). A test that kills a worker node adds one in its place, so every test
finds two worker nodes alive; each reads the nodes it asserts on from the cluster, not from a count."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import AWS_ENV, MotoS3, MultiNodeRay


@pytest.fixture(scope="package")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    server = MotoS3(tmp_path_factory.mktemp("s3") / "moto.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def multinode(s3: MotoS3, token_cache: Path) -> Iterator[MultiNodeRay]:
    """Every Ray process sees the S3 credentials (as a cluster's pods get them from their Secret) and
    the session's token cache."""
    cluster = MultiNodeRay(env={**AWS_ENV, "BATCHSWEEP_CACHE": str(token_cache)}).start()
    try:
        yield cluster
    finally:
        cluster.stop()
