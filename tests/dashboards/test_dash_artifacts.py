"""What a sweep publishes to MLflow, without Ray: plotly.js once per sweep (figures/plotly.min.js), six
small HTML figures and the page that load it by relative path, and a served page that needs no network.
The sweep is hand-made (`dash_helpers.rich_sweep`) and recorded with the recorder's layout."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from dash_helpers import record_sweep, rich_sweep
from mlflow.tracking import MlflowClient
from plotly.offline import get_plotlyjs

from dashboards import build_figures, dashboard_page, load_sweep, publish, render_dashboard
from dashboards.page import PLOTLYJS_TAG, inline_plotlyjs

NAMES = ["scaling", "lr_sensitivity", "best_lr", "loss_curves", "attention_logits", "steps_to_target"]
PLOTLYJS = re.compile(r"plotly\.js v\d")  # plotly.js's own banner: one per copy
SCRIPT_SRC = re.compile(r"<script[^>]*\bsrc=[\"']?([^\"' >]+)")


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, dict[str, int], Path]:
    """(tracking uri, summary run id, {artifact name under figures/: size in bytes}, the figures/ folder
    downloaded from MLflow) of a recorded, published sweep."""
    root = tmp_path_factory.mktemp("mlflow-store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    _, summary_id, _ = record_sweep(uri, rich_sweep("sized"), root / "artifacts")
    publish(uri, "sized", root / "out")
    client = MlflowClient(uri)
    sizes = {Path(a.path).name: a.file_size for a in client.list_artifacts(summary_id, "figures")}
    folder = Path(client.download_artifacts(summary_id, "figures", str(root / "download")))
    return uri, summary_id, sizes, folder


def _artifact_file(uri: str, run_id: str, path: str) -> Path:
    """Where a run's artifact lies in the file artifact store `record_sweep` makes."""
    return Path(unquote(urlparse(MlflowClient(uri).get_run(run_id).info.artifact_uri).path)) / path


def test_plotlyjs_is_published_once_per_sweep(published: tuple) -> None:
    _, _, sizes, folder = published
    assert sorted(sizes) == sorted(
        [f"{n}{ext}" for n in NAMES for ext in (".png", ".html", ".json")] + ["dashboard.html", "plotly.min.js"]
    )
    # exactly one copy of plotly.js among everything published: the file the others load
    copies = {
        p.name: len(PLOTLYJS.findall(p.read_text(encoding="utf-8"))) for p in folder.iterdir() if p.suffix != ".png"
    }
    assert {n: k for n, k in copies.items() if k} == {"plotly.min.js": 1}
    assert (folder / "plotly.min.js").read_text(encoding="utf-8") == get_plotlyjs()
    # the six HTML figures are small (each was ~4.8 MB with plotly.js inline)
    html = {n: sizes[f"{n}.html"] for n in NAMES}
    assert all(0 < b < 200_000 for b in html.values()), html
    # per sweep: plotly.js once, ~1 MB besides (PNGs, JSON, HTML, the page with its PNG fallbacks);
    # it was ~35 MB (plotly.js in each of the six figures and in the page)
    js = sizes["plotly.min.js"]
    assert 4_000_000 < js < 6_000_000
    assert sum(sizes.values()) - js < 2_000_000, sizes


def test_every_html_finds_plotlyjs_by_relative_path(published: tuple) -> None:
    _, _, _, folder = published
    for page in sorted(folder.glob("*.html")):
        srcs = SCRIPT_SRC.findall(page.read_text(encoding="utf-8"))
        # one script source each: a relative path (no scheme, no host, no root), to plotly.js beside it
        assert srcs == ["plotly.min.js"], (page.name, srcs)
        target = (page.parent / srcs[0]).resolve()
        assert target.parent == folder.resolve() and target.is_file()
        assert PLOTLYJS.search(target.read_text(encoding="utf-8"))


def test_the_served_page_needs_no_network(published: tuple) -> None:
    uri, _, _, folder = published
    page = dashboard_page(uri, "sized")
    # the published page with the published plotly.js inlined: plotly.js once, no script source at all
    published_page = (folder / "dashboard.html").read_text(encoding="utf-8")
    assert page == inline_plotlyjs(published_page, (folder / "plotly.min.js").read_text(encoding="utf-8"))
    assert len(PLOTLYJS.findall(page)) == 1 and PLOTLYJS_TAG not in page
    assert not SCRIPT_SRC.search(page)
    assert not re.search(r"https?://", page.replace(get_plotlyjs(), ""))  # plotly.js names its CDN; nothing else
    assert re.findall(r'<div id="fig-([a-z_]+)" class="plotly-graph-div"', page) == NAMES
    # rendered afresh from MLflow (no artifact read), it is the same page byte for byte
    assert dashboard_page(uri, "sized", fresh=True) == page


def test_the_served_page_without_its_published_plotlyjs_and_an_older_inline_page(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _, summary_id, _ = record_sweep(uri, rich_sweep("partial"), tmp_path / "artifacts")
    publish(uri, "partial", tmp_path / "out")
    # an upload that lost plotly.min.js: the page is served with this plotly's copy inlined
    js = _artifact_file(uri, summary_id, "figures/plotly.min.js")
    js.unlink()
    page = dashboard_page(uri, "partial")
    assert page.count(get_plotlyjs()) == 1 and not SCRIPT_SRC.search(page)
    # a page published before plotly.js had a file of its own (inline already) is served as it is
    sweep = load_sweep(uri, "partial")
    old = render_dashboard(sweep, build_figures(sweep))
    _artifact_file(uri, summary_id, "figures/dashboard.html").write_text(old + "<!-- old -->", encoding="utf-8")
    assert dashboard_page(uri, "partial") == old + "<!-- old -->"
