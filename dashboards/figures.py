"""The figures of a sweep: ONE renderer-free description per figure, built from the tidy tables of
`dashboards.data`, and TWO renderers that draw any description: matplotlib (PNG) and plotly (HTML).

Rules
-----
- A figure function (`*_figure(sweep)`) reads its table once and builds its `FigureDesc` once; it
  never touches a renderer. Whatever a figure shows (points, bars, bands, lines, legend entries,
  labels, notes) is in the description, so the PNG and the HTML cannot disagree: each renderer maps
  every field and adds no content of its own (only its look: fonts, margins, the plotly template).
- A description holds only str, int, float, bool, None and tuples of them (frozen dataclasses):
  tests check the numbers and labels behind a figure on it, and on both renderings, never pixels.
- `FigureSpec` carries the description with the table it was built from (`data`); the renderings are
  made on first use and cached (`mpl_fig`, `plotly_fig`).
- Matplotlib is used through `matplotlib.figure.Figure` with an explicit Agg canvas: no pyplot, so no
  global figure registry to leak, no GUI backend looked for on a server, and the process-wide backend
  of whoever imports this module (a notebook) is left alone.
- The HTML of a figure references plotly.js by the relative path `plotly.min.js` (`PLOTLYJS_FILE`),
  which `dashboards.publish` writes once per sweep next to the figures: plotly.js is ~4.8 MB, a
  figure's own HTML a few tens of kB.
- Colours: one per optimizer (tab10, spec order) in every figure; batch sizes on viridis, layers on plasma.

Units: losses are cross-entropy in nats per token; batch sizes in sequences; "tokens" are tokens
seen by the optimizer (all workers); steps are optimizer steps; lr is the peak learning rate.
Lengths in a description (line widths, marker sizes, font sizes, text offsets) are in points
(1/72 inch, matplotlib's unit); plotly's are CSS pixels, 4/3 of a point (`PX_PER_PT`).
"""

from __future__ import annotations

import dataclasses
import html
import io
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
import plotly.graph_objects as go
import plotly.io as pio
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from dashboards.data import (
    NoiseTable,
    StepsTable,
    SweepData,
    attention_curves,
    best_lr_fit,
    loss_curves,
    lr_points,
    noise_scale,
    scaling_points,
    steps_to_target,
)
from dashboards.figure_desc import (
    GREY,
    Annotation,
    Axis,
    FigureDesc,
    Panel,
    Series,
    Style,
)
from dashboards.render import render_matplotlib, render_plotly

log = logging.getLogger(__name__)

__all__ = [
    "FIGURES",
    "PLOTLYJS_FILE",
    "Annotation",
    "Axis",
    "FigureDesc",
    "FigureSpec",
    "Panel",
    "Series",
    "Style",
    "attention_figure",
    "best_lr_figure",
    "loss_figure",
    "lr_figure",
    "render_matplotlib",
    "render_plotly",
    "scaling_figure",
    "steps_figure",
]

PNG_DPI = 120
OPT_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
LOSS_LABEL = "val loss (nats/token)"
BATCH_LABEL = "batch size (sequences)"
TOKENS_LABEL = "tokens seen"
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}
PLOTLYJS_FILE = "plotly.min.js"  # what a figure's HTML loads, relative to itself (publish writes it once)


# --------------------------------------------------------------------------------------------------
# The description: dashboards/figure_desc.py; the renderers: dashboards/render.py
# --------------------------------------------------------------------------------------------------


