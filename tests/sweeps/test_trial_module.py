"""The function a trial's actor runs lives in a module that imports no more than the trial needs: Ray
pickles `run_trial` by module and name, so every trial process imports `sweeps.trial`, and one that
pulled in Optuna, MLflow and the analysis cost each trial ~2 s before training started."""

from __future__ import annotations

import subprocess
import sys


def test_the_trial_function_imports_neither_optuna_nor_mlflow_nor_the_analysis() -> None:
    code = (
        "import sys, sweeps.trial, worker.config; "
        "print(sorted(m for m in ('optuna', 'mlflow', 'sweeps.analysis', 'sweeps.search', 'sqlalchemy') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
    # the driver passes Tune that very function, not a copy
    from sweeps import driver, trial

    assert driver.run_trial is trial.run_trial
    assert trial.run_trial.__module__ == "sweeps.trial"
