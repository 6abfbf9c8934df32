"""The two renderers of a figure description (`dashboards.figure_desc.FigureDesc`): matplotlib (PNG) and
plotly (HTML). Each draws exactly what the description holds; neither chooses data."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
from matplotlib.axes import Axes
from matplotlib.axis import Axis as MplAxis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter
from plotly.subplots import make_subplots

from dashboards.figure_desc import Annotation, Axis, FigureDesc, Panel, Ref, Series

PX_PER_PT = 96 / 72  # CSS pixels per point: a description's lengths in plotly
GRID_ALPHA = 0.3  # matplotlib grid lines: visible, under the data
PLOTLY_HEIGHT = 460  # px; the page stacks figures, each a fixed height (the div's 100% would collapse)

# --------------------------------------------------------------------------------------------------
# Renderer 1: matplotlib (PNG)
# --------------------------------------------------------------------------------------------------

_MPL_DASH = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-."}
_MPL_SYMBOL = {"circle": "o", "star": "*", "diamond": "D", "triangle-up": "^", "x": "x"}
_ERR_CAP = 4.0  # pt: the half-width of an error bar's caps


def render_matplotlib(desc: FigureDesc) -> Figure:
    """The description as a matplotlib figure (Agg canvas; `FigureSpec.png_bytes` saves it)."""
    fig = Figure(figsize=desc.size, layout="constrained")
    FigureCanvasAgg(fig)  # an explicit Agg canvas: savefig never looks for a GUI backend
    axes = list(fig.subplots(1, len(desc.panels), sharey=desc.share_y, squeeze=False)[0])
    for panel, ax in zip(desc.panels, axes, strict=True):
        _mpl_panel(ax, panel)
    if len(desc.panels) == 1 and not desc.panels[0].title:
        axes[0].set_title(desc.title, fontsize=10)
    else:
        fig.suptitle(desc.title, fontsize=10)
    return fig


def _mpl_panel(ax: Axes, panel: Panel) -> None:
    keyed: list[tuple[Any, str]] = []  # (handle, label): the legend in description order
    for s in panel.series:
        handle = _mpl_series(ax, s)
        if s.legend:
            keyed.append((handle, s.name))
    for a in panel.annotations:
        _mpl_annotation(ax, a)
    _mpl_axis(ax.xaxis, panel.x, ax.set_xscale, ax.set_xlim)
    _mpl_axis(ax.yaxis, panel.y, ax.set_yscale, ax.set_ylim)
    ax.set_xlabel(panel.x.label)
    ax.set_ylabel(panel.y.label)
    if panel.title:
        ax.set_title(panel.title, fontsize=panel.title_size)
    if panel.blank:  # an empty panel: no meaningless 0..1 ticks, just the reason
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        ax.grid(alpha=GRID_ALPHA, which=panel.grid)
    if keyed and panel.legend != "none":
        handles, labels = [h for h, _ in keyed], [label for _, label in keyed]
        if panel.legend == "outside":
            ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
        else:  # inside the axes it covers data: smaller
            ax.legend(handles, labels, loc=panel.legend, fontsize=7, frameon=False)


def _mpl_series(ax: Axes, s: Series) -> Any:
    """Draw one series; returns the artist its legend entry shows."""
    st = s.style
    ls = _MPL_DASH[st.dash] if st.dash else "none"
    # every artist carries the series' name: the legend is keyed explicitly, tests find artists by it
    common: dict[str, Any] = {"color": st.color, "alpha": st.alpha, "zorder": st.z, "label": s.name}
    if s.kind == "band":
        return ax.axhspan(s.y[0], s.y[1], lw=0, **common)
    if s.kind == "hline":
        return ax.axhline(s.y[0], ls=ls, lw=st.width, **common)
    if s.kind == "vline":
        return ax.axvline(s.x[0], ls=ls, lw=st.width, **common)
    marker: dict[str, Any] = {"marker": "None"}
    if st.symbol:
        marker = {
            "marker": _MPL_SYMBOL[st.symbol],
            "ms": st.size,
            "mfc": "none" if st.hollow else st.color,
            "mec": st.edge or st.color,
            "mew": st.edge_width,
        }
    if s.kind == "errorbar":
        return ax.errorbar(
            list(s.x),
            list(s.y),
            yerr=[list(s.err_low), list(s.err_high)],
            ls=ls,
            lw=st.width,
            capsize=_ERR_CAP,
            **marker,
            **common,
        )
    if s.top is not None:  # pinned at a height of the panel: x in data, y as a fraction of the axes
        (line,) = ax.plot(
            list(s.x),
            [s.top] * len(s.x),
            ls=ls,
            lw=st.width,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            **marker,
            **common,
        )
        return line
    (line,) = ax.plot(list(s.x), list(s.y), ls=ls, lw=st.width, **marker, **common)
    return line


def _mpl_annotation(ax: Axes, a: Annotation) -> None:
    where = ("axes fraction" if a.xref == "panel" else "data", "axes fraction" if a.yref == "panel" else "data")
    ax.annotate(
        a.text,
        (a.x, a.y),
        xycoords=where,
        textcoords="offset points",
        xytext=a.offset,
        fontsize=a.size,
        color=a.color,
        weight="bold" if a.bold else "normal",
        ha="center" if a.center else "left",
        va="center" if a.middle else "baseline",
        wrap=a.center,  # a centred note may be longer than a narrow panel is wide
    )


def _mpl_axis(axis: MplAxis, spec: Axis, set_scale: Callable[..., Any], set_lim: Callable[..., Any]) -> None:
    if spec.scale == "log2":
        set_scale("log", base=2)
    elif spec.scale == "log":
        set_scale("log")
    if spec.ticks:
        axis.set_ticks(list(spec.ticks), list(spec.tick_labels))
        axis.set_minor_formatter(NullFormatter())
    elif spec.plain and spec.scale != "linear":
        _plain_log(axis)
    if spec.limits is not None:
        set_lim(*spec.limits)


def _plain_log(axis: MplAxis) -> None:
    """Log ticks labelled 4, 10, 20 rather than 4x10^0: steps and sequences are counts."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))

    def minor(v: float, _: object) -> str:
        # within about a decade every minor tick gets a label (else only 10^k would); wider: 2x and 5x only
        lo, hi = sorted(axis.get_view_interval())
        if v <= 0 or lo <= 0:
            return ""
        if math.log10(hi / lo) < 1.2:
            return f"{v:g}"
        return f"{v:g}" if round(v / 10 ** math.floor(math.log10(v)), 6) in (2.0, 5.0) else ""

    axis.set_minor_formatter(FuncFormatter(minor))


