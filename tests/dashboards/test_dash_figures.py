"""Every figure and the page, from hand-made sweeps: the data behind them, the one description each
figure is built as, both renderings of it (matplotlib and plotly), and what the page holds."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import re
from collections import Counter

import plotly.graph_objects as go
import pytest
from dash_helpers import confirmations, make_sweep, rich_sweep, trial
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from plotly.offline import get_plotlyjs

from dashboards.data import loss_curves, lr_points, noise_scale, scaling_points, steps_to_target
from dashboards.figures import (
    FIGURES,
    NO_NOISE,
    PLOTLYJS_FILE,
    Annotation,
    Axis,
    FigureDesc,
    FigureSpec,
    Panel,
    Series,
    Style,
    lr_figure,
    render_matplotlib,
    render_plotly,
    steps_figure,
)
from dashboards.page import PLOTLYJS_TAG, inline_plotlyjs, render_dashboard
from dashboards.publish import build_figures
from sweeps.report import describe_noise

NAMES = ["scaling", "lr_sensitivity", "best_lr", "loss_curves", "attention_logits", "steps_to_target"]
TRACE_KINDS = ("line", "scatter", "errorbar")


@pytest.fixture(scope="module")
def rich() -> tuple:
    s = rich_sweep()
    return s, build_figures(s)


def _esc(s: str) -> str:
    """What plotly is given for a description's text (figures module: `_text`)."""
    return html.escape(s, quote=False).replace("\n", "<br>")


def _series(f: FigureSpec, panel: int | None = None) -> list[Series]:
    return [s for i, s in f.desc.series() if panel is None or i == panel]


def _mpl_lines(ax) -> Counter:
    """(label, x, y) of every named Line2D of a matplotlib axes (error bars' own lines are unnamed)."""
    return Counter(
        (ln.get_label(), tuple(ln.get_xdata()), tuple(ln.get_ydata()))
        for ln in ax.get_lines()
        if ln.get_label() != "_nolegend_"
    )


