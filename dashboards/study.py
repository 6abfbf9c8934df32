"""The figure of a study's laws (`sweeps study`), and its place in the study's MLflow run.

One panel per optimizer and reference (`sweeps.law.OptimizerLaw`): each scale's bracket of B*, the largest
batch size decided fine and the smallest decided degraded, against the token budget on log axes; the fitted
law at each scale's budget and the target's with its 95 % prediction interval; the prediction at the target;
the leave-largest-out check (the law fitted without the largest decided scale, predicting it); the lr law's
lr at the target in words. Where the data support no law, the panel says why and shows the brackets only.
A study that confirms (`confirm: true`) adds, per law its confirmation sweep judged (`sweeps.law.Confirmation`),
that sweep's bracket at the target's budget beside the prediction, drawn as the scales' brackets are, with the
outcome (held, missed by a factor, undecided) in the panel's title and legend and the lr it found in words;
the page (`law_page`, the artifact's HTML) says each outcome, or that the confirmation is pending or was not
run and why. Nothing here fits anything: every number comes from the `OptimizerLaw` that `sweeps law` prints
and the `Confirmation` that `sweeps study` prints.
"""

from __future__ import annotations

import html
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plotly.offline import get_plotlyjs

from dashboards.figure_desc import GREY, Annotation, Axis, FigureDesc, Panel, Series, Style
from dashboards.figures import BATCH_LABEL, OPT_COLORS, PLOTLYJS_FILE, FigureSpec, note
from sweeps.law import Bracket, Confirmation, OptimizerLaw
from sweeps.layout import FIGURES_DIR

__all__ = ["LAW_FIGURE", "ConfirmationState", "law_figure", "law_html", "law_page", "outcome", "publish_study"]

LAW_FIGURE = "law"  # file stem of the figure under figures/ in the study's run
CONFIRMED_COLOR = "#222222"  # the confirmation's bracket: one colour in every panel, apart from the scales'


@dataclass(frozen=True)
class ConfirmationState:
    """Where a confirming study's confirmation at the target stands, as the page and the figure show it.
    `status`: "pending" (its sweep not created yet), "not_run" (`note` says why), else its sweep's status
    (queued, running, succeeded, failed, cancelled); `judged`: each law's confirmation, once it succeeded."""

    status: str
    sweep_id: str = ""
    note: str | None = None
    judged: tuple[Confirmation, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConfirmationState:
        """From plain data (what the service sends the process that draws): status, sweep_id, note and
        confirmations, a list of `Confirmation` as JSON or None."""
        judged = tuple(Confirmation.model_validate(c) for c in data.get("confirmations") or ())
        return cls(str(data["status"]), str(data.get("sweep_id") or ""), data.get("note"), judged)

    def of(self, law: OptimizerLaw) -> Confirmation | None:
        """The law's own confirmation: the one of its optimizer and reference."""
        return next((c for c in self.judged if (c.optimizer, c.against) == (law.optimizer, law.against)), None)

    def stands(self) -> str:
        """Where it stands in a word or two for a panel's title: pending, not run, or how its sweep ended
        otherwise; "" once it succeeded (each law's outcome says the rest)."""
        if self.status == "succeeded":
            return ""
        return {"not_run": "not run", "queued": "pending", "running": "pending"}.get(self.status, self.status)

    def words(self) -> str:
        """The confirmation when no law has its outcome yet: pending, not run and why, or how its sweep ended."""
        sweep = f" (sweep {self.sweep_id})" if self.sweep_id else ""
        if self.status == "not_run":
            return "confirmation at the target: not run" + (f": {self.note}" if self.note else "")
        if self.status in ("pending", "queued", "running"):
            return f"confirmation at the target: pending{sweep}, {self.status}"
        if self.status == "succeeded":
            return f"confirmation at the target: done{sweep}"
        return f"confirmation at the target: its sweep{sweep} ended {self.status}, no outcome"


def outcome(c: Confirmation) -> str:
    """The confirmation's outcome in a few words: held, missed by x<factor>, or undecided."""
    if c.held is None:
        return "undecided"
    return "held" if c.held else f"missed by x{c.miss:.2f}"


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.3g}"


