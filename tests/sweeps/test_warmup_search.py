"""Warm-up searched with the lr (the spec's `schedule.warmup_search`).

At each batch size, once the lr search has ended, the other warm-ups are trained at the best lr (seed 0,
like the search) and the best of them and the spec's own gets the confirmation runs; the report says
which, per cell. The simulated problems here have a known answer: a batch size that is degraded only
because its warm-up is too short must be found fine once the warm-up is searched.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from harness import tiny_spec
from ray.tune.search import Searcher
from spec_helpers import spec_for

from sweeps.analysis import TrialResult, build_report, pick_warmup, validate_report
from sweeps.plan import BRACKET_STEP, run_name
from sweeps.search import CellSearcher
from sweeps.simulate import Run, simulate
from sweeps.spec import SpecError, SweepSpec
from sweeps.stores import open_storage

LR_STAR = 3e-3
BUDGET = 32 * 32 * 8  # tokens per trial: seq_len 32 x the largest batch 32 x 8 steps
SHORT, LONG = 256, 2048  # warm-up tokens: the spec's own, and the one the search may try


def spec_of(**schedule: Any) -> SweepSpec:
    return SweepSpec.from_mapping(
        tiny_spec(
            "warmup",
            optimizers=[{"name": "adamw"}, {"name": "lion"}],
            batch_sizes=[4, 8, 16, 32],
            token_budget=BUDGET,
            lr={"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 6},
            seeds=2,
            degradation={"tolerance": 0.01, "baseline": "adamw"},
            schedule={"warmup_tokens": SHORT, **schedule},
        )
    )


def needs_warmup(run: Run) -> list[float]:
    """A bowl in ln lr around LR_STAR that no batch size degrades, except through its warm-up: one
    shorter than 20 % of the tokens costs 0.1 per doubling of the batch past 8 (a large batch at its
    high peak lr needs the longer ramp); a longer warm-up costs a little (0.001 x its share of the run)."""
    total = run.eval_tokens[-1]
    u = math.log(run.lr / LR_STAR)
    short = run.warmup_tokens < 0.2 * total
    final = 3.0 + 0.05 * u * u + 0.001 * run.warmup_tokens / total
    final += 0.1 * max(0.0, math.log2(run.batch_size / 8)) if short else 0.0
    return [final * (1 + 0.2 * (1 - t / total)) for t in run.eval_tokens]


def test_a_batch_size_degraded_only_by_its_warmup_is_fine_once_warmup_is_searched() -> None:
    fixed = simulate(spec_of(), needs_warmup)
    searched_spec = spec_of(warmup_search=[LONG])
    seen: list[Run] = []

    def objective(run: Run) -> list[float]:
        seen.append(run)
        return needs_warmup(run)

    searched = simulate(searched_spec, objective)
    validate_report(searched.report)
    for opt in ("adamw", "lion"):
        # with the spec's short warm-up only, 16 and 32 read degraded; searched, every size is fine
        assert fixed.report.optimizers[opt].largest_degradation_free_batch_size.self == 8
        assert searched.report.optimizers[opt].largest_degradation_free_batch_size.self == 32
        cells = searched.report.optimizers[opt].cells
        # the long warm-up wins where the short one costs (16, 32); the short one where it is free
        assert [c.warmup for c in cells] == [SHORT, SHORT, LONG, LONG]
        for c in cells:
            assert [w for w, _ in c.warmups_tried] == [SHORT, LONG]  # the spec's own first
            assert c.val_loss_mean == pytest.approx(min(loss for _, loss in c.warmups_tried))
        assert [c.warmup for c in fixed.report.optimizers[opt].cells] == [SHORT] * 4
        assert all(c.warmups_tried == [] for c in fixed.report.optimizers[opt].cells)
    assert "warm-up searched with the lr" in searched.report.warmup
    assert "only the peak lr is searched" in fixed.report.warmup

    # every warm-up run trained at its cell's best lr with seed 0; every confirmation run at the cell's
    # chosen warm-up (the run's warm-up tokens are its steps x tokens per step)
    best = {
        (o, c.batch_size): c for o, r in searched.report.optimizers.items() for c in r.cells
    }  # fmt: skip
    warmup_runs = [r for r in seen if r.role == "warmup"]
    assert len(warmup_runs) == 8  # one per cell
    for r in warmup_runs:
        cell = best[(r.optimizer, r.batch_size)]
        assert r.seed == 0 and r.lr == pytest.approx(cell.best_lr)
        steps = max(1, round(LONG / (r.batch_size * 32)))
        assert r.warmup_tokens == steps * r.batch_size * 32
    for t in searched.results:
        if t.role == "confirm":
            assert t.warmup == best[(t.optimizer, t.batch_size)].warmup
    # the warm-up runs are the spec's counted trials: the cap and the price include them
    # (and one more search trial at each optimizer's reference)
    assert searched.trials <= searched_spec.total_trials == 2 * (4 * (6 + 1 + 2) + 1)


def test_the_spec_states_warmup_search_in_the_unit_of_its_warmup() -> None:
    spec = spec_of(warmup_search=[LONG, 0])
    assert spec.schedule.warmup_unit == "tokens" and spec.schedule.warmup_choices == [SHORT, LONG, 0]
    cfg = spec.train_config("adamw", 16, 1e-3, 1, warmup=LONG)
    assert (cfg.schedule.warmup_tokens, cfg.schedule.warmup_steps, cfg.warmup_total_steps) == (
        LONG,
        None,
        4,
    )  # 2048 / (16 x 32)
    assert spec.train_config("adamw", 16, 1e-3, 1).schedule.warmup_tokens == SHORT
    fraction = SweepSpec.from_mapping(tiny_spec(schedule={"warmup_fraction": 0.05, "warmup_search": [0.2]}))
    assert fraction.train_config("adamw", 8, 1e-3, 0, warmup=0.2).schedule.warmup_fraction == 0.2
    assert "5%, 20%" in fraction.schedule.describe_warmup()
    for schedule, message in [
        ({"warmup_search": [1.5]}, r"warmup_search\[0\] must be a fraction of the steps in \[0, 1\).*got 1.5"),
        ({"warmup_search": [0.1, 0.05]}, r"warmup_search\[1\]=0.05 repeats the spec's own warm-up"),
        ({"warmup_search": [0.1, 0.1]}, r"warmup_search\[1\]=0.1 repeats an earlier entry"),
        ({"warmup_steps": 10, "warmup_search": [2.5]}, r"warmup_search\[0\] must be a whole number of steps.*got 2.5"),
        ({"warmup_tokens": 10, "warmup_search": [-1]}, r"warmup_search\[0\] must be a whole number of tokens.*got -1"),
        ({"warmup_search": [0.01, 0.02, 0.1, 0.2, 0.3]}, "at most 4"),
    ]:
        with pytest.raises((SpecError, ValueError), match=message):
            SweepSpec.from_mapping(tiny_spec(schedule=schedule))


def test_pick_warmup_takes_the_lowest_loss_ties_to_the_specs_own_then_the_earlier_run() -> None:
    assert pick_warmup([(3.0, -1, 0.05), (2.9, 4, 0.2), (2.95, 3, 0.01)]) == 0.2
    assert pick_warmup([(3.0, -1, 0.05), (3.0, 2, 0.2)]) == 0.05
    assert pick_warmup([(3.1, -1, 0.05), (3.0, 7, 0.2), (3.0, 5, 0.01)]) == 0.01


def result(role: str, loss: float | None, *, warmup: float, seed: int = 0, lr: float = 1e-3, **kw: Any) -> TrialResult:
    status = kw.pop("status", "completed")
    return TrialResult(
        optimizer="adamw",
        batch_size=4,
        lr=lr,
        seed=seed,
        role=role,  # type: ignore[arg-type]
        status=status,
        val_loss=loss,
        tokens=1000,
        steps=10,
        warmup=warmup,
        **kw,
    )


def test_the_report_judges_a_cell_by_its_confirmation_runs_at_the_chosen_warmup_only() -> None:
    spec = spec_for(name="w", batch_sizes=(4,), tolerance=0.01, lr=(1e-4, 1e-1), seeds=2, seq_len=32)
    trials = [
        result("search", 3.0, warmup=0.05, number=0),
        result("search", 3.5, warmup=0.05, lr=1e-2, number=1),
        result("warmup", 2.9, warmup=0.2, number=2),
        result("warmup", None, warmup=0.5, status="diverged", number=3),
        result("confirm", 2.95, warmup=0.2, seed=1),
        result("confirm", 2.97, warmup=0.2, seed=2),
        result("confirm", 3.4, warmup=0.05, seed=1),  # at the spec's own warm-up (before a resume changed it)
    ]
    cell = build_report(trials, spec=spec).optimizers["adamw"].cells[0]
    assert cell.warmup == 0.2 and cell.best_lr == 1e-3
    assert cell.warmups_tried == [(0.05, 3.0), (0.2, 2.9), (0.5, None)]
    assert cell.val_losses == [2.95, 2.97] and cell.stable is True
    # the diverged warm-up run says the warm-up is too long at that lr, not that the batch size is unstable
    trials[2] = result("warmup", 3.2, warmup=0.2, number=2)
    cell = build_report(trials[:4] + [result("confirm", 3.01, warmup=0.05, seed=s) for s in (1, 2)], spec=spec)
    assert cell.optimizers["adamw"].cells[0].warmup == 0.05
    assert cell.optimizers["adamw"].cells[0].val_losses == [3.01, 3.01]


def done(val: float | None, status: str = "completed") -> dict:
    return {"status": status, "tokens": BUDGET, "step": 8, "train_time_s": 1.0, **({"val_loss": val} if val else {})}


def test_warmup_runs_come_after_the_lr_search_and_a_resume_repeats_none(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    spec = SweepSpec.from_mapping(
        tiny_spec(
            optimizers=[{"name": "adamw"}],
            batch_sizes=[4],
            lr={"min": 1e-3, "max": 1e-1, "trials_per_batch_size": 3},
            seeds=2,
            schedule={"warmup_fraction": 0.05, "warmup_search": [0.2, 0.01]},
        )
    )
    s = CellSearcher(spec, "w", storage)
    search = [s.suggest(f"t{i}") for i in range(3)]
    assert [c["role"] for c in search] == ["search"] * 3 and {c["warmup"] for c in search} == {0.05}
    assert s.suggest("t3") is None  # nothing at the best lr before the lr search has ended
    for i, loss in enumerate([3.2, 3.0, 3.4]):
        s.on_trial_complete(f"t{i}", done(loss))
    # bs 4, the reference, searches one lr more than trials_per_batch_size (it has no warm start)
    step = s.suggest("t3b")
    assert (step["role"], step["warmup"]) == ("search", 0.05)
    s.on_trial_complete("t3b", done(3.1))
    best_lr = search[1]["lr"]
    w1 = s.suggest("w1")
    assert (w1["role"], w1["seed"], w1["warmup"], w1["lr"]) == ("warmup", 0, 0.2, best_lr)
    assert w1["train"]["schedule"]["warmup_fraction"] == 0.2 and w1["warmup_searched"] is True
    s.on_trial_complete("w1", done(2.9))  # better than the spec's own

    resumed = CellSearcher(spec, "w", storage)  # the driver restarted
    w2 = resumed.suggest("w2")
    assert (w2["role"], w2["warmup"]) == ("warmup", 0.01)  # 0.2 is recorded: not run again
    assert resumed.suggest("x") is None  # the confirmation runs wait for the last warm-up's result
    resumed.on_trial_complete("w2", done(None, status="diverged"))
    seeds = [resumed.suggest("s1"), resumed.suggest("s2")]
    assert [(c["role"], c["seed"], c["warmup"], c["lr"]) for c in seeds] == [
        ("confirm", 1, 0.2, best_lr),
        ("confirm", 2, 0.2, best_lr),
    ]
    assert seeds[0]["train"]["schedule"]["warmup_fraction"] == 0.2
    resumed.on_trial_complete("s1", done(2.95))
    resumed.on_trial_complete("s2", done(2.96))
    cell = resumed.states()["adamw/bs4"]
    assert cell.finished and cell.confirmed == [2.95, 2.96]
    progress = resumed.progress()
    assert progress.trials_done == progress.trials_total == (3 + 1) + 2 + 2  # search, warm-ups, seeds
    report = resumed.report()
    cell = report.optimizers["adamw"].cells[0]
    assert (cell.warmup, cell.val_losses) == (0.2, [2.95, 2.96])
    assert cell.warmups_tried == [(0.05, 3.0), (0.2, 2.9), (0.01, None)]


def test_mlflow_names_the_warmup_of_a_run_where_the_sweep_searches_it() -> None:
    assert run_name("merit", 64, 3.1e-3, 0, 0.2) == "merit bs=64 lr=3.1e-03 seed=0 warmup=0.2"
    assert run_name("merit", 64, 3.1e-3, 1, 2048) == "merit bs=64 lr=3.1e-03 seed=1 warmup=2048"
    assert run_name("merit", 64, 3.1e-3, 1) == "merit bs=64 lr=3.1e-03 seed=1"


def test_the_storage_of_a_sweep_without_warmup_search_is_unchanged(tmp_path: Path) -> None:
    """Runs recorded before warm-up was searched (no warm-up attribute) count at the spec's own."""
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    spec = spec_of()
    s = CellSearcher(spec, "old", storage)
    first = s.suggest("t0")
    s.on_trial_complete("t0", done(3.0))
    trial = s.cells[0].study.trials[0]
    assert "warmup" not in trial.user_attrs and s.states()["adamw/bs4"].warmup_of(trial) == SHORT
    assert first["warmup"] == SHORT and first["warmup_searched"] is False