def assert_both_renderings_draw(desc: FigureDesc, mpl_fig: Figure, pfig: go.Figure) -> None:
    """Every series, annotation, axis and legend entry of the description is in both renderings, and
    nothing else is: the PNG and the HTML show the same figure."""
    # ---- matplotlib: one axes per panel
    assert len(mpl_fig.axes) == len(desc.panels)
    for p, ax in zip(desc.panels, mpl_fig.axes, strict=True):
        own_title = p.title or (desc.title if len(desc.panels) == 1 else "")
        assert ax.get_title() == own_title
        if len(desc.panels) > 1:
            assert mpl_fig.get_suptitle() == desc.title
        assert (ax.get_xlabel(), ax.get_ylabel()) == (p.x.label, p.y.label)
        for spec, axis, scale in ((p.x, ax.xaxis, ax.get_xscale()), (p.y, ax.yaxis, ax.get_yscale())):
            assert scale == ("linear" if spec.scale == "linear" else "log")
            if spec.scale == "log2":
                assert axis.get_transform().base == 2
            if spec.ticks:
                assert list(axis.get_ticklocs()) == list(spec.ticks)
                assert [t.get_text() for t in axis.get_ticklabels()] == list(spec.tick_labels)
            if spec.limits is not None:
                lim = ax.get_xlim() if axis is ax.xaxis else ax.get_ylim()
                assert lim == pytest.approx(spec.limits)
        if p.blank:
            assert list(ax.get_xticks()) == [] and list(ax.get_yticks()) == []
        want_lines: Counter = Counter()
        bands, bars = [], []
        for s in p.series:
            if s.kind in ("line", "scatter"):
                ys = (s.top,) * len(s.x) if s.top is not None else s.y
                want_lines[(s.name, s.x, ys)] += 1
            elif s.kind == "hline":
                want_lines[(s.name, (0, 1), (s.y[0], s.y[0]))] += 1
            elif s.kind == "vline":
                want_lines[(s.name, (s.x[0], s.x[0]), (0, 1))] += 1
            elif s.kind == "band":
                bands.append((s.name, s.y))
            else:
                bars.append(s)
        assert _mpl_lines(ax) == want_lines
        # pinned points: x in data, y a fraction of the axes (the blended x-axis transform)
        for ln in ax.get_lines():
            pinned = [
                s for s in p.series if s.top is not None and s.name == ln.get_label() and s.x == tuple(ln.get_xdata())
            ]
            if pinned:
                assert ln.get_transform().contains_branch_seperately(ax.transData) == (True, False)
        rects = [r for r in ax.patches if isinstance(r, Rectangle)]
        assert [(r.get_label(), (r.get_y(), r.get_y() + r.get_height())) for r in rects] == [
            (n, pytest.approx(y)) for n, y in bands
        ]
        containers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert [c.get_label() for c in containers] == [s.name for s in bars]
        for c, s in zip(containers, bars, strict=True):
            line, _, (segments,) = c.lines
            assert tuple(line.get_xdata()) == s.x and tuple(line.get_ydata()) == s.y
            ends = [(seg[0][1], seg[1][1]) for seg in segments.get_segments()]
            want = [(y - lo, y + hi) for y, lo, hi in zip(s.y, s.err_low, s.err_high, strict=True)]
            assert ends == [pytest.approx(w) for w in want]
        assert [t.get_text() for t in ax.texts] == [a.text for a in p.annotations]
        keyed = [s.name for s in p.series if s.legend]
        legend = ax.get_legend()
        if p.legend != "none" and keyed:
            assert [t.get_text() for t in legend.get_texts()] == keyed
        else:
            assert legend is None
    # ---- plotly: traces and shapes in description order, one legend in description order
    traces = [(i, s) for i, s in desc.series() if s.kind in TRACE_KINDS]
    shapes = [(i, s) for i, s in desc.series() if s.kind not in TRACE_KINDS]
    assert len(pfig.data) == len(traces) and len(pfig.layout.shapes) == len(shapes)
    for tr, (i, s) in zip(pfig.data, traces, strict=True):
        assert (tr.xaxis or "x", tr.yaxis or "y") == (f"x{i + 1 if i else ''}", f"y{i + 1 if i else ''}")
        assert tr.name == _esc(s.name) and tr.showlegend == s.legend and (tr.legendgroup or "") == s.group
        assert list(tr.x) == (list(s.x) or [None]) and list(tr.y) == (list(s.y) or [None])
        assert tr.opacity == s.style.alpha
        assert ("lines" in tr.mode) == (s.kind != "scatter" and s.style.dash is not None)
        assert ("markers" in tr.mode) == (s.style.symbol is not None or "lines" not in tr.mode)
        if s.style.symbol:
            assert tr.marker.symbol == s.style.symbol + ("-open" if s.style.hollow and s.style.symbol != "x" else "")
        assert list(tr.text or ()) == list(s.text)
        assert list(tr.hovertext or ()) == [_esc(h) for h in s.hover]
        if s.kind == "errorbar":
            assert list(tr.error_y.array) == list(s.err_high) and list(tr.error_y.arrayminus) == list(s.err_low)
        else:
            assert tr.error_y.array is None
    for sh, (i, s) in zip(pfig.layout.shapes, shapes, strict=True):
        sfx = str(i + 1) if i else ""
        assert sh.name == _esc(s.name) and bool(sh.showlegend) == s.legend
        if s.kind == "vline":
            assert (sh.type, sh.x0, sh.x1, sh.xref, sh.yref) == ("line", s.x[0], s.x[0], f"x{sfx}", f"y{sfx} domain")
        else:
            y0, y1 = (s.y[0], s.y[1]) if s.kind == "band" else (s.y[0], s.y[0])
            kind = "rect" if s.kind == "band" else "line"
            assert (sh.type, sh.y0, sh.y1, sh.yref, sh.xref) == (kind, y0, y1, f"y{sfx}", f"x{sfx} domain")
    entries = [(tr.legendrank, tr.name) for tr in pfig.data if tr.showlegend]
    entries += [(sh.legendrank, sh.name) for sh in pfig.layout.shapes if sh.showlegend]
    assert [n for _, n in sorted(entries)] == [_esc(s.name) for _, s in desc.series() if s.legend]
    # annotations: the subplot titles (non-empty ones, made by make_subplots), then the description's
    titled = [p.title for p in desc.panels if p.title] if len(desc.panels) > 1 or desc.panels[0].title else []
    anns = list(pfig.layout.annotations)
    assert [a.text for a in anns[: len(titled)]] == [_esc(t) for t in titled]
    ours = anns[len(titled) :]
    want = [(i, a) for i, p in enumerate(desc.panels) for a in p.annotations]
    assert len(ours) == len(want)
    for pa, (i, a) in zip(ours, want, strict=True):
        sfx = str(i + 1) if i else ""
        panel = desc.panels[i]
        assert pa.text == (f"<b>{_esc(a.text)}</b>" if a.bold else _esc(a.text))
        for v, ref, axis, got, gref, letter in (
            (a.x, a.xref, panel.x, pa.x, pa.xref, "x"),
            (a.y, a.yref, panel.y, pa.y, pa.yref, "y"),
        ):
            if ref == "panel":
                assert (gref, got) == (f"{letter}{sfx} domain", v)
            else:  # plotly places annotations on a log axis by the exponent
                assert gref == f"{letter}{sfx}"
                assert got == pytest.approx(math.log10(v) if axis.scale != "linear" else v)
    title = pfig.layout.title.text
    assert title == _esc(desc.title)
    for i, p in enumerate(desc.panels):
        for spec, ax in (
            (p.x, pfig.layout[f"xaxis{i + 1 if i else ''}"]),
            (p.y, pfig.layout[f"yaxis{i + 1 if i else ''}"]),
        ):
            assert ax.type == ("linear" if spec.scale == "linear" else "log")
            assert (ax.title.text or "") == _esc(spec.label)
            if spec.ticks:
                assert list(ax.tickvals) == list(spec.ticks) and list(ax.ticktext) == list(spec.tick_labels)
            if spec.limits is not None:
                lo, hi = spec.limits
                want_range = [math.log10(lo), math.log10(hi)] if spec.scale != "linear" else [lo, hi]
                assert list(ax.range) == pytest.approx(want_range)
            if p.blank:
                assert ax.showticklabels is False


def _leaves(obj: object) -> list[object]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [v for f in dataclasses.fields(obj) for v in _leaves(getattr(obj, f.name))]
    if isinstance(obj, tuple):
        return [v for x in obj for v in _leaves(x)]
    return [obj]


# --------------------------------------------------------------------------------------------------
# One description per figure, drawn by both renderers
# --------------------------------------------------------------------------------------------------