@dataclass
class FigureSpec:
    """One figure: `name` (file stem), `data` (the tidy table it was built from), `desc` (what it
    shows); `mpl_fig` and `plotly_fig` are its two renderings, made from `desc` on first use."""

    name: str
    data: Any
    desc: FigureDesc
    _cache: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def title(self) -> str:
        return self.desc.title

    @property
    def mpl_fig(self) -> Figure:
        if "mpl" not in self._cache:
            self._cache["mpl"] = render_matplotlib(self.desc)
        return self._cache["mpl"]

    @property
    def plotly_fig(self) -> go.Figure:
        if "plotly" not in self._cache:
            self._cache["plotly"] = render_plotly(self.desc)
        return self._cache["plotly"]

    def png_bytes(self, dpi: int = PNG_DPI) -> bytes:
        """The PNG, rendered once per dpi (the file and the page's fallback share it)."""
        key = ("png", dpi)
        if key not in self._cache:
            buf = io.BytesIO()
            self.mpl_fig.savefig(buf, format="png", dpi=dpi)
            self._cache[key] = buf.getvalue()
        return self._cache[key]

    def html(self) -> str:
        """A standalone page that loads plotly.js from `plotly.min.js` next to it (a few tens of kB,
        not 4.8 MB). Opened where that file is not beside it (a lone copy; an artifact viewer that
        shows one file by itself, as MLflow's preview may), it says so in place of a blank page."""
        page = pio.to_html(
            self.plotly_fig,
            full_html=True,
            include_plotlyjs=PLOTLYJS_FILE,  # a name ending in .js: a <script src> to it, nothing inline
            config=PLOTLY_CONFIG,
            div_id=f"fig-{self.name}",
        )
        missing = (
            f'<p id="no-plotly" style="font-family: sans-serif; color: {GREY}">This interactive figure needs '
            f"{PLOTLYJS_FILE} next to it: open it from the sweep's figures/ folder (artifacts of the summary "
            f"run), where {PLOTLYJS_FILE} is published once for all figures. The same figure: "
            f"{html.escape(self.name)}.png.</p>"
        )
        check = f"<script>if (!window.Plotly) document.body.insertAdjacentHTML('afterbegin', {json.dumps(missing)});</script>"
        return page.replace("</body>", check + "</body>", 1)

    def div(self) -> str:
        """The figure's div and its script, without plotly.js (the page includes it once) and without
        its title (the page's heading above it says the same)."""
        fig = go.Figure(self.plotly_fig)
        fig.update_layout(title_text="", margin_t=40)
        return pio.to_html(
            fig, full_html=False, include_plotlyjs=False, config=PLOTLY_CONFIG, div_id=f"fig-{self.name}"
        )

    def data_json(self) -> str:
        """The table behind the figure as strict JSON (NaN/inf as null)."""
        return json.dumps(_jsonable(self.data), indent=1, allow_nan=False)

    def release(self) -> None:
        """Drop the renderings (the Agg buffers now rather than at garbage collection); the
        description stays, and a later use renders again."""
        fig = self._cache.get("mpl")
        if fig is not None:
            fig.clear()
        self._cache.clear()


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# --------------------------------------------------------------------------------------------------
# Shared pieces of the descriptions
# --------------------------------------------------------------------------------------------------


def opt_color(sweep: SweepData, optimizer: str) -> str:
    return OPT_COLORS[sweep.optimizers.index(optimizer) % len(OPT_COLORS)]


def _ramp(cmap: str, n: int) -> list[str]:
    """n colours along a colormap, stopping short of its pale end (readable on white)."""
    m = matplotlib.colormaps[cmap]
    return [to_hex(m(0.85 * i / (n - 1))) if n > 1 else to_hex(m(0.0)) for i in range(n)]


def batch_colors(sizes: Sequence[int]) -> dict[int, str]:
    return dict(zip(sorted(sizes), _ramp("viridis", len(sizes)), strict=True))


def batch_axis(sizes: Sequence[int]) -> Axis:
    """Log-x in base 2, one labelled tick per tested batch size, with room for markers and labels at
    both ends (a factor 1.4 beyond the smallest and the largest)."""
    if not sizes:
        return Axis(BATCH_LABEL, "log2")
    return Axis(
        BATCH_LABEL,
        "log2",
        ticks=tuple(float(b) for b in sizes),
        tick_labels=tuple(str(b) for b in sizes),
        limits=(min(sizes) / 1.4, max(sizes) * 1.4),
    )


def note(text: str) -> Annotation:
    """A reason in the middle of a panel (nothing to draw there, or not everything)."""
    return Annotation(text, 0.5, 0.5, xref="panel", yref="panel", center=True, middle=True)


def key(name: str, style: Style, group: str = "") -> Series:
    """A legend entry that draws nothing: a line when the style has one, else a marker."""
    return Series("line" if style.dash else "scatter", name, style, legend=True, group=group)


