"""The `sweeps` client commands against a live uvicorn server (drivers faked)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import real_report, tiny_spec
from svc_helpers import ALICE, ThreadServer, wait_until
from typer.testing import CliRunner

from cli.main import app

REPORT: dict[str, Any] = real_report()


@pytest.fixture
def cli(fake_server: ThreadServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("SWEEPS_URL", fake_server.url)
    monkeypatch.setenv("SWEEPS_TOKEN", ALICE)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_spec()))
    return path


def test_submit_list_status_cancel(cli: Any, spec_file: Path, fake_server: ThreadServer) -> None:
    out = cli("submit", str(spec_file))
    assert out.exit_code == 0, out.output
    sweep_id = out.output.strip()
    assert sweep_id.startswith("tiny-")
    wait_until(lambda: sweep_id in fake_server.launcher.drivers, 10)

    listed = cli("list")
    assert listed.exit_code == 0 and sweep_id in listed.output and "0/7" in listed.output
    shown = cli("status", sweep_id)
    assert shown.exit_code == 0 and "adamw/bs8" in shown.output and "running" in shown.output

    report = cli("report", sweep_id)
    # the service's 409 becomes a message and a non-zero exit
    assert report.exit_code == 1 and "409 not_finished" in report.output

    cancelled = cli("cancel", sweep_id)
    assert cancelled.exit_code == 0 and "cancelling" in cancelled.output
    assert sweep_id in fake_server.launcher.cancelled


def test_dry_run_and_invalid_spec(cli: Any, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(__import__("json").dumps(tiny_spec()))
    out = cli("submit", "--dry-run", str(good))
    assert out.exit_code == 0 and "7 trials" in out.output
    assert "GPU-hours: no GPU-hours cap is set" in out.output  # the caps' verdict (none configured here)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_spec(token_budget=10)))
    out = cli("submit", str(bad))
    # a refused spec names the field, like `sweeps run` does
    assert out.exit_code == 2 and "token_budget" in out.output and "422" in out.output


def test_a_study_is_priced_by_the_service_and_never_submitted(cli: Any, tmp_path: Path) -> None:
    sweep = {k: v for k, v in tiny_spec("law").items() if k not in ("model", "token_budget")}
    study = sweep | {
        "scales": {"models": [{"preset": "gpt2-nano", "seq_len": 32}], "token_budgets": [3000, 6000]},
        "target": {"model": {"preset": "gpt2-nano", "seq_len": 32}, "token_budget": 48000},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    out = cli("submit", "--dry-run", str(path))
    assert out.exit_code == 0, out.output
    assert "a study of 2 sweeps" in out.output and "law-s1" in out.output and "law-s2" in out.output
    assert "law-target" in out.output and "replaces" in out.output and "of the sweep at the target" in out.output
    assert "GPU-hours: no GPU-hours cap is set" in out.output and "confirmation" not in out.output
    path.write_text(yaml.safe_dump(study | {"confirm": True}))
    out = cli("submit", "--dry-run", str(path))
    assert out.exit_code == 0, out.output
    assert "law-confirm" in out.output and "confirmation (at most):" in " ".join(out.output.split())
    out = cli("submit", str(path))
    assert out.exit_code == 2 and "study: the service prices one" in out.output and "sweeps study" in out.output


def test_submit_watch_prints_the_answer(cli: Any, spec_file: Path, fake_server: ThreadServer) -> None:
    launcher = fake_server.launcher

    def drive() -> None:
        sweep_id = wait_until(lambda: next(iter(launcher.drivers), None), 20)
        time.sleep(0.3)
        launcher.set(
            sweep_id,
            progress={
                "cells_done": 1,
                "cells_total": 2,
                "trials_done": 2,
                "trials_total": 4,
                "cells": [
                    {"cell": "adamw/bs4", "search_best_val_loss": 5.12},
                ],
            },
        )
        time.sleep(0.3)
        launcher.finish(sweep_id, report=REPORT)

    threading.Thread(target=drive, daemon=True).start()
    out = cli("submit", "--watch", str(spec_file))
    assert out.exit_code == 0, out.output
    assert "succeeded" in out.output
    # not a terminal (a log file, a pipe): one plain line per change of progress, none repeated
    moved = [line for line in out.output.splitlines() if "running: 2/4 trials, 1/2 cells" in line]
    assert len(moved) == 1 and "adamw/bs4 5.120 (search)" in moved[0], out.output
    # the answer table of the report
    assert "largest degradation-free batch size" in out.output


def test_show_prints_a_report_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    runner = CliRunner()
    good = tmp_path / "report.json"
    good.write_text(json.dumps(REPORT))
    out = runner.invoke(app, ["show", str(good)])
    assert out.exit_code == 0, out.output
    assert "largest degradation-free batch size" in out.output and "5.1" in out.output
    # a newer writer's added top-level field is left out, as the dashboards do
    (tmp_path / "newer.json").write_text(json.dumps({**REPORT, "added_later": {"x": 1}}))
    out = runner.invoke(app, ["show", str(tmp_path / "newer.json")])
    assert out.exit_code == 0 and "largest degradation-free batch size" in out.output, out.output
    # a report of another shape (a field renamed) is refused by name, not half printed
    bad = json.loads(json.dumps(REPORT))
    bad["optimizers"]["adamw"]["cells"][0]["best_learning_rate"] = bad["optimizers"]["adamw"]["cells"][0].pop("best_lr")
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    out = runner.invoke(app, ["show", str(tmp_path / "bad.json")])
    assert out.exit_code == 2 and "not a report of this version" in out.output, out.output
    assert "best_lr" in out.output or "best_learning_rate" in out.output, out.output
    assert "adamw" not in out.output.split("not a report")[0]  # no table before the refusal
    (tmp_path / "list.json").write_text("[]")  # JSON, but not even an object
    out = runner.invoke(app, ["show", str(tmp_path / "list.json")])
    assert out.exit_code == 2 and "not a report of this version" in out.output, out.output


def test_without_a_token_the_client_says_so(
    spec_file: Path, fake_server: ThreadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SWEEPS_TOKEN", raising=False)
    out = CliRunner().invoke(app, ["list", "--url", fake_server.url])
    assert out.exit_code == 2 and "no token" in out.output
    out = CliRunner().invoke(app, ["list", "--url", fake_server.url, "--token", "wrong"])
    assert out.exit_code == 1 and "401 unauthorized" in out.output


def test_status_counts_runs_done_against_those_planned_and_only_those() -> None:
    from cli.client import _done_of

    assert _done_of(3, 6) == "3/6"
    assert _done_of(0, 0) == "0/0"
    # a cell nothing is planned for yet (a search of the batch axis has not sized it) reads its count alone
    assert _done_of(2, None) == "2"
