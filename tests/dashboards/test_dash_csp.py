"""The dashboard as the service serves it, under its Content-Security-Policy: exactly its own inline
scripts, by their hashes (service/web/pages.py, dashboard_csp)."""

from __future__ import annotations

import base64
import hashlib
import re

from dash_helpers import rich_sweep

from dashboards import build_figures, render_dashboard
from dashboards.page import plotlyjs_from
from service.web.pages import PLOTLYJS_URL, dashboard_csp, with_service_bar


def test_the_dashboard_allows_its_own_inline_scripts_by_hash_and_no_others() -> None:
    """A real dashboard page (dashboards/ on a hand-made sweep, as the service serves it): every inline
    script is named by its sha256, nothing allows inline or eval'd code at large (the browser test,
    tests/dashboards/test_ui_browser.py, draws such a page in Chromium with no console errors)."""
    sweep = rich_sweep()
    page = with_service_bar(
        plotlyjs_from(render_dashboard(sweep, build_figures(sweep), plotlyjs="relative"), PLOTLYJS_URL), ""
    )
    csp = dashboard_csp(page)
    script_src = next(d for d in csp.split("; ") if d.startswith("script-src"))
    assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src
    inline = re.findall(r"<script(?![^>]*src=)[^>]*>(.*?)</script>", page, re.S)
    assert len(inline) >= 6  # a Plotly.newPlot per figure
    hashes = {f"'sha256-{base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()}'" for js in inline}
    assert set(script_src.split()[2:]) == hashes
    # a script that was not in the page when it was hashed is not allowed
    assert "'sha256-" + base64.b64encode(hashlib.sha256(b"alert(1)").digest()).decode() + "'" not in csp