def _bracket_series(
    brackets: Sequence[Bracket], color: str, label: str = "", size: float = 1.0, hollow: bool = False
) -> list[Series]:
    """Brackets of B* against tokens: the largest size decided fine (a circle) and the smallest decided degraded
    (a cross), each where it is bounded; an open end draws nothing; the sweep's point (a diamond, with its 95 %
    error bar from its sd), where it has one: the law is fitted through the points. `label` prefixes the
    series' names and hovers; `size` scales the markers."""
    fine = [(b.tokens, float(b.largest_fine)) for b in brackets if b.largest_fine is not None]
    degraded = [(b.tokens, float(b.smallest_degraded)) for b in brackets if b.smallest_degraded is not None]
    points = [(b.tokens, b.point, b.point_sd) for b in brackets if b.point is not None and b.point_sd is not None]
    z = 1.96  # a Normal's 95 % on either side, in ln B*
    return [
        Series(
            "errorbar",
            f"{label}the sweep's point, 95 % interval",
            Style(color, None, symbol="diamond", size=6 * size, hollow=hollow, edge_width=1.5 if hollow else 1.0),
            x=tuple(t for t, _, _ in points),
            y=tuple(p for _, p, _ in points),
            err_low=tuple(p - p * math.exp(-z * sd) for _, p, sd in points),
            err_high=tuple(p * math.exp(z * sd) - p for _, p, sd in points),
            legend=True,
            hover=tuple(
                f"{label}{_fmt(t)} tokens: its point B* {p:.0f} (sd x{math.exp(sd):.2f})" for t, p, sd in points
            ),
        ),
        Series(
            "scatter",
            f"{label}largest size decided fine",
            Style(color, None, symbol="circle", size=7 * size, hollow=hollow, edge_width=1.5 if hollow else 1.0),
            x=tuple(t for t, _ in fine),
            y=tuple(b for _, b in fine),
            legend=True,
            hover=tuple(f"{label}{_fmt(t)} tokens: fine up to B = {b:.0f}" for t, b in fine),
        ),
        Series(
            "scatter",
            f"{label}smallest size decided degraded",
            Style(color, None, symbol="x", size=8 * size),
            x=tuple(t for t, _ in degraded),
            y=tuple(b for _, b in degraded),
            legend=True,
            hover=tuple(f"{label}{_fmt(t)} tokens: degraded from B = {b:.0f}" for t, b in degraded),
        ),
    ]


def _law_series(law: OptimizerLaw, color: str) -> list[Series]:
    """The law's line and band, its prediction at the target and the leave-largest-out check, where it has them."""
    series = []
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
    return series


def _panel(law: OptimizerLaw, color: str, legend: bool, confirming: ConfirmationState | None) -> Panel:
    """One optimizer's law against one reference (`legend`: the PNG's key in this panel; every panel's series
    have the same names, but for the confirmation's outcome); with its confirmation where `confirming` has one."""
    ref = "itself" if law.against == "self" else law.reference
    title = f"{law.optimizer} against {ref}"
    scales = _bracket_series(law.scales, color)
    series = scales + _law_series(law, color)
    judged = confirming.of(law) if confirming is not None else None
    if judged is not None:  # its bracket at the target's budget, beside the prediction drawn there
        title += f": confirmation {outcome(judged)}"
        label = f"confirmation ({outcome(judged)}): "
        series += _bracket_series([judged.bracket], CONFIRMED_COLOR, label, size=1.4, hollow=True)
    elif confirming is not None and confirming.stands():  # no outcome (yet): where it stands
        title += f": confirmation {confirming.stands()}"
    # the axes span every scale's budget and the target's, whatever is drawn (log axes need a positive range
    # where nothing is: a reference none of whose brackets is bounded)
    tokens = [s.tokens for s in law.scales] + [law.target_tokens]
    x_axis = Axis("tokens (training budget)", "log", limits=(min(tokens) / 1.5, max(tokens) * 1.5))
    y_limits = None if any(s.y for s in series) else (1.0, 64.0)
    lines = _words(law) + ([_confirmed_words(judged)] if judged is not None else [])
    notes = tuple(Annotation(text, 0.02, 0.97 - 0.07 * i, xref="panel", yref="panel") for i, text in enumerate(lines))
    if not any(s.x for s in scales):
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


def _confirmed_words(c: Confirmation) -> str:
    """The confirmation's bracket in a few words, and the lr it found beside the lr law's where it has both."""
    lo, hi = c.bracket.largest_fine, c.bracket.smallest_degraded
    words = f"confirmed: B* in [{lo if lo is not None else '?'}, {hi if hi is not None else '?'})"
    if c.lr_found is not None and c.lr_predicted is not None:
        words += f", lr {c.lr_found:.3g} at B {c.lr_at} (law {c.lr_predicted:.3g})"
    return words


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


def law_figure(laws: Sequence[OptimizerLaw], study: str, confirming: ConfirmationState | None = None) -> FigureSpec:
    """The study's laws, one panel per optimizer and reference, side by side; with the confirmation at the
    target where `confirming` has one (None: the study does not confirm)."""
    names = list(dict.fromkeys(law.optimizer for law in laws))
    panels = tuple(
        _panel(law, OPT_COLORS[names.index(law.optimizer) % len(OPT_COLORS)], i == 0, confirming)
        for i, law in enumerate(laws)
    )
    if not panels:
        panels = (Panel(Axis(), Axis(), annotations=(note("the study has no optimizer in every scale"),), blank=True),)
    title = f"The largest degradation-free batch size B* against tokens, and its law — study {study}"
    width = max(7.0, 5.5 * len(panels))
    data = [law.model_dump(mode="json") | _judged_json(law, confirming) for law in laws]
    return FigureSpec(LAW_FIGURE, data, FigureDesc(title, panels, size=(width, 5.0)))


