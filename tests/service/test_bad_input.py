"""Bad input gets a clear 4xx, fast, and nothing heavy is accepted.

Every case goes through the HTTP API in-process (FakeLauncher, no Ray) unless it needs real concurrency
(uvicorn in a thread): YAML aliases and deep nesting, optimizer keywords, upper bounds and non-finite
numbers, bounded validation and the dry-run rate limit, sequences longer than the corpus, NUL bytes,
query ranges, data roots, the event-stream limit, and idempotent submits under 100 concurrent clients.
Every error keeps the `{"error": {"code", "message", "details"}}` shape and echoes at most an excerpt.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from harness import tiny_spec
from svc_helpers import BOB, FakeLauncher, ThreadServer, auth, wait_until

from service import policy
from service.api.limits import Slots, TokenBucket
from service.app import create_app
from service.settings import Settings
from sweeps.documents import MAX_DEPTH, MAX_NODES
from worker.messages import EXCERPT_CHARS

YAML = {"Content-Type": "application/yaml"}
JSON = {"Content-Type": "application/json"}


def assert_error(resp: Any, status: int, code: str) -> dict[str, Any]:
    """The error shape, with no traceback or server file in it."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code, body
    assert "Traceback" not in resp.text and "site-packages" not in resp.text and ".py" not in resp.text
    return body["error"]  # type: ignore[no-any-return]


def refusal(client: TestClient, spec: Any, *, kind: str = "json", path: str = "/sweeps") -> dict[str, Any]:
    body = yaml.safe_dump(spec) if kind == "yaml" and not isinstance(spec, str) else spec
    if kind == "yaml":
        resp = client.post(path, content=body, headers=auth() | YAML)
    elif isinstance(body, (str, bytes)):
        resp = client.post(path, content=body, headers=auth() | JSON)
    else:
        resp = client.post(path, json=body, headers=auth())
    return assert_error(resp, 422, "invalid_spec")


def fields(err: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["field"]: d for d in err["details"]}


def stored(client: TestClient) -> int:
    return int(client.get("/sweeps", headers=auth()).json()["total"])


# ---- 1. YAML aliases, deep and large documents --------------------------------------------------------

ALIAS_BOMB = """\
name: bomb
optimizers:
  - name: adamw
    extra:
      a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
      b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
      c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
      d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
      e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
      f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
batch_sizes: [4, 8]
token_budget: 6000
lr: {min: 1.0e-3, max: 1.0e-2}
degradation: {baseline: adamw}
"""


@pytest.mark.parametrize(
    ("document", "line"),
    [
        (ALIAS_BOMB, 5),  # the first anchor
        ("name: x\nself: &s [*s]\n", 2),  # a self-referencing alias: a cyclic object (was a 500)
        ("name: x\nbase: &b {tolerance: 0.1}\ndegradation:\n  <<: *b\n  baseline: adamw\n", 2),  # merge key
        ("name: x\nlr: {min: 0.001, max: *nowhere}\n", 2),  # an alias with no anchor
    ],
)
def test_yaml_anchors_and_aliases_are_refused_naming_the_line(client: TestClient, document: str, line: int) -> None:
    started = time.perf_counter()
    err = refusal(client, document, kind="yaml")
    # refused before anything is expanded: milliseconds; an expanded bomb or cycle takes seconds to
    # forever. 3 s leaves room for a loaded 2-core CI machine (1.2 s seen once next to a benchmark)
    assert time.perf_counter() - started < 3.0
    (detail,) = err["details"]
    assert detail["field"] == "body"
    assert "aliases" in detail["message"] and f"(line {line})" in detail["message"]
    assert stored(client) == 0