def test_the_price_counts_the_warmup_runs_and_none_of_them_as_prunable() -> None:
    from sweeps.cost import price

    plain, searched = price(spec_of()), price(spec_of(warmup_search=[LONG, 512]))
    # 2 optimizers x (4 batch sizes x (6 search [+ 2 warm-up] + 2 seeds) + the reference's one more search)
    assert (plain.trials.max, searched.trials.max) == (2 * (4 * (6 + 2) + 1), 2 * (4 * (6 + 2 + 2) + 1))
    assert searched.search_trials == 2 * (4 * (6 + 2) + 1) and plain.search_trials == 2 * (4 * 6 + 1)
    assert searched.prunable_training_tokens == plain.prunable_training_tokens == 2 * (4 * 6 + 1) * BUDGET
    assert searched.training_tokens.max == 2 * (4 * 10 + 1) * BUDGET


def test_the_cli_and_the_dashboard_say_which_warmup_each_cell_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import cli.main
    from cli.main import app
    from dashboards.data import SweepData
    from dashboards.page import _answer, _cells_table
    from sweeps.analysis import report_to_json

    monkeypatch.setattr(cli.main.console, "width", 200)  # made at import: one line per table row
    report = simulate(spec_of(warmup_search=[LONG]), needs_warmup).report
    (tmp_path / "report.json").write_text(report_to_json(report))
    out = CliRunner().invoke(app, ["show", str(tmp_path / "report.json")], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if line.startswith("│ ") and "e-03" in line]
    assert [line.split("│")[-2].strip() for line in rows] == [str(w) for w in (SHORT, SHORT, LONG, LONG) * 2]
    assert out.output.count("┃ warm-up") == 2, out.output  # a column of its own in each optimizer's table
    assert "warm-up searched with the lr" in " ".join(out.output.split())
    sweep = SweepData("s", report)
    assert _cells_table(sweep).count(f", warm-up {LONG}") == 4
    assert "warm-up searched with the lr" in _answer(sweep)
    plain = simulate(spec_of(), needs_warmup).report
    (tmp_path / "plain.json").write_text(report_to_json(plain))
    out = CliRunner().invoke(app, ["show", str(tmp_path / "plain.json")], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "┃ warm-up" not in out.output, out.output  # no column
    assert "only the peak lr" in " ".join(out.output.split())


def test_cells_csv_has_each_cells_warmup() -> None:
    import csv
    import io

    from sweeps.record import cells_csv

    rows = list(csv.DictReader(io.StringIO(cells_csv(simulate(spec_of(warmup_search=[LONG]), needs_warmup).report))))
    assert [int(r["warmup"]) for r in rows] == [SHORT, SHORT, LONG, LONG] * 2


def test_a_search_of_the_batch_axis_tries_the_warmups_in_every_cell_it_opens() -> None:
    spec = SweepSpec.from_mapping(
        tiny_spec(
            "axis-warmup",
            optimizers=[{"name": "adamw"}],
            batch_sizes={"min": 4, "max": 64, "resolution": 2},
            token_budget=64 * 32 * 8,
            lr={"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 4},
            seeds=2,
            degradation={"tolerance": 0.01, "baseline": "adamw"},
            schedule={"warmup_tokens": SHORT, "warmup_search": [4 * LONG]},
        ),
        max_trials=10**4,
    )
    result = simulate(spec, needs_warmup)
    validate_report(result.report)
    cells = result.report.optimizers["adamw"].cells
    assert len(cells) >= 3 and result.trials <= spec.total_trials
    for c in cells:
        assert [w for w, _ in c.warmups_tried] == [SHORT, 4 * LONG] and c.seeds == 2
        assert c.val_loss_mean == pytest.approx(min(loss for _, loss in c.warmups_tried))
    # short warm-ups cost past batch 8 and the long one is free there: every size is fine once searched
    assert result.report.optimizers["adamw"].largest_degradation_free_batch_size.self == 64


def test_a_retreat_after_a_diverged_confirmation_tries_the_warmups_again_only_with_room_for_its_seeds() -> None:
    def sweep(trials: int) -> tuple[CellSearcher, float, list[dict]]:
        spec = SweepSpec.from_mapping(
            tiny_spec(
                optimizers=[{"name": "adamw"}],
                batch_sizes=[4],
                lr={"min": 1e-3, "max": 1e-1, "trials_per_batch_size": trials},
                seeds=1,
                schedule={"warmup_fraction": 0.05, "warmup_search": [0.2]},
            )
        )
        s = CellSearcher(spec, "r", open_storage("sqlite://"))
        for i in range(3):  # the coarse start: a symmetric valley, converged at its middle lr
            s.suggest(f"t{i}")
        for i, loss in enumerate([3.1, 3.0, 3.1]):
            s.on_trial_complete(f"t{i}", done(loss))
        # the reference (its only batch size) narrows its bracket: a step up, then one down, both worse
        steps = [s.suggest("n0")]
        s.on_trial_complete("n0", done(3.02))
        steps.append(s.suggest("n1"))
        s.on_trial_complete("n1", done(3.02))
        middle = s.states()["adamw/bs4"].best_lr
        assert [(c["role"], c["lr"]) for c in steps] == [
            ("search", pytest.approx(middle * math.exp(BRACKET_STEP))),
            ("search", pytest.approx(middle * math.exp(-BRACKET_STEP))),
        ]
        warm = s.suggest("w")
        assert (warm["role"], warm["warmup"]) == ("warmup", 0.2)
        s.on_trial_complete("w", done(2.9))
        seed = s.suggest("s")
        assert (seed["role"], seed["lr"], seed["warmup"]) == ("confirm", warm["lr"], 0.2)
        s.on_trial_complete("s", done(None, status="diverged"))  # too high at that lr: retreat
        runs = []
        while (c := s.suggest(f"r{len(runs)}")) not in (None, Searcher.FINISHED):
            runs.append(c)
            s.on_trial_complete(f"r{len(runs) - 1}", done(3.05))
        return s, warm["lr"], runs

    # 5 search trials of 7 (6 + the reference's one more) ran: of the 2 left, one tries the other warm-up
    # at the lower lr, one confirms
    s, high, runs = sweep(6)
    cell = s.states()["adamw/bs4"]
    assert cell.best_lr < high and [(r["role"], r["lr"]) for r in runs] == [  # type: ignore[operator]
        ("warmup", cell.best_lr),
        ("confirm", cell.best_lr),
    ]
    assert len(cell.read.all_trials) == 7 + 1 + 1  # the cell's budget: search, the other warm-up, seeds
    # 5 of 6 ran: the one left goes to the confirmation run, at the spec's own warm-up
    s, high, runs = sweep(5)
    assert [(r["role"], r["warmup"]) for r in runs] == [("confirm", 0.05)]
    cell = s.states()["adamw/bs4"]
    assert cell.confirmed == [3.05] and len(cell.read.all_trials) == 6 + 1 + 1
