"""Reading a sweep back from MLflow and publishing its figures to the summary run, without Ray: the
sweep is written with the recorder's layout by `dash_helpers.record_sweep`."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from dash_helpers import record_sweep, rich_sweep
from mlflow.tracking import MlflowClient

from dashboards import SweepDataError, dashboard_page, load_sweep, publish
from dashboards.data import best_runs, sample_runs
from dashboards.page import inline_plotlyjs
from dashboards.publish import publish_figures
from sweeps import layout

FIGURE_NAMES = ["scaling", "lr_sensitivity", "best_lr", "loss_curves", "attention_logits", "steps_to_target"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object, str, str]:
    """(tracking uri, the hand-made sweep as recorded (MLflow's run ids), experiment id, summary run id)
    in a fresh SQLite store."""
    root = tmp_path_factory.mktemp("mlflow-store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    exp_id, summary_id, sweep = record_sweep(uri, rich_sweep("recorded"), root / "artifacts")
    return uri, sweep, exp_id, summary_id


def test_load_sweep_reads_back_what_was_recorded(recorded: tuple) -> None:
    uri, original, exp_id, summary_id = recorded
    s = load_sweep(uri, "recorded")
    assert (s.experiment_id, s.summary_run_id, s.status, s.tracking_uri) == (exp_id, summary_id, "succeeded", uri)
    assert s.report == original.report  # it names the runs by their MLflow run ids
    assert {t.run_id for t in s.trials} == {t.run_id for t in original.trials}
    # the driver's "warnings" key lives outside the report schema: it is split off, not lost
    assert s.warnings == original.warnings
    key = lambda t: (t.optimizer, t.batch_size, t.lr, t.seed, t.role, t.status)  # noqa: E731
    assert sorted(map(key, s.trials)) == sorted(map(key, original.trials))
    by_name = {t.run_name + t.role: t for t in s.trials}
    for t in original.trials:
        got = by_name[t.run_name + t.role]
        assert got.lr == t.lr  # exact: the lr tag is repr(float)
        assert got.final_val_loss == t.final_val_loss
        assert (got.run_id, got.number) == (t.run_id, t.number)
    # histories are fetched for the runs the report names (every cell's best search trial and its
    # confirmation runs: all completed here) and for every run of each optimizer's largest batch size
    cells = [c for o in s.report.optimizers.values() for c in o.cells]
    named = {c.search_best_run_id for c in cells if c.search_best_run_id is not None}
    named |= {i for c in cells for i in c.confirmation_run_ids if i is not None}
    assert len(named) == 7 * 3  # 7 cells with a best lr (AdamW's B=32 has none), 1 + 2 runs each
    with_history = {t.run_id for t in s.trials if t.history}
    wanted = named | {t.run_id for t in s.trials if t.batch_size == 32 and t.status != "cancelled" and t.metrics}
    assert with_history == wanted
    assert {t.run_id for runs in sample_runs(s).values() for t in runs} | {
        t.run_id for t in best_runs(s).values()
    } == named
    for key_, run in best_runs(s).items():
        assert run.history["val_loss"] == best_runs(original)[key_].history["val_loss"]
    for key_, runs in sample_runs(s).items():
        assert [r.history["val_loss"] for r in runs] == [r.history["val_loss"] for r in sample_runs(original)[key_]]


def test_runs_tagged_with_the_role_seed_read_as_confirmation_runs(recorded: tuple, tmp_path: Path) -> None:
    """Trial runs tagged batchsweep.role=seed (the value the confirmation role has in sweeps recorded before
    it was "confirm") are confirmation runs to the data layer and to the layout's queries."""
    uri = recorded[0]
    sweep = rich_sweep("old-roles")
    old = replace(sweep, trials=tuple(replace(t, role="seed") if t.role == "confirm" else t for t in sweep.trials))
    exp_id, _, written = record_sweep(uri, old, tmp_path / "artifacts")
    confirmations = {t.run_id for t in written.trials if t.role == "seed"}
    client = MlflowClient(uri)
    assert confirmations and {r.data.tags[layout.Tag.role] for r in layout.runs_of(client, exp_id)} >= {"seed"}
    assert {r.info.run_id for r in layout.runs_of(client, exp_id, layout.Role.confirm)} == confirmations
    assert {r.info.run_id for r in layout.trial_runs(client, exp_id)} == {t.run_id for t in written.trials}
    s = load_sweep(uri, "old-roles")
    assert len(s.trials) == len(written.trials)
    assert {t.run_id for t in s.trials if t.role == "confirm"} == confirmations
    assert {t.role for t in s.trials} <= {"search", "confirm", "warmup"}
    samples = [t for runs in sample_runs(s).values() for t in runs]
    assert samples and all(t.role == "confirm" and t.history["val_loss"] for t in samples)


def test_load_sweep_refuses_what_it_cannot_draw(recorded: tuple, tmp_path: Path) -> None:
    uri = recorded[0]
    with pytest.raises(SweepDataError, match="no MLflow experiment named 'nope'"):
        load_sweep(uri, "nope")
    client = MlflowClient(uri)
    exp = client.create_experiment("running", artifact_location=(tmp_path / "a").as_uri())
    client.create_run(exp, run_name="adamw bs=4", tags={"batchsweep.role": "cell"})
    with pytest.raises(SweepDataError, match="no summary run yet"):
        load_sweep(uri, "running")
    client.create_run(exp, run_name="summary", tags={"batchsweep.role": "summary"})
    with pytest.raises(SweepDataError, match=r"no report\.json"):
        load_sweep(uri, "running")


def test_publish_logs_every_figure_to_the_summary_run_and_is_idempotent(recorded: tuple, tmp_path: Path) -> None:
    uri, _, _, summary_id = recorded
    paths = publish(uri, "recorded", tmp_path / "out")
    expected = sorted(
        [f"{n}{ext}" for n in FIGURE_NAMES for ext in (".png", ".html", ".json")] + ["dashboard.html", "plotly.min.js"]
    )
    assert sorted(p.name for p in paths) == expected
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    client = MlflowClient(uri)
    logged = sorted(Path(a.path).name for a in client.list_artifacts(summary_id, "figures"))
    assert logged == expected
    # the report the driver wrote is still there, next to the figures
    assert {"report.json", "figures"} <= {a.path for a in client.list_artifacts(summary_id)}
    first = {a.path: a.file_size for a in client.list_artifacts(summary_id, "figures")}
    # regenerate into another folder: the same artifact paths are overwritten, none added
    publish(uri, "recorded", tmp_path / "again")
    again = {a.path: a.file_size for a in client.list_artifacts(summary_id, "figures")}
    assert set(again) == set(first)
    assert again["figures/scaling.json"] == first["figures/scaling.json"]  # same data, same table


def test_publish_without_out_dir_writes_to_a_fresh_folder(recorded: tuple) -> None:
    paths = publish(recorded[0], "recorded")
    assert len(paths) == 20 and all(p.is_file() for p in paths)  # 6 x png/html/json, the page, plotly.min.js
    assert len({p.parent for p in paths}) == 1 and paths[0].parent.name == "figures"


def test_publish_figures_logs_them_and_leaves_no_local_copy(
    recorded: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = recorded[0]
    record_sweep(uri, rich_sweep("driven"), tmp_path / "artifacts")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the driver's copies would land
    publish_figures(uri, "driven")
    client = MlflowClient(uri)
    summary = client.search_runs(
        [client.get_experiment_by_name("driven").experiment_id], "tags.`batchsweep.role` = 'summary'"
    )[0].info.run_id
    assert len(client.list_artifacts(summary, "figures")) == 20
    assert list(scratch.iterdir()) == []  # a service publishing a sweep an hour keeps no 5 MiB each


def test_dashboard_page_serves_the_published_page_or_renders_one(recorded: tuple, tmp_path: Path) -> None:
    uri = recorded[0]
    record_sweep(uri, rich_sweep("unpublished"), tmp_path / "artifacts")
    # nothing published yet: rendered on the spot, and nothing is logged by asking
    page = dashboard_page(uri, "unpublished")
    assert page.startswith("<!DOCTYPE html>") and "Sweep unpublished" in page
    client = MlflowClient(uri)
    summary = client.search_runs(
        [client.get_experiment_by_name("unpublished").experiment_id], "tags.`batchsweep.role` = 'summary'"
    )[0].info.run_id
    assert client.list_artifacts(summary, "figures") == []
    # once published, the page is the published artifact itself, with the published plotly.js inlined
    paths = publish(uri, "unpublished", tmp_path / "out")
    published = next(p for p in paths if p.name == "dashboard.html").read_text(encoding="utf-8")
    js = next(p for p in paths if p.name == "plotly.min.js").read_text(encoding="utf-8")
    assert dashboard_page(uri, "unpublished") == inline_plotlyjs(published, js) != published
    with pytest.raises(SweepDataError):
        dashboard_page(uri, "nope")


def test_dashboards_import_neither_worker_nor_torch() -> None:
    # statically: no module of dashboards/ imports worker, torch or ray (the package's rule)
    import ast

    import dashboards

    for path in Path(dashboards.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        bad = sorted(n for n in names if n.split(".")[0] in ("worker", "torch", "ray", "transformers"))
        assert not bad, f"{path.name} imports {bad}"
    # and at run time nothing heavy comes in through its dependencies (sweeps/__init__ loads the
    # `worker` package itself, a few env vars; none of its modules may follow), nor pyplot (no GUI backend)
    code = (
        "import sys, dashboards, dashboards.data, dashboards.figures, dashboards.page, dashboards.publish\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'transformers')"
        " or m.startswith('worker.') or m in ('sweeps.record', 'sweeps.driver', 'sweeps.search',"
        " 'matplotlib.pyplot')))\n"
        "print(callable(dashboards.publish))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout
