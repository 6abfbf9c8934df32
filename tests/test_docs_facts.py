"""What the docs and the code's own comments name exists: every file path and every `python -m` or dotted
project module they cite, and every project module is on the contributors' map. And the MLflow layout is
spelled in one module: no other product module writes an MLflow search filter or looks up an experiment
by name."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("worker", "sweeps", "dashboards", "service", "cli")
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
# a file of the repository: a path under one of its folders with a file name's extension (kubectl's
# `deploy/NAME` names a Deployment, not a file)
PATH_RE = re.compile(
    r"(?<![\w./-])((?:worker|sweeps|dashboards|service|cli|tests|benchmarks|deploy|docs)/[\w./-]*\.(?:py|md|sh|ya?ml|toml|json)"
    r"(?:\.\w+)?)(?![\w/-])"
)
# a project module in backquotes or after `python -m` (plain words such as a variable `sweeps.router` are not)
MODULE_RE = re.compile(r"(?:`|python -m )((?:worker|sweeps|dashboards|service|cli)(?:\.[a-z_][a-z0-9_]*)+)")


def _module_exists(dotted: str) -> bool:
    """`dotted` is a module or package of the project, or a name defined in one: its longest module
    prefix exists, and the next part is a name that module's source defines or imports."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            if n == len(parts):
                return True
            return re.search(rf"\b{re.escape(parts[n])}\b", source.read_text(encoding="utf-8")) is not None
    return False


def _cited(texts: list[Path], pattern: re.Pattern[str]) -> set[tuple[str, str]]:
    out = set()
    for path in texts:
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            out.add((str(path.relative_to(ROOT)), match.group(1).rstrip(".")))
    return out


def test_every_path_the_docs_and_the_code_cite_exists() -> None:
    missing = []
    for where, cited in _cited(DOCS + SOURCES, PATH_RE):
        target = cited.split("::")[0]
        module, _, _ = target.partition(".py.")  # `path/file.py.name`: a name in that file
        if not (ROOT / target).exists() and not (ROOT / f"{module}.py").is_file():
            missing.append(f"{where}: {cited}")
    assert missing == []


def test_every_project_module_the_docs_and_the_code_name_exists() -> None:
    missing = []
    for where, cited in _cited(DOCS + SOURCES, MODULE_RE):
        if cited.split(".")[-1] in ("py", "md", "yaml", "sh", "json", "csv", "db", "html"):
            continue  # a file name, checked as a path
        if not _module_exists(cited):
            missing.append(f"{where}: {cited}")
    assert missing == []


def test_the_contributors_map_names_every_product_module() -> None:
    text = (ROOT / "docs" / "contributors.md").read_text(encoding="utf-8")
    unmapped = []
    for path in SOURCES:
        rel = path.relative_to(ROOT)
        if path.name == "__init__.py" or "alembic" in rel.parts:
            continue
        dotted = ".".join(rel.with_suffix("").parts)
        # named by path, by dotted name, or by file name within its package's section
        if str(rel) not in text and dotted not in text and f"`{path.name}`" not in text:
            unmapped.append(str(rel))
    assert unmapped == []


def test_only_the_layout_module_spells_an_mlflow_query() -> None:
    spelled = []
    for path in SOURCES:
        if path == ROOT / "sweeps" / "layout.py":
            continue
        text = path.read_text(encoding="utf-8")
        for pattern in (r"\.search_runs\(", r"get_experiment_by_name\(", r"tags\.`", r"attributes\.status"):
            if re.search(pattern, text):
                spelled.append(f"{path.relative_to(ROOT)}: {pattern}")
    assert spelled == []


def test_the_module_finder_is_not_fooled() -> None:
    assert _module_exists("sweeps.simulate.simulate") and _module_exists("service.config_doc")
    assert not _module_exists("service.settings_doc") and importlib.util.find_spec("sweeps") is not None
