"""The figures of a sweep, each drawn twice from the same tidy table: matplotlib (PNG) and plotly (HTML).

Every `*_figure(sweep)` returns a `FigureSpec` whose `data` is the table it was drawn from
(`dashboards.data`), so tests check the numbers behind a figure, never its pixels. Matplotlib is used
through `matplotlib.figure.Figure` with an explicit Agg canvas: no pyplot, so no global figure
registry to leak, no GUI backend looked for on a server, and the process-wide backend of whoever
imports this module (a notebook) is left alone. Colours: one per optimizer (tab10, spec order) in every figure;
batch sizes on viridis, layers on plasma.

Units: losses are cross-entropy in nats per token; batch sizes in sequences; "tokens" are tokens
seen by the optimizer (all workers); steps are optimizer steps; lr is the peak learning rate.
"""

from __future__ import annotations

import dataclasses
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
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter
from plotly.subplots import make_subplots

from dashboards.data import (
    SweepData,
    attention_curves,
    best_lr_fit,
    loss_curves,
    lr_points,
    noise_scale,
    scaling_points,
    steps_to_target,
)

log = logging.getLogger(__name__)

__all__ = [
    "FIGURES",
    "FigureSpec",
    "attention_figure",
    "best_lr_figure",
    "loss_figure",
    "lr_figure",
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
GREY = "#555555"
LOSS_LABEL = "val loss (nats/token)"
BATCH_LABEL = "batch size (sequences)"
TOKENS_LABEL = "tokens seen"
PLOTLY_HEIGHT = 460  # px; the page stacks figures, each a fixed height (the div's 100% would collapse)
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


@dataclass
class FigureSpec:
    """One figure: `name` (file stem), `title`, `data` (the tidy table drawn), both renderings."""

    name: str
    title: str
    data: Any
    mpl_fig: Figure
    plotly_fig: go.Figure
    _png: dict[int, bytes] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def png_bytes(self, dpi: int = PNG_DPI) -> bytes:
        """The PNG, rendered once per dpi (the file and the page's fallback share it)."""
        if dpi not in self._png:
            buf = io.BytesIO()
            self.mpl_fig.savefig(buf, format="png", dpi=dpi)
            self._png[dpi] = buf.getvalue()
        return self._png[dpi]

    def html(self) -> str:
        """A standalone page with plotly.js inline (~4.7 MB): it renders offline, also inside the MLflow UI."""
        return pio.to_html(
            self.plotly_fig, full_html=True, include_plotlyjs=True, config=PLOTLY_CONFIG, div_id=f"fig-{self.name}"
        )

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
# Shared drawing helpers
# --------------------------------------------------------------------------------------------------


def opt_color(sweep: SweepData, optimizer: str) -> str:
    return OPT_COLORS[sweep.optimizers.index(optimizer) % len(OPT_COLORS)]


def _ramp(cmap: str, n: int) -> list[str]:
    """n colours along a colormap, stopping short of its pale end (readable on white)."""
    m = matplotlib.colormaps[cmap]
    return [to_hex(m(0.85 * i / (n - 1))) if n > 1 else to_hex(m(0.0)) for i in range(n)]


def batch_colors(sizes: Sequence[int]) -> dict[int, str]:
    return dict(zip(sorted(sizes), _ramp("viridis", len(sizes)), strict=True))


def _mpl(ncols: int = 1, *, width: float = 7.5, height: float = 4.6, sharey: bool = False) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # an explicit Agg canvas: savefig never looks for a GUI backend
    axes = fig.subplots(1, ncols, sharey=sharey, squeeze=False)[0]
    return fig, list(axes)


def _log2_batch_axis(ax: Axes, sizes: Sequence[int]) -> None:
    """Log-x in base 2, one labelled tick per tested batch size."""
    ax.set_xscale("log", base=2)
    if sizes:
        ax.set_xticks(list(sizes), [str(b) for b in sizes])
        ax.xaxis.set_minor_formatter(NullFormatter())
        lo, hi = min(sizes), max(sizes)
        ax.set_xlim(lo / 1.4, hi * 1.4)  # room for markers and labels at both ends
    ax.set_xlabel(BATCH_LABEL)


def _plain_log_y(ax: Axes) -> None:
    """Log-y labelled 4, 10, 20 rather than 4x10^0: steps and sequences are counts."""
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))

    def minor(v: float, _: object) -> str:
        # within about a decade every minor tick gets a label (else only 10^k would); wider: 2x and 5x only
        lo, hi = sorted(ax.get_ylim())
        if v <= 0 or lo <= 0:
            return ""
        if math.log10(hi / lo) < 1.2:
            return f"{v:g}"
        return f"{v:g}" if round(v / 10 ** math.floor(math.log10(v)), 6) in (2.0, 5.0) else ""

    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def _legend_by_optimizer(ax: Axes, optimizers: Sequence[str]) -> None:
    """Outside legend with each optimizer's entries together (matplotlib lists error bars last)."""
    handles, labels = ax.get_legend_handles_labels()
    rank = {o: i for i, o in enumerate(optimizers)}
    order = sorted(range(len(labels)), key=lambda i: (rank.get(labels[i].split(" ")[0].rstrip(":"), len(rank)), i))
    _legend_outside(ax, [handles[i] for i in order], labels=[labels[i] for i in order])