def curve(name: str, style: Style, xs: tuple[float, ...], f: Callable[[float], float], group: str) -> Series:
    """The line of y = f(x) through `xs` (a fit, a rule, a reference line), in the legend."""
    return Series("line", name, style, x=xs, y=tuple(f(x) for x in xs), legend=True, group=group)


def _known(v: float | None) -> float:
    """A value of a row the caller already filtered for having one (for the type checker)."""
    assert v is not None
    return v


def _f(values: Sequence[float | None]) -> tuple[float, ...]:
    """Values the caller already filtered for being there, as a description's tuple."""
    return tuple(_known(v) for v in values)


def _unshared(y: Axis, i: int) -> Axis:
    """Panels after the first share the first panel's y axis: its label only once."""
    return y if i == 0 else dataclasses.replace(y, label="")


# --------------------------------------------------------------------------------------------------
# 1. Scaling
# --------------------------------------------------------------------------------------------------


def scaling_figure(sweep: SweepData) -> FigureSpec:
    """Final val loss (mean, 95% CI over seeds) vs batch size, one line per optimizer; each optimizer's
    tolerance band; stars at the largest degradation-free batch size (vs itself), open diamonds vs the baseline."""
    t = scaling_points(sweep)
    ref_b = sweep.report.reference_batch_size
    title = f"Final val loss vs batch size (mean ± 95% CI over seeds) — sweep {sweep.sweep_id}"
    series: list[Series] = []
    notes: list[Annotation] = []
    for opt in sweep.optimizers:
        c = opt_color(sweep, opt)
        for band in (b for b in t.bands if b.optimizer == opt):
            label = f"{opt} tolerance band: ≤ +{t.tolerance:.0%} of its loss at B={band.reference_batch_size}"
            label += " (the baseline reference)" if band.is_baseline else ""
            series.append(
                Series("band", label, Style(c, alpha=0.12), y=(band.reference, band.upper), legend=True, group=opt)
            )
        pts = [p for p in t.points if p.optimizer == opt and p.val_loss_mean is not None]
        empty = sum(1 for p in t.points if p.optimizer == opt and p.val_loss_mean is None)
        label = f"{opt} (mean, 95% CI over seeds)" + (f"; {empty} cell(s) without a completed run" if empty else "")
        means = _f([p.val_loss_mean for p in pts])
        series.append(
            Series(
                "errorbar",
                label,
                Style(c, width=1.8, symbol="circle", size=5),
                x=tuple(float(p.batch_size) for p in pts),
                y=means,
                # error bar lengths below/above the mean: the report's CI, not a recomputed one
                err_low=tuple(m - _known(p.ci_low) for m, p in zip(means, pts, strict=True)),
                err_high=tuple(_known(p.ci_high) - m for m, p in zip(means, pts, strict=True)),
                legend=True,
                group=opt,
                hover=tuple(
                    f"{opt} B={p.batch_size}\nmean {m:.4f}\n95% CI [{_known(p.ci_low):.4f}, {_known(p.ci_high):.4f}]"
                    f"\nseeds {p.seeds}"
                    for m, p in zip(means, pts, strict=True)
                ),
            )
        )
        for m in (m for m in t.marks if m.optimizer == opt):
            if m.reference == "baseline" and opt == t.baseline:
                continue  # the baseline's "vs baseline" answer is its "vs self" answer
            noise = " (within noise)" if m.within_noise else ""
            star = Style(c, dash=None, symbol="star", size=17, edge="black", z=5)
            diamond = Style(c, dash=None, symbol="diamond", size=12, hollow=True, edge_width=1.8, z=5)
            if m.batch_size is None or m.val_loss_mean is None:
                # no answer to mark: say so in the legend rather than dropping it silently
                txt = f"{opt}: no degradation-free batch size vs {'itself' if m.reference == 'self' else t.baseline}"
                series.append(key(txt, dataclasses.replace(star if m.reference == "self" else diamond, hollow=True)))
                continue
            if m.reference == "self":
                txt = f"{opt}: largest degradation-free B = {m.batch_size} (vs itself at B={ref_b}){noise}"
                style = star
                notes.append(
                    Annotation(f"B={m.batch_size}", m.batch_size, m.val_loss_mean, offset=(7, 7), color=c, bold=True)
                )
            else:
                txt = f"{opt}: largest degradation-free B = {m.batch_size} vs baseline {t.baseline}{noise}"
                style = diamond
            series.append(
                Series(
                    "scatter",
                    txt,
                    style,
                    x=(float(m.batch_size),),
                    y=(m.val_loss_mean,),
                    legend=True,
                    group=opt,
                    hover=(txt,),
                )
            )
    if not any(p.val_loss_mean is not None for p in t.points):
        notes.append(note("no cell has a completed run"))
    panel = Panel(
        batch_axis(sweep.batch_sizes),
        Axis("final " + LOSS_LABEL),
        tuple(series),
        tuple(notes),
        legend="outside",
    )
    return FigureSpec("scaling", t, FigureDesc(title, (panel,), size=(11.5, 5.0)))