@pytest.mark.parametrize(
    ("body", "headers", "what"),
    [
        ("[" * 10_000, JSON, "nested deeper than 32 levels"),  # was a RecursionError: 500
        ('{"a": ' + "[" * 10_000 + "]" * 10_000 + "}", JSON, "nested deeper than 32 levels"),
        ("a: " + "[" * 10_000, YAML, "nested deeper than 32 levels (line 1)"),
        ("a:\n" + "".join(f"{'  ' * i}- \n" for i in range(1, 40)), YAML, "nested deeper than 32 levels"),
        (json.dumps({"batch_sizes": list(range(MAX_NODES + 1))}), JSON, f"more than {MAX_NODES} values"),
        (yaml.safe_dump({"batch_sizes": list(range(MAX_NODES + 1))}), YAML, f"more than {MAX_NODES} values"),
        ('{"name": "x", "seeds": ' + "9" * 5000 + "}", JSON, "more than 4300 digits"),
        ("name: x\nseeds: " + "9" * 5000 + "\n", YAML, "invalid YAML"),
    ],
)
def test_deep_or_huge_documents_are_422_not_500(
    client: TestClient, body: str, headers: dict[str, str], what: str
) -> None:
    started = time.perf_counter()
    resp = client.post("/sweeps?dry_run=true", content=body, headers=auth() | headers)
    assert time.perf_counter() - started < 2.0
    err = assert_error(resp, 422, "invalid_spec")
    assert err["details"][0]["field"] == "body" and what in err["details"][0]["message"], err
    assert len(resp.content) < 2000  # the refused document is not echoed


def test_depth_limit_leaves_room_for_real_specs(client: TestClient) -> None:
    # spec > optimizers > entry > extra are 4 levels; the value below them may nest up to MAX_DEPTH
    def spec_nested(levels: int) -> dict[str, Any]:
        nested: Any = 1
        for _ in range(levels):
            nested = [nested]
        return tiny_spec(optimizers=[{"name": "adamw", "extra": {"amsgrad": nested}}])

    err = refusal(client, spec_nested(MAX_DEPTH - 4))
    assert "optimizers.0.extra.amsgrad" in fields(err)  # parsed; then refused by the optimizer's rule
    err = refusal(client, spec_nested(MAX_DEPTH - 3))
    assert err["details"][0]["field"] == "body" and "nested deeper" in err["details"][0]["message"]


# ---- 2. optimizer keywords checked at submit ------------------------------------------------------------


def test_unknown_extra_keyword_is_422_listing_the_valid_ones(client: TestClient) -> None:
    err = refusal(client, tiny_spec(optimizers=[{"name": "adamw"}, {"name": "sophia", "extra": {"rh0": 0.1}}]))
    detail = fields(err)["optimizers.1.extra.rh0"]
    assert "unknown extra keyword 'rh0'" in detail["message"] and "valid keywords: rho" in detail["message"]
    err = refusal(client, tiny_spec(optimizers=[{"name": "adamw", "extra": {"nesterov": True}}]))
    message = fields(err)["optimizers.0.extra.nesterov"]["message"]
    assert all(k in message for k in ("amsgrad", "foreach", "fused", "maximize"))
    err = refusal(client, tiny_spec(optimizers=[{"name": "adamw"}, {"name": "merit", "extra": {"k": 1}}]))
    assert "merit takes no extra keywords" in fields(err)["optimizers.1.extra.k"]["message"]
    assert stored(client) == 0


@pytest.mark.parametrize(
    ("optimizer", "key", "value", "words"),
    [
        ("sophia", "rho", [0.1, 0.2], "takes a number (an int or a finite float), got [0.1, 0.2]"),  # not a scalar
        ("sophia", "rho", {"x": 1}, "takes a number"),
        ("sophia", "rho", True, "takes a number"),  # a bool is not a number
        ("sophia", "rho", "0.1", "takes a number"),
        ("adamw", "fused", "yes", "takes a bool or null, got 'yes'"),
        ("adamw", "amsgrad", None, "takes a bool (true or false), got None"),
        ("lamb", "n_sma_threshold", 2.5, "takes an int"),
        ("adamw", "lr", 0.1, "not allowed"),  # from the optimizer config
        ("sophia", "bs", 64, "not allowed"),  # from tokens_per_step
    ],
)
def test_extra_values_must_be_scalars_of_the_keywords_kind(
    client: TestClient, optimizer: str, key: str, value: Any, words: str
) -> None:
    opts = [{"name": "adamw"}] if optimizer != "adamw" else []
    err = refusal(client, tiny_spec(optimizers=[*opts, {"name": optimizer, "extra": {key: value}}]))
    detail = fields(err)[f"optimizers.{len(opts)}.extra.{key}"]
    assert words in detail["message"]


