"""Admission against the cluster (issue 46): a spec whose trials no node the cluster has, or its autoscaler can
add, can hold is refused at submit with a 422 naming the field and the estimate; the dry run and the submit
page's check say so; nothing is stored or started. In-process app, the cluster's nodes given to the fake
launcher (the real Ray path: tests/cluster/test_service_on_cluster.py)."""

from __future__ import annotations

import html
import time
from collections.abc import Iterator

import pytest
import yaml
from fastapi.testclient import TestClient
from harness import tiny_spec
from svc_helpers import FakeLauncher, auth

from service.app import create_app
from service.settings import Settings
from sweeps.admission import capacity_from

GIB = 2**30
SMALL = capacity_from([{"Alive": True, "NodeManagerAddress": "10.0.0.7", "Resources": {"CPU": 2, "memory": 6 * GIB}}])
LARGE = tiny_spec("large", model={"preset": "gpt2-large", "seq_len": 1024}, token_budget=65_536)
GPU = tiny_spec("gpu", resources={"gpus_per_worker": 1})


@pytest.fixture
def small(settings: Settings, launcher: FakeLauncher) -> Iterator[TestClient]:
    launcher.capacity_of = SMALL  # one node: 2 CPUs, 6 GiB, no GPU, no autoscaler
    with TestClient(create_app(settings, launcher=launcher)) as client:
        yield client


def test_a_model_no_node_can_hold_is_refused_naming_the_estimate(small: TestClient, launcher: FakeLauncher) -> None:
    resp = small.post("/sweeps", json=LARGE, headers=auth())
    assert resp.status_code == 422, resp.text
    err = resp.json()["error"]
    assert err["code"] == "cluster_cannot_run"
    assert (
        "GiB of host memory per worker" in err["message"] and "node 10.0.0.7: 2 CPUs, 0 GPUs, 6.0 GiB" in err["message"]
    )
    assert [d["field"] for d in err["details"]] == ["model"] and err["details"][0]["value"] == "gpt2-large"
    assert small.get("/sweeps", headers=auth()).json()["total"] == 0 and launcher.started == []


def test_gpus_the_cluster_has_none_of_are_refused(small: TestClient) -> None:
    resp = small.post("/sweeps", json=GPU, headers=auth())
    assert resp.status_code == 422 and resp.json()["error"]["details"][0]["field"] == "resources.gpus_per_worker"


def test_the_dry_run_says_what_the_cluster_cannot_run_and_still_prices_it(small: TestClient) -> None:
    resp = small.post("/sweeps?dry_run=true", json=LARGE, headers=auth())
    assert resp.status_code == 200, resp.text
    fit = resp.json()["cluster"]
    assert fit["checked"] and not fit["passes"] and fit["memory_per_worker_bytes"] > 6 * GIB
    assert "6.0 GiB" in fit["problems"][0] and resp.json()["cost"]["gpu_hours"]["max"] > 0
    ok = small.post("/sweeps?dry_run=true", json=tiny_spec(), headers=auth()).json()["cluster"]
    assert ok["passes"] and ok["problems"] == [] and ok["memory_per_worker_bytes"] < GIB
    # the page's check says it too, and does not invite a submit
    page = html.unescape(
        small.post("/submit", data={"spec": yaml.safe_dump(LARGE), "action": "check"}, headers=auth()).text
    )
    assert "This cluster cannot run it" in page and "Submit it to start" not in page
    fine = html.unescape(
        small.post("/submit", data={"spec": yaml.safe_dump(tiny_spec()), "action": "check"}, headers=auth()).text
    )
    assert "The cluster can run it" in fine and "Submit it to start" in fine


def test_a_cluster_whose_nodes_cannot_be_read_judges_nothing(client: TestClient, launcher: FakeLauncher) -> None:
    assert launcher.capacity_of is None
    fit = client.post("/sweeps?dry_run=true", json=LARGE, headers=auth()).json()["cluster"]
    assert fit["checked"] is False and fit["passes"] is True
    assert client.post("/sweeps", json=LARGE, headers=auth()).status_code == 201


def test_a_cluster_slow_to_answer_does_not_hold_a_submit(
    small: TestClient, launcher: FakeLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GCS that does not answer (a cluster restarting) costs a submit CAPACITY_WAIT_S, not the GCS client's
    own minute: the spec is then not judged here (the driver checks it before any trial)."""
    from service import manager

    monkeypatch.setattr(manager, "CAPACITY_WAIT_S", 0.3)
    launcher.capacity_delay_s = 5.0
    started = time.monotonic()
    resp = small.post("/sweeps", json=LARGE, headers=auth())
    assert resp.status_code == 201, resp.text
    assert time.monotonic() - started < 3.0