# --------------------------------------------------------------------------------------------------
# 2. LR sensitivity
# --------------------------------------------------------------------------------------------------


def lr_figure(sweep: SweepData) -> FigureSpec:
    """Val loss vs lr for every trial, one panel per optimizer, coloured by batch size.
    Filled: completed (final val loss); star: the cell's best search trial as the report names it
    (`search_best_run_id`: it chose the best lr); hollow: pruned (loss when stopped);
    'x' at the top of the panel: diverged or failed (no final loss), counted in the panel title."""
    t = lr_points(sweep)
    opts = sweep.optimizers
    colors = batch_colors(sweep.batch_sizes)
    title = f"LR sensitivity: val loss vs peak lr for every trial — sweep {sweep.sweep_id}"
    finite = [p.val_loss for p in t.points if p.val_loss is not None]
    lo_y, hi_y = (min(finite), max(finite)) if finite else (0.0, 1.0)
    span = max(hi_y - lo_y, 0.05)  # nats; a floor so a single loss still gets a readable range
    top = hi_y + 0.08 * span  # the data y of the 'x' markers where they cannot be pinned (plotly)
    y_axis = Axis("final " + LOSS_LABEL, limits=(lo_y - 0.05 * span, hi_y + 0.15 * span) if finite else None)
    lr_lo, lr_hi = t.lr_range
    # the axis holds every lr tried: the line search may step past the range by lr.extend
    tried = [p.lr for p in t.points]
    x_limits = (min([lr_lo, *tried]) / 1.5, max([lr_hi, *tried]) * 1.5)
    n_bad = sum(1 for p in t.points if p.val_loss is None)
    n_pruned = sum(1 for p in t.points if p.status == "pruned")
    # the legend (of the last panel): one filled circle per batch size, then the marker kinds in grey
    keys = [key(f"B={bs}", Style(colors[bs], dash=None, symbol="circle"), group=f"bs{bs}") for bs in sweep.batch_sizes]
    keys += [
        key("best lr of the cell", Style(GREY, dash=None, symbol="star", size=13, edge="black")),
        key(f"pruned ({n_pruned}): loss when stopped", Style(GREY, dash=None, symbol="circle", hollow=True)),
        key(f"diverged/failed ({n_bad}): no final loss", Style(GREY, dash=None, symbol="x")),
        key("searched lr range", Style(GREY, dash="dot", width=1.0)),
    ]
    panels = []
    for i, opt in enumerate(opts):
        series: list[Series] = []
        for bs in sweep.batch_sizes:
            c = colors[bs]
            mine = [p for p in t.points if p.optimizer == opt and p.batch_size == bs]
            done = Style(c, None, symbol="circle", size=5.5, z=3)
            best = Style(c, None, symbol="star", size=14.8, edge="black", edge_width=0.8, z=4)
            pruned = dataclasses.replace(done, hollow=True)
            bad = Style(c, None, symbol="x", size=6.3, z=3)
            # marker sizes: diameters in pt (the PNG drew scatter areas of 30, 220 and 40 pt^2 before)
            for group, style in (
                ([p for p in mine if p.status == "completed" and not p.is_best], done),
                ([p for p in mine if p.is_best], best),
                ([p for p in mine if p.status == "pruned" and p.val_loss is not None], pruned),
                ([p for p in mine if p.val_loss is None], bad),
            ):
                if not group:
                    continue
                series.append(
                    Series(
                        "scatter",
                        f"B={bs}",
                        style,
                        x=tuple(p.lr for p in group),
                        # diverged/failed: no loss to place on y, so at the top of the panel
                        y=tuple(top if p.val_loss is None else p.val_loss for p in group),
                        group=f"bs{bs}",
                        text=tuple(f"{p.run_name} ({p.status})" for p in group),
                        hover=tuple(
                            f"{p.run_name} ({p.status})\nlr {p.lr:.3g}\n"
                            + ("no final loss" if p.val_loss is None else f"val loss {p.val_loss:.4f}")
                            for p in group
                        ),
                        top=0.96 if style is bad else None,
                    )
                )
        series += [
            Series("vline", "searched lr range", Style(GREY, dash="dot", width=1.0), x=(x,)) for x in (lr_lo, lr_hi)
        ]
        last = i == len(opts) - 1
        n_c, n_p = t.count(opt, "completed"), t.count(opt, "pruned")
        n_x = t.count(opt, "diverged") + t.count(opt, "failed")
        panels.append(
            Panel(
                Axis("peak learning rate", "log", limits=x_limits),
                _unshared(y_axis, i),
                tuple(series + (keys if last else [])),
                (note("no finished trials"),) if not any(p.optimizer == opt for p in t.points) else (),
                title=f"{opt}: {n_c} completed, {n_p} pruned, {n_x} diverged/failed",
                title_size=9,
                legend="outside" if last else "none",
            )
        )
    desc = FigureDesc(title, tuple(panels), size=(4.6 * len(opts) + 1.8, 4.4), share_y=True)
    return FigureSpec("lr_sensitivity", t, desc)


