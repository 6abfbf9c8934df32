"""What a figure shows, for any renderer: panels of series, annotations and axes (`FigureDesc`), plain
frozen dataclasses that `dashboards.figures` builds from a sweep's tables and `dashboards.render` draws.
Lengths (line widths, marker sizes, font sizes, text offsets) are in points (1/72 inch)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

GREY = "#555555"  # annotations, notes and neutral lines

# --------------------------------------------------------------------------------------------------
# The description: what a figure shows, for any renderer
# --------------------------------------------------------------------------------------------------

Kind = Literal["line", "scatter", "errorbar", "band", "hline", "vline"]
Dash = Literal["solid", "dash", "dot", "dashdot"]
Symbol = Literal["circle", "star", "diamond", "triangle-up", "x"]
Scale = Literal["linear", "log", "log2"]
Ref = Literal["data", "panel"]
LegendPlace = Literal["outside", "lower left", "best", "none"]


@dataclass(frozen=True)
class Style:
    """How a series looks. `dash` None: no line (markers only); `symbol` None: no markers. `hollow`:
    the marker's outline only, in `edge` (None: the series colour). `alpha` is the opacity of the
    whole series (of a band: its fill). `z`: stacking, higher on top (a renderer that stacks in
    drawing order, plotly, draws in description order)."""

    color: str
    dash: Dash | None = "solid"
    width: float = 1.5  # line width, pt
    symbol: Symbol | None = None
    size: float = 6.0  # marker diameter, pt
    hollow: bool = False
    edge: str | None = None  # marker outline colour; None: the series colour
    edge_width: float = 1.0  # marker outline width, pt
    alpha: float = 1.0
    z: float = 2.0


@dataclass(frozen=True)
class Series:
    """One thing drawn in a panel, in data units.

    Kinds: "line" joins x/y in order (markers too when the style has a symbol); "scatter" marks x/y;
    "errorbar" is a line with a vertical bar from y - err_low to y + err_high at each point; "band"
    spans y[0]..y[1] across the panel; "hline" is y[0] across the panel; "vline" x[0] up it.

    `name` is the series' legend entry, shown when `legend` (renderers key each panel's or the
    figure's legend in description order); a series with `legend` and no points is a key: a
    legend entry only. `group` ties series together (plotly shows and hides a group at once).
    `text`: per point, what it is (the run it comes from); `hover`: per point, what the HTML shows
    under the pointer (lines split at "\\n"); both empty or one per point.
    `top`: for points without a y to place (a diverged trial, a target never reached): they are
    drawn at that fraction (0..1) of the panel's height where a renderer can pin to the panel
    (matplotlib), else at `y`, which then holds a data value above every other point (plotly).
    """

    kind: Kind
    name: str
    style: Style
    x: tuple[float, ...] = ()
    y: tuple[float, ...] = ()
    err_low: tuple[float, ...] = ()
    err_high: tuple[float, ...] = ()
    legend: bool = False
    group: str = ""
    text: tuple[str, ...] = ()
    hover: tuple[str, ...] = ()
    top: float | None = None

    def __post_init__(self) -> None:
        n = len(self.x)
        if self.kind in ("line", "scatter", "errorbar") and len(self.y) != n:
            raise ValueError(f"{self.kind} {self.name!r}: {n} x but {len(self.y)} y")
        if self.kind == "errorbar" and not (len(self.err_low) == len(self.err_high) == n):
            raise ValueError(f"errorbar {self.name!r}: one err_low and err_high per point")
        need = {"band": (0, 2), "hline": (0, 1), "vline": (1, 0)}.get(self.kind)
        if need is not None and (len(self.x), len(self.y)) != need:
            raise ValueError(f"{self.kind} {self.name!r} takes {need[0]} x and {need[1]} y")
        for field in ("text", "hover"):
            if getattr(self, field) and len(getattr(self, field)) != n:
                raise ValueError(f"{self.kind} {self.name!r}: {field} needs one entry per point")

    @property
    def is_key(self) -> bool:
        """A legend entry only: nothing drawn in the panel."""
        return self.kind in ("line", "scatter", "errorbar") and not self.x


@dataclass(frozen=True)
class Annotation:
    """Text at a point: `x`/`y` in data units, or for `xref`/`yref` "panel" as a fraction (0..1) of
    the panel; `offset` moves the text right/up from there, in pt. The text starts at the point
    (`center`: is centred on it) and stands on it (`middle`: is centred on it vertically)."""

    text: str
    x: float
    y: float
    xref: Ref = "data"
    yref: Ref = "data"
    offset: tuple[float, float] = (0.0, 0.0)
    color: str = GREY
    size: float = 9.0  # pt
    bold: bool = False
    center: bool = False
    middle: bool = False


@dataclass(frozen=True)
class Axis:
    """`scale` "log2" is logarithmic in base 2 (log2 and log differ only in where a renderer puts
    its own ticks). `ticks`: the only labelled ticks, labelled `tick_labels` (same length; no minor
    labels); empty: the renderer's. `limits` in data units; None: fitted to what is drawn. `plain`:
    log tick labels as plain numbers (4, 10, 20, 0.001), never 10^k: counts and lrs read as such."""

    label: str = ""
    scale: Scale = "linear"
    ticks: tuple[float, ...] = ()
    tick_labels: tuple[str, ...] = ()
    limits: tuple[float, float] | None = None
    plain: bool = False

    def __post_init__(self) -> None:
        if len(self.ticks) != len(self.tick_labels):
            raise ValueError(f"axis {self.label!r}: one label per tick")


@dataclass(frozen=True)
class Panel:
    """One set of axes. `legend`: where the legend of this panel's series goes in the PNG (outside
    to the right, or inside); the HTML has one legend for the figure with every series that has
    `legend`, in panel and series order. `grid` "both": minor grid lines too (log axes).
    `blank`: no ticks or grid at all: the panel has nothing on its axes (its annotations say why)."""

    x: Axis
    y: Axis
    series: tuple[Series, ...] = ()
    annotations: tuple[Annotation, ...] = ()
    title: str = ""
    title_size: float = 10.0  # pt
    legend: LegendPlace = "none"
    grid: Literal["major", "both"] = "major"
    blank: bool = False


@dataclass(frozen=True)
class FigureDesc:
    """A figure: its `title`, its panels side by side (`share_y`: one y axis for all, labelled on the
    first panel), and the PNG's `size` in inches (the HTML is as wide as its page and
    PLOTLY_HEIGHT px tall). A single panel without a title of its own carries the figure's title."""

    title: str
    panels: tuple[Panel, ...]
    size: tuple[float, float]  # inches
    share_y: bool = False

    def series(self) -> Iterator[tuple[int, Series]]:
        """(panel index, series) in description order."""
        for i, p in enumerate(self.panels):
            for s in p.series:
                yield i, s
