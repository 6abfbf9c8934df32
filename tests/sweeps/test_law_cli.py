"""`sweeps law`: finished sweeps' reports at several token budgets (made by `sweeps.simulate` against a model
whose critical batch size doubles with every 4x of tokens) fitted as a law and predicted past them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from harness import tiny_spec
from typer.testing import CliRunner

from cli.main import app
from sweeps.analysis import read_report, report_to_json
from sweeps.law import scale_of
from sweeps.simulate import Run, simulate
from sweeps.spec import SweepSpec

BUDGETS = (8192, 32768, 131072)  # B* = 8 sqrt(tokens / 8192): 8, 16, 32


def report_at(tokens: int, tmp_path: Path) -> Path:
    spec = SweepSpec.from_mapping(
        tiny_spec(
            f"law-{tokens}",
            batch_sizes=[4, 8, 16, 32, 64],
            token_budget=tokens,
            eval_every_tokens=None,
            lr={"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 3},
            seeds=4,
            degradation={"tolerance": 0.01, "baseline": "adamw"},
        )
    )
    critical = 8 * math.sqrt(tokens / 8192)

    def objective(run: Run) -> list[float]:
        u = math.log(run.lr / 3e-3)
        final = 3.0 + 0.02 * u * u + 0.1 * max(0.0, math.log(run.batch_size / critical)) + 0.002 * run.seed
        return [final * (1 + 0.2 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]

    path = tmp_path / f"report-{tokens}.json"
    path.write_text(report_to_json(simulate(spec, objective).report))
    return path


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    tmp = tmp_path_factory.mktemp("law")
    return [report_at(t, tmp) for t in BUDGETS]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_three_budgets_give_a_law_a_prediction_and_a_check(reports: list[Path]) -> None:
    brackets = [json.loads(p.read_text())["optimizers"]["adamw"]["bracket"]["baseline"] for p in reports]
    assert [b["largest_fine"] for b in brackets] == [8, 16, 32]  # the model's B*, each decided
    out = invoke("law", *map(str, reports), "--target-tokens", "2097152")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    exponent = float(text.split("B* ~ tokens^")[1].split()[0])
    assert exponent == pytest.approx(0.5, abs=0.15)
    assert "from 3 scales" in text and "at 2.1e+06 tokens: B*" in text
    # each scale's point beside its bracket: the law is fitted through the points
    first = scale_of(read_report(json.loads(reports[0].read_text())), "adamw")
    assert first.point is not None and first.point_sd is not None
    assert f"tokens: [8, 16), point {first.point:.0f} (sd x{math.exp(first.point_sd):.2f})" in text
    assert "check: without the largest scale: 2 scale(s)" in text  # 2 scales left: too few for a law
    assert "lr there:" in text


def test_too_few_scales_and_bad_input_say_so(reports: list[Path], tmp_path: Path) -> None:
    out = invoke("law", *map(str, reports[:2]), "--target-tokens", "1e6")
    assert out.exit_code == 0 and "no law: 2 scale(s) with a point or a bracket bounded on a side" in " ".join(
        out.output.split()
    )
    out = invoke("law", str(reports[0]), "--target-tokens", "1e6", "--against", "nobody")
    assert out.exit_code == 2 and "--against must be self or baseline" in out.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 2}')
    out = invoke("law", str(bad), "--target-tokens", "1e6")
    assert out.exit_code == 2 and "cannot read report" in out.output


def test_a_study_is_recorded_in_mlflow_with_its_sweeps_nested(reports: list[Path], tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from sweeps.analysis import read_report
    from sweeps.law import study_laws
    from sweeps.layout import LAW_FILE, PARENT_TAG, STUDY_FILE, Role, Tag, runs_of, study_experiment
    from sweeps.study import StudySpec
    from sweeps.study_record import record_study

    sweep = {k: v for k, v in tiny_spec("law").items() if k not in ("model", "token_budget")}
    model = {"preset": "gpt2-nano", "seq_len": 32}
    study = StudySpec.model_validate(
        sweep
        | {
            "scales": {"models": [model], "token_budgets": list(BUDGETS)},
            "target": {"model": dict(model), "token_budget": 2097152},
        }
    )
    loaded = [(read_report(json.loads(p.read_text())), None) for p in reports]
    laws = study_laws(loaded, 2097152.0, None, "baseline")
    scales = [(f"law-s{i + 1}", r) for i, (r, _) in enumerate(loaded)]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = record_study(uri, study, scales, laws)
    assert record_study(uri, study, scales, laws) == run_id  # again: the same runs, updated

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(study_experiment("law"))
    assert experiment is not None and experiment.tags[Tag.study] == "law"
    (parent,) = runs_of(client, experiment.experiment_id, Role.study)
    assert parent.info.run_id == run_id and parent.info.status == "FINISHED"
    law = json.loads((Path(client.download_artifacts(run_id, LAW_FILE, str(tmp_path)))).read_text())
    assert law["laws"] == [x.model_dump(mode="json") for x in laws]
    assert (Path(client.download_artifacts(run_id, STUDY_FILE, str(tmp_path)))).read_text().startswith("name: law")
    assert parent.data.metrics["adamw.baseline.tokens_exponent"] == pytest.approx(laws[0].tokens_exponent)
    assert parent.data.metrics["adamw.baseline.predicted_batch_size"] == pytest.approx(laws[0].predicted.value)  # type: ignore[union-attr]
    nested = runs_of(client, experiment.experiment_id, Role.scale)
    assert sorted(r.data.tags[Tag.sweep_id] for r in nested) == ["law-s1", "law-s2", "law-s3"]
    assert {r.data.tags[PARENT_TAG] for r in nested} == {run_id}
    by_sweep = {r.data.tags[Tag.sweep_id]: r for r in nested}
    assert [by_sweep[f"law-s{i}"].data.metrics["adamw.baseline.largest_fine"] for i in (1, 2, 3)] == [8, 16, 32]
    # a confirmation at the target (here the largest scale's report stands in for its sweep's) is kept beside
    from sweeps.law import confirm_laws

    (confirmed,) = confirm_laws(laws, loaded[-1][0])
    assert (confirmed.bracket.largest_fine, confirmed.bracket.smallest_degraded) == (32, 64)
    assert confirmed.held is False and confirmed.says.startswith("missed: B* in [32, 64), the predicted")
    assert record_study(uri, study, scales, laws, [confirmed]) == run_id
    (tmp_path / "again").mkdir()
    law = json.loads((Path(client.download_artifacts(run_id, LAW_FILE, str(tmp_path / "again")))).read_text())
    assert law["confirmations"] == [confirmed.model_dump(mode="json")]
    assert client.get_run(run_id).data.metrics["adamw.baseline.confirmation_held"] == 0.0


def test_the_law_s_line_runs_through_the_scales_and_the_target_at_its_exponent(reports: list[Path]) -> None:
    from sweeps.analysis import read_report
    from sweeps.law import study_laws

    loaded = [(read_report(json.loads(p.read_text())), None) for p in reports]
    (law,) = study_laws(loaded, 2097152.0, None, "baseline")
    assert [p.tokens for p in law.line] == [*map(float, BUDGETS), 2097152.0]
    assert law.line[-1].model_dump(exclude={"tokens"}) == law.predicted.model_dump()  # type: ignore[union-attr]
    for a, b in zip(law.line, law.line[1:], strict=False):  # a power law: one slope on log-log axes
        slope = math.log(b.value / a.value) / math.log(b.tokens / a.tokens)
        assert slope == pytest.approx(law.tokens_exponent, rel=1e-9)
    assert all(p.low < p.value < p.high for p in law.line)


def test_the_study_figure_draws_the_law_s_own_numbers_and_is_logged_to_the_study_run(
    reports: list[Path], tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    from dashboards.study import law_figure, publish_study
    from sweeps.analysis import read_report
    from sweeps.law import study_laws

    loaded = [(read_report(json.loads(p.read_text())), None) for p in reports]
    laws = study_laws(loaded, 2097152.0, None, "baseline") + study_laws(loaded[:2], 2097152.0, None, "self")
    fig = law_figure(laws, "law")
    fitted, unfitted = fig.desc.panels
    assert (fitted.title, unfitted.title) == ("adamw against adamw", "adamw against itself")
    drawn = {s.name: s for s in fitted.series}
    assert drawn["largest size decided fine"].y == (8.0, 16.0, 32.0)
    assert drawn["largest size decided fine"].x == tuple(map(float, BUDGETS))
    law = laws[0]
    line = drawn["law, 95 % prediction interval"]
    assert line.x == tuple(p.tokens for p in law.line) and line.y == tuple(p.value for p in law.line)
    assert line.err_high == tuple(p.high - p.value for p in law.line)
    assert drawn["prediction at the target"].y == (law.predicted.value,)  # type: ignore[union-attr]
    assert any(name.startswith("without the largest scale") for name in drawn) is (law.check is not None)
    words = [a.text for a in fitted.annotations]
    assert words[0].startswith(f"B* ∝ tokens^{law.tokens_exponent:.2f} [")
    assert any(w.startswith(f"target: B* {law.predicted.value:.0f} [") for w in words)  # type: ignore[union-attr]
    # two scales support no law: the panel says why and draws the brackets only
    assert [a.text for a in unfitted.annotations][0].startswith("no law: ")
    assert "law, 95 % prediction interval" not in {s.name for s in unfitted.series}
    assert fig.png_bytes().startswith(b"\x89PNG") and "plotly.min.js" in fig.html()

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("study")).info.run_id
    paths = publish_study(uri, run_id, laws, "law")
    assert sorted(a.path for a in client.list_artifacts(run_id, "figures")) == sorted(paths)
    assert sorted(paths) == ["figures/law.html", "figures/law.json", "figures/law.png", "figures/plotly.min.js"]
    data = json.loads(Path(client.download_artifacts(run_id, "figures/law.json", str(tmp_path))).read_text())
    assert data == [x.model_dump(mode="json") for x in laws]


def test_a_panel_with_nothing_bounded_still_draws_and_says_why() -> None:
    from dashboards.study import law_figure
    from sweeps.law import OptimizerLaw

    nothing = OptimizerLaw.model_validate(
        {
            "optimizer": "merit",
            "against": "self",
            "reference": "merit",
            "scales": [{"tokens": t, "params": None, "largest_fine": None, "smallest_degraded": None} for t in BUDGETS],
            "target_tokens": 2097152.0,
            "no_law": "0 scale(s) with a bracket bounded on a side",
        }
    )
    fig = law_figure([nothing], "empty")
    (panel,) = fig.desc.panels
    assert panel.x.limits == (BUDGETS[0] / 1.5, 2097152.0 * 1.5) and panel.y.limits == (1.0, 64.0)
    assert [a.text for a in panel.annotations] == ["no law: 0 scale(s) with a bracket bounded on a side",
                                                   "no scale's bracket bounds B*"]  # fmt: skip
    assert fig.png_bytes().startswith(b"\x89PNG") and "plotly.min.js" in fig.html()


def test_sweeps_study_goes_through_its_scales_in_order_fits_records_and_runs_again_the_same(
    reports: list[Path], data_dir: Path, tmp_path: Path
) -> None:
    """`sweeps study` where every scale has its report (a study run before): nothing trains (no Ray is
    reached), the scales go smallest first, the law is fitted and recorded with its figure; run again, the same
    answer and the same MLflow runs. Its scales' real training through Ray: `sweeps run` (tests/cluster) and the
    study through the service (tests/service/test_live_service.py)."""
    import shutil

    import yaml
    from mlflow.tracking import MlflowClient

    from sweeps.layout import LAW_FILE, PARENT_TAG, Role, Tag, runs_of, study_experiment
    from sweeps.settings import runtime_from_env

    sweep = {k: v for k, v in tiny_spec("study").items() if k not in ("model", "token_budget")}
    model = {"preset": "gpt2-nano", "seq_len": 32}
    study = sweep | {
        "scales": {"models": [model], "token_budgets": [BUDGETS[2], BUDGETS[0], BUDGETS[1]]},  # out of order
        "target": {"model": dict(model), "token_budget": 2097152},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    out = tmp_path / "reports"
    out.mkdir()
    for i, report in enumerate(reports, 1):  # smallest budget first: the study's own order
        shutil.copy(report, out / f"study-s{i}.json")
    from sweeps.record import ensure_store

    ensure_store(runtime_from_env().tracking_uri)  # made now, its log lines are not in the first answer's
    first = invoke("study", str(path), "--out", str(out))
    assert first.exit_code == 0, first.output
    text = " ".join(first.output.split())
    assert text.index("scale 1 of 3: study-s1 done before") < text.index("scale 2 of 3: study-s2 done before")
    assert text.index("scale 3 of 3: study-s3 done before") < text.index("the law, predicted at 2,097,152 tokens")
    exponent = float(text.split("B* ~ tokens^")[1].split()[0])
    assert exponent == pytest.approx(0.5, abs=0.15)  # the reports' B* doubles with every 4x of tokens

    client = MlflowClient(runtime_from_env().tracking_uri)
    experiment = client.get_experiment_by_name(study_experiment("study"))
    assert experiment is not None
    (parent,) = runs_of(client, experiment.experiment_id, Role.study)
    assert parent.info.run_id in text
    nested = runs_of(client, experiment.experiment_id, Role.scale)
    assert sorted(r.data.tags[Tag.sweep_id] for r in nested) == ["study-s1", "study-s2", "study-s3"]
    assert {r.data.tags[PARENT_TAG] for r in nested} == {parent.info.run_id}
    law = json.loads(Path(client.download_artifacts(parent.info.run_id, LAW_FILE, str(tmp_path))).read_text())
    assert [(x["optimizer"], x["against"]) for x in law["laws"]] == [("adamw", "baseline")]
    figures = {a.path for a in client.list_artifacts(parent.info.run_id, "figures")}
    assert figures == {f"figures/law.{x}" for x in ("png", "html", "json")} | {"figures/plotly.min.js"}
    # again: the same law, the same runs, not a second study run
    again = invoke("study", str(path), "--out", str(out))
    assert again.exit_code == 0, again.output
    assert text.split("the law, predicted at")[1] == " ".join(again.output.split()).split("the law, predicted at")[1]
    assert [r.info.run_id for r in runs_of(client, experiment.experiment_id, Role.study)] == [parent.info.run_id]
    assert len(runs_of(client, experiment.experiment_id, Role.scale)) == 3


def test_sweeps_study_that_confirms_draws_its_confirmation_in_the_study_s_figure(
    reports: list[Path], data_dir: Path, tmp_path: Path
) -> None:
    """`sweeps study` with `confirm: true` where every sweep has its report (the largest scale's stands in for
    the confirmation's): the figure logged to the study's run draws each law's confirmation and says its
    outcome."""
    import shutil

    import yaml
    from mlflow.tracking import MlflowClient

    from sweeps.layout import Role, runs_of, study_experiment
    from sweeps.settings import runtime_from_env

    sweep = {
        k: v
        for k, v in tiny_spec("confirmed", batch_sizes=[4, 8, 16, 32, 64]).items()
        if k not in ("model", "token_budget")
    }
    model = {"preset": "gpt2-nano", "seq_len": 32}
    study = sweep | {
        "scales": {"models": [model], "token_budgets": list(BUDGETS)},
        "target": {"model": dict(model), "token_budget": 196_608},  # B* 39 there, inside the stand-in's [32, 64)
        "confirm": True,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    out = tmp_path / "reports"
    out.mkdir()
    for i, report in enumerate(reports, 1):
        shutil.copy(report, out / f"confirmed-s{i}.json")
    shutil.copy(reports[-1], out / "confirmed-confirm.json")
    done = invoke("study", str(path), "--out", str(out))
    assert done.exit_code == 0, done.output
    assert "adamw against baseline: held: B* in [32, 64)" in " ".join(done.output.split())
    client = MlflowClient(runtime_from_env().tracking_uri)
    experiment = client.get_experiment_by_name(study_experiment("confirmed"))
    assert experiment is not None
    (parent,) = runs_of(client, experiment.experiment_id, Role.study)
    page = Path(client.download_artifacts(parent.info.run_id, "figures/law.html", str(tmp_path))).read_text()
    assert "confirmation at the target: done" in page and "adamw against adamw: held — held: B* in [32, 64)" in page
    assert "adamw against adamw: confirmation held" in page  # the panel's title
