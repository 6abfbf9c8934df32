"""A study priced over HTTP (in-process app, drivers faked, no Ray): `POST /studies/dry-run` answers each
scale's sweep with its cost, their sum and the sweep at the target it replaces, the same figures as
`sweeps.study.price_study` by hand, and with `confirm: true` its confirmation at most; whether its sweeps
pass the GPU-hours caps; and refuses, naming the field, a body that is not a study, a scale the service would
not run, a bad pricing parameter. Nothing is recorded or started."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from harness import tiny_spec
from svc_helpers import FakeLauncher, auth

from service.policy import capped_price
from sweeps.cost import PriceConfig, price
from sweeps.study import StudySpec, confirm_bound_spec, price_study


def tiny_study(name: str = "law", budgets: tuple[int, ...] = (3000, 6000), **overrides: Any) -> dict[str, Any]:
    sweep = {k: v for k, v in tiny_spec(name).items() if k not in ("model", "token_budget")}
    model = {"preset": "gpt2-nano", "seq_len": 32}
    return sweep | {
        "scales": {"models": [model], "token_budgets": list(budgets)},
        "target": {"model": dict(model), "token_budget": 48_000},  # a copy: YAML would write an alias
    } | overrides  # fmt: skip


def error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]  # type: ignore[no-any-return]


def test_a_study_is_priced_scale_by_scale_beside_the_sweep_it_replaces(
    app_client: Callable[..., TestClient], launcher: FakeLauncher
) -> None:
    client = app_client()
    study = tiny_study()
    resp = client.post("/studies/dry-run", params={"gpu": "A100", "mfu": 0.3}, json=study, headers=auth())
    assert resp.status_code == 200, resp.text
    got = resp.json()
    want = price_study(StudySpec.model_validate(study), PriceConfig(gpu="A100", mfu=0.3))
    assert [s["name"] for s in got["sweeps"]] == ["law-s1", "law-s2"] == [n for n, _ in want.scales]
    for s, (_, cost) in zip(got["sweeps"], want.scales, strict=True):
        assert s["cost"] == cost.model_dump(mode="json") and s["model"] == "gpt2-nano"
    assert [s["trained_tokens"] for s in got["sweeps"]] == [
        s.trained_tokens for s in StudySpec.model_validate(study).sweep_specs()
    ]
    assert got["target"]["name"] == "law-target" and got["target"]["cost"] == want.target.model_dump(mode="json")
    assert got["gpu_hours"] == want.gpu_hours.model_dump() and got["ratio"] == want.ratio.model_dump()
    assert 0 < got["ratio"]["max"] < 1  # two small budgets against one 8x the larger
    # the caps judge the study's sweeps at their own pricing: together, and each as its submit would be
    caps = got["caps"]
    hours = [capped_price(s) for s in StudySpec.model_validate(study).sweep_specs()]
    assert caps["passes"] is True and caps["gpu_hours"] == pytest.approx(sum(hours))
    # the same study as YAML: the same answer
    resp = client.post(
        "/studies/dry-run",
        params={"gpu": "A100", "mfu": 0.3},
        content=yaml.safe_dump(study),
        headers=auth() | {"content-type": "application/yaml"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == got
    assert got["confirmation"] is None  # the study does not confirm
    # nothing recorded, nothing started
    assert client.get("/sweeps", headers=auth()).json()["total"] == 0 and launcher.started == []


def test_a_confirming_study_is_priced_with_its_confirmation_at_most(
    app_client: Callable[..., TestClient], launcher: FakeLauncher
) -> None:
    study = tiny_study(batch_sizes=[4, 8, 16, 32], confirm=True)
    resp = app_client().post("/studies/dry-run", params={"gpu": "A100", "mfu": 0.3}, json=study, headers=auth())
    assert resp.status_code == 200, resp.text
    got = resp.json()
    plan = StudySpec.model_validate(study)
    bound = confirm_bound_spec(plan)
    # a line of its own: the target's spec at its reference and the two costliest sizes one prediction can pick
    assert bound is not None and len(bound.batch_sizes) == 3 and bound.batch_sizes[0] == 4
    confirmation = got["confirmation"]
    assert confirmation["name"] == "law-confirm" and confirmation["model"] == "gpt2-nano"
    assert confirmation["cost"] == price(bound, PriceConfig(gpu="A100", mfu=0.3)).model_dump(mode="json")
    assert confirmation["trained_tokens"] == plan.target_spec().trained_tokens
    assert confirmation["cost"]["trials"]["max"] < got["target"]["cost"]["trials"]["max"]  # fewer sizes
    # the scales' sum and ratio stay the scales'; the caps judge the confirmation with them
    assert got["gpu_hours"] == price_study(plan, PriceConfig(gpu="A100", mfu=0.3)).gpu_hours.model_dump()
    hours = [capped_price(s) for s in plan.sweep_specs()]
    assert got["caps"]["gpu_hours"] == pytest.approx(sum(hours) + capped_price(bound))
    # caps per owner the scales pass together: the confirmation alone over one (at 8x the larger's tokens),
    # with them over the other
    most = capped_price(bound)
    for cap, problem in (
        (sum(hours) * 1.01, "law-confirm: "),
        (most + sum(hours) / 2, "the study's 3 sweeps together: "),
    ):
        client = app_client(max_gpu_hours_per_owner=cap)
        caps = client.post("/studies/dry-run", json=study, headers=auth()).json()["caps"]
        assert caps["passes"] is False and caps["problems"][0].startswith(problem), caps
        plain = client.post("/studies/dry-run", json=tiny_study(batch_sizes=[4, 8, 16, 32]), headers=auth()).json()
        assert plain["caps"]["passes"] is True and plain["confirmation"] is None
    assert launcher.started == []


def test_the_caps_judge_each_sweep_and_the_study_together(app_client: Callable[..., TestClient]) -> None:
    study = tiny_study()
    hours = [capped_price(s) for s in StudySpec.model_validate(study).sweep_specs()]
    # a cap per sweep between the two: the larger sweep is named
    client = app_client(max_gpu_hours_per_sweep=(hours[0] + hours[1]) / 2)
    caps = client.post("/studies/dry-run", json=study, headers=auth()).json()["caps"]
    assert caps["passes"] is False and len(caps["problems"]) == 1
    assert caps["problems"][0].startswith("law-s2: ") and "SWEEPS_MAX_GPU_HOURS_PER_SWEEP" in caps["problems"][0]
    # a cap per owner each sweep passes alone but not both together
    client = app_client(max_gpu_hours_per_owner=max(hours) * 1.01)
    caps = client.post("/studies/dry-run", json=study, headers=auth()).json()["caps"]
    assert caps["passes"] is False and caps["owner_gpu_hours"] == 0.0
    assert caps["problems"][0].startswith("the study's 2 sweeps together: ")
    assert "SWEEPS_MAX_GPU_HOURS_PER_OWNER" in caps["problems"][0]


def test_what_is_not_a_study_the_service_would_run_is_refused_naming_it(app_client: Callable[..., TestClient]) -> None:
    client = app_client(max_token_budget=5000)
    # a sweep spec is not a study
    err = error(client.post("/studies/dry-run", json=tiny_spec(), headers=auth()), 422)
    assert "not a study" in err["message"] and err["details"][0]["field"] == "scales"
    # one scale over the service's token budget: its sweep named, the field with it
    err = error(client.post("/studies/dry-run", json=tiny_study(), headers=auth()), 422)
    assert [d["field"] for d in err["details"]] == ["law-s2.token_budget"]
    assert "max_token_budget=5000" in err["details"][0]["message"]
    # the study's own rules: one scale is no law
    err = error(client.post("/studies/dry-run", json=tiny_study(budgets=(3000,)), headers=auth()), 422)
    assert "2 to 24 scales, got 1" in str(err["details"])
    # a bad pricing parameter, named with its value
    err = error(client.post("/studies/dry-run", params={"mfu": 2}, json=tiny_study(), headers=auth()), 422)
    assert "mfu" in str(err["details"]) and "2" in str(err["details"])


def test_a_scale_whose_grown_axis_passes_a_cap_is_refused_saying_who_grew_it(
    app_client: Callable[..., TestClient],
) -> None:
    # 4..16 at the smallest budget, 4..64 at 4x it: the larger scale's search can test 5 sizes, not 3
    study = tiny_study(budgets=(4096, 16384), batch_sizes={"min": 4, "max": 16, "resolution": 2.0})
    specs = StudySpec.model_validate(study).sweep_specs()
    assert [s.lattice[-1] for s in specs] == [16, 64]
    trials = [s.total_trials for s in specs]
    client = app_client(max_trials=trials[0])
    err = error(client.post("/studies/dry-run", json=study, headers=auth()), 422)
    assert [d["field"] for d in err["details"]] == ["law-s2.total_trials"]
    message = err["details"][0]["message"]
    assert f"total trials {trials[1]}" in message and "raised this sweep's batch_sizes.max from 16 to 64" in message
    # kept at the file's max, the same study passes; each sweep's answer lists the sizes it may train at
    fixed = client.post("/studies/dry-run", json=study | {"grow_batch_axis": False}, headers=auth())
    assert fixed.status_code == 200, fixed.text
    assert [s["batch_sizes"] for s in fixed.json()["sweeps"]] == [[4, 8, 16]] * 2
    grown = app_client().post("/studies/dry-run", json=study, headers=auth())
    assert [s["batch_sizes"] for s in grown.json()["sweeps"]] == [s.lattice for s in specs]
