"""The search and the analysis, end to end, give the same reports as when this file's data was written:
on fixed simulated problems of every benchmark family (benchmarks/search_efficiency.py, `sweeps.simulate`),
each optimizer's answer, bracket and verdicts, every cell's best lr, and the trials and tokens the search
spent, to the last digit. A change of structure (a module split, the searcher in parts) must leave them
all; a change of method changes them on purpose, and rewrites the data with

    python tests/sweeps/test_simulated_reports.py --write

saying in its commit what moved and why (the benchmarks measure whether it is better)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for bench_helpers when run as a script

from bench_helpers import load_bench  # noqa: E402

DATA = Path(__file__).parent / "data" / "simulated_reports.json"
PROBLEMS = [(family, index) for family in ("bowls", "cliffs", "noise-scale") for index in (0, 1, 2)]


def fingerprint(bench: ModuleType, family: str, index: int) -> dict[str, Any]:
    spec = bench.make_spec()
    problem = bench.FAMILIES[family](index, base_seed=11)
    outcome = bench.run_searcher(problem, spec)
    report = outcome.report
    return {
        "tokens": outcome.tokens,
        "trials": outcome.trials,
        "optimizers": {
            name: {
                "answer": opt.largest_degradation_free_batch_size.model_dump(),
                "bracket": {ref: getattr(opt.bracket, ref).model_dump() for ref in ("self", "baseline")},
                "cells": [
                    {
                        "batch_size": c.batch_size,
                        "best_lr": c.best_lr,
                        "seeds": c.seeds,
                        "val_loss_mean": c.val_loss_mean,
                        "verdict": c.verdict.model_dump(),
                    }
                    for c in opt.cells
                ],
            }
            for name, opt in report.optimizers.items()
        },
    }


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("search_efficiency")


@pytest.mark.parametrize(("family", "index"), PROBLEMS)
def test_the_same_problem_gives_the_same_report(bench: ModuleType, family: str, index: int) -> None:
    want = json.loads(DATA.read_text())[f"{family}/{index}"]
    # through JSON, as stored: floats compare by their shortest repr, which round-trips exactly
    assert json.loads(json.dumps(fingerprint(bench, family, index))) == want


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    module = load_bench("search_efficiency")
    DATA.write_text(json.dumps({f"{f}/{i}": fingerprint(module, f, i) for f, i in PROBLEMS}, indent=1) + "\n")
    print(f"wrote {DATA}")