def _blank(ax: Axes, text: str) -> None:
    """An empty panel: no meaningless 0..1 ticks, just the reason."""
    ax.set_xticks([])
    ax.set_yticks([])
    _note(ax, text)


def _note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color=GREY, fontsize=9, wrap=True)


def _legend_outside(ax: Axes, handles: list[Any] | None = None, **kw: Any) -> None:
    kwargs: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "fontsize": 8, "frameon": False}
    kwargs.update(kw)
    if handles is not None:
        ax.legend(handles, kwargs.pop("labels", [h.get_label() for h in handles]), **kwargs)
    else:
        ax.legend(**kwargs)


def _plotly(
    ncols: int = 1,
    *,
    titles: Sequence[str] | None = None,
    shared_y: bool = False,
    title: str = "",
    width: int | None = None,
) -> go.Figure:
    if ncols == 1 and not titles:
        fig = go.Figure()
    else:
        fig = make_subplots(
            rows=1,
            cols=ncols,
            shared_yaxes=shared_y,
            subplot_titles=list(titles or []),
            horizontal_spacing=0.08 if ncols > 1 else 0.2,
        )
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        height=PLOTLY_HEIGHT,
        width=width,
        legend={"font": {"size": 11}},
        margin={"t": 70, "r": 20, "l": 60, "b": 50},
    )
    return fig


def _plotly_batch_axis(fig: go.Figure, sizes: Sequence[int], **where: Any) -> None:
    fig.update_xaxes(
        type="log", tickvals=list(sizes), ticktext=[str(b) for b in sizes], title_text=BATCH_LABEL, **where
    )


def _known(v: float | None) -> float:
    """A value of a row the caller already filtered for having one (for the type checker)."""
    assert v is not None
    return v


# --------------------------------------------------------------------------------------------------
# 1. Scaling
# --------------------------------------------------------------------------------------------------


