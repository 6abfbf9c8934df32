"""The figure of a study's laws (`sweeps study`), and its place in the study's MLflow run.

One panel per optimizer and reference (`sweeps.law.OptimizerLaw`): each scale's bracket of B*, the largest
batch size decided fine and the smallest decided degraded, against the token budget on log axes; the fitted
law at each scale's budget and the target's with its 95 % prediction interval; the prediction at the target;
the leave-largest-out check (the law fitted without the largest decided scale, predicting it); the lr law's
lr at the target in words. Where the data support no law, the panel says why and shows the brackets only.
Nothing here fits anything: every number comes from the `OptimizerLaw` that `sweeps law` prints.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plotly.offline import get_plotlyjs

from dashboards.figure_desc import GREY, Annotation, Axis, FigureDesc, Panel, Series, Style
from dashboards.figures import BATCH_LABEL, OPT_COLORS, PLOTLYJS_FILE, FigureSpec, note
from sweeps.law import OptimizerLaw
from sweeps.layout import FIGURES_DIR

__all__ = ["LAW_FIGURE", "law_figure", "publish_study"]

LAW_FIGURE = "law"  # file stem of the figure under figures/ in the study's run


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.3g}"


def _panel(law: OptimizerLaw, color: str, legend: bool) -> Panel:
    """One optimizer's law against one reference (`legend`: the PNG's key in this panel; every panel's series
    have the same names)."""
    ref = "itself" if law.against == "self" else law.reference
    title = f"{law.optimizer} against {ref}"
    fine = [(s.tokens, float(s.largest_fine)) for s in law.scales if s.largest_fine is not None]
    degraded = [(s.tokens, float(s.smallest_degraded)) for s in law.scales if s.smallest_degraded is not None]
    series = [
        Series(
            "scatter",
            "largest size decided fine",
            Style(color, None, symbol="circle", size=7),
            x=tuple(t for t, _ in fine),
            y=tuple(b for _, b in fine),
            legend=True,
            hover=tuple(f"{_fmt(t)} tokens: fine up to B = {b:.0f}" for t, b in fine),
        ),
        Series(
            "scatter",
            "smallest size decided degraded",
            Style(color, None, symbol="x", size=8),
            x=tuple(t for t, _ in degraded),
            y=tuple(b for _, b in degraded),
            legend=True,
            hover=tuple(f"{_fmt(t)} tokens: degraded from B = {b:.0f}" for t, b in degraded),
        ),
    ]
    if law.line:  # the law's B* and its prediction interval at each scale's budget and the target's
        series.append(
            Series(
                "errorbar",
                "law, 95 % prediction interval",
                Style(color, "dash", width=1.4, alpha=0.8),
                x=tuple(p.tokens for p in law.line),
                y=tuple(p.value for p in law.line),
                err_low=tuple(p.value - p.low for p in law.line),
                err_high=tuple(p.high - p.value for p in law.line),
                legend=True,
                hover=tuple(
                    f"law at {_fmt(p.tokens)} tokens: B* {p.value:.0f} [{p.low:.0f}, {p.high:.0f}]" for p in law.line
                ),
            )
        )
    if law.predicted is not None:
        series.append(
            Series(
                "scatter",
                "prediction at the target",
                Style(color, None, symbol="star", size=13),
                x=(law.target_tokens,),
                y=(law.predicted.value,),
                legend=True,
                hover=(f"target {_fmt(law.target_tokens)} tokens: B* {law.predicted.value:.0f}",),
            )
        )
    if law.check is not None:
        c = law.check
        said = "held" if c.held else f"missed by x{c.miss:.2f}"
        series.append(
            Series(
                "errorbar",
                f"without the largest scale: {said}",
                Style(GREY, None, symbol="diamond", size=8, hollow=True, edge_width=1.5),
                x=(c.left_out.tokens,),
                y=(c.predicted.value,),
                err_low=(c.predicted.value - c.predicted.low,),
                err_high=(c.predicted.high - c.predicted.value,),
                legend=True,
                hover=(
                    f"fitted without it: B* {c.predicted.value:.0f} [{c.predicted.low:.0f}, {c.predicted.high:.0f}]",
                ),
            )
        )
    # the axes span every scale's budget and the target's, whatever is drawn (log axes need a positive range
    # where nothing is: a reference none of whose brackets is bounded)
    tokens = [s.tokens for s in law.scales] + [law.target_tokens]
    x_axis = Axis("tokens (training budget)", "log", limits=(min(tokens) / 1.5, max(tokens) * 1.5))
    drawn = [b for _, b in fine + degraded] + [p.high for p in law.line] + [p.low for p in law.line]
    y_limits = None if drawn else (1.0, 64.0)
    lines = _words(law)
    notes = tuple(Annotation(text, 0.02, 0.97 - 0.07 * i, xref="panel", yref="panel") for i, text in enumerate(lines))
    if not fine and not degraded:
        notes += (note("no scale's bracket bounds B*"),)
    return Panel(
        x_axis,
        Axis(BATCH_LABEL, "log2", plain=True, limits=y_limits),
        tuple(series),
        notes,
        title=title,
        legend="best" if legend else "none",
        grid="both",
    )


def _words(law: OptimizerLaw) -> list[str]:
    """The law in words, as `sweeps law` prints it: the exponent, the prediction and the lr, or why not."""
    if law.no_law is not None:
        return [f"no law: {law.no_law}"]
    out = []
    if law.tokens_exponent is not None and law.tokens_interval is not None:
        lo, hi = law.tokens_interval
        out.append(f"B* ∝ tokens^{law.tokens_exponent:.2f} [{lo:.2f}, {hi:.2f}]")
    if law.params_exponent is not None and law.params_interval is not None:
        lo, hi = law.params_interval
        out.append(f"× params^{law.params_exponent:.2f} [{lo:.2f}, {hi:.2f}]")
    if law.predicted is not None:
        p = law.predicted
        out.append(f"target: B* {p.value:.0f} [{p.low:.0f}, {p.high:.0f}]")
    elif law.no_prediction is not None:
        out.append(f"no prediction: {law.no_prediction}")
    if law.lr is not None:
        out.append(f"lr there {law.lr.value:.3g} [{law.lr.low:.3g}, {law.lr.high:.3g}]")
    if law.check is None:
        out.append("no leave-largest-out check (law.json says why)")
    return out


def law_figure(laws: Sequence[OptimizerLaw], study: str) -> FigureSpec:
    """The study's laws, one panel per optimizer and reference, side by side."""
    names = list(dict.fromkeys(law.optimizer for law in laws))
    panels = tuple(
        _panel(law, OPT_COLORS[names.index(law.optimizer) % len(OPT_COLORS)], legend=i == 0)
        for i, law in enumerate(laws)
    )
    if not panels:
        panels = (Panel(Axis(), Axis(), annotations=(note("the study has no optimizer in every scale"),), blank=True),)
    title = f"The largest degradation-free batch size B* against tokens, and its law — study {study}"
    width = max(7.0, 5.5 * len(panels))
    data = [law.model_dump(mode="json") for law in laws]
    return FigureSpec(LAW_FIGURE, data, FigureDesc(title, panels, size=(width, 5.0)))