def test_every_figure_is_one_description_drawn_by_both_renderers(rich: tuple) -> None:
    s, figs = rich
    assert [f.name for f in figs] == NAMES
    for f in figs:
        assert isinstance(f, FigureSpec) and isinstance(f.desc, FigureDesc)
        assert isinstance(f.mpl_fig, Figure) and isinstance(f.plotly_fig, go.Figure)
        assert f.title == f.desc.title and s.sweep_id in f.title
        # renderer-free: nothing but plain values (no artist, no trace, no callable) in the description
        leaves = _leaves(f.desc)
        assert leaves and all(v is None or isinstance(v, (str, int, float, bool)) for v in leaves)
        # the renderings are functions of the description alone
        assert render_plotly(f.desc).to_plotly_json() == f.plotly_fig.to_plotly_json()
        assert [ax.get_title() for ax in render_matplotlib(f.desc).axes] == [ax.get_title() for ax in f.mpl_fig.axes]
        assert_both_renderings_draw(f.desc, f.mpl_fig, f.plotly_fig)
        png = f.png_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and f.png_bytes() is png  # rendered once per dpi
        data = json.loads(f.data_json())  # the table behind it, strict JSON
        assert data


def test_both_renderers_draw_any_description() -> None:
    """A hand-made description with every kind of series, both axis scales, both annotation
    references, a blank panel and text that HTML would read as markup."""
    c = "#1f77b4"
    series = (
        Series("band", "band <a> & b", Style(c, alpha=0.12), y=(1.0, 2.0), legend=True, group="g"),
        Series(
            "errorbar",
            "bars",
            Style(c, symbol="circle"),
            x=(2.0, 4.0, 8.0),
            y=(1.5, 3.0, 6.0),
            err_low=(0.1, 0.2, 0.3),  # asymmetric: below and above must not be swapped
            err_high=(0.5, 0.7, 0.9),
            legend=True,
            group="g",
            hover=("a\nb", "c", "<d>"),
        ),
        Series("line", "line", Style(c, dash="dash", width=1.2, alpha=0.6), x=(2.0, 8.0), y=(1.0, 4.0), legend=True),
        Series("scatter", "hollow", Style(c, None, symbol="diamond", hollow=True), x=(4.0,), y=(2.0,), text=("run",)),
        Series("scatter", "pinned", Style(c, None, symbol="x"), x=(2.0, 8.0), y=(9.0, 9.0), top=0.9, legend=True),
        Series("hline", "h", Style("#555555", dash="dashdot"), y=(3.0,)),
        Series("vline", "v", Style("#555555", dash="dot"), x=(5.0,), legend=True),
        Series("scatter", "key only", Style("#555555", None, symbol="star"), legend=True),
    )
    anns = (
        Annotation("at 4, 3", 4.0, 3.0, offset=(5, 4), bold=True),
        Annotation("left edge <i>", 0.01, 2.0, xref="panel", size=7),
    )
    desc = FigureDesc(
        "a <title> & more",
        (
            Panel(
                Axis("x <label>", "log2", ticks=(2.0, 4.0, 8.0), tick_labels=("2", "4", "8"), limits=(1.5, 11.0)),
                Axis("y & label", "log", plain=True),
                series,
                anns,
                title="first",
                legend="outside",
                grid="both",
            ),
            Panel(
                Axis("tokens"),
                Axis(""),
                (),
                (Annotation("nothing\nhere", 0.5, 0.5, "panel", "panel", center=True),),
                blank=True,
            ),
        ),
        size=(8.0, 4.0),
    )
    mpl_fig, pfig = render_matplotlib(desc), render_plotly(desc)
    assert_both_renderings_draw(desc, mpl_fig, pfig)
    # the spot checks behind the generic one: error bars the right way up, markup escaped for plotly
    (tr,) = [t for t in pfig.data if t.name == "bars"]
    assert list(tr.error_y.arrayminus) == [0.1, 0.2, 0.3] and list(tr.error_y.array) == [0.5, 0.7, 0.9]
    assert list(tr.hovertext) == ["a<br>b", "c", "&lt;d&gt;"]
    assert pfig.layout.title.text == "a &lt;title&gt; &amp; more"
    assert pfig.layout.xaxis.title.text == "x &lt;label&gt;" and pfig.layout.yaxis.title.text == "y &amp; label"
    assert pfig.layout.shapes[0].name == "band &lt;a&gt; &amp; b"
    ax = mpl_fig.axes[0]
    (bar,) = ax.containers
    assert [tuple(seg[:, 1]) for seg in bar.lines[2][0].get_segments()] == [
        pytest.approx((1.4, 2.0)),
        pytest.approx((2.8, 3.7)),
        pytest.approx((5.7, 6.9)),
    ]
    assert ax.get_title() == "first" and mpl_fig.get_suptitle() == "a <title> & more"  # matplotlib: plain text
    png = FigureSpec("probe", {}, desc).png_bytes()
    assert png[:4] == b"\x89PNG"


def test_release_drops_the_renderings_and_keeps_the_description() -> None:
    s = rich_sweep()
    f = FIGURES[0](s)
    first = f.mpl_fig
    f.png_bytes()
    f.release()
    assert first.axes == []  # the Agg figure was cleared
    assert f.mpl_fig is not first and len(f.mpl_fig.axes) == 1  # and is rendered again on use