def scaling_figure(sweep: SweepData) -> FigureSpec:
    """Final val loss (mean, 95% CI over seeds) vs batch size, one line per optimizer; each optimizer's
    tolerance band; stars at the largest degradation-free batch size (vs itself), open diamonds vs the baseline."""
    t = scaling_points(sweep)
    sizes = sweep.batch_sizes
    ref_b = sweep.report.reference_batch_size
    title = f"Final val loss vs batch size (mean ± 95% CI over seeds) — sweep {sweep.sweep_id}"
    fig, (ax,) = _mpl(width=11.5, height=5.0)
    pfig = _plotly(title=title)
    for opt in sweep.optimizers:
        c = opt_color(sweep, opt)
        for band in (b for b in t.bands if b.optimizer == opt):
            label = f"{opt} tolerance band: ≤ +{t.tolerance:.0%} of its loss at B={band.reference_batch_size}"
            label += " (the baseline reference)" if band.is_baseline else ""
            ax.axhspan(band.reference, band.upper, color=c, alpha=0.12, lw=0, label=label)
            pfig.add_hrect(
                y0=band.reference,
                y1=band.upper,
                fillcolor=c,
                opacity=0.12,
                line_width=0,
                name=label,
                showlegend=True,
                legendgroup=opt,
            )
        pts = [p for p in t.points if p.optimizer == opt and p.val_loss_mean is not None]
        empty = sum(1 for p in t.points if p.optimizer == opt and p.val_loss_mean is None)
        label = f"{opt} (mean, 95% CI over seeds)" + (f"; {empty} cell(s) without a completed run" if empty else "")
        xs = [p.batch_size for p in pts]
        ys = [_known(p.val_loss_mean) for p in pts]
        lo = [_known(p.val_loss_mean) - _known(p.ci_low) for p in pts]  # error bar lengths below/above the mean
        hi = [_known(p.ci_high) - _known(p.val_loss_mean) for p in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", color=c, capsize=4, lw=1.8, ms=5, label=label)
        pfig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                name=label,
                legendgroup=opt,
                line={"color": c},
                error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo, "color": c},
                customdata=[[p.seeds, p.ci_low, p.ci_high] for p in pts],
                hovertemplate=f"{opt} B=%{{x}}<br>mean %{{y:.4f}}<br>95%% CI [%{{customdata[1]:.4f}}, %{{customdata[2]:.4f}}]"
                "<br>seeds %{customdata[0]}<extra></extra>",
            )
        )
        for m in (m for m in t.marks if m.optimizer == opt):
            if m.reference == "baseline" and opt == t.baseline:
                continue  # the baseline's "vs baseline" answer is its "vs self" answer
            noise = " (within noise)" if m.within_noise else ""
            if m.batch_size is None or m.val_loss_mean is None:
                # no answer to mark: say so in the legend rather than dropping it silently
                txt = f"{opt}: no degradation-free batch size vs {'itself' if m.reference == 'self' else t.baseline}"
                ax.plot([], [], ls="none", marker="*" if m.reference == "self" else "D", mfc="none", mec=c, label=txt)
                pfig.add_trace(
                    go.Scatter(
                        x=[None],
                        y=[None],
                        mode="markers",
                        name=txt,
                        legendgroup=opt,
                        marker={"color": c, "symbol": "x"},
                    )
                )
                continue
            if m.reference == "self":
                txt = f"{opt}: largest degradation-free B = {m.batch_size} (vs itself at B={ref_b}){noise}"
                ax.plot(
                    [m.batch_size],
                    [m.val_loss_mean],
                    ls="none",
                    marker="*",
                    ms=17,
                    mfc=c,
                    mec="black",
                    zorder=5,
                    label=txt,
                )
                ax.annotate(
                    f"B={m.batch_size}",
                    (m.batch_size, m.val_loss_mean),
                    textcoords="offset points",
                    xytext=(7, 7),
                    fontsize=9,
                    color=c,
                    weight="bold",
                )
                sym, size = "star", 20
            else:
                txt = f"{opt}: largest degradation-free B = {m.batch_size} vs baseline {t.baseline}{noise}"
                ax.plot(
                    [m.batch_size],
                    [m.val_loss_mean],
                    ls="none",
                    marker="D",
                    ms=12,
                    mfc="none",
                    mec=c,
                    mew=1.8,
                    zorder=5,
                    label=txt,
                )
                sym, size = "diamond-open", 16
            pfig.add_trace(
                go.Scatter(
                    x=[m.batch_size],
                    y=[m.val_loss_mean],
                    mode="markers",
                    name=txt,
                    legendgroup=opt,
                    marker={"symbol": sym, "size": size, "color": c, "line": {"color": "black", "width": 1}},
                    hovertemplate=f"{txt}<extra></extra>",
                )
            )
    _log2_batch_axis(ax, sizes)
    ax.set_ylabel("final " + LOSS_LABEL)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if not any(p.val_loss_mean is not None for p in t.points):
        _note(ax, "no cell has a completed run")
    _legend_by_optimizer(ax, sweep.optimizers)
    _plotly_batch_axis(pfig, sizes)
    pfig.update_yaxes(title_text="final " + LOSS_LABEL)
    return FigureSpec("scaling", title, t, fig, pfig)


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
    top = hi_y + 0.08 * max(hi_y - lo_y, 0.05)  # where plotly draws the 'x' markers (no axes-fraction y)
    subtitles = []
    for opt in opts:
        n_c, n_p = t.count(opt, "completed"), t.count(opt, "pruned")
        n_x = t.count(opt, "diverged") + t.count(opt, "failed")
        subtitles.append(f"{opt}: {n_c} completed, {n_p} pruned, {n_x} diverged/failed")
    fig, axes = _mpl(len(opts), width=4.6 * len(opts) + 1.8, height=4.4, sharey=True)
    pfig = _plotly(len(opts), titles=subtitles, shared_y=True, title=title)
    # legend-only traces: one filled circle per batch size, then the marker kinds in grey
    for bs in sweep.batch_sizes:
        pfig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=f"B={bs}",
                legendgroup=f"bs{bs}",
                marker={"symbol": "circle", "size": 8, "color": colors[bs]},
            ),
            row=1,
            col=1,
        )
    n_bad = sum(1 for p in t.points if p.val_loss is None)
    n_pruned = sum(1 for p in t.points if p.status == "pruned")
    for symbol, name in (
        ("star", "best lr of the cell"),
        ("circle-open", f"pruned ({n_pruned}): loss when stopped"),
        ("x", f"diverged/failed ({n_bad}): no final loss, drawn at the top"),
    ):
        pfig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", name=name, marker={"symbol": symbol, "size": 10, "color": GREY}
            ),
            row=1,
            col=1,
        )
    for i, (opt, ax) in enumerate(zip(opts, axes, strict=True)):
        col = i + 1
        for bs in sweep.batch_sizes:
            c = colors[bs]
            mine = [p for p in t.points if p.optimizer == opt and p.batch_size == bs]
            done = [p for p in mine if p.status == "completed" and not p.is_best]
            best = [p for p in mine if p.is_best]
            pruned = [p for p in mine if p.status == "pruned" and p.val_loss is not None]
            bad = [p for p in mine if p.val_loss is None]
            label = f"B={bs}" if i == 0 else None
            ax.scatter([p.lr for p in done], [_known(p.val_loss) for p in done], color=c, s=30, label=label, zorder=3)
            ax.scatter(
                [p.lr for p in best],
                [_known(p.val_loss) for p in best],
                color=c,
                marker="*",
                s=220,
                edgecolors="black",
                linewidths=0.8,
                zorder=4,
            )
            ax.scatter(
                [p.lr for p in pruned],
                [_known(p.val_loss) for p in pruned],
                facecolors="none",
                edgecolors=c,
                s=30,
                zorder=3,
            )
            # diverged/failed: no loss to place on y, so at the top of the panel (axes fraction 0.96)
            ax.scatter(
                [p.lr for p in bad],
                [0.96] * len(bad),
                color=c,
                marker="x",
                s=40,
                transform=ax.get_xaxis_transform(),
                zorder=3,
                clip_on=False,
            )
            for group, symbol, size, kind in (
                (done, "circle", 8, "completed"),
                (best, "star", 18, "best lr"),
                (pruned, "circle-open", 8, "pruned"),
                (bad, "x", 9, "diverged/failed"),
            ):
                if not group:
                    continue
                pfig.add_trace(
                    go.Scatter(
                        x=[p.lr for p in group],
                        y=[p.val_loss if p.val_loss is not None else top for p in group],
                        mode="markers",
                        name=f"B={bs}",
                        legendgroup=f"bs{bs}",
                        showlegend=False,
                        marker={
                            "symbol": symbol,
                            "size": size,
                            "color": c,
                            "line": {"color": "black" if kind == "best lr" else c, "width": 1},
                        },
                        text=[f"{p.run_name} ({p.status})" for p in group],
                        hovertemplate="%{text}<br>lr %{x:.3g}<br>"
                        + ("val loss %{y:.4f}" if kind != "diverged/failed" else "no final loss")
                        + "<extra></extra>",
                    ),
                    row=1,
                    col=col,
                )
        lr_lo, lr_hi = t.lr_range
        for x in (lr_lo, lr_hi):
            ax.axvline(x, color=GREY, ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlim(lr_lo / 1.5, lr_hi * 1.5)
        ax.set_xlabel("peak learning rate")
        ax.set_title(subtitles[i], fontsize=9)
        ax.grid(alpha=0.3)
        if not any(p.optimizer == opt for p in t.points):
            _note(ax, "no finished trials")
        pfig.update_xaxes(
            type="log",
            title_text="peak learning rate",
            row=1,
            col=col,
            range=[math.log10(lr_lo / 1.5), math.log10(lr_hi * 1.5)],
        )
        for x in (lr_lo, lr_hi):
            pfig.add_vline(x=x, line_dash="dot", line_color=GREY, line_width=1, row=1, col=col)
    axes[0].set_ylabel("final " + LOSS_LABEL)
    if finite:
        axes[0].set_ylim(lo_y - 0.05 * max(hi_y - lo_y, 0.05), hi_y + 0.15 * max(hi_y - lo_y, 0.05))
    handles = [Line2D([], [], ls="none", marker="o", color=colors[b], label=f"B={b}") for b in sweep.batch_sizes] + [
        Line2D([], [], ls="none", marker="*", ms=13, color=GREY, mec="black", label="best lr of the cell"),
        Line2D([], [], ls="none", marker="o", mfc="none", color=GREY, label=f"pruned ({n_pruned}): loss when stopped"),
        Line2D([], [], ls="none", marker="x", color=GREY, label=f"diverged/failed ({n_bad}): no final loss"),
        Line2D([], [], ls=":", color=GREY, label="searched lr range"),
    ]
    _legend_outside(axes[-1], handles)
    fig.suptitle(title, fontsize=10)
    pfig.update_yaxes(title_text="final " + LOSS_LABEL, row=1, col=1)
    return FigureSpec("lr_sensitivity", title, t, fig, pfig)


# --------------------------------------------------------------------------------------------------
# 3. Best lr vs batch size
# --------------------------------------------------------------------------------------------------


def best_lr_figure(sweep: SweepData) -> FigureSpec:
    """Best lr vs batch size (log-log), a fitted power law per optimizer, and the sqrt (B^1/2) and
    linear (B^1) rules from its smallest batch size. Hollow markers: best lr at the edge of the range."""
    t = best_lr_fit(sweep)
    sizes = sweep.batch_sizes
    title = f"Best lr vs batch size (log-log) with fitted power laws — sweep {sweep.sweep_id}"
    fig, (ax,) = _mpl(width=9.5)
    pfig = _plotly(title=title)
    xs_line = [min(sizes) / 1.2, max(sizes) * 1.2] if sizes else []
    for opt in sweep.optimizers:
        c = opt_color(sweep, opt)
        pts = [p for p in t.points if p.optimizer == opt]
        inner = [p for p in pts if not p.lr_at_edge]
        edge = [p for p in pts if p.lr_at_edge]
        ax.plot([p.batch_size for p in inner], [p.best_lr for p in inner], "o", color=c, ms=7, label=f"{opt} best lr")
        if edge:
            ax.plot(
                [p.batch_size for p in edge],
                [p.best_lr for p in edge],
                "o",
                mfc="none",
                mec=c,
                ms=9,
                mew=1.5,
                label=f"{opt} best lr at the edge of the searched range",
            )
        for group, sym, name in (
            (inner, "circle", f"{opt} best lr"),
            (edge, "circle-open", f"{opt} best lr (at range edge)"),
        ):
            if group:
                pfig.add_trace(
                    go.Scatter(
                        x=[p.batch_size for p in group],
                        y=[p.best_lr for p in group],
                        mode="markers",
                        name=name,
                        legendgroup=opt,
                        marker={"symbol": sym, "size": 10, "color": c},
                        hovertemplate=f"{opt} B=%{{x}}<br>best lr %{{y:.3g}}<extra></extra>",
                    )
                )
        fit = next((f.law for f in t.fits if f.optimizer == opt), None)
        if fit is not None:
            r2 = f", R²={fit.r2:.2f}" if fit.r2 is not None else ""
            label = f"{opt} fit: lr = {fit.prefactor:.3g}·B^{fit.exponent:.2f}{r2}"
            ys = [fit(x) for x in xs_line]
            ax.plot(xs_line, ys, "-", color=c, lw=1.8, label=label)
            pfig.add_trace(go.Scatter(x=xs_line, y=ys, mode="lines", name=label, legendgroup=opt, line={"color": c}))
        for rule in (r for r in t.rules if r.optimizer == opt):
            dash, mdash = ("--", "dash") if rule.rule == "sqrt" else (":", "dot")
            label = f"{opt} {rule.rule} rule (lr ∝ B^{rule.exponent:g}) from B={rule.anchor_batch}"
            ys = [rule(x) for x in xs_line]
            ax.plot(xs_line, ys, dash, color=c, lw=1.2, alpha=0.6, label=label)
            pfig.add_trace(
                go.Scatter(
                    x=xs_line,
                    y=ys,
                    mode="lines",
                    name=label,
                    legendgroup=opt,
                    opacity=0.6,
                    line={"color": c, "dash": mdash, "width": 1.5},
                )
            )
    lr_lo, lr_hi = sweep.report.lr_range
    for y in (lr_lo, lr_hi):
        ax.axhline(y, color=GREY, ls="-.", lw=0.8)
        pfig.add_hline(y=y, line_dash="dashdot", line_color=GREY, line_width=1)
    ax.plot([], [], "-.", color=GREY, lw=0.8, label="searched lr range")
    if not t.points:
        _note(ax, "no cell has a best lr")
    _log2_batch_axis(ax, sizes)
    ax.set_yscale("log")
    _plain_log_y(ax)
    ax.set_ylabel("best peak learning rate")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    _legend_by_optimizer(ax, sweep.optimizers)
    _plotly_batch_axis(pfig, sizes)
    pfig.update_yaxes(type="log", title_text="best peak learning rate")
    return FigureSpec("best_lr", title, t, fig, pfig)


# --------------------------------------------------------------------------------------------------
# 4. Loss vs tokens
# --------------------------------------------------------------------------------------------------


def loss_figure(sweep: SweepData) -> FigureSpec:
    """Val (solid) and train (dashed) loss vs tokens of each cell's first confirmation run (the run the
    report's steps to reference come from; `dashboards.data` docstring), one panel per optimizer."""
    t = loss_curves(sweep)
    opts = sweep.optimizers
    colors = batch_colors(sweep.batch_sizes)
    title = f"Loss vs tokens of each cell's first confirmation run — sweep {sweep.sweep_id}"
    fig, axes = _mpl(len(opts), width=4.6 * len(opts) + 1.6, height=4.4, sharey=True)
    pfig = _plotly(len(opts), titles=opts, shared_y=True, title=title)
    for i, (opt, ax) in enumerate(zip(opts, axes, strict=True)):
        any_curve = False
        for bs in sweep.batch_sizes:
            for metric, ls, dash, alpha in (("val_loss", "-", "solid", 1.0), ("train_loss", "--", "dash", 0.5)):
                pts = [p for p in t if p.optimizer == opt and p.batch_size == bs and p.metric == metric]
                if not pts:
                    continue
                any_curve = True
                xs, ys = [p.tokens for p in pts], [p.value for p in pts]
                ax.plot(xs, ys, ls, color=colors[bs], alpha=alpha, marker="o" if metric == "val_loss" else None, ms=3)
                pfig.add_trace(
                    go.Scatter(
                        x=xs,
                        y=ys,
                        mode="lines+markers" if metric == "val_loss" else "lines",
                        opacity=alpha,
                        name=f"B={bs}",
                        legendgroup=f"bs{bs}",
                        showlegend=bool(i == 0 and metric == "val_loss"),
                        line={"color": colors[bs], "dash": dash},
                        text=[pts[0].run_name] * len(pts),
                        hovertemplate=f"%{{text}}<br>{metric} %{{y:.4f}} at %{{x}} tokens<extra></extra>",
                    ),
                    row=1,
                    col=i + 1,
                )
        if not any_curve:
            _note(ax, "no completed confirmation run")
        ax.set_title(opt, fontsize=10)
        ax.set_xlabel(TOKENS_LABEL)
        ax.grid(alpha=0.3)
        pfig.update_xaxes(title_text=TOKENS_LABEL, row=1, col=i + 1)
    axes[0].set_ylabel("loss (nats/token)")
    handles = [Line2D([], [], color=colors[b], label=f"B={b}") for b in sweep.batch_sizes] + [
        Line2D([], [], color=GREY, ls="-", marker="o", ms=3, label="val loss"),
        Line2D([], [], color=GREY, ls="--", alpha=0.6, label="train loss (mean since last eval)"),
    ]
    _legend_outside(axes[-1], handles)
    fig.suptitle(title, fontsize=10)
    pfig.update_yaxes(title_text="loss (nats/token)", row=1, col=1)
    return FigureSpec("loss_curves", title, t, fig, pfig)


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
    subtitles = []
    for opt in opts:
        if opt in t.runs:
            bs, name, status = t.runs[opt]
            subtitles.append(f"{opt}, B={bs}: {name}" + ("" if status == "completed" else f" ({status})"))
        else:
            subtitles.append(f"{opt}: no attention probe")
    title = f"Max attention logit per layer vs tokens at the largest batch size — sweep {sweep.sweep_id}"
    fig, axes = _mpl(len(opts), width=4.6 * len(opts) + 1.4, height=4.4, sharey=True)
    pfig = _plotly(len(opts), titles=subtitles, shared_y=True, title=title)
    for i, (opt, ax) in enumerate(zip(opts, axes, strict=True)):
        for layer in layers:
            pts = [p for p in t.points if p.optimizer == opt and p.layer == layer]
            if not pts:
                continue
            xs, ys = [p.tokens for p in pts], [p.value for p in pts]
            ax.plot(xs, ys, "-o", ms=3, color=colors[layer])
            pfig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines+markers",
                    name=f"layer {layer}",
                    legendgroup=f"l{layer}",
                    showlegend=i == 0,
                    line={"color": colors[layer]},
                    hovertemplate=f"layer {layer}<br>max logit %{{y:.3f}} at %{{x}} tokens<extra></extra>",
                ),
                row=1,
                col=i + 1,
            )
        if opt in t.missing:
            _note(ax, "no attention probe recorded")
        ax.set_title(subtitles[i], fontsize=8)
        ax.set_xlabel(TOKENS_LABEL)
        ax.grid(alpha=0.3)
        pfig.update_xaxes(title_text=TOKENS_LABEL, row=1, col=i + 1)
    axes[0].set_ylabel("max attention logit q·k/√d (probe batch)")
    if layers:
        _legend_outside(
            axes[-1], [Line2D([], [], color=colors[k], marker="o", ms=3, label=f"layer {k}") for k in layers]
        )
    fig.suptitle(title, fontsize=10)
    pfig.update_yaxes(title_text="max attention logit q·k/√d", row=1, col=1)
    pfig.update_annotations(font_size=11)
    return FigureSpec("attention_logits", title, t, fig, pfig)


