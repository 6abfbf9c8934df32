"""The search and the analysis, end to end, give the same reports as when this file's data was written:
on fixed simulated problems of every benchmark family (benchmarks/search_efficiency.py, `sweeps.simulate`),
each optimizer's answer, bracket and verdicts, every cell's best lr, and the trials and tokens the search
spent: every decision and count exactly, every float to 1e-9 of itself (its last digits follow the numpy
and scipy installed, which `make venv` does not pin). A change of structure (a module split, the searcher in parts) must leave them
all; a change of method changes them on purpose, and rewrites the data with

    python tests/sweeps/test_simulated_reports.py --write

saying in its commit what moved and why (the benchmarks measure whether it is better)."""

from __future__ import annotations

import json
import math
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


FLOAT_REL = 1e-9  # a float's last digits move with the numerics libraries; a decision moves nothing by 1e-9


def differences(got: Any, want: Any, at: str = "") -> list[str]:
    """Where `got` differs from `want`: keys, lengths, ints, strings and bools exactly, floats to FLOAT_REL."""
    if isinstance(want, dict) and isinstance(got, dict):
        if got.keys() != want.keys():
            return [f"{at}: keys {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in differences(got[k], want[k], f"{at}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{at}: {len(got)} items != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in differences(g, w, f"{at}[{i}]")]
    if isinstance(want, float) and type(got) is float:
        return [] if math.isclose(got, want, rel_tol=FLOAT_REL, abs_tol=0.0) else [f"{at}: {got!r} != {want!r}"]
    return [] if type(got) is type(want) and got == want else [f"{at}: {got!r} != {want!r}"]


def test_differences_names_what_moved() -> None:
    assert differences({"a": [1, 2.0, "x"]}, {"a": [1, 2.0 * (1 + 1e-12), "x"]}) == []
    assert differences({"a": [1, 2.0]}, {"a": [1, 2.0 * (1 + 1e-8)]}) == [f".a[1]: 2.0 != {2.0 * (1 + 1e-8)!r}"]
    assert differences({"a": 1}, {"a": 1.0}) == [".a: 1 != 1.0"]
    assert differences({"a": True}, {"a": 1}) == [".a: True != 1"]
    assert differences({"a": [1]}, {"a": [1, 2]}) == [".a: 1 items != 2"]
    assert differences({"a": 1}, {"b": 1}) == [": keys ['a'] != ['b']"]


@pytest.mark.parametrize(("family", "index"), PROBLEMS)
def test_the_same_problem_gives_the_same_report(bench: ModuleType, family: str, index: int) -> None:
    want = json.loads(DATA.read_text())[f"{family}/{index}"]
    got = json.loads(json.dumps(fingerprint(bench, family, index)))  # through JSON, as stored
    assert differences(got, want) == []


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    module = load_bench("search_efficiency")
    DATA.write_text(json.dumps({f"{f}/{i}": fingerprint(module, f, i) for f, i in PROBLEMS}, indent=1) + "\n")
    print(f"wrote {DATA}")