def test_a_series_refuses_what_no_renderer_could_draw() -> None:
    grey = Style("#555555")
    with pytest.raises(ValueError, match="2 x but 1 y"):
        Series("line", "l", grey, x=(1.0, 2.0), y=(1.0,))
    with pytest.raises(ValueError, match="err_low and err_high"):
        Series("errorbar", "e", grey, x=(1.0,), y=(1.0,), err_low=(0.1,))
    with pytest.raises(ValueError, match="band 'b' takes 0 x and 2 y"):
        Series("band", "b", grey, y=(1.0,))
    with pytest.raises(ValueError, match="hover needs one entry per point"):
        Series("scatter", "s", grey, x=(1.0, 2.0), y=(1.0, 2.0), hover=("a",))
    assert Series("line", "k", grey, legend=True).is_key


def test_scaling_figure_draws_the_report_numbers(rich: tuple) -> None:
    s, figs = rich
    f = figs[0]
    assert f.data == scaling_points(s)
    (panel,) = f.desc.panels
    (ax,) = f.mpl_fig.axes
    for opt in s.optimizers:
        cells = [c for c in s.report.optimizers[opt].cells if c.val_loss_mean is not None]
        xs = [c.batch_size for c in cells]
        means = [c.val_loss_mean for c in cells]
        lows, highs = [c.val_loss_ci95[0] for c in cells], [c.val_loss_ci95[1] for c in cells]
        # the description: the line of each optimizer holds exactly its cells with a mean, with the
        # report's CI as error bars
        (d,) = [x for x in panel.series if x.kind == "errorbar" and x.name.startswith(f"{opt} (mean")]
        assert list(d.x) == xs and list(d.y) == pytest.approx(means)
        assert [m - e for m, e in zip(d.y, d.err_low, strict=True)] == pytest.approx(lows)
        assert [m + e for m, e in zip(d.y, d.err_high, strict=True)] == pytest.approx(highs)
        # plotly
        (line,) = [tr for tr in f.plotly_fig.data if tr.name.startswith(f"{opt} (mean")]
        assert list(line.x) == xs
        assert list(line.y) == pytest.approx(means)
        hi = [m + e for m, e in zip(line.y, line.error_y.array, strict=True)]
        lo = [m - e for m, e in zip(line.y, line.error_y.arrayminus, strict=True)]
        assert hi == pytest.approx(highs)
        assert lo == pytest.approx(lows)
        # matplotlib: the error bar's ends are the CI
        (bar,) = [c for c in ax.containers if c.get_label().startswith(f"{opt} (mean")]
        assert list(bar.lines[0].get_xdata()) == xs
        ends = [(seg[0][1], seg[1][1]) for seg in bar.lines[2][0].get_segments()]
        assert ends == [pytest.approx((a, b)) for a, b in zip(lows, highs, strict=True)]
    # the star sits at the report's answer, labelled with it
    star_name = "merit: largest degradation-free B = "
    (d_star,) = [x for x in panel.series if x.name.startswith(star_name) and "itself" in x.name]
    assert d_star.x == (32,) and d_star.style.symbol == "star"
    (star,) = [tr for tr in f.plotly_fig.data if tr.name.startswith(star_name) and "itself" in tr.name]
    assert list(star.x) == [32]
    (mpl_star,) = [ln for ln in ax.get_lines() if ln.get_label().startswith(star_name) and "itself" in ln.get_label()]
    assert list(mpl_star.get_xdata()) == [32] and mpl_star.get_marker() == "*"
    assert "B=32" in [a.text for a in panel.annotations] and "B=32" in [t.get_text() for t in ax.texts]
    assert "<b>B=32</b>" in [a.text for a in f.plotly_fig.layout.annotations]
    # the legend admits AdamW's cell without a completed run, in both renderings
    missing = "1 cell(s) without a completed run"
    assert any(missing in x.name for x in panel.series if x.legend)
    assert any(missing in tr.name for tr in f.plotly_fig.data)
    assert any(missing in t.get_text() for t in ax.get_legend().get_texts())
    # log-x in base 2 with a tick per batch size
    assert (panel.x.scale, panel.x.ticks) == ("log2", (4, 8, 16, 32))
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [4, 8, 16, 32]
    assert f.plotly_fig.layout.xaxis.type == "log" and list(f.plotly_fig.layout.xaxis.tickvals) == [4, 8, 16, 32]
    assert "batch size (sequences)" == panel.x.label == ax.get_xlabel() == f.plotly_fig.layout.xaxis.title.text
    assert "nats/token" in panel.y.label and "nats/token" in ax.get_ylabel()
    assert "nats/token" in f.plotly_fig.layout.yaxis.title.text


def test_lr_figure_marks_diverged_trials_at_the_top(rich: tuple) -> None:
    _, figs = rich
    f = figs[1]
    finite = [p.val_loss for p in f.data.points if p.val_loss is not None]
    n_bad = sum(1 for p in f.data.points if p.val_loss is None)
    assert n_bad == 6
    # the description: every diverged/failed trial once, pinned at the top, its data y above every loss
    bad = [x for x in _series(f) if x.style.symbol == "x" and x.x]
    assert sum(len(x.x) for x in bad) == n_bad
    assert all(x.top == 0.96 and all(y > max(finite) for y in x.y) for x in bad)
    # plotly: at that data y (it pins no trace to the panel)
    xs = [tr for tr in f.plotly_fig.data if tr.marker.symbol == "x" and tr.x and tr.x[0] is not None]
    assert sum(len(tr.x) for tr in xs) == n_bad
    assert all(y > max(finite) for tr in xs for y in tr.y)
    # matplotlib: at 96% of the panel's height, whatever its y range
    pinned = [ln for ax in f.mpl_fig.axes for ln in ax.get_lines() if ln.get_marker() == "x" and len(ln.get_xdata())]
    assert sum(len(ln.get_xdata()) for ln in pinned) == n_bad and all(set(ln.get_ydata()) == {0.96} for ln in pinned)
    assert len(f.desc.panels) == len(f.mpl_fig.axes) == 2
    assert f.desc.panels[0].x.scale == f.mpl_fig.axes[0].get_xscale() == f.plotly_fig.layout.xaxis.type == "log"
    assert "4 diverged/failed" in f.desc.panels[0].title
    assert "4 diverged/failed" in f.mpl_fig.axes[0].get_title()
    assert "4 diverged/failed" in f.plotly_fig.layout.annotations[0].text


