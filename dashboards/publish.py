"""Build a sweep's figures and page, write them to disk and log them to the sweep's summary run.

`publish(tracking_uri, sweep_id)` writes and logs them (the CLI's `sweeps plots ID`); `publish_figures` is
what the sweep's driver actor (`service.cluster.remote`) and `sweeps run` call when a sweep finishes, and
`dashboard_page` what the service serves. Publishing is idempotent: a second call rewrites the same files
and overwrites the same artifact paths (`figures/<name>.png|.html|.json`, `figures/dashboard.html`, `figures/plotly.min.js`).

plotly.js (~4.8 MB) is published once per sweep, as `figures/plotly.min.js`; the figures' HTML and
dashboard.html load it by that relative path (so they work opened from a download of `figures/`,
without network). `dashboard_page` gives the page with it inlined, or (`plotlyjs_src`, what
`GET /sweeps/{id}/dashboard` serves) loading it from a URL of the service.
Per sweep: ~1 MB of figures and page plus plotly.js once (with plotly.js inlined in each figure and the
page it would be ~35 MB).
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from plotly.offline import get_plotlyjs

from dashboards.data import SweepData, load_sweep
from dashboards.figures import FIGURES, PLOTLYJS_FILE, FigureSpec
from dashboards.page import PLOTLYJS_TAG, inline_plotlyjs, plotlyjs_from, render_dashboard
from sweeps.layout import find_experiment, summary_run

log = logging.getLogger(__name__)

__all__ = ["ARTIFACT_DIR", "build_figures", "dashboard_page", "publish", "write_figures"]

ARTIFACT_DIR = "figures"  # artifact path of everything published, in the summary run
DASHBOARD = "dashboard.html"


def build_figures(sweep: SweepData) -> list[FigureSpec]:
    """Every figure of the sweep, in page order. A figure whose drawing fails is logged and left out
    (the others still publish): a figure is a view, never a reason to lose the rest."""
    out = []
    for make in FIGURES:
        try:
            out.append(make(sweep))
        except Exception:
            log.exception("figure %s of sweep %s failed", make.__name__, sweep.sweep_id)
    return out


def write_figures(sweep: SweepData, figures: list[FigureSpec], out_dir: Path) -> list[Path]:
    """<out_dir>/figures/<name>.png, .html, .json (the data), dashboard.html and plotly.min.js, the one
    copy of plotly.js that every HTML there loads by relative path."""
    fig_dir = Path(out_dir) / ARTIFACT_DIR
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for f in figures:
        for suffix, content in (
            (".png", f.png_bytes()),
            (".html", f.html().encode()),
            (".json", f.data_json().encode()),
        ):
            path = fig_dir / f"{f.name}{suffix}"
            path.write_bytes(content)
            paths.append(path)
    page = fig_dir / DASHBOARD
    page.write_text(render_dashboard(sweep, figures, plotlyjs="relative"), encoding="utf-8")
    paths.append(page)
    js = fig_dir / PLOTLYJS_FILE
    js.write_text(get_plotlyjs(), encoding="utf-8")  # the version the figures' JSON was written for
    paths.append(js)
    return paths


def publish(tracking_uri: str, sweep_id: str, out_dir: str | Path | None = None) -> list[Path]:
    """Regenerate a sweep's figures and log them as artifacts of its summary run (under figures/).

    Returns the written files. Without `out_dir` they go to a new temporary directory that is left in
    place for the caller (it holds the files the returned paths name). Raises
    `dashboards.data.SweepDataError` when the sweep has no summary run or report yet.
    """
    from mlflow.tracking import MlflowClient

    started = time.perf_counter()
    client = MlflowClient(tracking_uri)
    sweep = load_sweep(tracking_uri, sweep_id, client=client)
    figures = build_figures(sweep)
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix=f"batchsweep-figures-{sweep_id}-"))
    paths = write_figures(sweep, figures, out)
    assert sweep.summary_run_id is not None  # load_sweep always finds one (it raises otherwise)
    client.log_artifacts(sweep.summary_run_id, str(out / ARTIFACT_DIR), artifact_path=ARTIFACT_DIR)
    for f in figures:
        f.release()  # free the Agg buffers now rather than at garbage collection
    log.info(
        "published %d figures of sweep %s to run %s in %.1f s",
        len(figures),
        sweep_id,
        sweep.summary_run_id,
        time.perf_counter() - started,
    )
    return paths


def dashboard_page(tracking_uri: str, sweep_id: str, *, fresh: bool = False, plotlyjs_src: str | None = None) -> str:
    """The dashboard page of a sweep, for `GET /sweeps/{id}/dashboard`.

    The published one (artifact figures/dashboard.html of the summary run) when there is one and
    `fresh` is false, with the published figures/plotly.min.js inlined in place of its reference
    (the page served needs nothing else, and no network); serving it costs two downloads, not a
    rendering (several CPU-seconds). Otherwise it is rendered now from MLflow, plotly.js inline,
    without logging anything. Raises `SweepDataError` when the sweep has no summary run or report yet.
    `plotlyjs_src`: the page loads plotly.js from this URL instead (`dashboards.page.plotlyjs_from`; the
    service's /static/ copy), and the published plotly.min.js is not downloaded.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    if not fresh:
        exp = find_experiment(client, sweep_id)
        summary = summary_run(client, exp.experiment_id) if exp is not None else None
        if summary is not None:
            run_id = summary.info.run_id
            listed = {a.path for a in client.list_artifacts(run_id, ARTIFACT_DIR)}
            if f"{ARTIFACT_DIR}/{DASHBOARD}" in listed:
                with tempfile.TemporaryDirectory() as d:
                    page = Path(client.download_artifacts(run_id, f"{ARTIFACT_DIR}/{DASHBOARD}", d)).read_text("utf-8")
                    if PLOTLYJS_TAG not in page:
                        return page  # published before plotly.js had a file of its own: inline already
                    if plotlyjs_src is not None:
                        return plotlyjs_from(page, plotlyjs_src)
                    js_path = f"{ARTIFACT_DIR}/{PLOTLYJS_FILE}"
                    if js_path not in listed:  # a partial upload: this plotly's copy is the next best
                        log.warning("sweep %s: %s missing next to its page; inlining this plotly's", sweep_id, js_path)
                        return inline_plotlyjs(page)
                    js = Path(client.download_artifacts(run_id, js_path, d)).read_text("utf-8")
                    return inline_plotlyjs(page, js)
    sweep = load_sweep(tracking_uri, sweep_id, client=client)
    figures = build_figures(sweep)
    if plotlyjs_src is None:
        page = render_dashboard(sweep, figures)
    else:
        page = plotlyjs_from(render_dashboard(sweep, figures, plotlyjs="relative"), plotlyjs_src)
    for f in figures:
        f.release()
    return page


def publish_figures(tracking_uri: str, sweep_id: str) -> None:
    """`publish` for a sweep's driver: the figures into its MLflow summary run; a figure never fails a sweep.

    The local copies go to a temporary directory removed once they are logged (about 5 MiB a sweep,
    which a long-lived service would otherwise pile up in its temporary folder).
    """
    try:
        with tempfile.TemporaryDirectory(prefix=f"batchsweep-figures-{sweep_id}-") as out:
            publish(tracking_uri, sweep_id, out_dir=out)
    except Exception:
        log.exception("figures of sweep %s could not be published", sweep_id)
