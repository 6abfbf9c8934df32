"""Every figure and the page, from hand-made sweeps: the data behind them and what the page holds."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
import pytest
from dash_helpers import confirmations, make_sweep, rich_sweep, trial
from matplotlib.figure import Figure
from plotly.offline import get_plotlyjs

from dashboards.data import loss_curves, lr_points, noise_scale, scaling_points, steps_to_target
from dashboards.figures import FIGURES, FigureSpec, lr_figure, steps_figure
from dashboards.page import render_dashboard
from dashboards.publish import build_figures

NAMES = ["scaling", "lr_sensitivity", "best_lr", "loss_curves", "attention_logits", "steps_to_target"]


@pytest.fixture(scope="module")
def rich() -> tuple:
    s = rich_sweep()
    return s, build_figures(s)


def test_every_figure_is_built_twice_from_its_table(rich: tuple) -> None:
    s, figs = rich
    assert [f.name for f in figs] == NAMES
    for f in figs:
        assert isinstance(f, FigureSpec) and isinstance(f.mpl_fig, Figure) and isinstance(f.plotly_fig, go.Figure)
        assert f.title and s.sweep_id in f.title
        png = f.png_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        data = json.loads(f.data_json())  # the table behind it, strict JSON
        assert data


def test_scaling_figure_draws_the_report_numbers(rich: tuple) -> None:
    s, figs = rich
    f = figs[0]
    assert f.data == scaling_points(s)
    # the plotly line of each optimizer holds exactly its cells with a mean, with the report's CI as error bars
    for opt in s.optimizers:
        (line,) = [tr for tr in f.plotly_fig.data if tr.name.startswith(f"{opt} (mean")]
        cells = [c for c in s.report.optimizers[opt].cells if c.val_loss_mean is not None]
        assert list(line.x) == [c.batch_size for c in cells]
        assert list(line.y) == pytest.approx([c.val_loss_mean for c in cells])
        hi = [m + e for m, e in zip(line.y, line.error_y.array, strict=True)]
        lo = [m - e for m, e in zip(line.y, line.error_y.arrayminus, strict=True)]
        assert hi == pytest.approx([c.val_loss_ci95[1] for c in cells])
        assert lo == pytest.approx([c.val_loss_ci95[0] for c in cells])
    # the star sits at the report's answer
    (star,) = [
        tr
        for tr in f.plotly_fig.data
        if tr.name.startswith("merit: largest degradation-free B = ") and "itself" in tr.name
    ]
    assert list(star.x) == [32]
    # the legend admits AdamW's cell without a completed run
    assert any("1 cell(s) without a completed run" in tr.name for tr in f.plotly_fig.data)
    # matplotlib: log-x in base 2 with a tick per batch size
    ax = f.mpl_fig.axes[0]
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [4, 8, 16, 32]
    assert "batch size (sequences)" == ax.get_xlabel() and "nats/token" in ax.get_ylabel()


def test_lr_figure_marks_diverged_trials_at_the_top(rich: tuple) -> None:
    _, figs = rich
    f = figs[1]
    xs = [tr for tr in f.plotly_fig.data if tr.marker.symbol == "x" and tr.x and tr.x[0] is not None]
    finite = [p.val_loss for p in f.data.points if p.val_loss is not None]
    # every diverged/failed trial drawn once, above every finite loss (they have none)
    assert sum(len(tr.x) for tr in xs) == sum(1 for p in f.data.points if p.val_loss is None) == 6
    assert all(y > max(finite) for tr in xs for y in tr.y)
    assert len(f.mpl_fig.axes) == 2 and f.mpl_fig.axes[0].get_xscale() == "log"
    assert "4 diverged/failed" in f.mpl_fig.axes[0].get_title()


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
    stars = [tr for tr in f.plotly_fig.data if tr.marker.symbol == "star" and tr.x and tr.x[0] is not None]
    # one star per named run, at its lr and the report's search_best_val_loss, and no other star
    assert sorted(t for tr in stars for t in tr.text) == sorted(named) and len(named) == 7
    drawn = {(x, y) for tr in stars for x, y in zip(tr.x, tr.y, strict=True)}
    assert drawn == {
        (c.best_lr, c.search_best_val_loss) for o in s.report.optimizers.values() for c in o.cells if c.best_lr
    }
    # every trial is drawn: the confirmation runs as plain circles (at the same lr as the star)
    circles = [t for tr in f.plotly_fig.data if tr.marker.symbol == "circle" and tr.text for t in tr.text]
    assert sum("seed=1" in t or "seed=2" in t for t in circles) == 14


def test_loss_figure_draws_the_first_confirmation_run(rich: tuple) -> None:
    s, figs = rich
    f = figs[3]
    assert f.name == "loss_curves" and f.data == loss_curves(s) and "first confirmation run" in f.title
    by_id = s.runs_by_id()
    traces = [tr for tr in f.plotly_fig.data if tr.text]
    names = {tr.text[0] for tr in traces}
    first = {
        by_id[c.confirmation_run_ids[0]].run_name
        for o in s.report.optimizers.values()
        for c in o.cells
        if c.confirmation_run_ids
    }
    assert names == first and all(n.endswith("seed=1") for n in names)
    # val and train per cell, each the run's own curve
    assert len(traces) == 2 * 7
    for tr in traces:
        run = next(r for r in s.trials if r.run_name == tr.text[0])
        metric = "val_loss" if tr.mode == "lines+markers" else "train_loss"
        assert list(zip(tr.x, tr.y, strict=True)) == list(run.history[metric])


def test_steps_figure_draws_the_reports_steps_and_the_first_confirmation_runs_solid(rich: tuple) -> None:
    s, figs = rich
    f = figs[5]
    assert f.data.steps == steps_to_target(s) and f.data.noise == noise_scale(s)
    for opt, o in s.report.optimizers.items():
        (line,) = [tr for tr in f.plotly_fig.data if tr.name == opt]
        reached = [c for c in o.cells if c.steps_to_reference]
        assert list(line.x) == [c.batch_size for c in reached]
        assert list(line.y) == [c.steps_to_reference for c in reached]
        assert list(line.customdata) == [c.tokens_to_reference for c in reached]
    # B_simple: MERIT's confirmation runs at B >= 8; the first (seed 1) solid, seed 2 faint; no search trial
    noise = [tr for tr in f.plotly_fig.data if tr.name == "merit B_simple"]
    assert sorted((tr.text[0], tr.opacity) for tr in noise) == sorted(
        (f"merit bs={bs} lr={lr:.1e} seed={seed}", 0.95 if seed == 1 else 0.35)
        for bs in (8, 16, 32)
        for lr in [s.cell("merit", bs).best_lr]  # type: ignore[union-attr]
        for seed in (1, 2)
    )
    # matplotlib: each first run labelled with its batch size at its end
    labels = [t.get_text() for t in f.mpl_fig.axes[1].texts]
    assert sorted(x for x in labels if x.startswith("B=")) == ["B=16", "B=32", "B=8"]


def test_best_lr_figure_is_log_log_with_fits(rich: tuple) -> None:
    _, figs = rich
    f = figs[2]
    ax = f.mpl_fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    labels = [tr.name for tr in f.plotly_fig.data]
    assert any(n.startswith("adamw fit: lr = ") and "B^0.50" in n for n in labels)
    assert any(n.startswith("merit fit: lr = ") and "B^0.80" in n for n in labels)
    assert sum("sqrt rule" in n for n in labels) == 2 and sum("linear rule" in n for n in labels) == 2


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
    texts = [t.get_text() for t in f.mpl_fig.axes[1].texts]
    assert any("no gradient noise scale recorded" in t for t in texts)
    assert any("no gradient noise scale recorded" in (a.text or "") for a in f.plotly_fig.layout.annotations)


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
    assert f.mpl_fig.axes[0].get_title() == "adamw: 1 completed, 1 pruned, 1 diverged/failed"


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
    assert "<b>B = 8</b>" in page and "<b>B = 32</b>" in page and "<b>B = 16</b>" in page
    # text from the sweep is escaped (the warning holds <exceeds> and &)
    assert "token_budget &lt;exceeds&gt; the corpus &amp; repeats data" in page
    assert "<exceeds>" not in page


def test_page_escapes_a_hostile_sweep_id() -> None:
    evil = '<script>alert("x")</script>'
    s = make_sweep(
        [trial("adamw", 4, 0.01, val=[(64, 3.0)]), trial("merit", 4, 0.02, val=[(64, 3.1)])],
        batch_sizes=(4,),
        sweep_id=evil,
    )
    page = render_dashboard(s, build_figures(s), png_fallback=False)
    assert evil not in page  # neither in the page's HTML nor in plotly's embedded JSON (it escapes < as \u003c)
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