def test_extra_non_finite_value_is_refused(client: TestClient) -> None:
    body = '{"name": "x", "optimizers": [{"name": "sophia", "extra": {"rho": NaN}}]}'
    err = refusal(client, body)
    assert "NaN" in err["details"][0]["message"] and "finite" in err["details"][0]["message"]


def test_eps_of_an_optimizer_without_one_is_refused_at_submit(client: TestClient) -> None:
    err = refusal(client, tiny_spec(optimizers=[{"name": "adamw"}, {"name": "lion", "eps": 1e-8}]))
    assert "takes no eps" in fields(err)["optimizers.1.eps"]["message"]


def test_valid_extra_keywords_are_accepted(client: TestClient) -> None:
    spec = tiny_spec(
        optimizers=[
            {"name": "adamw", "extra": {"fused": None, "amsgrad": True}},
            {"name": "sophia", "extra": {"rho": 1}},
        ]
    )
    resp = client.post("/sweeps?dry_run=true", json=spec, headers=auth())
    assert resp.status_code == 200, resp.text
    assert resp.json()["spec"]["optimizers"][1]["extra"] == {"rho": 1}


# ---- 3. upper bounds, finite numbers, bounded validation, dry-run rate limit -------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"batch_sizes": [4, 65_537]}, "batch_sizes"),
        ({"batch_sizes": list(range(1, 34))}, "batch_sizes"),
        ({"resources": {"max_micro_batch": 1025}}, "resources.max_micro_batch"),
        ({"resources": {"cpus_per_worker": 129}}, "resources.cpus_per_worker"),
        ({"resources": {"gpus_per_worker": 9}}, "resources.gpus_per_worker"),
        ({"resources": {"workers_per_trial": 65}}, "resources.workers_per_trial"),
        ({"resources": {"max_concurrent_trials": 257}}, "resources.max_concurrent_trials"),
        ({"model": {"preset": None, "n_layer": 129, "n_head": 2, "n_embd": 64}}, "model.n_layer"),
        ({"model": {"preset": None, "n_layer": 2, "n_head": 129, "n_embd": 129}}, "model.n_head"),
        ({"model": {"preset": None, "n_layer": 2, "n_head": 2, "n_embd": 8194}}, "model.n_embd"),
        ({"model": {"preset": "gpt2-nano", "seq_len": 8193}}, "model.seq_len"),
        ({"data": {"vocab_size": 65_536}}, "data.vocab_size"),
        # numbers past any float (were OverflowError: 500) or past any sense
        ({"eval_every_tokens": 10**400}, "eval_every_tokens"),
        ({"checkpoint_every_tokens": 10**400}, "checkpoint_every_tokens"),
        ({"token_budget": 10**400}, "token_budget"),
        ({"pruning": {"reduction_factor": 10**400}}, "pruning.reduction_factor"),
        ({"lr": {"min": 1e-4, "max": 1e300, "trials_per_batch_size": 2}}, "lr.max"),
        ({"lr": {"min": 1e-4, "max": 1e-2, "trials_per_batch_size": 2, "extend": 1e9}}, "lr.extend"),
        ({"schedule": {"warmup_tokens": 10**400}}, "schedule.warmup_tokens"),
    ],
)
def test_every_costly_number_has_an_upper_bound(client: TestClient, changes: dict[str, Any], field: str) -> None:
    err = refusal(client, tiny_spec(**changes))
    assert field in fields(err), err


