"""Figures of a recorded sweep: read MLflow (`data`), draw (`figures`), assemble a page (`page`),
log them back to the sweep's summary run (`publish`). Imports neither `worker` nor torch.

`dashboards.publish(tracking_uri, sweep_id)` is the entry point (the name is bound to the function
here, over the submodule of the same name; `from dashboards.publish import publish` works as well).
"""

from __future__ import annotations

from dashboards.data import SweepData, SweepDataError, load_sweep
from dashboards.figures import FigureSpec
from dashboards.page import render_dashboard
from dashboards.publish import build_figures, dashboard_page, publish

__all__ = [
    "FigureSpec",
    "SweepData",
    "SweepDataError",
    "build_figures",
    "dashboard_page",
    "load_sweep",
    "publish",
    "render_dashboard",
]
