"""The study's law figure and page with its confirmation at the target (`dashboards.study`): the confirmation
sweep's bracket drawn at the target's budget beside the prediction, the outcome (held, missed by a factor,
undecided) in the panel's title, legend and the page's words; pending or not run, the page says so; a study
that does not confirm draws none. Laws and confirmations written by hand: no fit, no sweep, no MLflow."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dashboards.study import ConfirmationState, law_figure, law_page
from sweeps.law import Confirmation, OptimizerLaw

BUDGETS = (8192.0, 32768.0, 131072.0)  # the scales' budgets; their brackets [8, 16), [16, 32), [32, 64)
TARGET = 524288.0  # tokens at the target, where the law predicts B* 64 [40, 100]
PREDICTED = {"value": 64.0, "low": 40.0, "high": 100.0}


def law(optimizer: str = "adamw") -> OptimizerLaw:
    brackets = [(8, 16), (16, 32), (32, 64)]
    return OptimizerLaw.model_validate(
        {
            "optimizer": optimizer,
            "against": "baseline",
            "reference": "adamw",
            "scales": [
                {"tokens": t, "params": None, "largest_fine": lo, "smallest_degraded": hi}
                for t, (lo, hi) in zip(BUDGETS, brackets, strict=True)
            ],
            "tokens_exponent": 0.5,
            "tokens_interval": (0.4, 0.6),
            "sigma": 0.2,
            "fitted_scales": 3,
            "target_tokens": TARGET,
            "predicted": PREDICTED,
            "lr": {"value": 2e-3, "low": 1e-3, "high": 4e-3},
            "line": [{"tokens": t, "value": 8.0 * (t / 8192) ** 0.5, "low": 6.0, "high": 200.0} for t in BUDGETS]
            + [{"tokens": TARGET} | PREDICTED],
        }
    )


def confirmation(
    lo: int | None, hi: int | None, held: bool | None, miss: float, optimizer: str = "adamw"
) -> Confirmation:
    says = {True: "held: ...", False: "missed: ...", None: "undecided: ..."}[held]
    return Confirmation.model_validate(
        {
            "optimizer": optimizer,
            "against": "baseline",
            "predicted": PREDICTED,
            "tested": [4, 32, 64, 128],
            "bracket": {"tokens": TARGET, "params": None, "largest_fine": lo, "smallest_degraded": hi},
            "held": held,
            "miss": miss,
            "lr_predicted": 2e-3,
            "lr_found": 2.5e-3,
            "lr_at": 64,
            "says": f"{says} B* in [{lo or '?'}, {hi or '?'})",
        }
    )


def series_of(fig: Any, panel: int = 0) -> dict[str, Any]:
    return {s.name: s for s in fig.desc.panels[panel].series}


def traces_of(fig: Any) -> dict[str, Any]:
    return {t.name: t for t in fig.plotly_fig.data}


def state(*judged: Confirmation) -> dict[str, Any]:
    """The confirmation as the service sends it to the process that draws the page."""
    return {"status": "succeeded", "sweep_id": "s-s4", "note": None, "confirmations": [c.model_dump() for c in judged]}


def test_a_confirmation_that_held_and_one_that_missed_are_drawn_at_the_target_with_their_outcome() -> None:
    held = confirmation(64, 128, True, 1.0)
    missed = confirmation(16, 32, False, 2.0, optimizer="merit")
    laws = [law(), law("merit")]
    fig = law_figure(laws, "s", ConfirmationState.from_json(state(held, missed)))
    first, second = fig.desc.panels
    assert first.title == "adamw against adamw: confirmation held"
    assert second.title == "merit against adamw: confirmation missed by x2.00"
    for panel, (lo, hi), said in ((0, (64.0, 128.0), "held"), (1, (16.0, 32.0), "missed by x2.00")):
        drawn = series_of(fig, panel)
        fine = drawn[f"confirmation ({said}): largest size decided fine"]
        degraded = drawn[f"confirmation ({said}): smallest size decided degraded"]
        assert (fine.x, fine.y, degraded.x, degraded.y) == ((TARGET,), (lo,), (TARGET,), (hi,))
        assert drawn["prediction at the target"].x == (TARGET,)  # beside the prediction
        # the scales' brackets are drawn by the same code: the same names without the confirmation's prefix
        assert drawn["largest size decided fine"].x == BUDGETS
        words = [a.text for a in fig.desc.panels[panel].annotations]
        assert f"confirmed: B* in [{lo:.0f}, {hi:.0f}), lr 0.0025 at B 64 (law 0.002)" in words
    # the HTML figure has the traces; the figure's data keeps each law's confirmation
    trace = traces_of(fig)["confirmation (missed by x2.00): smallest size decided degraded"]
    assert tuple(trace.x) == (TARGET,) and tuple(trace.y) == (32.0,)
    assert [x["confirmation"]["held"] for x in fig.data] == [True, False]
    # the page says each outcome in words, the lr found beside the lr law's
    page = law_page([x.model_dump() for x in laws], "s", "/static/plotly.min.js", state(held, missed))
    assert 'data-confirmation="succeeded">confirmation at the target: done (sweep s-s4)</p>' in page
    assert '<li data-confirmed="adamw.baseline">adamw against adamw: held — held: ... B* in [64, 128)' in page
    assert '<li data-confirmed="merit.baseline">merit against adamw: missed by x2.00 — missed: ...' in page
    assert "lr 0.0025 found at B 64, the lr law said 0.002" in page
    assert 'src="/static/plotly.min.js"' in page


def test_an_open_end_is_drawn_as_the_scales_are_and_leaves_it_undecided() -> None:
    open_top = confirmation(128, None, None, 1.0)
    fig = law_figure([law()], "s", ConfirmationState.from_json(state(open_top)))
    drawn = series_of(fig)
    assert fig.desc.panels[0].title == "adamw against adamw: confirmation undecided"
    assert drawn["confirmation (undecided): largest size decided fine"].y == (128.0,)
    degraded = drawn["confirmation (undecided): smallest size decided degraded"]
    assert degraded.x == degraded.y == ()  # an open end: nothing drawn, as at a scale open there
    assert "confirmed: B* in [128, ?), lr 0.0025 at B 64 (law 0.002)" in [
        a.text for a in fig.desc.panels[0].annotations
    ]


def test_a_study_without_confirmation_draws_none_and_a_pending_or_not_run_one_says_so() -> None:
    laws = [law()]
    for confirming in (None, {"status": "running", "sweep_id": "s-s4"}, {"status": "not_run", "note": "no law"}):
        fig = law_figure(laws, "s", ConfirmationState.from_json(confirming) if confirming else None)
        assert not [s.name for s in fig.desc.panels[0].series if s.name.startswith("confirmation")]
        assert not [t.name for t in fig.plotly_fig.data if (t.name or "").startswith("confirmation")]
        assert "confirmation" not in fig.data[0]
    assert law_figure(laws, "s").desc.panels[0].title == "adamw against adamw"
    plain = law_page([x.model_dump() for x in laws], "s", "/p.js")
    assert 'id="confirmation"' not in plain and "confirmation at the target" not in plain
    pending = law_page([x.model_dump() for x in laws], "s", "/p.js", {"status": "running", "sweep_id": "s-s4"})
    assert "confirmation at the target: pending (sweep s-s4), running" in pending
    assert "adamw against adamw: confirmation pending" in pending  # the panel's title too
    note = "no law predicts a B* inside 4..8"
    not_run = law_page([x.model_dump() for x in laws], "s", "/p.js", {"status": "not_run", "note": note})
    assert f'data-confirmation="not_run">confirmation at the target: not run: {note}</p>' in not_run
    assert "adamw against adamw: confirmation not run" in not_run


def test_the_scales_points_are_drawn_with_their_95_percent_bars_where_they_have_one() -> None:
    data = law().model_dump()
    data["scales"][0] |= {"point": 12.0, "point_sd": 0.2}
    data["scales"][2] |= {"point": 45.0, "point_sd": 0.1}
    fig = law_figure([OptimizerLaw.model_validate(data)], "s")
    points = series_of(fig)["the sweep's point, 95 % interval"]
    assert points.x == (BUDGETS[0], BUDGETS[2]) and points.y == (12.0, 45.0)  # the middle scale has none
    assert points.err_low == pytest.approx((12 - 12 * math.exp(-0.392), 45 - 45 * math.exp(-0.196)), rel=1e-12)
    assert points.err_high == pytest.approx((12 * math.exp(0.392) - 12, 45 * math.exp(0.196) - 45), rel=1e-12)
    assert tuple(traces_of(fig)["the sweep's point, 95 % interval"].y) == (12.0, 45.0)
    # a law without points draws the series empty
    assert series_of(law_figure([law()], "s"))["the sweep's point, 95 % interval"].x == ()