def test_lr_figure_stars_the_reports_search_best(rich: tuple) -> None:
    s, figs = rich
    f = figs[1]
    assert f.data == lr_points(s)
    by_id = s.runs_by_id()
    named = {
        f"{by_id[c.search_best_run_id].run_name} (completed)"
        for o in s.report.optimizers.values()
        for c in o.cells
        if c.search_best_run_id is not None
    }
    assert len(named) == 7
    expected = {(c.best_lr, c.search_best_val_loss) for o in s.report.optimizers.values() for c in o.cells if c.best_lr}
    # one star per named run, at its lr and the report's search_best_val_loss, and no other star
    stars = [x for x in _series(f) if x.style.symbol == "star" and x.x]
    assert sorted(t for x in stars for t in x.text) == sorted(named)
    assert {(a, b) for x in stars for a, b in zip(x.x, x.y, strict=True)} == expected
    p_stars = [tr for tr in f.plotly_fig.data if tr.marker.symbol == "star" and tr.x and tr.x[0] is not None]
    assert sorted(t for tr in p_stars for t in tr.text) == sorted(named)
    assert {(x, y) for tr in p_stars for x, y in zip(tr.x, tr.y, strict=True)} == expected
    m_stars = [ln for ax in f.mpl_fig.axes for ln in ax.get_lines() if ln.get_marker() == "*" and len(ln.get_xdata())]
    assert {(x, y) for ln in m_stars for x, y in zip(ln.get_xdata(), ln.get_ydata(), strict=True)} == expected
    # every trial is drawn: the confirmation runs as plain circles (at the same lr as the star)
    circles = [t for x in _series(f) if x.style.symbol == "circle" and not x.style.hollow for t in x.text]
    assert sum("seed=1" in t or "seed=2" in t for t in circles) == 14
    p_circles = [t for tr in f.plotly_fig.data if tr.marker.symbol == "circle" and tr.text for t in tr.text]
    assert sorted(p_circles) == sorted(circles)


def test_loss_figure_draws_the_first_confirmation_run(rich: tuple) -> None:
    s, figs = rich
    f = figs[3]
    assert f.name == "loss_curves" and f.data == loss_curves(s) and "first confirmation run" in f.title
    by_id = s.runs_by_id()
    first = {
        by_id[c.confirmation_run_ids[0]].run_name
        for o in s.report.optimizers.values()
        for c in o.cells
        if c.confirmation_run_ids
    }
    curves = [x for x in _series(f) if x.text]
    assert {x.text[0] for x in curves} == first and all(n.endswith("seed=1") for n in first)
    # val and train per cell, each the run's own curve: val with markers, train dashed
    assert len(curves) == 2 * 7
    for x in curves:
        run = next(r for r in s.trials if r.run_name == x.text[0])
        metric = "val_loss" if x.style.symbol else "train_loss"
        assert x.style.dash == ("solid" if metric == "val_loss" else "dash")
        assert list(zip(x.x, x.y, strict=True)) == list(run.history[metric])
    traces = [tr for tr in f.plotly_fig.data if tr.text]
    assert len(traces) == 2 * 7 and {tr.text[0] for tr in traces} == first
    for tr in traces:
        run = next(r for r in s.trials if r.run_name == tr.text[0])
        metric = "val_loss" if tr.mode == "lines+markers" else "train_loss"
        assert list(zip(tr.x, tr.y, strict=True)) == list(run.history[metric])
    drawn = Counter(
        tuple(zip(ln.get_xdata(), ln.get_ydata(), strict=True))
        for ax in f.mpl_fig.axes
        for ln in ax.get_lines()
        if len(ln.get_xdata())
    )
    assert drawn == Counter(tuple(zip(x.x, x.y, strict=True)) for x in curves)


