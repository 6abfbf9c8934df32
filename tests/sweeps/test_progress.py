"""The live progress's models (sweeps/progress.py): the plan of a spec before the driver reports, the
searcher's first report against it, and what a reader of the store takes from the JSON of another version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import tiny_spec

from sweeps.progress import CellProgress, DriverProgress, Progress, TrialCurve
from sweeps.search import CellSearcher
from sweeps.spec import SweepSpec
from sweeps.stores import open_storage


def spec_of(**overrides: Any) -> SweepSpec:
    values: dict[str, Any] = {
        "optimizers": [{"name": "adamw"}, {"name": "lion"}],
        "batch_sizes": [4, 8, 16],
        "lr": {"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 2},
        "seeds": 1,
    }
    return SweepSpec.from_mapping(tiny_spec("progress", **(values | overrides)), max_trials=10**5)


def test_the_plan_of_two_optimizers_by_three_batch_sizes() -> None:
    spec = spec_of()
    p = Progress.planned(spec)
    # per optimizer 3 x (2 search + 1 confirmation), and its reference (bs4) one search trial more
    assert (p.cells_done, p.cells_total, p.trials_done, p.trials_total) == (0, 6, 0, 20)
    assert p.trials_total == spec.total_trials  # fixed seeds: the plan is the most the sweep runs
    assert [(c.cell, c.search_total, c.seeds_total) for c in p.cells] == [
        ("adamw/bs4", 3, 1),
        ("adamw/bs8", 2, 1),
        ("adamw/bs16", 2, 1),
        ("lion/bs4", 3, 1),
        ("lion/bs8", 2, 1),
        ("lion/bs16", 2, 1),
    ]
    assert all(
        (c.search_done, c.seeds_done, c.running, c.finished, c.best_lr, c.stopped) == (0, 0, 0, False, None, None)
        for c in p.cells
    )


def test_the_plan_confirms_at_the_fewest_seeds_and_counts_the_warmups() -> None:
    spec = spec_of(seeds={"min": 2, "max": 4, "step": 2}, schedule={"warmup_fraction": 0.05, "warmup_search": [0.2]})
    p = Progress.planned(spec)
    # search: 2 lrs and 1 other warm-up (+1 at the reference); adaptive confirmation adds runs as it decides
    assert {c.cell: (c.search_total, c.seeds_total) for c in p.cells if c.optimizer == "adamw"} == {
        "adamw/bs4": (4, 2),
        "adamw/bs8": (3, 2),
        "adamw/bs16": (3, 2),
    }
    assert p.trials_total == 2 * (4 + 3 + 3 + 3 * 2) == 32 < spec.total_trials


def test_a_search_of_the_batch_axis_plans_its_reference_cells() -> None:
    spec = spec_of(batch_sizes={"min": 4, "max": 64, "resolution": 1.5}, token_budget=200_000)
    p = Progress.planned(spec)
    assert [(c.cell, c.search_total, c.seeds_total) for c in p.cells] == [("adamw/bs4", 3, 1), ("lion/bs4", 3, 1)]
    assert (p.cells_total, p.trials_total) == (2, 8)


def test_the_searchers_first_report_is_the_plan(tmp_path: Path) -> None:
    for spec in (spec_of(), spec_of(batch_sizes={"min": 4, "max": 64, "resolution": 1.5}, token_budget=200_000)):
        storage = open_storage(f"sqlite:///{tmp_path / spec.name}-{len(spec.lattice)}.db")
        first = CellSearcher(spec, "unit", storage).progress()
        planned = Progress.planned(spec)
        assert first.curves == []
        assert (first.cells_total, first.trials_total) == (planned.cells_total, planned.trials_total)
        # the searcher lists its cells in the order they get trial slots (sweeps.plan.cell_order), and says
        # why each is tested (the plan leaves that to it)
        by_cell = {c.cell: c.model_dump(exclude={"chosen", "why"}) for c in first.cells}
        assert by_cell == {c.cell: c.model_dump(exclude={"chosen", "why"}) for c in planned.cells}


def test_a_stored_progress_of_another_version_reads() -> None:
    # an older driver's JSON: no `stopped`, no curve's `warmup`, cells of a few fields; a newer one's fields
    old: dict[str, Any] = {
        "cells_done": 1,
        "cells_total": 2,
        "trials_done": 3,
        "trials_total": 7,
        "retired_field": {"x": 1},
        "cells": [{"cell": "adamw/bs4", "search_best_val_loss": 5.5, "finished": True, "later": 2}],
        "curves": [{"cell": "adamw/bs4", "lr": 3e-3, "seed": 0, "role": "search", "status": "completed",
                    "points": [[512, 5.1], [1024, 4.7]], "later": "x"}],
    }  # fmt: skip
    p = Progress.model_validate(old)
    assert p.model_dump() == {
        "cells_done": 1,
        "cells_total": 2,
        "trials_done": 3,
        "trials_total": 7,
        "cells": [CellProgress(cell="adamw/bs4", search_best_val_loss=5.5, finished=True).model_dump()],
    }
    assert p.cells[0].stopped is None and p.cells[0].search_total is None
    curve = DriverProgress.model_validate(old).curves[0]
    assert curve == TrialCurve(cell="adamw/bs4", lr=3e-3, seed=0, role="search", status="completed",
                               points=[(512, 5.1), (1024, 4.7)])  # fmt: skip
    assert curve.warmup is None and curve.best is False
    # the progress the store kept of a sweep that named the confirmation role "seed" reads with its role now
    confirmation = {**old["curves"][0], "seed": 1, "role": "seed"}
    assert DriverProgress.model_validate({**old, "curves": [confirmation]}).curves[0].role == "confirm"
    # what the driver sends (its JSON) reads back as it was sent
    sent = DriverProgress(cells=p.cells, curves=[curve], trials_total=7)
    assert DriverProgress.model_validate(sent.model_dump(mode="json")) == sent