def _judged_json(law: OptimizerLaw, confirming: ConfirmationState | None) -> dict[str, Any]:
    """The figure's data beside a law: its confirmation, where it has one."""
    judged = confirming.of(law) if confirming is not None else None
    return {"confirmation": judged.model_dump(mode="json")} if judged is not None else {}


def _confirmation_text(laws: Sequence[OptimizerLaw], confirming: ConfirmationState) -> str:
    """The page's words on the confirmation: each law's outcome as `sweeps study` prints it, or where the
    confirmation stands (pending, not run and why, its sweep ended without an outcome)."""
    items = []
    for law in laws:
        c = confirming.of(law)
        ref = "itself" if law.against == "self" else law.reference
        if c is not None:
            lr = ""
            if c.lr_found is not None and c.lr_predicted is not None:
                lr = f"; lr {c.lr_found:.3g} found at B {c.lr_at}, the lr law said {c.lr_predicted:.3g}"
            said = f"{outcome(c)} — {c.says}{lr}"
        elif confirming.judged and law.predicted is None:
            reason = law.no_prediction or law.no_law
            said = "no confirmation: the law predicts no B*" + (f" ({reason})" if reason else "")
        elif confirming.judged:
            said = "no confirmation: the confirmation sweep did not train this optimizer"
        else:
            continue
        key, name = html.escape(f"{law.optimizer}.{law.against}"), html.escape(f"{law.optimizer} against {ref}")
        items.append(f'<li data-confirmed="{key}">{name}: {html.escape(said)}</li>')
    head = f'<p data-confirmation="{html.escape(confirming.status)}">{html.escape(confirming.words())}</p>'
    listed = f"<ul>{''.join(items)}</ul>" if items else ""
    style = "font-family: sans-serif; font-size: 14px; margin: 8px 16px"
    return f'<section id="confirmation" style="{style}">{head}{listed}</section>'


def law_html(fig: FigureSpec, laws: Sequence[OptimizerLaw], confirming: ConfirmationState | None) -> str:
    """The law figure's standalone page (`FigureSpec.html`), with the confirmation's words above the figure
    where the study confirms."""
    page = fig.html()
    if confirming is None:
        return page
    return page.replace("<body>", "<body>" + _confirmation_text(laws, confirming), 1)


def law_page(
    laws: Sequence[dict[str, Any]], study: str, plotlyjs_src: str, confirmation: dict[str, Any] | None = None
) -> str:
    """The law figure as one HTML page that loads plotly.js from `plotlyjs_src` (the service's law page).
    `laws` as the study stored them (OptimizerLaw's JSON) and `confirmation` as `ConfirmationState.from_json`
    reads it (None: the study does not confirm): plain data to send the process that draws it."""
    from dashboards.page import plotlyjs_from

    fitted = [OptimizerLaw.model_validate(law) for law in laws]
    confirming = ConfirmationState.from_json(confirmation) if confirmation is not None else None
    fig = law_figure(fitted, study, confirming)
    try:
        return plotlyjs_from(law_html(fig, fitted, confirming), plotlyjs_src)
    finally:
        fig.release()


def publish_study(
    tracking_uri: str,
    run_id: str,
    laws: Sequence[OptimizerLaw],
    study: str,
    confirming: ConfirmationState | None = None,
) -> list[str]:
    """The law figure (PNG, HTML, its data as JSON) and plotly.min.js, which the HTML loads by relative path,
    logged under figures/ of the study's run, with the confirmation where `confirming` has one; returns their
    artifact paths. Publishing again overwrites them."""
    from mlflow.tracking import MlflowClient

    fig = law_figure(laws, study, confirming)
    with tempfile.TemporaryDirectory(prefix="batchsweep-study-") as out:
        folder = Path(out)
        files = {
            f"{LAW_FIGURE}.png": fig.png_bytes(),
            f"{LAW_FIGURE}.html": law_html(fig, laws, confirming).encode(),
            f"{LAW_FIGURE}.json": fig.data_json().encode(),
            PLOTLYJS_FILE: get_plotlyjs().encode(),
        }
        for name, content in files.items():
            (folder / name).write_bytes(content)
        MlflowClient(tracking_uri).log_artifacts(run_id, out, artifact_path=FIGURES_DIR)
    fig.release()
    return [f"{FIGURES_DIR}/{name}" for name in files]