def test_steps_figure_draws_the_reports_steps_and_the_first_confirmation_runs_solid(rich: tuple) -> None:
    s, figs = rich
    f = figs[5]
    assert f.data.steps == steps_to_target(s) and f.data.noise == noise_scale(s)
    left, right = f.desc.panels
    ax, bx = f.mpl_fig.axes
    for opt, o in s.report.optimizers.items():
        reached = [c for c in o.cells if c.steps_to_reference]
        xs, steps = [c.batch_size for c in reached], [c.steps_to_reference for c in reached]
        tokens = [f"({c.tokens_to_reference} tokens)" for c in reached]
        (d,) = [x for x in left.series if x.name == opt]
        assert list(d.x) == xs and list(d.y) == steps
        assert len(d.hover) == len(tokens) and all(t in h for t, h in zip(tokens, d.hover, strict=True))
        (line,) = [tr for tr in f.plotly_fig.data if tr.name == opt]
        assert list(line.x) == xs and list(line.y) == steps
        assert all(t in h for t, h in zip(tokens, line.hovertext, strict=True))
        (m,) = [ln for ln in ax.get_lines() if ln.get_label() == opt]
        assert list(m.get_xdata()) == xs and list(m.get_ydata()) == steps
    # the count itself is written next to each point, in both renderings
    counts = sorted(str(p.steps) for p in f.data.steps.points if p.steps)
    assert counts and sorted(a.text for a in left.annotations if a.text.isdigit()) == counts
    assert sorted(t.get_text() for t in ax.texts if t.get_text().isdigit()) == counts
    assert sorted(a.text for a in f.plotly_fig.layout.annotations if a.xref == "x" and a.text.isdigit()) == counts
    # B_simple: MERIT's confirmation runs at B >= 8; the first (seed 1) solid, seed 2 faint; no search trial
    name = "merit B_simple (label: the run's batch size)"
    want = sorted(
        (f"merit bs={bs} lr={lr:.1e} seed={seed}", 0.95 if seed == 1 else 0.35)
        for bs in (8, 16, 32)
        for lr in [s.cell("merit", bs).best_lr]  # type: ignore[union-attr]
        for seed in (1, 2)
    )
    assert sorted((x.text[0], x.style.alpha) for x in right.series if x.name == name) == want
    assert sorted((tr.text[0], tr.opacity) for tr in f.plotly_fig.data if tr.name == name) == want
    assert sorted(ln.get_alpha() for ln in bx.get_lines() if ln.get_label() == name) == sorted(a for _, a in want)
    # each first run labelled with its batch size at its end
    ends = ["B=16", "B=32", "B=8"]
    assert sorted(a.text for a in right.annotations if a.text.startswith("B=")) == ends
    assert sorted(t.get_text() for t in bx.texts if t.get_text().startswith("B=")) == ends
    assert sorted(a.text for a in f.plotly_fig.layout.annotations if a.xref == "x2" and a.text.startswith("B=")) == ends
    # B_crit: a vertical line on the left, a horizontal one on the right (also in the HTML)
    crit = f.data.noise.critical[0].b_crit
    assert [x.x for x in left.series if x.kind == "vline"] == [(crit,)]
    assert [x.y for x in right.series if x.kind == "hline"] == [(crit,)]
    assert [(sh.y0, sh.yref) for sh in f.plotly_fig.layout.shapes if sh.xref == "x2 domain"] == [(crit, "y2")]


def test_best_lr_figure_is_log_log_with_fits(rich: tuple) -> None:
    s, figs = rich
    f = figs[2]
    (panel,) = f.desc.panels
    ax = f.mpl_fig.axes[0]
    assert (panel.x.scale, panel.y.scale) == ("log2", "log")
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert (f.plotly_fig.layout.xaxis.type, f.plotly_fig.layout.yaxis.type) == ("log", "log")
    for labels in (
        [x.name for x in panel.series],
        [tr.name for tr in f.plotly_fig.data],
        [t.get_text() for t in ax.get_legend().get_texts()],
    ):
        assert any(n.startswith("adamw fit: lr = ") and "B^0.50" in n for n in labels)
        assert any(n.startswith("merit fit: lr = ") and "B^0.80" in n for n in labels)
        assert sum("sqrt rule" in n for n in labels) == 2 and sum("linear rule" in n for n in labels) == 2
    # the searched range: two lines, one legend entry
    assert [x.y[0] for x in panel.series if x.kind == "hline"] == list(s.report.lr_range)
    assert [sh.y0 for sh in f.plotly_fig.layout.shapes] == list(s.report.lr_range)
    assert sum(t.get_text() == "searched lr range" for t in ax.get_legend().get_texts()) == 1


def test_steps_figure_without_noise_scale_says_why() -> None:
    s = make_sweep(
        [
            trial("adamw", 4, 0.01, val=[(64, 3.5), (128, 3.0)]),
            *confirmations("adamw", 4, 0.01, [(64, 3.5), (128, 3.0)], [(64, 3.55), (128, 3.02)]),
            trial("adamw", 8, 0.01, val=[(64, 3.6), (128, 3.1)]),
            *confirmations("adamw", 8, 0.01, [(64, 3.6), (128, 3.1)], [(64, 3.62), (128, 3.12)]),
        ],
        optimizers=("adamw",),
    )
    f = steps_figure(s)
    # target 1.05 x 3.01 = 3.1605, first reached at 128 tokens by both seed-1 runs: 128 // (4 x 8), 128 // (8 x 8)
    assert [p.steps for p in f.data.steps.points] == [4, 2]
    assert f.data.noise.points == () and f.data.noise.missing == ("adamw",)
    right = f.desc.panels[1]
    assert right.blank and [a.text for a in right.annotations] == [NO_NOISE]
    texts = [t.get_text() for t in f.mpl_fig.axes[1].texts]
    assert any("no gradient noise scale recorded" in t for t in texts)
    assert any("no gradient noise scale recorded" in (a.text or "") for a in f.plotly_fig.layout.annotations)
    assert_both_renderings_draw(f.desc, f.mpl_fig, f.plotly_fig)