@pytest.mark.parametrize(
    ("model", "words"),
    [
        # preset x seq_len: gpt2-large at 8k tokens keeps 48 G attention scores per sequence
        ({"preset": "gpt2-large", "seq_len": 8192}, "attention scores per sequence"),
        # within every per-field bound, but 103 B parameters
        ({"preset": None, "n_layer": 128, "n_head": 64, "n_embd": 8192, "seq_len": 16}, "parameters"),
    ],
)
def test_model_size_is_bounded_as_a_whole(client: TestClient, model: dict[str, Any], words: str) -> None:
    err = refusal(client, tiny_spec(model=model, token_budget=10**9))
    assert words in fields(err)["model"]["message"]


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ('"max": 0.01', '"max": Infinity', "body"),  # JSON's Infinity (was accepted, failed at run time)
        ('"max": 0.01', '"max": 1e400', "body"),  # overflows to inf
        ('"max": 0.01', '"max": "inf"', "lr.max"),  # a string pydantic would read as inf
        ('"seeds": 1', '"seeds": 1, "grad_clip": "NaN"', "grad_clip"),
        (
            '"max_concurrent_trials": 2',
            '"max_concurrent_trials": 2, "gpus_per_worker": "Infinity"',
            "resources.gpus_per_worker",
        ),
        ('"tolerance": 0.05', '"tolerance": NaN', "body"),
    ],
)
def test_no_infinity_or_nan_anywhere(client: TestClient, old: str, new: str, field: str) -> None:
    raw = json.dumps(tiny_spec())
    assert old in raw
    err = refusal(client, raw.replace(old, new))
    assert field in fields(err), err


def test_yaml_infinity_is_refused(client: TestClient) -> None:
    text = yaml.safe_dump(tiny_spec()).replace("max: 0.01", "max: .inf")
    assert "max: .inf" in text
    err = refusal(client, text, kind="yaml")
    assert "finite" in err["details"][0]["message"] and "lr.max" in err["details"][0]["message"]


