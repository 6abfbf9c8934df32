"""Settings come from the environment; the tools' own variable names win over the data-dir defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.settings import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "MLFLOW_UI_URL"):
        monkeypatch.delenv(key, raising=False)


def test_defaults_live_under_one_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SWEEPS_DATA_DIR", str(tmp_path / "d"))
    s = Settings()
    root = (tmp_path / "d").resolve()
    assert s.data_dir == root
    assert s.database == f"sqlite:///{root / 'service.db'}"
    assert s.tracking_uri == f"sqlite:///{root / 'mlflow.db'}"
    assert s.optuna_url == f"sqlite:///{root / 'optuna.db'}"
    assert s.ray_address is None  # no address: a local cluster
    # the service binds to loopback unless told otherwise
    assert (s.host, s.port) == ("127.0.0.1", 8000)
    # what every sweep driver is handed: the same stores, as one typed object
    runtime = s.runtime()
    assert (runtime.data_dir, runtime.tracking_uri, runtime.optuna_storage) == (root, s.tracking_uri, s.optuna_url)
    assert runtime.artifact_root == root / "mlartifacts"


def test_tool_env_vars_win_over_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setenv("SWEEPS_OPTUNA_STORAGE", "postgresql://u@127.0.0.1/optuna")
    s = Settings()
    assert s.tracking_uri == "http://127.0.0.1:5000"
    assert s.ray_address == "127.0.0.1:6379"
    assert s.runtime().optuna_storage == "postgresql://u@127.0.0.1/optuna"
    assert s.runtime().tracking_uri == "http://127.0.0.1:5000"


def test_lists_and_tokens_from_comma_separated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SWEEPS_TOKENS", "alice=t1-0123456789abcdef, bob=t2-0123456789abcdef")
    monkeypatch.setenv("SWEEPS_DATA_ROOTS", f"{tmp_path}/a,{tmp_path}/b")
    monkeypatch.setenv("SWEEPS_HF_DATASETS", "wikitext:wikitext-2-raw-v1,tiny_shakespeare")
    monkeypatch.setenv("SWEEPS_MAX_CONCURRENT_PER_OWNER", "3")
    s = Settings()
    assert s.owner_of() == {"t1-0123456789abcdef": "alice", "t2-0123456789abcdef": "bob"}
    assert s.data_roots == [(tmp_path / "a").resolve(), (tmp_path / "b").resolve()]
    assert s.hf_datasets == ["wikitext:wikitext-2-raw-v1", "tiny_shakespeare"]
    assert s.max_concurrent_per_owner == 3
    # tokens never show in reprs (logs)
    assert "t1-0123" not in repr(s)


@pytest.mark.parametrize("value", ["alice", "alice=", "=t1", "alice=t1,alice=t2", "alice=t1,bob=t1"])
def test_malformed_tokens_are_refused_without_echoing_them(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SWEEPS_TOKENS", value)
    with pytest.raises(ValidationError) as info:
        Settings()
    assert "SWEEPS_TOKENS" in str(info.value)
    # a refused setting must not leak its tokens into logs
    assert "t1" not in str(info.value).replace("SWEEPS_TOKENS", "")


def test_mlflow_link_only_when_a_ui_is_configured() -> None:
    assert Settings(mlflow_ui_url=None).mlflow_link("3") is None
    assert (
        Settings(mlflow_ui_url="http://127.0.0.1:5000/").mlflow_link("3")
        == "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning"
    )
    assert Settings(mlflow_ui_url="http://127.0.0.1:5000").mlflow_link(None) is None


def test_trial_storage_is_local_by_default_and_refused_where_a_node_cannot_see_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sweeps.runtime import StorageNotShared, check_storage

    monkeypatch.setenv("SWEEPS_DATA_DIR", str(tmp_path / "d"))
    local = Settings().runtime()
    assert local.trial_storage == str((tmp_path / "d").resolve() / "ray_results") and local.storage_is_local
    check_storage(local, nodes=1, unseen=lambda path: pytest.fail("one machine: nothing to probe"))
    # several nodes: shared when every node reads the marker back (a mount), else refused naming the nodes
    asked: list[Path] = []
    check_storage(local, nodes=3, unseen=lambda path: asked.append(path) or [])
    assert asked == [(tmp_path / "d").resolve() / "ray_results"]
    with pytest.raises(StorageNotShared, match=r"1 of them cannot see \(abc \(10.0.0.7\)\).*SWEEPS_STORAGE_URI"):
        check_storage(local, nodes=3, unseen=lambda path: ["abc (10.0.0.7)"])
    monkeypatch.setenv("SWEEPS_STORAGE_URI", "s3://sweeps/results?endpoint_override=http://127.0.0.1:9000")
    shared = Settings().runtime()
    assert shared.trial_storage == "s3://sweeps/results?endpoint_override=http://127.0.0.1:9000"
    check_storage(shared, nodes=3, unseen=lambda path: pytest.fail("a URI is shared storage: nothing to probe"))


def test_passwords_in_uris_are_redacted_for_logs() -> None:
    from service.settings import redacted

    assert (
        redacted("postgresql://mlflow:s3cret@db.internal:5432/mlflow")
        == "postgresql://mlflow:***@db.internal:5432/mlflow"
    )
    assert redacted("http://u:p%40ss@mlflow:5000") == "http://u:***@mlflow:5000"
    assert redacted("sqlite:////data/mlflow.db") == "sqlite:////data/mlflow.db"
    assert redacted("http://mlflow:5000") == "http://mlflow:5000"


def test_the_local_ray_head_does_not_inherit_the_apis_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cluster.ray_head import head_env

    monkeypatch.setenv("SWEEPS_TOKENS", "alice=secret-token")
    monkeypatch.setenv("SWEEPS_SESSION_SECRET", "x" * 40)
    monkeypatch.setenv("SWEEPS_OPTUNA_STORAGE", "sqlite:////tmp/o.db")
    env = head_env()
    assert "SWEEPS_TOKENS" not in env and "SWEEPS_SESSION_SECRET" not in env
    assert env["SWEEPS_OPTUNA_STORAGE"] == "sqlite:////tmp/o.db"  # what drivers need still travels


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("SWEEPS_TOKENS", "alice=tiny1", "the token of 'alice' is a placeholder or shorter than 16"),
        ("SWEEPS_TOKENS", "alice=CHANGE-ME-token-of-alice", "the token of 'alice' is a placeholder"),
        ("SWEEPS_SESSION_SECRET", "CHANGE-ME-run-openssl-rand-hex-32", "no placeholder"),
        ("SWEEPS_SESSION_SECRET", "x" * 31, "at least 32 characters"),
        # the example Secret's Ray token (deploy/kubernetes/secret.example.yaml)
        ("RAY_AUTH_TOKEN", "CHANGE-ME-run-openssl-rand-hex-32", "no placeholder"),
        ("RAY_AUTH_TOKEN", "r" * 20, "at least 32 characters"),
    ],
)
def test_placeholder_or_short_secrets_refuse_to_start(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, words: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as info:
        Settings()
    assert words in str(info.value)
    assert value.split("=")[-1] not in str(info.value)  # the secret itself is not echoed


def test_the_log_format_reaches_every_driver_and_a_bad_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWEEPS_LOG_FORMAT", "json")
    assert Settings().runtime().log_format == "json"  # what each SweepActor configures its process with
    monkeypatch.setenv("SWEEPS_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError, match="log_format"):
        Settings()


SERVE = ["-m", "cli.main", "serve"]  # `sweeps serve`


def test_the_example_secrets_ray_token_is_refused() -> None:
    import yaml

    docs = yaml.safe_load_all((Path(__file__).parents[2] / "deploy/kubernetes/secret.example.yaml").read_text())
    example = next(d for d in docs if d and d["metadata"]["name"] == "batchsweep")["stringData"]["RAY_AUTH_TOKEN"]
    with pytest.raises(ValidationError, match="no placeholder"):
        Settings(ray_auth_token=example)
    assert Settings(ray_auth_token="0" * 64).ray_auth_token is not None


@pytest.mark.parametrize(
    ("command", "env", "line"),
    [
        (SERVE, {"SWEEPS_TOKENS": "alice=short"}, "bad setting SWEEPS_TOKENS: the token of 'alice' is a placeholder"),
        (SERVE, {"SWEEPS_PORT": "99999"}, "bad setting SWEEPS_PORT: Input should be less than or equal to 65535"),
        (
            SERVE,
            {"RAY_AUTH_TOKEN": "CHANGE-ME-run-openssl-rand-hex-32"},
            "bad setting RAY_AUTH_TOKEN: must be at least",
        ),
        (["-m", "service"], {"SWEEPS_PORT": "abc"}, "bad setting SWEEPS_PORT: Input should be a valid integer"),
    ],
)
def test_a_bad_setting_ends_serve_with_one_line_naming_the_variable(
    command: list[str], env: dict[str, str], line: str, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SWEEPS_", "RAY_", "MLFLOW_"))}
    out = subprocess.run(
        [sys.executable, *command],
        env=clean | env | {"SWEEPS_DATA_DIR": str(tmp_path), "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