# --------------------------------------------------------------------------------------------------
# 3. Best lr vs batch size
# --------------------------------------------------------------------------------------------------


def best_lr_figure(sweep: SweepData) -> FigureSpec:
    """Best lr vs batch size (log-log), a fitted power law per optimizer, and the sqrt (B^1/2) and
    linear (B^1) rules from its smallest batch size. Hollow markers: best lr at the edge of the range."""
    t = best_lr_fit(sweep)
    sizes = sweep.batch_sizes
    title = f"Best lr vs batch size (log-log) with fitted power laws — sweep {sweep.sweep_id}"
    xs_line = (min(sizes) / 1.2, max(sizes) * 1.2) if sizes else ()
    series: list[Series] = []
    for opt in sweep.optimizers:
        c = opt_color(sweep, opt)
        pts = [p for p in t.points if p.optimizer == opt]
        for group, name, style in (
            ([p for p in pts if not p.lr_at_edge], f"{opt} best lr", Style(c, None, symbol="circle", size=7)),
            (
                [p for p in pts if p.lr_at_edge],
                f"{opt} best lr at the edge of the searched range",
                Style(c, None, symbol="circle", size=9, hollow=True, edge_width=1.5),
            ),
        ):
            if group:
                series.append(
                    Series(
                        "scatter",
                        name,
                        style,
                        x=tuple(float(p.batch_size) for p in group),
                        y=tuple(p.best_lr for p in group),
                        legend=True,
                        group=opt,
                        hover=tuple(f"{opt} B={p.batch_size}\nbest lr {p.best_lr:.3g}" for p in group),
                    )
                )
        fit = next((f.law for f in t.fits if f.optimizer == opt), None)
        if fit is not None:
            r2 = f", R²={fit.r2:.2f}" if fit.r2 is not None else ""
            label = f"{opt} fit: lr = {fit.prefactor:.3g}·B^{fit.exponent:.2f}{r2}"
            series.append(curve(label, Style(c, width=1.8), xs_line, fit, opt))
        for rule in (r for r in t.rules if r.optimizer == opt):
            label = f"{opt} {rule.rule} rule (lr ∝ B^{rule.exponent:g}) from B={rule.anchor_batch}"
            style = Style(c, dash="dash" if rule.rule == "sqrt" else "dot", width=1.2, alpha=0.6)
            series.append(curve(label, style, xs_line, rule, opt))
    lr_lo, lr_hi = sweep.report.lr_range
    for y in (lr_lo, lr_hi):  # one legend entry for both edges; they show and hide together
        series.append(
            Series(
                "hline",
                "searched lr range",
                Style(GREY, dash="dashdot", width=0.8),
                y=(y,),
                legend=y == lr_lo,
                group="lr range",
            )
        )
    panel = Panel(
        batch_axis(sizes),
        Axis("best peak learning rate", "log", plain=True),
        tuple(series),
        (note("no cell has a best lr"),) if not t.points else (),
        legend="outside",
        grid="both",
    )
    return FigureSpec("best_lr", t, FigureDesc(title, (panel,), size=(9.5, 4.6)))


