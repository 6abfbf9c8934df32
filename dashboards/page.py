"""One HTML page per sweep: the answer at the top, the figures below.

plotly.js comes once per page, never from a CDN (the machines serving it have no internet):
- `plotlyjs="inline"` (the default): inlined in the head, the page is self-contained (~0.8 MB of page
  and PNGs, plus 4.8 MB of plotly.js).
- `plotlyjs="relative"` (the published artifact figures/dashboard.html): a <script src="plotly.min.js">
  to the file published once per sweep next to it, so plotly.js is stored once per sweep, not in
  the page and in every figure. `inline_plotlyjs` turns such a page into the inline one, and
  `plotlyjs_from` into one that loads plotly.js from a URL: what `GET /sweeps/{id}/dashboard` serves,
  with the service's one copy under /static/ (cached by the browser for every dashboard).
Each figure is a plotly div, with its PNG in a <noscript> so the page is readable without JavaScript too.
Every piece of text that comes from a sweep (ids, optimizer names, warnings) goes through html.escape;
plotly escapes what it embeds in its JSON.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from typing import Literal

from plotly.offline import get_plotlyjs

from dashboards.data import SweepData
from dashboards.figures import PLOTLYJS_FILE, FigureSpec
from sweeps.analysis import Report, describe_bracket
from sweeps.batch_axis import bracket_of
from sweeps.report import OptimizerReport, describe_noise

__all__ = ["PLOTLYJS_TAG", "inline_plotlyjs", "plotlyjs_from", "render_dashboard"]

# the page's reference to plotly.js next to it: written exactly so, so that `inline_plotlyjs` finds it
PLOTLYJS_TAG = f'<script charset="utf-8" src="{PLOTLYJS_FILE}"></script>'

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0 auto;
       max-width: 1400px; padding: 1rem 2rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; }
.meta { color: #666; font-size: .9rem; }
table { border-collapse: collapse; margin: .6rem 0 1rem; font-size: .92rem; }
th, td { border: 1px solid #ddd; padding: .3rem .6rem; text-align: right; }
th { background: #f4f4f4; } td.name, th.name { text-align: left; }
.answer { background: #f3f8ff; border-left: 4px solid #1f77b4; padding: .6rem 1rem; margin: 1rem 0; }
.answer li { margin: .25rem 0; }
.warn { background: #fff7e6; border-left: 4px solid #f0a020; padding: .5rem 1rem; }
.ok { color: #1a7f37; } .bad { color: #b42318; } .unk { color: #777; }
section.figure { margin: 1.5rem 0 2rem; } section.figure h2 { font-size: 1.1rem; }
.plotly-graph-div { min-height: 460px; }
noscript img { max-width: 100%; }
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _bs(x: int | None) -> str:
    return "none" if x is None else f"B = {x}"


def _verdict(free: bool | None) -> str:
    if free is None:
        return '<span class="unk">n/a</span>'
    return '<span class="ok">yes</span>' if free else '<span class="bad">no</span>'


def answer_list(report: Report, *, steps: bool) -> str:
    """The answer per optimizer as an HTML list, the one rendering of it: what the sweep decided with
    confidence (vs itself, and vs the baseline), the point estimate beside it, and with `steps` the batch
    sizes a search of the batch axis tested, in order. The dashboard and the service's list of sweeps
    both show this."""
    items = []
    for opt, o in report.optimizers.items():
        a = o.largest_degradation_free_batch_size
        vs_base = (
            ""
            if opt == report.baseline
            else (
                f"; vs baseline <b>{_e(report.baseline)}</b>: <b>{_e(describe_bracket(o.bracket.baseline))}</b> "
                f'<span class="meta">(estimate {_e(_bs(a.baseline))}{_noise(o, "baseline")})</span>'
            )
        )
        tested = ""
        if steps and o.search_steps:
            order = " → ".join(f"{st.batch_size} ({st.chosen})" for st in o.search_steps)
            tested = f'<div class="meta search-steps">tested in order: {_e(order)}</div>'
        items.append(
            f"<li><b>{_e(opt)}</b>: vs itself: <b>{_e(describe_bracket(o.bracket.self))}</b> "
            f'<span class="meta">(estimate {_e(_bs(a.self))}{_noise(o, "self")})</span>{vs_base}{tested}</li>'
        )
    return f'<ul class="answer-list">{"".join(items)}</ul>'


def _noise(o: OptimizerReport, ref: str) -> str:
    noise = describe_noise(o, ref)
    return f"; {_e(noise)}" if noise else ""


def _answer(sweep: SweepData) -> str:
    r = sweep.report
    warmup = f'<p class="rule">Warm-up: {_e(r.warmup)}</p>' if r.warmup else ""
    return (
        f'<div class="answer" id="answer"><p>The largest degradation-free batch size: the largest whose final '
        f"val loss stays within +{r.tolerance:.1%} of the reference (loss at B = {r.reference_batch_size}, the smallest batch size), "
        f"first as decided with 95% confidence (paired by seed; undecided where the seeds cannot tell), then "
        f"the point estimate from the means.</p>{answer_list(r, steps=False)}"
        f'<p class="rule">{_e(r.verdict_rule)}</p>{warmup}</div>'
    )


def _cells_table(sweep: SweepData) -> str:
    r = sweep.report
    rows = []
    for opt, o in r.optimizers.items():
        for c in o.cells:
            lo, hi = c.val_loss_ci95
            ci = f"[{lo:.4f}, {hi:.4f}]" if c.ci_available and lo is not None and hi is not None else "n/a"
            st = c.trial_status
            rows.append(
                "<tr>"
                + "".join(
                    f"<td>{v}</td>"
                    for v in (
                        _e(opt),
                        c.batch_size,
                        _e("n/a" if c.best_lr is None else f"{c.best_lr:.3g}")
                        + (" (edge)" if c.lr_at_edge else "")
                        + (_e(f", warm-up {c.warmup:g}") if c.warmups_tried and c.warmup is not None else ""),
                        _e("n/a" if c.val_loss_mean is None else f"{c.val_loss_mean:.4f}"),
                        _e(ci),
                        c.seeds,
                        _e(f"{st.completed}/{st.pruned}/{st.diverged}/{st.failed}"),
                        _verdict(c.degradation_free.self),
                        _verdict(c.degradation_free.baseline),
                    )
                ).replace("<td>", '<td class="name">', 1)
                + "</tr>"
            )
    head = "".join(
        f"<th>{_e(h)}</th>"
        for h in (
            "optimizer",
            "batch size",
            "best lr",
            "val loss (mean)",
            "95% CI",
            "seeds",
            "completed/pruned/diverged/failed",
            "degradation-free vs self",
            "vs baseline",
        )
    ).replace("<th>", '<th class="name">', 1)
    return f'<table id="cells"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _search(sweep: SweepData) -> str:
    """A search of the batch axis: per optimizer the sizes in the order it tested them, why, the verdict
    each got and how the bracket narrowed with each one (the final verdicts of the sizes tested so far)."""
    r = sweep.report
    if r.batch_search is None:
        return ""
    against = r.batch_search.against
    parts = []
    for opt, o in r.optimizers.items():
        verdict = {c.batch_size: getattr(c.verdict, against) for c in o.cells}
        rows, so_far = [], {}
        for st in o.search_steps:
            so_far[st.batch_size] = verdict.get(st.batch_size)
            lo, hi = bracket_of(so_far)
            seeds = f" (+{st.seeds_added} seeds)" if st.seeds_added else ""
            cells = (
                st.order,
                f"B = {st.batch_size}",
                _e(st.chosen) + seeds,
                _e(st.why),
                _e(so_far[st.batch_size] or "n/a"),
                _e(f"[{lo if lo is not None else '-'}, {hi if hi is not None else '-'})"),
            )
            rows.append(
                "<tr>" + "".join(f"<td>{v}</td>" for v in cells).replace("<td>", '<td class="name">', 4) + "</tr>"
            )
        head = "".join(
            f"<th>{h}</th>" for h in ("step", "batch size", "chosen", "why", f"verdict vs {against}", "bracket")
        )
        parts.append(
            f'<h3>{_e(opt)}</h3><table class="search-steps" data-optimizer="{_e(opt)}">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )
    lattice = r.batch_search.lattice
    return (
        f'<section id="batch-search"><h2>The search of the batch axis</h2><p class="meta">from {lattice[0]} to '
        f"{lattice[-1]} ({len(lattice)} lattice sizes), steps x{r.batch_search.step:g} until a size is degraded "
        f"against the {_e(against)} reference, then bisection to a ratio of {r.batch_search.resolution:g}. "
        f"Assumed: {_e(r.batch_search.assumption)}.</p>{''.join(parts)}</section>"
    )


def _warnings(sweep: SweepData) -> str:
    if not sweep.warnings:
        return ""
    items = "".join(f"<li>{_e(w)}</li>" for w in sweep.warnings)
    return f'<div class="warn" id="warnings"><b>Warnings</b><ul>{items}</ul></div>'


def _figure(spec: FigureSpec, *, png_fallback: bool) -> str:
    fallback = ""
    if png_fallback:
        b64 = base64.b64encode(spec.png_bytes()).decode("ascii")
        fallback = f'<noscript><img alt="{_e(spec.title)}" src="data:image/png;base64,{b64}"></noscript>'
    return f'<section class="figure" id="{_e(spec.name)}"><h2>{_e(spec.title)}</h2>{spec.div()}{fallback}</section>'


def _inline(js: str) -> str:
    return f'<script type="text/javascript">{js}</script>'


def inline_plotlyjs(page: str, js: str | None = None) -> str:
    """A page rendered with `plotlyjs="relative"`, with plotly.js `js` (default: this plotly's) inlined
    in place of its reference. A page without the reference (inline already) is returned as it is."""
    if PLOTLYJS_TAG not in page:
        return page
    return page.replace(PLOTLYJS_TAG, _inline(get_plotlyjs() if js is None else js), 1)


def plotlyjs_from(page: str, src: str) -> str:
    """A page rendered with `plotlyjs="relative"`, loading plotly.js from `src` instead of next to it
    (the service: its one copy under /static/, which the browser caches for every dashboard). A page
    without the reference (inline already) is returned as it is."""
    return page.replace(PLOTLYJS_TAG, f'<script charset="utf-8" src="{html.escape(src, quote=True)}"></script>', 1)


def render_dashboard(
    sweep: SweepData,
    figures: Sequence[FigureSpec],
    *,
    png_fallback: bool = True,
    plotlyjs: Literal["inline", "relative"] = "inline",
) -> str:
    """The dashboard page, a complete HTML document (~0.8 MB with the PNG fallbacks, plus plotly.js
    when `plotlyjs` is "inline"; "relative": it loads `plotly.min.js` next to it, module docstring).

    `png_fallback` embeds each figure's PNG in a <noscript> for readers without JavaScript.
    """
    if plotlyjs not in ("inline", "relative"):
        raise ValueError(f"plotlyjs must be 'inline' or 'relative', not {plotlyjs!r}")
    status = f", status {sweep.status}" if sweep.status else ""
    figs = "".join(_figure(f, png_fallback=png_fallback) for f in figures)
    nav = " · ".join(f'<a href="#{_e(f.name)}">{_e(f.title.split(" — ")[0])}</a>' for f in figures)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # an empty icon of its own: otherwise every browser also asks the server for /favicon.ico,
        # which a page served from MLflow's artifacts or a test's file server answers with a 404
        '<link rel="icon" href="data:,">'
        f"<title>Sweep {_e(sweep.sweep_id)}: batch-size scaling</title><style>{_CSS}</style>"
        # plotly.js once, inline or next to the page: no network needed; figures' scripts below call Plotly.newPlot
        + (_inline(get_plotlyjs()) if plotlyjs == "inline" else PLOTLYJS_TAG)
        + "</head><body>"
        f"<h1>Sweep {_e(sweep.sweep_id)}: how large can the batch get?</h1>"
        f'<p class="meta">baseline {_e(sweep.report.baseline)}, tolerance {sweep.report.tolerance:g}, '
        f"reference batch size {sweep.report.reference_batch_size}, seq_len {sweep.report.seq_len}{_e(status)}"
        + (f", MLflow experiment {_e(sweep.experiment_id)}" if sweep.experiment_id else "")
        + "</p>"
        f"{_answer(sweep)}{_warnings(sweep)}{_search(sweep)}{_cells_table(sweep)}"
        f'<nav class="meta">Figures: {nav}</nav>{figs}</body></html>\n'
    )