@pytest.mark.parametrize("case", ["nothing_completed", "one_batch_size", "optimizer_without_trials"])
def test_figures_survive_missing_data(case: str) -> None:
    if case == "nothing_completed":
        s = make_sweep(
            [
                trial("adamw", 4, 0.01, status="diverged", val=[(50, 9.0)]),
                trial("adamw", 8, 0.01, status="failed"),
                trial("merit", 4, 0.01, status="pruned", val=[(50, 5.0)]),
            ]
        )
    elif case == "one_batch_size":
        s = make_sweep(
            [
                trial("adamw", 4, 0.01, val=[(64, 3.0)]),
                *confirmations("adamw", 4, 0.01, [(64, 3.0)], [(64, 3.01)]),
                trial("merit", 4, 0.02, val=[(64, 3.1)]),
                *confirmations("merit", 4, 0.02, [(64, 3.1)], [(64, 3.11)]),
            ],
            batch_sizes=(4,),
        )
    else:
        s = make_sweep(
            [
                trial("adamw", 4, 0.01, val=[(64, 3.0)]),
                *confirmations("adamw", 4, 0.01, [(64, 3.0)], [(64, 3.01)]),
                trial("adamw", 8, 0.01, val=[(64, 3.05)]),
                *confirmations("adamw", 8, 0.01, [(64, 3.05)], [(64, 3.06)]),
            ]
        )
    # the cases with a completed run have cells with a mean: the figures draw something, not only notes
    assert any(p.val_loss_mean is not None for p in scaling_points(s).points) == (case != "nothing_completed")
    figs = [make(s) for make in FIGURES]  # a crash here is the failure
    assert [f.name for f in figs] == NAMES
    for f in figs:
        assert f.png_bytes()[:4] == b"\x89PNG"
        assert_both_renderings_draw(f.desc, f.mpl_fig, f.plotly_fig)
    if case == "nothing_completed":  # every empty panel says why, in both renderings
        scaling = figs[0]
        assert [a.text for a in scaling.desc.panels[0].annotations] == ["no cell has a completed run"]
        assert [t.get_text() for t in scaling.mpl_fig.axes[0].texts] == ["no cell has a completed run"]
    page = render_dashboard(s, figs, png_fallback=False)
    assert page.count('class="plotly-graph-div"') == len(figs)


def test_lr_figure_counts_in_the_panel_titles() -> None:
    s = make_sweep(
        [
            trial("adamw", 4, 0.01, val=[(64, 3.0)]),
            trial("adamw", 4, 0.05, status="diverged", val=[(32, 3.3)]),
            trial("adamw", 4, 0.001, status="pruned", val=[(32, 3.9)]),
        ],
        optimizers=("adamw",),
        batch_sizes=(4,),
    )
    f = lr_figure(s)
    want = "adamw: 1 completed, 1 pruned, 1 diverged/failed"
    assert f.desc.panels[0].title == want
    assert f.mpl_fig.axes[0].get_title() == want
    assert f.plotly_fig.layout.annotations[0].text == want


def test_lr_figure_shows_the_lrs_the_search_tried_past_the_range() -> None:
    # the line search steps past lr.min and lr.max (by up to lr.extend): those trials stay on the axis
    s = make_sweep(
        [
            trial("adamw", 4, 1e-2, val=[(64, 3.0)]),
            trial("adamw", 4, 40.0, status="diverged", val=[(32, 3.3)]),
            trial("adamw", 4, 1e-7, val=[(64, 3.4)]),
        ],
        optimizers=("adamw",),
        batch_sizes=(4,),
    )
    lo, hi = s.report.lr_range
    assert 1e-7 < lo and hi < 40.0
    f = lr_figure(s)
    assert f.desc.panels[0].x.limits == (1e-7 / 1.5, 40.0 * 1.5)
    x_lo, x_hi = f.mpl_fig.axes[0].get_xlim()
    assert x_lo <= 1e-7 and x_hi >= 40.0


# --------------------------------------------------------------------------------------------------
# A figure's HTML: small, plotly.js by relative path
# --------------------------------------------------------------------------------------------------


def test_a_figures_html_loads_plotlyjs_next_to_it(rich: tuple) -> None:
    _, figs = rich
    for f in figs:
        page = f.html()
        assert len(page.encode()) < 200_000  # was ~4.8 MB with plotly.js inline
        assert not re.search(r"plotly\.js v\d", page)  # plotly.js itself is not in it
        assert re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", page) == [PLOTLYJS_FILE]
        assert f'<div id="fig-{f.name}" class="plotly-graph-div"' in page
        # where plotly.min.js is missing, the page says so rather than staying blank
        assert "if (!window.Plotly)" in page and f"{f.name}.png" in page


# --------------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------------


