"""Loading a script of benchmarks/ (not a package) as a module, for the tests that drive a benchmark."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_bench(name: str) -> ModuleType:
    """benchmarks/<name>.py, run afresh as module `name`; registered in sys.modules first, as an import
    would, so its dataclasses and pickles resolve their module."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
