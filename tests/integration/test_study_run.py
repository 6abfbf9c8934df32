"""`sweeps study` end to end on the session's Ray cluster: a study of two token budgets runs its sweeps
smallest first, each into its report, then turns to the law (two scales support none, and it says so: the fit
itself is tests/sweeps/test_law.py's and test_law_cli.py's), recorded in MLflow as the study's run with its
sweeps nested under it and the law's figure; run again, it trains nothing, answers from the reports it has and
updates the same runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import tiny_spec
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from cli.main import app
from sweeps.analysis import read_report
from sweeps.layout import LAW_FILE, PARENT_TAG, Role, Tag, runs_of, study_experiment
from sweeps.settings import runtime_from_env

pytestmark = pytest.mark.ray

BUDGETS = [4096, 2048]  # listed out of order: the study runs the smallest first


def study() -> dict[str, Any]:
    spec = tiny_spec(
        "study",
        lr={"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 1},
        eval_every_tokens=1024,
        eval_tokens=1024,
        seeds=1,  # 5 trials a sweep
    )
    sweep = {k: v for k, v in spec.items() if k not in ("model", "token_budget")}
    model = spec["model"]
    return sweep | {
        "scales": {"models": [model], "token_budgets": BUDGETS},
        "target": {"model": model, "token_budget": 65536},
    }


def test_a_study_runs_its_scales_smallest_first_and_fits_the_law(
    ray_session: str, data_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(study()))))
    out = tmp_path / "reports"
    runner = CliRunner()
    result = runner.invoke(app, ["study", str(path), "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    reports = {p.stem: read_report(json.loads(p.read_text())) for p in out.glob("*.json")}
    assert sorted(reports) == ["study-s1", "study-s2"]
    assert [reports[f"study-s{i}"].trained_tokens for i in (1, 2)] == sorted(BUDGETS)
    text = " ".join(result.output.split())
    assert text.index("scale 1 of 2") < text.index("scale 2 of 2") < text.index("the law, predicted at 65,536 tokens")
    assert "no law: 2 scale(s)" in text or "no law: 1 scale(s)" in text or "no law: 0 scale(s)" in text
    # in MLflow: the study's run, its two sweeps nested under it, and what the fit said
    client = MlflowClient(runtime_from_env().tracking_uri)
    experiment = client.get_experiment_by_name(study_experiment("study"))
    assert experiment is not None
    (parent,) = runs_of(client, experiment.experiment_id, Role.study)
    assert parent.info.run_id in text
    nested = runs_of(client, experiment.experiment_id, Role.scale)
    assert sorted(r.data.tags[Tag.sweep_id] for r in nested) == ["study-s1", "study-s2"]
    assert {r.data.tags[PARENT_TAG] for r in nested} == {parent.info.run_id}
    law = json.loads(Path(client.download_artifacts(parent.info.run_id, LAW_FILE, str(tmp_path))).read_text())
    assert [x["optimizer"] for x in law["laws"]] == ["adamw"] and law["laws"][0]["no_law"]
    # and its figure (dashboards.study), from the same laws
    figures = {a.path for a in client.list_artifacts(parent.info.run_id, "figures")}
    assert figures == {f"figures/law.{x}" for x in ("png", "html", "json")} | {"figures/plotly.min.js"}
    drawn = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "figures/law.json", str(tmp_path))).read_text()
    )
    assert drawn == law["laws"]
    # again: every scale has its report, nothing trains, the same law
    again = runner.invoke(app, ["study", str(path), "--out", str(out)], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert " ".join(again.output.split()).count("done before") == 2
    assert text.split("the law, predicted at")[1] == " ".join(again.output.split()).split("the law, predicted at")[1]
    # and the same runs, not a second study run
    assert [r.info.run_id for r in runs_of(client, experiment.experiment_id, Role.study)] == [parent.info.run_id]
    assert len(runs_of(client, experiment.experiment_id, Role.scale)) == 2