def _over_tokens(
    title: str,
    y_label: str,
    panels: list[tuple[str, list[Series], tuple[Annotation, ...]]],
    keys: list[Series],
    *,
    legend_width: float,
    title_size: float = Panel.title_size,
) -> FigureDesc:
    """Panels (title, series, annotations) side by side over tokens, one y axis for all (labelled on the
    first); the last panel carries the legend `keys` outside to its right, `legend_width` inches wide."""
    out = []
    for i, (panel_title, series, notes) in enumerate(panels):
        last = i == len(panels) - 1
        out.append(
            Panel(
                Axis(TOKENS_LABEL),
                Axis(y_label if i == 0 else ""),
                tuple(series + (keys if last else [])),
                notes,
                title=panel_title,
                title_size=title_size,
                legend="outside" if last and keys else "none",
            )
        )
    return FigureDesc(title, tuple(out), size=(4.6 * len(panels) + legend_width, 4.4), share_y=True)


# --------------------------------------------------------------------------------------------------
# 4. Loss vs tokens
# --------------------------------------------------------------------------------------------------


def loss_figure(sweep: SweepData) -> FigureSpec:
    """Val (solid) and train (dashed) loss vs tokens of each cell's first confirmation run (the run the
    report's steps to reference come from; rules: docs/researchers.md), one panel per optimizer."""
    t = loss_curves(sweep)
    opts = sweep.optimizers
    colors = batch_colors(sweep.batch_sizes)
    title = f"Loss vs tokens of each cell's first confirmation run — sweep {sweep.sweep_id}"
    keys = [key(f"B={b}", Style(colors[b]), group=f"bs{b}") for b in sweep.batch_sizes] + [
        key("val loss", Style(GREY, symbol="circle", size=3)),
        key("train loss (mean since last eval)", Style(GREY, dash="dash", alpha=0.6)),
    ]
    panels: list[tuple[str, list[Series], tuple[Annotation, ...]]] = []
    for opt in opts:
        series: list[Series] = []
        for bs in sweep.batch_sizes:
            for metric, dash, alpha in (("val_loss", "solid", 1.0), ("train_loss", "dash", 0.5)):
                pts = [p for p in t if p.optimizer == opt and p.batch_size == bs and p.metric == metric]
                if not pts:
                    continue
                val = metric == "val_loss"
                series.append(
                    Series(
                        "line",
                        f"B={bs}",
                        Style(colors[bs], dash=dash, symbol="circle" if val else None, size=3, alpha=alpha),  # type: ignore[arg-type]
                        x=tuple(float(p.tokens) for p in pts),
                        y=tuple(p.value for p in pts),
                        group=f"bs{bs}",
                        text=tuple(p.run_name for p in pts),
                        hover=tuple(f"{p.run_name}\n{metric} {p.value:.4f} at {p.tokens} tokens" for p in pts),
                    )
                )
        panels.append((opt, series, (note("no completed confirmation run"),) if not series else ()))
    return FigureSpec("loss_curves", t, _over_tokens(title, "loss (nats/token)", panels, keys, legend_width=1.6))


# --------------------------------------------------------------------------------------------------
# 5. Max attention logit per layer
# --------------------------------------------------------------------------------------------------


