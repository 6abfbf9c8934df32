"""The dry run's price, over HTTP (in-process app, drivers faked, no Ray) and through the CLI:
`POST /sweeps/dry-run[?gpu=&mfu=&peak_tflops=]` and `POST /sweeps?dry_run=true[&gpu=...]` answer a `cost`,
the same one, a bad pricing parameter is a 422 naming it and its value, and `sweeps submit --dry-run` /
`sweeps price` print the same figures."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from harness import tiny_spec
from svc_helpers import ALICE, FakeLauncher, ThreadServer, auth
from typer.testing import CliRunner

from cli.main import app
from service.app import create_app
from service.settings import Settings
from sweeps.cost import PriceConfig, price
from sweeps.spec import SweepSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "sweeps" / "examples"

# the dry run's two addresses: its own route, and the submit route's flag (public since before it had one)
DRY_RUNS = {"route": ("/sweeps/dry-run", {}), "flag": ("/sweeps", {"dry_run": "true"})}


def dry_run(client: TestClient, how: str, spec: Any, **params: Any) -> Any:
    path, flag = DRY_RUNS[how]
    return client.post(path, params=flag | params, json=spec, headers=auth())


def assert_error(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == code
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("how", DRY_RUNS)
def test_a_dry_run_answers_the_cost_by_hand(client: TestClient, launcher: FakeLauncher, how: str) -> None:
    spec = {k: v for k, v in tiny_spec().items() if k not in ("eval_every_tokens", "eval_tokens")}
    resp = dry_run(client, how, spec)  # the evaluation defaults
    assert resp.status_code == 200, resp.text
    cost = resp.json()["cost"]
    # tiny_spec: gpt2-nano (L=2, d=64), seq_len 32, vocab 512, batch sizes [4, 8], 2 search + 1 seed, and
    # one more search trial at batch size 4 (the reference)
    assert cost["trials"] == {"min": 7, "max": 7}
    assert cost["trained_tokens"] == 23 * 256 == 5888  # 6000 rounded down to lcm(4, 8) x 32
    assert cost["tokens_per_trial"] == cost["trained_tokens"]  # its first name, the same value
    n = 2 * (12 * 64**2 + 13 * 64) + 512 * 64 + 2 * 64  # without the position embeddings
    assert cost["flop_parameters"] == n == 132_864 and cost["parameters"] == n + 32 * 64
    fpt = 6 * n + 12 * 2 * 32 * 64
    assert cost["training_flops_per_token"] == fpt == 846_336
    # evaluations every 588 tokens (a tenth of the budget): batch 4 every 5 of 46 steps = 10, batch 8
    # every 2 of 23 = 12; 4 trials at batch 4 and 3 at batch 8; each scores 32,768 tokens (eval_tokens' default)
    assert cost["evaluations"] == {"min": 76, "max": 76} == {"min": 4 * 10 + 3 * 12, "max": 76}
    total = 7 * 5888 * fpt + 76 * 32768 * (2 * n + 4 * 2 * 32 * 64)
    assert cost["total_flops"] == {"min": total, "max": total}
    assert cost["gpu"] == "H100-SXM" and cost["mfu"] == 0.4
    assert cost["gpu_hours"]["max"] == pytest.approx(total / (0.4 * 989e12) / 3600, rel=1e-12)
    assert launcher.started == [] and client.get("/sweeps", headers=auth()).json()["total"] == 0


@pytest.mark.parametrize("how", DRY_RUNS)
def test_the_gpu_mfu_and_peak_are_query_parameters(client: TestClient, how: str) -> None:
    def hours(**params: Any) -> dict[str, Any]:
        resp = dry_run(client, how, tiny_spec(), **params)
        assert resp.status_code == 200, resp.text
        return resp.json()["cost"]  # type: ignore[no-any-return]

    h100, a100 = hours(), hours(gpu="a100", mfu=0.5)
    assert (a100["gpu"], a100["peak_flops"], a100["mfu"]) == ("A100", 312e12, 0.5)
    assert a100["gpu_hours"]["max"] == pytest.approx(h100["gpu_hours"]["max"] * (0.4 * 989) / (0.5 * 312))
    custom = hours(gpu="A10G", peak_tflops=70)
    assert (custom["gpu"], custom["peak_flops"], custom["peak_from"]) == ("A10G", 70e12, "peak_tflops")


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"gpu": "B9000"}, "query.gpu", ["unknown GPU 'B9000'", "known GPUs: H100-SXM", "A100"]),
        ({"mfu": "1.5"}, "query.mfu", ["mfu must be in [0.001, 1]", "mfu=1.5"]),
        ({"mfu": "0"}, "query.mfu", ["mfu=0"]),
        ({"mfu": "nan"}, "query.mfu", ["finite"]),
        ({"mfu": "fast"}, "query.mfu", ["number"]),
        ({"peak_tflops": "-5"}, "query.peak_tflops", ["peak_tflops=-5"]),
        ({"gpu": "x" * 65}, "query.gpu", ["at most 64"]),
    ],
)
@pytest.mark.parametrize("how", DRY_RUNS)
def test_a_bad_pricing_parameter_is_a_422_naming_it(
    client: TestClient, params: dict[str, str], field: str, words: list[str], how: str
) -> None:
    resp = dry_run(client, how, tiny_spec(), **params)
    err = assert_error(resp, 422, "invalid_request")
    assert [d["field"] for d in err["details"]] == [field]
    text = err["details"][0]["message"]
    for w in words:
        assert w in text, text
    assert field in err["message"]


def test_both_addresses_answer_the_same_dry_run(client: TestClient, launcher: FakeLauncher) -> None:
    yaml_body = yaml.safe_dump(tiny_spec()).encode()
    answers = {}
    for how, (path, flag) in DRY_RUNS.items():
        resp = client.post(
            path,
            params=flag | {"gpu": "A100", "mfu": 0.3},
            content=yaml_body,
            headers=auth() | {"Content-Type": "application/yaml"},
        )
        assert resp.status_code == 200, resp.text
        answers[how] = resp.json()
    assert answers["route"] == answers["flag"]
    assert answers["route"]["valid"] is True and answers["route"]["cost"]["gpu"] == "A100"
    assert {"caps", "cluster", "total_trials", "cells", "trained_tokens", "spec"} <= set(answers["route"])
    # a dry run stores and starts nothing, at either address
    assert launcher.started == [] and client.get("/sweeps", headers=auth()).json()["total"] == 0


def test_the_dry_run_route_refuses_as_the_api_does(client: TestClient) -> None:
    resp = client.post("/sweeps/dry-run", json=tiny_spec())
    assert_error(resp, 401, "unauthorized")
    err = assert_error(client.post("/sweeps/dry-run", json=tiny_spec(seeds=0), headers=auth()), 422, "invalid_spec")
    assert [d["field"] for d in err["details"]] == ["seeds"]
    plain = auth() | {"Content-Type": "text/plain"}
    assert_error(client.post("/sweeps/dry-run", content=b"name: x", headers=plain), 415, "unsupported_media_type")
    # it has no sweep id: a GET of the address is the read of a sweep that does not exist
    assert_error(client.get("/sweeps/dry-run", headers=auth()), 404, "not_found")


def test_the_openapi_documents_the_dry_run_route(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/sweeps/dry-run"]["post"]
    assert {p["name"] for p in operation["parameters"]} == {"gpu", "mfu", "peak_tflops"}
    body = operation["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/SweepSpec"}
    assert "application/yaml" in body
    ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/DryRunResult"}
    assert {"401", "413", "415", "422", "429"} <= set(operation["responses"])


def test_pricing_a_real_submit_is_refused(client: TestClient, launcher: FakeLauncher) -> None:
    resp = client.post("/sweeps", params={"gpu": "A100"}, json=tiny_spec(), headers=auth())
    err = assert_error(resp, 422, "invalid_request")
    assert "dry_run=true" in err["message"] and err["details"][0]["field"] == "query.gpu"
    assert launcher.started == [] and client.get("/sweeps", headers=auth()).json()["total"] == 0


def test_the_papers_protocol_prices_in_thousands_of_gpu_hours(
    make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    """What a team sees before it pays: the medium protocol on a service configured to accept it."""
    settings = make_settings(max_token_budget=50 * 10**9, hf_datasets=["Skylion007/openwebtext"])
    body = (EXAMPLES / "merit_gpt2.yaml").read_bytes()
    with TestClient(create_app(settings, launcher=launcher)) as client:
        resp = client.post(
            "/sweeps?dry_run=true&gpu=H100", content=body, headers=auth() | {"Content-Type": "application/yaml"}
        )
        assert resp.status_code == 200, resp.text
        cost = resp.json()["cost"]
        # the same function as offline (sweeps price), on the same spec
        offline = price(SweepSpec.load(EXAMPLES / "merit_gpt2.yaml"), PriceConfig(gpu="H100"))
        assert cost == offline.model_dump(mode="json")
        assert 1_000 <= cost["gpu_hours"]["max"] < 100_000
        # the default limits refuse it, naming the budget
        with TestClient(create_app(make_settings(hf_datasets=["Skylion007/openwebtext"]), launcher=launcher)) as small:
            refused = small.post(
                "/sweeps?dry_run=true", content=body, headers=auth() | {"Content-Type": "application/yaml"}
            )
            err = assert_error(refused, 422, "invalid_spec")
            assert [d["field"] for d in err["details"]] == ["token_budget"]


def test_a_search_of_the_batch_axis_is_priced_as_a_range(
    make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    """The fewest and the most the search can spend: from the fewest sizes at the fewest seeds to the
    most sizes (its cap) at the most; the paper's protocol as a search, beside its list."""
    with TestClient(create_app(make_settings(), launcher=launcher)) as client:
        spec = tiny_spec(
            batch_sizes={"min": 4, "max": 64, "resolution": 1.5},
            seeds={"min": 2, "max": 4, "step": 2},
            token_budget=61440,
        )
        resp_tiny = client.post("/sweeps?dry_run=true", json=spec, headers=auth())
    assert resp_tiny.status_code == 200, resp_tiny.text
    cost = resp_tiny.json()["cost"]
    parsed = SweepSpec.from_mapping(spec)
    fewest, most = parsed.sizes_per_optimizer
    assert (fewest, most) == (1, 8) and parsed.lattice == [4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert cost["trials"] == {"min": fewest * (2 + 2) + 1, "max": most * (2 + 4) + 1}  # + the reference's one
    assert cost["trained_tokens"] == cost["tokens_per_trial"] == parsed.trained_tokens
    assert cost["training_tokens"] == {k: v * parsed.trained_tokens for k, v in cost["trials"].items()}
    assert any("a search of the batch axis" in n and "1 to 8 of the 9 lattice sizes" in n for n in cost["notes"])

    settings = make_settings(max_token_budget=50 * 10**9, hf_datasets=["Skylion007/openwebtext"])
    with TestClient(create_app(settings, launcher=launcher)) as client:
        costs = {}
        for name in ("merit_gpt2.yaml", "merit_gpt2_search.yaml"):
            resp = client.post(
                "/sweeps?dry_run=true",
                content=(EXAMPLES / name).read_bytes(),
                headers=auth() | {"Content-Type": "application/yaml"},
            )
            assert resp.status_code == 200, resp.text
            costs[name] = resp.json()["cost"]
            assert costs[name] == price(SweepSpec.load(EXAMPLES / name)).model_dump(mode="json")
    search = costs["merit_gpt2_search.yaml"]
    assert search["gpu_hours"]["min"] < costs["merit_gpt2.yaml"]["gpu_hours"]["min"] < search["gpu_hours"]["max"]


# ---- the CLI ------------------------------------------------------------------------------------


@pytest.fixture
def cli(fake_server: ThreadServer, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    monkeypatch.setenv("SWEEPS_URL", fake_server.url)
    monkeypatch.setenv("SWEEPS_TOKEN", ALICE)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200"})


def test_submit_dry_run_prints_the_cost(cli: Callable[..., Any], tmp_path: Path, fake_server: ThreadServer) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_spec()))
    out = cli("submit", "--dry-run", "--gpu", "A100", "--mfu", "0.5", str(path))
    assert out.exit_code == 0, out.output
    expected = price(SweepSpec.load(path), PriceConfig(gpu="A100", mfu=0.5))
    assert "7 trials" in out.output and "A100: 312 TFLOP/s" in out.output and "MFU 0.5" in out.output
    assert f"{expected.gpu_hours.max:.3g}" in out.output and "GPU-hours" in out.output
    assert "5.89K" in out.output  # tokens per trial
    assert fake_server.launcher.started == []

    refused = cli("submit", "--dry-run", "--mfu", "3", str(path))
    assert refused.exit_code == 2 and "422" in refused.output and "query.mfu" in refused.output
    priced_submit = cli("submit", "--gpu", "A100", str(path))
    assert priced_submit.exit_code == 2 and "--dry-run" in priced_submit.output


def test_price_works_offline_and_agrees_with_the_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWEEPS_URL", "http://127.0.0.1:9")  # nothing listens: price needs no service
    runner = CliRunner()
    path = EXAMPLES / "merit_gpt2.yaml"
    expected = price(SweepSpec.load(path))
    out = runner.invoke(app, ["price", str(path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert f"{expected.gpu_hours.max:,.0f}" in out.output and "(upper bound)" in out.output
    assert "165 (111 of them lr search)" in out.output and "47.9B" in out.output
    as_json = runner.invoke(app, ["price", str(path), "--gpu", "h200", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output) == price(SweepSpec.load(path), PriceConfig(gpu="H200")).model_dump(mode="json")
    bad = runner.invoke(app, ["price", str(path), "--gpu", "B9000"])
    assert bad.exit_code == 2 and "unknown GPU 'B9000'" in bad.output