# --------------------------------------------------------------------------------------------------
# Renderer 2: plotly (HTML)
# --------------------------------------------------------------------------------------------------

_PLOTLY_DASH = {"solid": "solid", "dash": "dash", "dot": "dot", "dashdot": "dashdot"}
_TRACES = ("line", "scatter", "errorbar")  # kinds drawn as traces; the others are layout shapes


def _px(pt: float) -> float:
    return round(pt * PX_PER_PT, 2)


def _text(s: str) -> str:
    """Plotly reads its strings as a small subset of HTML: escape what a sweep may hold (&, <, >),
    and "\\n" becomes a line break."""
    return html.escape(s, quote=False).replace("\n", "<br>")


def render_plotly(desc: FigureDesc) -> go.Figure:
    """The description as a plotly figure: one legend for the whole figure, in description order
    (`legendrank`), traces for line/scatter/errorbar, shapes for band/hline/vline."""
    n = len(desc.panels)
    titles = [p.title for p in desc.panels]
    sub = n > 1 or any(titles)
    if sub:
        fig = make_subplots(
            rows=1,
            cols=n,
            shared_yaxes=desc.share_y,
            subplot_titles=[_text(t) for t in titles],
            horizontal_spacing=0.08 if n > 1 else 0.2,
        )
        # make_subplots adds one annotation per non-empty title, in panel order
        sizes = [p.title_size for p in desc.panels if p.title]
        for ann, size in zip(fig.layout.annotations, sizes, strict=True):
            ann.font.size = _px(size)
    else:
        fig = go.Figure()
    fig.update_layout(
        title={"text": _text(desc.title), "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        height=PLOTLY_HEIGHT,
        legend={"font": {"size": 11}},
        margin={"t": 70, "r": 20, "l": 60, "b": 50},
    )
    rank = 0
    for i, panel in enumerate(desc.panels):
        where: dict[str, Any] = {"row": 1, "col": i + 1} if sub else {}
        for s in panel.series:
            rank += 1
            if s.kind in _TRACES:
                fig.add_trace(_plotly_trace(s, rank), **where)
            else:
                _plotly_shape(fig, s, rank, where)
        suffix = "" if i == 0 else str(i + 1)
        for a in panel.annotations:
            fig.add_annotation(_plotly_annotation(a, panel, suffix))
        fig.update_xaxes(**_plotly_axis(panel.x, panel, shared=False), **where)
        fig.update_yaxes(**_plotly_axis(panel.y, panel, shared=desc.share_y and i > 0), **where)
    return fig


def _plotly_trace(s: Series, rank: int) -> go.Scatter:
    st = s.style
    if s.kind == "scatter" or st.dash is None:
        mode = "markers"
    else:
        mode = "lines+markers" if st.symbol else "lines"
    kw: dict[str, Any] = {
        # a key draws nothing: a point at (None, None) gives plotly a legend entry without a mark
        "x": list(s.x) if s.x else [None],
        "y": list(s.y) if s.y else [None],
        "mode": mode,
        "name": _text(s.name),
        "showlegend": s.legend,
        "legendrank": rank,
        "opacity": st.alpha,
    }
    if s.group:
        kw["legendgroup"] = s.group
    if st.dash:
        kw["line"] = {"color": st.color, "dash": _PLOTLY_DASH[st.dash], "width": _px(st.width)}
    if st.symbol:
        # an open symbol is drawn by its outline in the marker colour
        kw["marker"] = {
            "symbol": st.symbol + ("-open" if st.hollow and st.symbol != "x" else ""),
            "size": _px(st.size),
            "color": (st.edge or st.color) if st.hollow else st.color,
            "line": {"color": st.edge or st.color, "width": _px(st.edge_width)},
        }
    if s.kind == "errorbar":
        kw["error_y"] = {
            "type": "data",
            "symmetric": False,
            "array": list(s.err_high),
            "arrayminus": list(s.err_low),
            "color": st.color,
            "width": _px(_ERR_CAP),
        }
    if s.text:
        kw["text"] = list(s.text)
    if s.hover:
        kw["hovertext"] = [_text(h) for h in s.hover]
        kw["hoverinfo"] = "text"
    elif s.is_key:
        kw["hoverinfo"] = "skip"
    return go.Scatter(**kw)


def _plotly_shape(fig: go.Figure, s: Series, rank: int, where: dict[str, Any]) -> None:
    st = s.style
    kw: dict[str, Any] = {
        "name": _text(s.name),
        "showlegend": s.legend,
        "legendrank": rank,
        "opacity": st.alpha,
        "exclude_empty_subplots": False,  # a panel with no trace still gets its lines
        **where,
    }
    if s.group:
        kw["legendgroup"] = s.group
    line = {"line_dash": _PLOTLY_DASH[st.dash or "solid"], "line_color": st.color, "line_width": _px(st.width)}
    if s.kind == "band":
        fig.add_hrect(y0=s.y[0], y1=s.y[1], fillcolor=st.color, line_width=0, layer="below", **kw)
    elif s.kind == "hline":
        fig.add_hline(y=s.y[0], **line, **kw)
    else:
        fig.add_vline(x=s.x[0], **line, **kw)


def _plotly_annotation(a: Annotation, panel: Panel, suffix: str) -> dict[str, Any]:
    def place(v: float, ref: Ref, axis: Axis, letter: str) -> tuple[float, str]:
        if ref == "panel":
            return v, f"{letter}{suffix} domain"
        # plotly places annotations on a log axis by the exponent (shapes and traces by the value)
        return (math.log10(v) if axis.scale != "linear" else v), f"{letter}{suffix}"

    x, xref = place(a.x, a.xref, panel.x, "x")
    y, yref = place(a.y, a.yref, panel.y, "y")
    text = _text(a.text)
    return {
        "text": f"<b>{text}</b>" if a.bold else text,
        "x": x,
        "y": y,
        "xref": xref,
        "yref": yref,
        "showarrow": False,
        "xanchor": "center" if a.center else "left",
        "yanchor": "middle" if a.middle else "bottom",
        "xshift": _px(a.offset[0]),
        "yshift": _px(a.offset[1]),
        "font": {"color": a.color, "size": _px(a.size)},
    }


def _plotly_axis(spec: Axis, panel: Panel, *, shared: bool) -> dict[str, Any]:
    log = spec.scale != "linear"
    kw: dict[str, Any] = {"title_text": _text(spec.label), "type": "log" if log else "linear"}
    if spec.ticks:
        kw["tickvals"] = list(spec.ticks)
        kw["ticktext"] = [_text(t) for t in spec.tick_labels]
    if spec.limits is not None:  # plotly's range of a log axis is in exponents
        lo, hi = spec.limits
        kw["range"] = [math.log10(lo), math.log10(hi)] if log else [lo, hi]
    if log and spec.plain:
        kw["exponentformat"] = "none"
    if log and panel.grid == "both" and not spec.ticks:  # labelled ticks only: no minor lines between them
        kw["minor"] = {"showgrid": True}
    if panel.blank:
        kw.update(showticklabels=False, showgrid=False, zeroline=False)
    elif shared:
        kw["showticklabels"] = False  # the first panel's labels are the shared axis'
    return kw