def test_validation_is_fast_at_the_limits(make_settings: Callable[..., Settings], launcher: FakeLauncher) -> None:
    settings = make_settings(max_token_budget=10**13, max_trials=10**6, dry_run_burst=100)
    with TestClient(create_app(settings, launcher=launcher)) as client:
        # a 400-byte dry run that took 12 s: one huge batch size and micro-batch (split_batch counted
        # up through every divisor candidate, for each cell and lr)
        old_worst = tiny_spec(
            optimizers=[{"name": "adamw"}, {"name": "lion"}, {"name": "lamb"}],
            batch_sizes=[4, 8, 60_000_011],
            token_budget=10**12,
            resources={"max_micro_batch": 10**9},
            model={"preset": "gpt2-nano", "seq_len": 2},
        )
        started = time.perf_counter()
        err = assert_error(client.post("/sweeps?dry_run=true", json=old_worst, headers=auth()), 422, "invalid_spec")
        assert time.perf_counter() - started < 0.5
        assert {"batch_sizes", "resources.max_micro_batch"} <= set(fields(err))
        # the largest spec the limits let through: 5 optimizers x 32 batch sizes up to 65536 (the 32
        # largest divisors of 2^11 x 3^3 = 55296, so that lcm(batch_sizes) x seq_len fits the budget)
        divisors = sorted(d for d in range(1, 55297) if 55296 % d == 0)[-32:]
        largest = tiny_spec(
            optimizers=[{"name": n} for n in ("adamw", "lamb", "lion", "merit", "sophia")],
            batch_sizes=divisors,
            token_budget=65536 * 32,
            lr={"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 1},
            resources={"max_micro_batch": 1024},
        )
        started = time.perf_counter()
        resp = client.post("/sweeps?dry_run=true", json=largest, headers=auth())
        assert resp.status_code == 200, resp.text
        assert resp.json()["cells"] == 160
        assert time.perf_counter() - started < 0.5


def test_dry_runs_are_rate_limited_per_owner(make_settings: Callable[..., Settings], launcher: FakeLauncher) -> None:
    settings = make_settings(dry_run_burst=3, dry_run_refill_s=60.0)
    with TestClient(create_app(settings, launcher=launcher)) as client:
        # one bucket for the dry run at both its addresses
        for path in ("/sweeps?dry_run=true", "/sweeps/dry-run", "/sweeps?dry_run=true"):
            assert client.post(path, json=tiny_spec(), headers=auth()).status_code == 200
        assert_error(client.post("/sweeps/dry-run", json=tiny_spec(), headers=auth()), 429, "too_many_dry_runs")
        # an invalid dry run counts too: validating it is the work being limited
        resp = client.post("/sweeps?dry_run=true", json=tiny_spec(seeds=0), headers=auth())
        err = assert_error(resp, 429, "too_many_dry_runs")
        assert 1 <= int(resp.headers["retry-after"]) <= 60
        assert "3 dry runs" in err["message"]
        assert client.post("/sweeps?dry_run=true", json=tiny_spec(), headers=auth(BOB)).status_code == 200  # per owner
        assert client.post("/sweeps", json=tiny_spec(), headers=auth()).status_code == 201  # submits are not dry runs


def test_submits_are_rate_limited_per_owner_before_the_body_is_read(
    make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    settings = make_settings(submit_burst=2, submit_refill_s=60.0, dry_run_burst=5)
    with TestClient(create_app(settings, launcher=launcher)) as client:
        assert client.post("/sweeps", json=tiny_spec(), headers=auth()).status_code == 201
        # a refused submit counts: parsing and validating it is the work being limited
        assert_error(client.post("/sweeps", content="[" * 100, headers=auth() | JSON), 422, "invalid_spec")
        resp = client.post("/sweeps", json=tiny_spec(), headers=auth())
        err = assert_error(resp, 429, "too_many_submits")
        assert 1 <= int(resp.headers["retry-after"]) <= 60 and "2 submits" in err["message"]
        assert stored(client) == 1
        assert client.post("/sweeps", json=tiny_spec(), headers=auth(BOB)).status_code == 201  # per owner
        assert client.post("/sweeps?dry_run=true", json=tiny_spec(), headers=auth()).status_code == 200  # own bucket


def test_token_bucket_refills_at_its_rate() -> None:
    now = [100.0]
    bucket = TokenBucket(burst=2, refill_s=10.0, clock=lambda: now[0])
    assert bucket.take("a") == 0.0 and bucket.take("a") == 0.0
    assert bucket.take("a") == pytest.approx(10.0)  # empty: one token in 10 s
    now[0] += 4.0
    assert bucket.take("a") == pytest.approx(6.0)
    now[0] += 6.0
    assert bucket.take("a") == 0.0
    now[0] += 1000.0
    assert [bucket.take("a") for _ in range(3)] == [0.0, 0.0, pytest.approx(10.0)]  # never more than the burst
    assert bucket.take("b") == 0.0


# ---- 4. sequences longer than the corpus, NUL bytes, query ranges ---------------------------------------


def test_seq_len_longer_than_the_builtin_corpus_is_422(client: TestClient) -> None:
    # micro-batches of 128 sequences of 8193 tokens: 1.05M, more than the builtin corpus's 571k training tokens
    spec = tiny_spec(
        model={"preset": "gpt2-nano", "seq_len": 8192},
        batch_sizes=[128],
        token_budget=128 * 8192,
        resources={"max_micro_batch": 128},
    )
    err = refusal(client, spec)
    detail = fields(err)["model.seq_len"]
    assert "builtin corpus" in detail["message"] and detail["value"] == 8192
    # the same sequences, fewer per step, fit
    ok = tiny_spec(model={"preset": "gpt2-nano", "seq_len": 8192}, batch_sizes=[4], token_budget=4 * 8192)
    assert client.post("/sweeps?dry_run=true", json=ok, headers=auth()).status_code == 200


def test_seq_len_longer_than_a_local_corpus_is_422(
    make_settings: Callable[..., Settings], launcher: FakeLauncher, tmp_path: Path
) -> None:
    root = tmp_path / "corpora"
    root.mkdir()
    (root / "small.txt").write_text("a few words of text " * 20)  # 400 bytes: at most 1,200 tokens
    settings = make_settings(data_roots=[root])
    with TestClient(create_app(settings, launcher=launcher)) as client:
        spec = tiny_spec(data={"source": str(root / "small.txt")}, model={"preset": "gpt2-nano", "seq_len": 2048})
        spec["token_budget"] = 8 * 2048
        err = refusal(client, spec)
        assert "model.seq_len" in fields(err) and "400 bytes" in fields(err)["model.seq_len"]["message"]


@pytest.mark.parametrize(
    "data",
    [
        {"source": "/srv/corpora/a\x00b.txt"},
        {"source": "hf:/srv/corpora/\x00"},
        {"source": "builtin", "cache_dir": "/tmp/\x00"},
        {"source": "hf:wikitext", "text_field": "te\x00xt"},
    ],
)
def test_nul_byte_in_a_path_is_422(client: TestClient, data: dict[str, Any]) -> None:
    err = refusal(client, tiny_spec(data=data))
    assert any("NUL" in d["message"] for d in err["details"]), err


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=-1",
        "limit=101",
        "limit=99999999999999999999999",
        "offset=-1",
        "offset=1000001",
        "offset=9223372036854775808",  # past SQLite's 64-bit integers: was an OverflowError, 500
        "offset=99999999999999999999999",
        "limit=abc",
        "offset=1.5",
        "status=bogus",
    ],
)
def test_query_parameters_out_of_range_are_422(client: TestClient, query: str) -> None:
    err = assert_error(client.get(f"/sweeps?{query}", headers=auth()), 422, "invalid_request")
    assert err["details"][0]["field"].startswith("query.")


