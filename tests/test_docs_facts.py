"""The docs name only what exists: every repository path they cite (a module, a script, a manifest) is in the
repository, and the benchmarks table stays a table (a target, its latest figure, its command: no paragraphs)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# a path into one of the project's own folders, as the docs write them (`sweeps/plan.py`, `deploy/gpu_check.sh`)
CITED = re.compile(
    r"\b(?:service|sweeps|worker|dashboards|benchmarks|deploy|cli|tests)/[\w./-]+\.(?:py|sh|yaml|jsonl)\b"
)


def test_every_path_the_docs_cite_exists() -> None:
    missing = {
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in DOCS
        for path in CITED.findall(doc.read_text())
        if not (ROOT / path).exists()
    }
    assert not missing, sorted(missing)


def test_the_benchmarks_table_has_no_paragraphs() -> None:
    rows = [line for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines() if line.startswith("| ")]
    assert len(rows) >= 10 and all(line.count(" | ") == 2 for line in rows[2:])  # target | figure | command
    assert max(len(line) for line in rows) <= 400


def test_the_contributors_map_names_every_module() -> None:
    """docs/contributors.md maps the code: every module of the five packages is there by its path (a database
    migration is named by its folder, `service/store/alembic/`)."""
    text = (ROOT / "docs" / "contributors.md").read_text()
    modules = [
        p.relative_to(ROOT).as_posix()
        for package in ("service", "sweeps", "worker", "dashboards", "cli")
        for p in sorted((ROOT / package).rglob("*.py"))
        if p.name != "__init__.py" and "alembic" not in p.parts
    ]
    assert len(modules) > 60 and "service/store/alembic/" in text
    unmapped = [m for m in modules if m not in text]
    assert not unmapped, unmapped