def attention_figure(sweep: SweepData) -> FigureSpec:
    """Max attention logit per layer vs tokens at the largest batch size, one panel per optimizer
    (the MERIT paper's mechanism: AdamW's max logit runs away at large batch, MERIT's stays bounded)."""
    t = attention_curves(sweep)
    opts = sweep.optimizers
    layers = sorted({p.layer for p in t.points})
    colors = dict(zip(layers, _ramp("plasma", len(layers)), strict=True))
    title = f"Max attention logit per layer vs tokens at the largest batch size — sweep {sweep.sweep_id}"
    keys = [key(f"layer {k}", Style(colors[k], symbol="circle", size=3), group=f"l{k}") for k in layers]
    panels: list[tuple[str, list[Series], tuple[Annotation, ...]]] = []
    for opt in opts:
        if opt in t.runs:
            bs, name, status = t.runs[opt]
            subtitle = f"{opt}, B={bs}: {name}" + ("" if status == "completed" else f" ({status})")
        else:
            subtitle = f"{opt}: no attention probe"
        series: list[Series] = []
        for layer in layers:
            pts = [p for p in t.points if p.optimizer == opt and p.layer == layer]
            if pts:
                series.append(
                    Series(
                        "line",
                        f"layer {layer}",
                        Style(colors[layer], symbol="circle", size=3),
                        x=tuple(float(p.tokens) for p in pts),
                        y=tuple(p.value for p in pts),
                        group=f"l{layer}",
                        hover=tuple(f"layer {layer}\nmax logit {p.value:.3f} at {p.tokens} tokens" for p in pts),
                    )
                )
        panels.append((subtitle, series, (note("no attention probe recorded"),) if opt in t.missing else ()))
    y_label = "max attention logit q·k/√d (probe batch)"
    return FigureSpec("attention_logits", t, _over_tokens(title, y_label, panels, keys, legend_width=1.4, title_size=8))


# --------------------------------------------------------------------------------------------------
# 6. Steps to target, and the gradient noise scale
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepsAndNoise:
    """Figure 6's two tables: steps to the target loss (left panel), B_simple over tokens (right)."""

    steps: StepsTable
    noise: NoiseTable


NO_NOISE = (
    "no gradient noise scale recorded:\nB_simple needs more than one micro-batch per step\n"
    "(gradient accumulation; a batch that fits one forward pass has none)"
)


def steps_figure(sweep: SweepData) -> FigureSpec:
    """Left: optimizer steps to reach (1 + tol) x the optimizer's own loss at the reference batch, vs
    batch size (log-log), with the perfect-scaling line steps ∝ 1/B from the smallest batch size and
    the predicted critical batch size (vertical dotted); the steps are the report's steps_to_reference.
    Right: B_simple over tokens of the confirmation runs, with B_crit (dashed). Cells that never reach
    the target: open triangles at the top."""
    st = steps_to_target(sweep)
    ns = noise_scale(sweep)
    sizes = sweep.batch_sizes
    tol = sweep.tolerance
    title = f"Steps to target loss vs batch size, and the gradient noise scale — sweep {sweep.sweep_id}"
    reached = [p.steps for p in st.points if p.steps]
    top = max(reached) * 2.0 if reached else 10.0  # the data y of 'not reached' where it cannot be pinned
    left: list[Series] = []
    left_notes: list[Annotation] = []
    right: list[Series] = []
    right_notes: list[Annotation] = []
    widths = {b: 1.0 + 1.2 * i / max(len(sizes) - 1, 1) for i, b in enumerate(sizes)}  # pt; thicker = larger B
    for opt in sweep.optimizers:
        c = opt_color(sweep, opt)
        series, notes = _steps_series(st, opt, c, top, sizes)
        left += series
        left_notes += notes
        for crit in (k for k in ns.critical if k.optimizer == opt):
            label = f"{opt} B_crit ≈ {crit.b_crit:.3g} (final B_simple at B={crit.batch_size}, {crit.runs} run(s))"
            left.append(
                Series("vline", label, Style(c, dash="dot", width=1.4), x=(crit.b_crit,), legend=True, group=opt)
            )
            right.append(
                Series("hline", f"{opt} B_crit", Style(c, dash="dash", width=1.2), y=(crit.b_crit,), group=opt)
            )
            right_notes.append(
                Annotation(
                    f"{opt} B_crit ≈ {crit.b_crit:.3g}", 0.01, crit.b_crit, xref="panel", offset=(2, 3), color=c, size=7
                )
            )
        series, notes = _noise_series(ns, opt, c, widths)
        right += series
        right_notes += notes
    if not reached:  # nothing to place on a log axis (matplotlib refuses an empty one)
        left_notes.append(note("no cell reached its target"))
    if not ns.points:
        right_notes.append(note(NO_NOISE))
    panels = (
        Panel(
            batch_axis(sizes),
            Axis("optimizer steps to target", "log" if reached else "linear", plain=True),
            tuple(left),
            tuple(left_notes),
            title=f"steps to (1+{tol:g}) x own loss at B={sweep.report.reference_batch_size}",
            title_size=9,
            legend="lower left",
            grid="both",
        ),
        Panel(
            Axis(TOKENS_LABEL),
            Axis("B_simple (sequences)", "log" if ns.points else "linear", plain=True),
            tuple(right),
            tuple(right_notes),
            title="gradient noise scale B_simple of the confirmation runs",
            title_size=9,
            legend="best" if ns.points else "none",
            grid="both",
            blank=not ns.points,
        ),
    )
    return FigureSpec("steps_to_target", StepsAndNoise(st, ns), FigureDesc(title, panels, size=(13.0, 4.8)))