def law_page(laws: Sequence[dict[str, Any]], study: str, plotlyjs_src: str) -> str:
    """The law figure as one HTML page that loads plotly.js from `plotlyjs_src` (the service's law page).
    `laws` as the study stored them (OptimizerLaw's JSON): plain data to send the process that draws it."""
    from dashboards.page import plotlyjs_from

    fig = law_figure([OptimizerLaw.model_validate(law) for law in laws], study)
    try:
        return plotlyjs_from(fig.html(), plotlyjs_src)
    finally:
        fig.release()


def publish_study(tracking_uri: str, run_id: str, laws: Sequence[OptimizerLaw], study: str) -> list[str]:
    """The law figure (PNG, HTML, its data as JSON) and plotly.min.js, which the HTML loads by relative path,
    logged under figures/ of the study's run; returns their artifact paths. Publishing again overwrites them."""
    from mlflow.tracking import MlflowClient

    fig = law_figure(laws, study)
    with tempfile.TemporaryDirectory(prefix="batchsweep-study-") as out:
        folder = Path(out)
        files = {
            f"{LAW_FIGURE}.png": fig.png_bytes(),
            f"{LAW_FIGURE}.html": fig.html().encode(),
            f"{LAW_FIGURE}.json": fig.data_json().encode(),
            PLOTLYJS_FILE: get_plotlyjs().encode(),
        }
        for name, content in files.items():
            (folder / name).write_bytes(content)
        MlflowClient(tracking_uri).log_artifacts(run_id, out, artifact_path=FIGURES_DIR)
    fig.release()
    return [f"{FIGURES_DIR}/{name}" for name in files]
