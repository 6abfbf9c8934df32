"""Imports point one way: worker <- sweeps <- dashboards <- service <- cli (the command line).

Every import of every module of the five packages, those inside functions too, read with `ast`: a
module may import its own package and the packages below it, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["worker", "sweeps", "dashboards", "service", "cli"]


def imported_packages(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out & set(LAYERS)


def test_no_package_imports_one_above_it() -> None:
    upward = []
    for rank, package in enumerate(LAYERS):
        files = sorted((ROOT / package).rglob("*.py"))
        assert files, f"no modules found in {package}/"
        for path in files:
            for target in imported_packages(path):
                if LAYERS.index(target) > rank:
                    upward.append(f"{path.relative_to(ROOT)} imports {target}")
    assert upward == []


def test_the_check_sees_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from service.settings import Settings\n    import dashboards\n")
    assert imported_packages(module) == {"service", "dashboards"}