def _steps_series(
    st: StepsTable, opt: str, c: str, top: float, sizes: Sequence[int]
) -> tuple[list[Series], list[Annotation]]:
    """One optimizer on the left panel: its steps to target, the cells that never reached it, its
    perfect-scaling line."""
    pts = [p for p in st.points if p.optimizer == opt and p.steps]
    never = [p for p in st.points if p.optimizer == opt and p.steps is None and p.target_loss is not None]
    series = [
        Series(
            "line",
            opt,
            Style(c, symbol="circle"),
            x=tuple(float(p.batch_size) for p in pts),
            y=_f([p.steps for p in pts]),
            legend=True,
            group=opt,
            hover=tuple(f"{opt} B={p.batch_size}\n{p.steps} steps ({p.tokens} tokens)" for p in pts),
        )
    ]
    # the count itself: log ticks alone leave most values unreadable
    notes = [Annotation(str(p.steps), p.batch_size, _known(p.steps), offset=(5, 4), color=c, size=7) for p in pts]
    if never:
        series.append(
            Series(
                "scatter",
                f"{opt}: target not reached",
                Style(c, None, symbol="triangle-up", size=7.7, hollow=True),
                x=tuple(float(p.batch_size) for p in never),
                y=(top,) * len(never),
                legend=True,
                group=opt,
                top=0.95,
            )
        )
    for line in (p for p in st.perfect if p.optimizer == opt):
        xs = (float(line.anchor_batch), float(max(sizes)))
        label = f"{opt} perfect scaling (steps ∝ 1/B from B={line.anchor_batch})"
        series.append(curve(label, Style(c, dash="dash", width=1.2, alpha=0.7), xs, line, opt))
    return series, notes


def _noise_series(ns: NoiseTable, opt: str, c: str, widths: dict[int, float]) -> tuple[list[Series], list[Annotation]]:
    """One optimizer on the right panel: B_simple over tokens of each confirmation run, the first run of
    each batch size solid and labelled with its batch size at its end, the others faint."""
    series: list[Series] = []
    notes: list[Annotation] = []
    runs = sorted({(p.batch_size, p.seed, p.run_name) for p in ns.points if p.optimizer == opt})
    lead: dict[int, int] = {}  # batch size -> its lowest seed drawn: the first confirmation run
    for bs, seed, _ in runs:
        lead.setdefault(bs, seed)
    for bs, seed, name in runs:
        pts_n = [p for p in ns.points if p.optimizer == opt and p.run_name == name]
        is_lead = seed == lead[bs]
        series.append(
            Series(
                "line",
                f"{opt} B_simple (label: the run's batch size)",
                Style(c, width=widths.get(bs, 1.0), alpha=0.95 if is_lead else 0.35),
                x=tuple(float(p.tokens) for p in pts_n),
                y=tuple(p.b_simple for p in pts_n),
                legend=(bs, seed) == runs[0][:2],
                group=opt,
                text=(name,) * len(pts_n),
                hover=tuple(f"{name}\nB_simple {p.b_simple:.3g} sequences at {p.tokens} tokens" for p in pts_n),
            )
        )
        if is_lead:
            notes.append(
                Annotation(f"B={bs}", pts_n[-1].tokens, pts_n[-1].b_simple, offset=(4, 0), color=c, size=7, middle=True)
            )
    return series, notes


# in the order the page shows them
FIGURES: tuple[Callable[[SweepData], FigureSpec], ...] = (
    scaling_figure,
    lr_figure,
    best_lr_figure,
    loss_figure,
    attention_figure,
    steps_figure,
)