# ---- 5. data roots --------------------------------------------------------------------------------------


@pytest.fixture
def roots(
    make_settings: Callable[..., Settings], launcher: FakeLauncher, tmp_path: Path
) -> Iterator[tuple[TestClient, Path, Path]]:
    inside, outside = tmp_path / "corpora", tmp_path / "private"
    (inside / "books").mkdir(parents=True)
    (inside / "books" / "a.txt").write_text("to be or not to be " * 2000)
    outside.mkdir()
    (outside / "secret.txt").write_text("keys " * 2000)
    with TestClient(create_app(make_settings(data_roots=[inside]), launcher=launcher)) as client:
        yield client, inside, outside


def test_a_folder_inside_a_root_is_accepted(roots: tuple[TestClient, Path, Path]) -> None:
    client, inside, _ = roots
    resp = client.post("/sweeps?dry_run=true", json=tiny_spec(data={"source": str(inside / "books")}), headers=auth())
    assert resp.status_code == 200, resp.text


def test_symlinked_file_inside_an_allowed_folder_pointing_outside_is_refused(
    roots: tuple[TestClient, Path, Path],
) -> None:
    client, inside, outside = roots
    os.symlink(outside / "secret.txt", inside / "books" / "z-link.txt")  # the folder is allowed, the link is not
    err = refusal(client, tiny_spec(data={"source": str(inside / "books")}))
    assert "resolves outside the allowed data roots" in fields(err)["data.source"]["message"]
    # the file itself, through the link
    err = refusal(client, tiny_spec(data={"source": str(inside / "books" / "z-link.txt")}))
    assert "outside the allowed data roots" in fields(err)["data.source"]["message"]
    assert stored(client) == 0


