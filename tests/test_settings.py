"""One typed settings object per layer, and no side doors.

- the environment is read by the settings classes only (worker.settings <- sweeps.settings <-
  service.settings), every module of the five packages read with `ast`;
- importing any package of the project changes neither the environment nor the home directory;
- the configuration reference (docs/configuration.md) is the one the classes generate, and every
  setting in it says what it means.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.config_doc import configuration_reference
from service.settings import Settings
from sweeps.settings import SweepSettings
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("worker", "sweeps", "dashboards", "service", "cli")
# the only modules that touch os.environ, and why
ALLOWED = {
    # Ray's own variables (loopback, token auth, Train's knobs), set at a process's entry before ray is imported
    "worker/local_ray.py",
    # passes the service's environment on to the Ray head's process, less the API's secrets
    "service/cluster/ray_head.py",
}


def environment_uses(path: Path, root: Path = ROOT) -> list[str]:
    """Lines of `path` that name os.environ, os.getenv, os.putenv or environ imported from os, in order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "environb"):
            found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if {a.name for a in node.names} & {"environ", "getenv", "putenv", "environb"}:
                found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}"))
    return [where for _, where in sorted(found)]


def test_nothing_reads_the_environment_outside_the_settings_classes() -> None:
    uses = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if str(path.relative_to(ROOT)) not in ALLOWED:
                uses += environment_uses(path)
    assert uses == []


def test_the_check_sees_every_spelling(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text("import os\nfrom os import getenv\na = os.environ.get('X')\nb = os.getenv('Y')\nc = 1\n")
    assert environment_uses(module, tmp_path) == ["probe.py:2", "probe.py:3", "probe.py:4"]


def test_importing_the_packages_changes_nothing(tmp_path: Path) -> None:
    """Every module of the five packages imported in a fresh interpreter with an empty home: the
    environment is what it was after ray's own import, and the home directory stays empty."""
    script = """
import importlib, os, pkgutil, shutil, sys
# the libraries' own changes first; ours are measured after them. ray sets RAY_CLIENT_MODE on import,
# transformers' GPT-2 (through torch's inductor) TORCHINDUCTOR_CACHE_DIR, mlflow writes
# ~/.config/mlflow/telemetry.json, matplotlib its font cache and config folder
import matplotlib.pyplot, mlflow, optuna, ray
from transformers import GPT2LMHeadModel
home = os.environ["HOME"]
for entry in os.listdir(home):
    shutil.rmtree(os.path.join(home, entry))
before = dict(os.environ)
names = []
for package in ("worker", "sweeps", "dashboards", "service", "cli"):
    module = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
        names.append(info.name)
changed = sorted(set(os.environ.items()) ^ set(before.items()))
print(len(names), sorted(os.listdir(home)), changed)
"""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SWEEPS_", "BATCHSWEEP_"))}
    env["HOME"] = str(home)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    count, rest = out.stdout.strip().split(" ", 1)
    assert int(count) > 60  # every module was imported, not a handful
    # no ~/.ray/auth_token, no cache; the environment as it was
    assert rest == "[] []"


def test_the_configuration_reference_is_generated_from_the_classes() -> None:
    written = (ROOT / "docs" / "configuration.md").read_text()
    assert written == configuration_reference() + "\n", (
        "docs/configuration.md is stale: python -m service.config_doc > docs/configuration.md"
    )


def test_every_setting_says_what_it_means() -> None:
    reference = configuration_reference()
    for name, field in Settings.model_fields.items():
        assert field.description and len(field.description) > 15, name
    # each variable once, under the layer that reads it first
    rows = [line.split("|")[1].strip() for line in reference.splitlines() if line.startswith("| `")]
    assert len(rows) == len(set(rows)) == len(Settings.model_fields)
    assert {"`RAY_ADDRESS`", "`BATCHSWEEP_CACHE`", "`SWEEPS_DATA_DIR`", "`SWEEPS_TOKENS`"} <= set(rows)


def test_each_layer_extends_the_one_below() -> None:
    assert issubclass(Settings, SweepSettings) and issubclass(SweepSettings, WorkerSettings)
    assert set(WorkerSettings.model_fields) < set(SweepSettings.model_fields) < set(Settings.model_fields)


def test_worker_settings_from_the_nodes_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("SWEEPS_DATA_ROOTS", "BATCHSWEEP_PEAK_TFLOPS", "BATCHSWEEP_CACHE"):
        monkeypatch.delenv(name, raising=False)
    unset = WorkerSettings()
    assert unset.data_roots is None  # no restriction
    assert unset.cache_root == Path("~/.cache/batchsweep").expanduser()
    monkeypatch.setenv("SWEEPS_DATA_ROOTS", "")
    assert WorkerSettings().data_roots == []  # set but empty: no local path
    monkeypatch.setenv("SWEEPS_DATA_ROOTS", f"{tmp_path}/a, ,{tmp_path}/b")
    assert WorkerSettings().data_roots == [(tmp_path / "a").resolve(), (tmp_path / "b").resolve()]
    monkeypatch.setenv("BATCHSWEEP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BATCHSWEEP_PEAK_TFLOPS", "989")
    s = WorkerSettings()
    assert (s.cache_root, s.peak_tflops) == (tmp_path / "cache", 989.0)
    monkeypatch.setenv("BATCHSWEEP_PEAK_TFLOPS", "-1")
    with pytest.raises(ValidationError, match=r"peak_tflops\n.*greater than 0"):
        WorkerSettings()


def test_sweep_settings_name_the_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sweeps.settings import runtime_from_env

    monkeypatch.setenv("SWEEPS_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("SWEEPS_OPTUNA_STORAGE", "postgresql://u@127.0.0.1/optuna")
    monkeypatch.setenv("SWEEPS_TOKENS", "not read here")  # the service's: a sweep ignores it
    runtime = runtime_from_env()
    assert runtime.data_dir == (tmp_path / "d").resolve()
    assert runtime.optuna_storage == "postgresql://u@127.0.0.1/optuna"
    assert runtime.tracking_uri == f"sqlite:///{(tmp_path / 'd' / 'mlflow.db').resolve()}"
    # an explicit folder wins over the environment's
    assert runtime_from_env(tmp_path / "e").data_dir == (tmp_path / "e").resolve()