# --------------------------------------------------------------------------------------------------
# 6. Steps to target, and the gradient noise scale
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepsAndNoise:
    """Figure 6's two tables: steps to the target loss (left panel), B_simple over tokens (right)."""

    steps: Any  # dashboards.data.StepsTable
    noise: Any  # dashboards.data.NoiseTable


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
    left = f"steps to (1+{tol:g}) x own loss at B={sweep.report.reference_batch_size}"
    right = "gradient noise scale B_simple of the confirmation runs"
    fig, (ax, bx) = _mpl(2, width=13.0, height=4.8)
    pfig = _plotly(2, titles=[left, right], title=title)
    reached = [p.steps for p in st.points if p.steps]
    top = max(reached) * 2.0 if reached else 10.0  # plotly: 'not reached' markers above every point
    for opt in sweep.optimizers:
        c = opt_color(sweep, opt)
        pts = [p for p in st.points if p.optimizer == opt and p.steps]
        never = [p for p in st.points if p.optimizer == opt and p.steps is None and p.target_loss is not None]
        ax.plot([p.batch_size for p in pts], [_known(p.steps) for p in pts], "o-", color=c, label=f"{opt}")
        for p in pts:  # the count itself: log ticks alone leave most values unreadable
            ax.annotate(
                str(p.steps),
                (p.batch_size, _known(p.steps)),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=7,
                color=c,
            )
        pfig.add_trace(
            go.Scatter(
                x=[p.batch_size for p in pts],
                y=[p.steps for p in pts],
                mode="lines+markers",
                name=opt,
                legendgroup=opt,
                line={"color": c},
                customdata=[p.tokens for p in pts],
                hovertemplate=f"{opt} B=%{{x}}<br>%{{y}} steps (%{{customdata}} tokens)<extra></extra>",
            ),
            row=1,
            col=1,
        )
        if never:
            ax.scatter(
                [p.batch_size for p in never],
                [0.95] * len(never),
                marker="^",
                facecolors="none",
                edgecolors=c,
                s=60,
                transform=ax.get_xaxis_transform(),
                clip_on=False,
                label=f"{opt}: target not reached",
            )
            pfig.add_trace(
                go.Scatter(
                    x=[p.batch_size for p in never],
                    y=[top] * len(never),
                    mode="markers",
                    name=f"{opt}: target not reached",
                    legendgroup=opt,
                    marker={"symbol": "triangle-up-open", "size": 12, "color": c},
                ),
                row=1,
                col=1,
            )
        for line in (p for p in st.perfect if p.optimizer == opt):
            xs = [line.anchor_batch, max(sizes)]
            ys = [line(x) for x in xs]
            label = f"{opt} perfect scaling (steps ∝ 1/B from B={line.anchor_batch})"
            ax.plot(xs, ys, "--", color=c, lw=1.2, alpha=0.7, label=label)
            pfig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines",
                    name=label,
                    legendgroup=opt,
                    opacity=0.7,
                    line={"color": c, "dash": "dash"},
                ),
                row=1,
                col=1,
            )
        for crit in (k for k in ns.critical if k.optimizer == opt):
            label = f"{opt} B_crit ≈ {crit.b_crit:.3g} (final B_simple at B={crit.batch_size}, {crit.runs} run(s))"
            ax.axvline(crit.b_crit, color=c, ls=":", lw=1.4, label=label)
            bx.axhline(crit.b_crit, color=c, ls="--", lw=1.2)
            pfig.add_vline(x=crit.b_crit, line_dash="dot", line_color=c, row=1, col=1)
            pfig.add_hline(y=crit.b_crit, line_dash="dash", line_color=c, row=1, col=2)
            pfig.add_trace(
                go.Scatter(
                    x=[None], y=[None], mode="lines", name=label, legendgroup=opt, line={"color": c, "dash": "dot"}
                ),
                row=1,
                col=1,
            )
        runs = sorted({(p.batch_size, p.seed, p.run_name) for p in ns.points if p.optimizer == opt})
        widths = {b: 1.0 + 1.2 * i / max(len(sizes) - 1, 1) for i, b in enumerate(sizes)}  # thicker = larger B
        lead: dict[int, int] = {}  # batch size -> its lowest seed drawn: the first confirmation run
        for bs, seed, _ in runs:
            lead.setdefault(bs, seed)
        for bs, seed, name in runs:
            pts_n = [p for p in ns.points if p.optimizer == opt and p.run_name == name]
            first = (bs, seed) == runs[0][:2]
            xs, ys = [p.tokens for p in pts_n], [p.b_simple for p in pts_n]
            is_lead = seed == lead[bs]
            # the first confirmation run solid and labelled with its batch size at its end; the others faint
            bx.plot(
                xs,
                ys,
                "-",
                color=c,
                lw=widths.get(bs, 1.0),
                alpha=0.95 if is_lead else 0.35,
                label=f"{opt} B_simple (label: the run's batch size)" if first else None,
            )
            if is_lead:
                bx.annotate(
                    f"B={bs}",
                    (xs[-1], ys[-1]),
                    textcoords="offset points",
                    xytext=(4, 0),
                    fontsize=7,
                    color=c,
                    va="center",
                )
            pfig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines",
                    name=f"{opt} B_simple",
                    legendgroup=opt,
                    showlegend=first,
                    opacity=0.95 if is_lead else 0.35,
                    line={"color": c, "width": 1.5 * widths.get(bs, 1.0)},
                    text=[name] * len(pts_n),
                    hovertemplate="%{text}<br>B_simple %{y:.3g} sequences at %{x} tokens<extra></extra>",
                ),
                row=1,
                col=2,
            )
        for crit in (k for k in ns.critical if k.optimizer == opt):
            bx.annotate(
                f"{opt} B_crit ≈ {crit.b_crit:.3g}",
                (0.01, crit.b_crit),
                xycoords=("axes fraction", "data"),
                textcoords="offset points",
                xytext=(2, 3),
                fontsize=7,
                color=c,
            )
    _log2_batch_axis(ax, sizes)
    if reached:
        ax.set_yscale("log")
        _plain_log_y(ax)
    else:  # nothing to place on a log axis (matplotlib refuses an empty one)
        _note(ax, "no cell reached its target")
    ax.set_ylabel("optimizer steps to target")
    ax.set_title(left, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower left", frameon=False)
    bx.set_xlabel(TOKENS_LABEL)
    bx.set_ylabel("B_simple (sequences)")
    bx.set_title(right, fontsize=9)
    bx.grid(alpha=0.3, which="both")
    if ns.points:
        bx.set_yscale("log")
        _plain_log_y(bx)
        bx.legend(fontsize=7, frameon=False)
    else:
        _blank(bx, NO_NOISE)
        pfig.add_annotation(
            text=NO_NOISE.replace("\n", "<br>"),
            xref="x2 domain",
            yref="y2 domain",
            x=0.5,
            y=0.5,
            showarrow=False,
            font={"color": GREY},
        )
    fig.suptitle(title, fontsize=10)
    _plotly_batch_axis(pfig, sizes, row=1, col=1)
    pfig.update_yaxes(type="log" if reached else "linear", title_text="optimizer steps to target", row=1, col=1)
    pfig.update_xaxes(title_text=TOKENS_LABEL, row=1, col=2)
    pfig.update_yaxes(type="log" if ns.points else "linear", title_text="B_simple (sequences)", row=1, col=2)
    return FigureSpec("steps_to_target", title, StepsAndNoise(st, ns), fig, pfig)


# in the order the page shows them
FIGURES: tuple[Callable[[SweepData], FigureSpec], ...] = (
    scaling_figure,
    lr_figure,
    best_lr_figure,
    loss_figure,
    attention_figure,
    steps_figure,
)