def test_refusals_outside_the_roots_do_not_reveal_existence(roots: tuple[TestClient, Path, Path]) -> None:
    client, inside, outside = roots
    os.symlink(outside / "secret.txt", inside / "books" / "link-existing.txt")
    os.symlink(outside / "missing.txt", inside / "books" / "link-missing.txt")
    os.symlink(outside, inside / "dir-link")

    def message(source: str) -> str:
        err = refusal(client, tiny_spec(data={"source": source}))
        text = str(fields(err)["data.source"]["message"])
        return text.replace(source, "<source>").replace(source.removeprefix("hf:"), "<source>")

    pairs = [
        (str(outside / "secret.txt"), str(outside / "missing.txt")),  # plain paths outside
        (str(inside / "books" / "link-existing.txt"), str(inside / "books" / "link-missing.txt")),  # links out
        (str(inside / "dir-link" / "secret.txt"), str(inside / "dir-link" / "missing.txt")),  # through a folder link
        (f"hf:{outside / 'secret.txt'}", f"hf:{outside / 'missing.txt'}"),
        ("hf:etc/passwd", "hf:etc/no-such-file"),  # relative: a hub name, never looked up on disk
    ]
    for existing, missing in pairs:
        assert message(existing) == message(missing), (existing, missing)
    # and a folder holding a dangling link out is refused like one holding a live link out
    (inside / "other").mkdir()
    os.symlink(outside / "missing.txt", inside / "other" / "gone.txt")
    assert "resolves outside" in message(str(inside / "other"))


