"""benchmarks/soak.py's end checks without Ray: what a sweep plans comes from the product's rule, and a
trial is identified by its Tune trial id in Optuna and in MLflow (the soak once keyed trials by cell, role
and seed, and took the reference's second search trial, seed 0 like the first, for one recorded twice)."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import optuna
import pytest
from bench_helpers import load_bench

from sweeps.layout import trial_tags
from sweeps.spec import SweepSpec, cell_search_trials

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    return load_bench("soak")


def recorded(planned: dict[tuple[str, str], int]) -> tuple[list[Any], list[Any], list[dict[str, str]]]:
    """A sweep that ran `planned` as the product records it: per trial an Optuna FrozenTrial in its cell's
    study (search trials and confirmation runs numbered in their study) and an MLflow run's tags."""
    studies: dict[str, list[Any]] = {}
    runs = []
    for (cell, role), n in sorted(planned.items()):
        for i in range(n):
            trial_id = f"ab12c_{len(runs):05d}"  # Tune's: a prefix of its searcher, then a count
            seed = 0 if role == "search" else i + 1
            number = len(studies.setdefault(cell, []))
            studies[cell].append(
                optuna.trial.create_trial(
                    params={"lr": 1e-3 * (i + 1)},
                    distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)},
                    value=3.0,
                    user_attrs={"role": role, "seed": seed, "status": "completed", "tune_trial_id": trial_id},
                )
            )
            studies[cell][-1].number = number
            optimizer, bs = cell.split("/bs")
            runs.append(
                trial_tags(
                    sweep_id="s1",
                    parent_run_id="p",
                    role=role,
                    cell=cell,
                    optimizer=optimizer,
                    batch_size=int(bs),
                    lr=1e-3 * (i + 1),
                    seed=seed,
                    status="completed",
                    optuna_number=number if role == "search" else None,  # a confirmation run has none in MLflow
                    tune_trial_id=trial_id,
                )
            )
    trials = [(cell, t) for cell, ts in studies.items() for t in ts]
    return [c for c, _ in trials], [t for _, t in trials], runs


def records(soak: ModuleType, planned: dict[tuple[str, str], int]) -> tuple[list[Any], list[Any]]:
    cells, trials, runs = recorded(planned)
    return [soak.optuna_record(c, t) for c, t in zip(cells, trials, strict=True)], [soak.mlflow_record(r) for r in runs]


def test_the_plan_is_the_products_rule_with_the_references_extra_search_trial(soak: ModuleType) -> None:
    planned = soak.planned_trials(soak.spec("soak-plan"))
    reference, other = (cell_search_trials(soak.TRIALS_PER_BATCH_SIZE, reference=r) for r in (True, False))
    assert reference > other  # the refined reference searches more: a count of its own would miss it
    assert planned == {
        ("adamw/bs4", "search"): reference,
        ("adamw/bs4", "confirm"): soak.SEEDS,
        ("adamw/bs8", "search"): other,
        ("adamw/bs8", "confirm"): soak.SEEDS,
    }
    assert sum(planned.values()) == SweepSpec.model_validate(soak.spec("soak-plan")).total_trials
    # each optimizer's smallest size is its reference
    wide = soak.spec("soak-wide") | {
        "optimizers": [{"name": "adamw"}, {"name": "lion"}],
        "batch_sizes": [4, 8, 16],
        "lr": {"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 3},
        "seeds": 2,
    }
    planned = soak.planned_trials(wide)
    searched = {c: n for (c, role), n in planned.items() if role == "search"}
    assert searched == {
        f"{o}/bs{b}": cell_search_trials(3, reference=b == 4) for o in ("adamw", "lion") for b in (4, 8, 16)
    }
    assert sum(planned.values()) == SweepSpec.model_validate(wide).total_trials


def test_a_plan_the_soak_cannot_count_exactly_is_refused(soak: ModuleType) -> None:
    adaptive = soak.spec("soak-adaptive") | {"seeds": {"min": 2, "max": 4, "step": 2}}
    with pytest.raises(ValueError, match="fixed plan"):
        soak.planned_trials(adaptive)


def test_a_sweep_that_ran_its_plan_passes(soak: ModuleType) -> None:
    # the reference cell's two search trials are both seed 0: distinct trials, by their Tune trial ids
    planned = soak.planned_trials(soak.spec("soak-plan"))
    optuna_trials, mlflow_trials = records(soak, planned)
    assert sum(1 for t in optuna_trials if (t.cell, t.role, t.seed) == ("adamw/bs4", "search", 0)) == 2
    assert soak.compare_records("s1", "succeeded", optuna_trials, mlflow_trials, planned) == []
    # a cancelled sweep ran part of its plan: only the stores' agreement is checked
    assert soak.compare_records("s1", "cancelled", optuna_trials[:2], mlflow_trials[:2], planned) == []


def test_a_trial_lost_doubled_or_told_apart_is_found(soak: ModuleType) -> None:
    planned = soak.planned_trials(soak.spec("soak-plan"))
    o, m = records(soak, planned)

    def check(optuna_trials: list[Any], mlflow_trials: list[Any], status: str = "succeeded") -> str:
        return " | ".join(soak.compare_records("s1", status, optuna_trials, mlflow_trials, planned))

    assert "succeeded with trials" in check(o[1:], [r for r in m if r.trial_id != o[0].trial_id])
    assert "more than once in Optuna" in check([*o, o[0]], m)
    assert "more than once in MLflow" in check(o, [*m, m[-1]], status="cancelled")
    assert "only in Optuna ['" in check(o, m[1:], status="cancelled")
    assert "without a Tune trial id in Optuna" in check([replace(o[0], trial_id=None), *o[1:]], m)
    for change in ({"cell": "adamw/bs8"}, {"role": "warmup"}, {"seed": 3}, {"number": 7}):
        assert f"trial {m[0].trial_id} is" in check(o, [replace(m[0], **change), *m[1:]]), change


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_soak_runs_its_cleanup(tmp_path: Path, signum: int) -> None:
    # the soak's `finally` stops the service, its head and PostgreSQL; a signal must reach it, SIGINT too in
    # a process started as a background job, which ignores SIGINT (`preexec_fn` does as such a shell does)
    marker = tmp_path / "cleaned"
    code = (
        "import sys, time; sys.path[:0] = ['benchmarks', 'tests']; import soak; soak.stop_on_signals()\n"
        f"try:\n    print('ready', flush=True); time.sleep(60)\nfinally:\n    open({str(marker)!r}, 'w').write('x')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 128 + signum
    assert marker.exists()