def test_page_is_self_contained_and_escaped(rich: tuple) -> None:
    s, figs = rich
    page = render_dashboard(s, figs)
    # plotly.js inline exactly once (offline machines), no external script or stylesheet
    assert len(re.findall(r"plotly\.js v\d", page)) == 1
    assert not re.search(r"<script[^>]+src=", page)
    # the one <link> is the page's own empty icon, so no browser asks the server for /favicon.ico
    assert re.findall(r"<link[^>]*>", page) == ['<link rel="icon" href="data:,">']
    # plotly.js itself names its CDN (for geo maps, unused); nothing outside it may
    rest = page.replace(get_plotlyjs(), "")
    assert "cdn.plot.ly" not in rest and "https://" not in rest
    # one plotly div per figure, in order, each with its PNG for readers without JavaScript
    assert re.findall(r'<div id="fig-([a-z_]+)" class="plotly-graph-div"', page) == NAMES
    assert page.count('<noscript><img alt="') == len(figs)
    # the answer first: before the first figure
    assert page.index('id="answer"') < page.index('class="figure"')
    assert all(re.search(rf"\(estimate B = {b}[;)]", page) for b in (8, 32, 16))
    # beside an estimate the seeds cannot tell from its neighbour: which sizes they cannot tell apart
    report = s.report
    for opt, o in report.optimizers.items():
        for ref in ("self",) if opt == report.baseline else ("self", "baseline"):
            if (noise := describe_noise(o, ref)) is not None:
                assert f"; {noise})" in page, (opt, ref, noise)
    assert "vs itself: <b>" in page and "Bonferroni" in page  # what could be decided leads, and how
    assert "largest degradation-free batch size" in page.lower()  # the question the page answers, by name
    # text from the sweep is escaped (the warning holds <exceeds> and &)
    assert "token_budget &lt;exceeds&gt; the corpus &amp; repeats data" in page
    assert "<exceeds>" not in page


def test_published_page_loads_plotlyjs_next_to_it_and_inlines_to_the_served_one(rich: tuple) -> None:
    s, figs = rich
    published = render_dashboard(s, figs, plotlyjs="relative")
    # no copy of plotly.js, one reference to the file next to it, and nothing from the network
    assert not re.search(r"plotly\.js v\d", published)
    assert re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", published) == [PLOTLYJS_FILE]
    assert published.count(PLOTLYJS_TAG) == 1 and published.index(PLOTLYJS_TAG) < published.index("</head>")
    assert not re.search(r"<script[^>]+src=[\"']?(https?:)?//", published)
    assert len(published.encode()) < 2_000_000  # the PNG fallbacks (~0.7 MB) and the figures' JSON
    # inlining it gives the self-contained page byte for byte; an inline page is left as it is
    served = render_dashboard(s, figs)
    assert inline_plotlyjs(published) == served
    assert inline_plotlyjs(served) == served
    assert inline_plotlyjs(published, "/* js */").count('<script type="text/javascript">/* js */</script>') == 1
    with pytest.raises(ValueError, match="plotlyjs must be"):
        render_dashboard(s, figs, plotlyjs="cdn")  # type: ignore[arg-type]


def test_page_escapes_a_hostile_sweep_id() -> None:
    evil = '<script>alert("x")</script>'
    s = make_sweep(
        [trial("adamw", 4, 0.01, val=[(64, 3.0)]), trial("merit", 4, 0.02, val=[(64, 3.1)])],
        batch_sizes=(4,),
    )
    # the id the page reads is the MLflow experiment's (load_sweep's argument), not the report's spec name
    s = dataclasses.replace(s, sweep_id=evil)
    figs = build_figures(s)
    page = render_dashboard(s, figs, png_fallback=False)
    assert evil not in page  # neither in the page's HTML nor in plotly's embedded JSON (it escapes < as \u003c)
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    # plotly reads its text as HTML: the description's title keeps the id, plotly gets it escaped
    assert all(evil in f.title for f in figs)
    assert all('&lt;script&gt;alert("x")&lt;/script&gt;' in f.plotly_fig.layout.title.text for f in figs)
    assert evil not in figs[0].html()


def test_a_search_of_the_batch_axis_draws_and_shows_its_steps() -> None:
    """Each optimizer tested its own sizes (a search): every figure and the page still draw, and the page
    lists each optimizer's steps in order with the bracket after each."""
    from dashboards import build_figures, render_dashboard

    rich = rich_sweep()
    tested = {"adamw": (4, 8, 16), "merit": (4, 16, 32)}
    trials = [t for t in rich.trials if t.batch_size in tested[t.optimizer]]
    steps = {
        opt: [
            {"batch_size": b, "chosen": c, "why": w, "seeds_added": 0}
            for b, c, w in zip(
                sizes,
                ("reference", "step up", "bisect"),
                ("the reference", "x2", "between 8 (fine) and 32"),
                strict=True,
            )
        ]
        for opt, sizes in tested.items()
    }
    search = {"min": 4, "max": 32, "resolution": 2.0, "step": 2.0, "against": "baseline"}
    sweep = make_sweep(trials, batch_sizes=search, tolerance=0.03, steps=steps)
    assert sweep.report.batch_search is not None and sweep.report.batch_search.lattice == [4, 8, 16, 32]
    assert [c.batch_size for c in sweep.report.optimizers["merit"].cells] == [4, 16, 32]
    figs = build_figures(sweep)
    page = render_dashboard(sweep, figs, png_fallback=False)
    section = page.split('<section id="batch-search">', 1)[1].split("</section>", 1)[0]
    for opt, sizes in tested.items():
        table = section.split(f'data-optimizer="{opt}"', 1)[1].split("</table>", 1)[0]
        assert re.findall(r"<td class=\"name\">B = (\d+)</td>", table) == [str(b) for b in sizes]
        assert table.count("<tr>") == len(sizes) + 1  # the head and one row per step
    # the bracket after the last step is the report's
    merit = sweep.report.optimizers["merit"].bracket.baseline
    last = section.split('data-optimizer="merit"', 1)[1].split("</table>", 1)[0].rsplit("<tr>", 1)[1]
    lo = "-" if merit.largest_fine is None else merit.largest_fine
    hi = "-" if merit.smallest_degraded is None else merit.smallest_degraded
    assert f"[{lo}, {hi})" in html.unescape(last)