def test_walking_a_folder_source_is_bounded(
    roots: tuple[TestClient, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, inside, _ = roots
    monkeypatch.setattr(policy, "MAX_SOURCE_ENTRIES", 5)
    (inside / "many").mkdir()
    (inside / "many" / "a.txt").write_text("text " * 2000)
    for i in range(10):
        (inside / "many" / f"{i}.bin").write_bytes(b"\0")  # not read, but walked: they count too
    started = time.perf_counter()
    err = refusal(client, tiny_spec(data={"source": str(inside / "many")}))
    assert "more than 5 files and folders" in fields(err)["data.source"]["message"]
    assert time.perf_counter() - started < 1.0


# ---- 6. event streams per owner ---------------------------------------------------------------------------


def test_event_streams_are_limited_per_owner(make_settings: Callable[..., Settings], launcher: FakeLauncher) -> None:
    settings = make_settings(max_event_streams_per_owner=2)
    with ThreadServer(settings, launcher) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        sweep_id = http.post("/sweeps", json=tiny_spec(), headers=auth()).json()["id"]
        other = http.post("/sweeps", json=tiny_spec(), headers=auth(BOB)).json()["id"]
        url = f"/sweeps/{sweep_id}/events"
        streams = [http.stream("GET", url, headers=auth()) for _ in range(2)]
        opened = [s.__enter__() for s in streams]
        assert all(r.status_code == 200 for r in opened)
        refused = http.get(url, headers=auth())
        err = assert_error(refused, 429, "too_many_streams")
        assert int(refused.headers["retry-after"]) >= 1 and "2 event streams" in err["message"]
        # another owner has its own allowance
        with http.stream("GET", f"/sweeps/{other}/events", headers=auth(BOB)) as bob:
            assert bob.status_code == 200
        # a closed stream frees its slot (the server notices the client went away)
        streams[0].__exit__(None, None, None)
        wait_until(lambda: _stream_opens(http, url), 10, what="a slot freed by a closed stream")
        streams[1].__exit__(None, None, None)


def _stream_opens(http: httpx.Client, url: str) -> bool:
    with http.stream("GET", url, headers=auth()) as resp:
        return resp.status_code == 200


def test_stream_slots_release_once() -> None:
    slots = Slots(limit=1)
    release = slots.acquire("a")
    assert release is not None and slots.acquire("a") is None and slots.acquire("b") is not None
    release()
    release()  # idempotent: a second call must not free a slot it does not hold
    again = slots.acquire("a")
    assert again is not None and slots.acquire("a") is None and slots.held("a") == 1


# ---- 7. idempotency under real concurrency ----------------------------------------------------------------


def test_concurrent_submits_with_distinct_and_repeated_keys(
    make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    settings = make_settings(max_concurrent_per_owner=500)
    with ThreadServer(settings, launcher) as server:
        clients = threading.local()

        def post(key: str) -> httpx.Response:
            if not hasattr(clients, "http"):
                clients.http = httpx.Client(base_url=server.url, timeout=60)
            return clients.http.post("/sweeps", json=tiny_spec(), headers=auth() | {"Idempotency-Key": key})

        start = threading.Barrier(50)

        def post_together(key: str) -> httpx.Response:
            try:
                start.wait(timeout=30)  # the first 50 requests leave at once
            except threading.BrokenBarrierError:
                pass
            return post(key)

        with ThreadPoolExecutor(max_workers=50) as pool:
            distinct = list(pool.map(post_together, [f"key-{i}" for i in range(100)]))
            start.reset()
            same = list(pool.map(post_together, ["one-key"] * 100))

        assert [r.status_code for r in distinct] == [201] * 100
        assert len({r.json()["id"] for r in distinct}) == 100
        assert [r.status_code for r in same] == [201] * 100
        ids = {r.json()["id"] for r in same}
        assert len(ids) == 1
        assert sum(not r.json()["replayed"] for r in same) == 1  # made once, replayed 99 times
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.get("/sweeps?limit=1", headers=auth()).json()["total"] == 101
        wait_until(lambda: len(launcher.started) == 101, 30, what="every sweep launched")
        assert launcher.started.count(ids.pop()) == 1  # the repeated key launched one driver


# ---- excerpts: a refused value is never echoed whole ------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        tiny_spec(name="x" * 100_000),
        tiny_spec(optimizers=[{"name": "y" * 100_000}]),
        tiny_spec(degradation={"baseline": "z" * 100_000}),
        tiny_spec(model={"preset": "p" * 100_000}),
        tiny_spec(data={"source": "/" + "d" * 3000}),
        tiny_spec(optimizers=[{"name": "adamw", "extra": {"k" * 100_000: 1}}]),
        tiny_spec(**{"q" * 100_000: 1}),
        tiny_spec(batch_sizes=list(range(1, 5000))),
    ],
)
def test_refused_values_are_echoed_as_short_excerpts(
    make_settings: Callable[..., Settings], launcher: FakeLauncher, spec: dict[str, Any]
) -> None:
    with TestClient(create_app(make_settings(max_body_bytes=1024 * 1024), launcher=launcher)) as client:
        resp = client.post("/sweeps", json=spec, headers=auth())
        err = assert_error(resp, 422, "invalid_spec")
        assert len(resp.content) < 4000, resp.text[:500]
        for detail in err["details"]:
            assert len(json.dumps(detail["value"])) <= EXCERPT_CHARS + 40
            assert len(detail["field"]) <= 200


def test_many_problems_are_counted_not_all_listed(client: TestClient) -> None:
    spec = tiny_spec() | {f"unknown_{i}": i for i in range(500)}
    err = refusal(client, spec)
    assert len(err["details"]) <= 21 and "more problems" in err["details"][-1]["message"]
    assert "more" in err["message"]


def test_sweep_errors_show_clients_their_first_line_only(client: TestClient, launcher: FakeLauncher) -> None:
    resp = client.post("/sweeps", json=tiny_spec(), headers=auth())
    sweep_id = resp.json()["id"]
    wait_until(lambda: sweep_id in launcher.drivers, 10)
    trace = 'Traceback (most recent call last):\n  File "/opt/cluster/sweeps/driver.py", line 62, in run_sweep\n'
    launcher.set(sweep_id, status="failed", error=f"ValueError: bad data\n{trace}", finished_at=1.0)
    wait_until(lambda: client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["status"] == "failed", 10)
    detail = client.get(f"/sweeps/{sweep_id}", headers=auth())
    assert detail.json()["error"] == "ValueError: bad data" and "driver.py" not in detail.text
    err = assert_error(client.get(f"/sweeps/{sweep_id}/report", headers=auth()), 409, "no_report")
    assert "bad data" in err["message"]


def test_unknown_sweep_id_is_excerpted(client: TestClient) -> None:
    resp = client.get("/sweeps/" + "a" * 80, headers=auth())
    assert_error(resp, 404, "not_found")
    # longer than any sweep id: refused as such (tests/service/test_sweep_ids.py), the value excerpted
    resp = client.get("/sweeps/" + "a" * 5000, headers=auth())
    assert_error(resp, 422, "invalid_request")
    assert len(resp.content) < 500
