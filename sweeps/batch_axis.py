"""Search the batch axis: the boundary of degradation, not a fixed list of batch sizes. Pure: no Ray,
no Optuna; `sweeps.search.CellSearcher` calls it with the report's verdicts.

A spec may give `batch_sizes: {min, max, resolution, step, against, start}`. Per optimizer, against one
reference (`against`: the baseline at `min`, the default, or the optimizer's own `min`), the search
starts at the reference (`min`), steps up geometrically (x `step`) until a batch size is degraded or
`max` is reached, then bisects geometrically between the largest fine and the smallest degraded size
until their ratio is at most `resolution`. Undecided sizes first get more seeds (adaptive
confirmation, in the searcher), and the bisection then continues on both sides of them. The other
reference is judged on the sizes tested (its bracket is as fine as they allow).

The lattice. Every size comes from a lattice fixed before anything runs, so that the token budget is
rounded once, to a multiple of lcm(lattice) x seq_len, and every cell trains exactly the same tokens:
u x m x 2^a for the mantissas m in [k, 2k), where k is the least whole number with (k + 1) / k <=
resolution (neighbours are then at most `resolution` apart), and u = min / k a multiple of the
workers of a trial (every size splits evenly over them). Mantissas and powers of two keep the lcm
small: 480..16384 at 1.25 is 21 sizes with lcm 1,612,800 sequences (1.65B tokens at seq_len 1024).
Hand-written: no search library has a notion of a verdict-driven bisection on a lattice.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MAX_LATTICE",
    "bracket_of",
    "Chosen",
    "Decision",
    "lattice",
    "lattice_lcm",
    "mantissa_count",
    "out_of_tolerance_twice",
    "plan_for_reference",
    "search_bounds",
]

MAX_LATTICE = 40  # sizes a lattice may hold: each is a possible column of cells (search_bounds: ~0.3 s at 40)

# Why a cell's batch size was tested: the report and MLflow say it for every cell
Chosen = Literal["listed", "reference", "predicted", "step up", "bisect", "speculative"]
Verdict = Literal["fine", "degraded", "undecided"]


def mantissa_count(resolution: float) -> int:
    """The least k with (k + 1) / k <= resolution: mantissas k..2k-1 have neighbours at most that far apart."""
    if not resolution > 1.0:
        raise ValueError(f"resolution must be > 1, got resolution={resolution}")
    return max(1, math.ceil(1.0 / (resolution - 1.0) - 1e-9))


def lattice(min_size: int, max_size: int, resolution: float, workers: int = 1) -> list[int]:
    """The batch sizes a search may test (the module's rule), ascending, from `min_size` to the largest
    lattice size <= `max_size`. ValueError (naming the values) when `min_size` admits no granule."""
    k = mantissa_count(resolution)
    for kk in range(k, 2 * k + 1):  # more mantissas are still fine grained enough; the lcm grows
        if min_size % kk == 0 and (min_size // kk) % workers == 0:
            k = kk
            break
    else:
        raise ValueError(
            f"min={min_size} cannot start a lattice at resolution={resolution} over {workers} worker(s): it must be "
            f"a multiple of {k} x {workers} (k mantissas k..2k-1 of a granule that splits over the workers), "
            f"e.g. min={math.lcm(k, workers) * max(1, round(min_size / math.lcm(k, workers)))}"
        )
    granule = min_size // k
    out: set[int] = set()
    scale = 1
    while granule * k * scale <= max_size:
        out.update(granule * m * scale for m in range(k, 2 * k) if granule * m * scale <= max_size)
        scale *= 2
        if len(out) > MAX_LATTICE:
            break
    return sorted(out)


def lattice_lcm(sizes: Sequence[int]) -> int:
    return math.lcm(*sizes)


@dataclass(frozen=True)
class Decision:
    """What one reference's bisection wants next: a size to test (with why), to wait, or nothing more."""

    kind: Literal["test", "wait", "done"]
    batch_size: int | None = None
    chosen: Chosen | None = None
    why: str = ""


def bracket_of(verdicts: Mapping[int, Verdict | None]) -> tuple[int | None, int | None]:
    """(largest_fine, smallest_degraded) of tested sizes' verdicts: the largest size that is fine with
    every smaller tested size fine, and the smallest degraded size above it (above all, with none fine).
    The one rule: the report's bracket (sweeps.analysis) and the search's plan both use it."""
    largest_fine = None
    for b in sorted(verdicts):
        if verdicts[b] != "fine":
            break
        largest_fine = b
    above = [b for b in sorted(verdicts) if largest_fine is None or b > largest_fine]
    return largest_fine, next((b for b in above if verdicts[b] == "degraded"), None)


def _nearest(sizes: Sequence[int], target: float) -> int:
    return min(sizes, key=lambda b: (abs(math.log(b / target)), b))


def plan_for_reference(
    sizes: Sequence[int],
    verdicts: Mapping[int, Verdict | None],
    *,
    step: float,
    resolution: float,
    passes: Mapping[int, bool | None] | None = None,
    start: int | None = None,
) -> Decision:
    """The next size of one reference's search over the lattice `sizes` from the verdicts of the tested
    sizes (None: not decided yet, its runs are under way).

    - the reference (the smallest size) first; then, with `start` (a predicted boundary), the lattice size
      nearest it, and on from there as below; if the reference is degraded nothing above it can be fine: done
      (undecided, against another optimizer's reference: nothing can be fine, the search still looks
      for the smallest degraded size);
    - largest_fine: the largest size with every tested size up to it fine; smallest_degraded: the
      smallest degraded size above it (the report's bracket);
    - no degraded size yet: step up from the largest tested size to the lattice size nearest x `step`
      (done at the top of the lattice);
    - else bisect, geometrically, the gap between largest_fine and the first tested size above it or
      the gap between the last tested size below smallest_degraded and it, the wider one, while it is
      wider than `resolution` and holds an untested lattice size (undecided sizes in between split the
      bracket into two; each side is then searched on its own); done when neither is.
    - then, with `passes` (per tested size: its mean within the tolerance of the reference, the report's
      degradation_free), the point estimate: bisect between the largest size that passes with every
      smaller one and the next tested size, while wider than `resolution` (sizes that stay undecided at
      their most seeds leave the bracket wide; the point estimate is still narrowed to the resolution).
    - with `passes` and no size degraded, two tested sizes out of tolerance by their means end the way up
      (`out_of_tolerance_twice`): the gap above largest_fine is bisected as below a degraded size, then the
      point estimate's, then done.
    A tested size still undecided by its runs (None) makes the plan wait: its verdict moves it."""
    ref = sizes[0]
    if ref not in verdicts:
        return Decision("test", ref, "reference", f"the reference batch size {ref}")
    if any(v is None for v in verdicts.values()):
        return Decision("wait")
    if verdicts[ref] == "degraded":
        return Decision("done", why=f"the reference {ref} is degraded: no batch size is fine against it")
    if start is not None and len(verdicts) == 1 and len(sizes) > 1:
        predicted = _nearest(sizes[1:], start)
        return Decision("test", predicted, "predicted", f"the predicted boundary, {start}")
    tested = sorted(verdicts)
    # largest_fine None: the reference itself is undecided (against another optimizer's)
    largest_fine, smallest_degraded = bracket_of(verdicts)
    anchor = largest_fine if largest_fine is not None else ref
    if smallest_degraded is None:
        top = tested[-1]
        twice = out_of_tolerance_twice(verdicts, passes) if passes is not None else None
        if twice is not None and largest_fine is not None:
            # the way up ends; the fine end still narrows, as below a degraded size (a speculation's hopeful
            # verdicts can call every tested size fine: then there is no gap above it)
            lo, hi = largest_fine, next((b for b in tested if b > largest_fine), None)
            between = [b for b in sizes if hi is not None and lo < b < hi and b not in verdicts]
            if hi is not None and hi / lo > resolution + 1e-12 and between:
                mid = _nearest(between, math.sqrt(lo * hi))
                return Decision("test", mid, "bisect", f"between {lo} (fine) and {hi} ({verdicts[hi]})")
        if top >= sizes[-1] or twice is not None:
            point = _point_estimate_step(sizes, verdicts, passes, resolution) if passes is not None else None
            why = (
                f"no tested size is degraded up to the top of the range, {top}"
                if twice is None
                else f"nothing decided degraded, but {twice[0]} and {twice[1]} are out of tolerance by their means: "
                "no higher"
            )
            return point or Decision("done", why=why)
        above = [b for b in sizes if b > top]
        nxt = _nearest(above, top * step)
        return Decision("test", nxt, "step up", f"{top} is {verdicts[top]}, nothing degraded yet: x{step:g}")
    inside = [b for b in tested if anchor <= b <= smallest_degraded]
    # with nothing fine, only the degraded end can move: sizes above an undecided reference are never fine
    gaps = {(inside[-2], inside[-1])} | ({(inside[0], inside[1])} if largest_fine is not None else set())
    best: tuple[float, int, int, int] | None = None
    for lo, hi in gaps:
        between = [b for b in sizes if lo < b < hi and b not in verdicts]
        if hi / lo <= resolution + 1e-12 or not between:
            continue
        width = math.log(hi / lo)
        mid = _nearest(between, math.sqrt(lo * hi))
        if best is None or width > best[0] + 1e-12:
            best = (width, lo, hi, mid)
    if best is None and passes is not None:
        point = _point_estimate_step(sizes, verdicts, passes, resolution)
        if point is not None:
            return point
    if best is None:
        return Decision(
            "done",
            why=f"fine up to {largest_fine}, degraded from {smallest_degraded}: as narrow as the lattice and "
            f"resolution {resolution:g} allow",
        )
    _, lo, hi, mid = best
    return Decision("test", mid, "bisect", f"between {lo} ({verdicts[lo]}) and {hi} ({verdicts[hi]})")


def out_of_tolerance_twice(
    verdicts: Mapping[int, Verdict | None], passes: Mapping[int, bool | None]
) -> tuple[int, int] | None:
    """The two smallest tested sizes whose means (fitted non-decreasing: the report's degradation_free) are out
    of tolerance, where there are two; a search steps no higher. Two sizes out of tolerance a lattice step or
    more apart are what noise or one divergence (a retreat to a lower lr) rarely makes of fine sizes, where one
    is not; every size above them is worse by the monotonicity the answer assumes, and each would cost a cell.
    Without this rule a search whose sizes stay undecided at 2 seeds (a Student-t with 1 degree of freedom at
    the Bonferroni level decides little) steps up to the top of the lattice."""
    failing = sorted(b for b, p in passes.items() if p is False and b in verdicts)
    return (failing[0], failing[1]) if len(failing) >= 2 else None


def _point_estimate_step(
    sizes: Sequence[int], verdicts: Mapping[int, Verdict | None], passes: Mapping[int, bool | None], resolution: float
) -> Decision | None:
    tested = sorted(verdicts)
    point = None
    for b in tested:
        if not (passes.get(b) or (b == sizes[0] and verdicts[b] == "fine")):
            break
        point = b
    above = next((b for b in tested if point is not None and b > point), None)
    if point is None or above is None or above / point <= resolution + 1e-12:
        return None
    between = [b for b in sizes if point < b < above and b not in verdicts]
    if not between:
        return None
    mid = _nearest(between, math.sqrt(point * above))
    return Decision(
        "test", mid, "bisect", f"point estimate: between {point} (within tolerance by its mean) and {above} (not)"
    )


def _tree(
    sizes: Sequence[int],
    verdicts: dict[int, Verdict | None],
    passes: dict[int, bool | None],
    bounds: tuple[int, int, int, int, int, int],
    step: float,
    resolution: float,
    start: int | None = None,
) -> tuple[int, int]:
    """(fewest, most) sizes tested from this state on, over the monotone outcomes still possible: sizes[:a]
    fine, sizes[a:c] undecided, sizes[c:] degraded, the means of sizes[:m] within the tolerance, a <= m <= c;
    `bounds` = (a_lo, a_hi, m_lo, m_hi, c_lo, c_hi) from what was revealed."""
    d = plan_for_reference(sizes, verdicts, step=step, resolution=resolution, passes=passes, start=start)
    if d.kind != "test":
        return len(verdicts), len(verdicts)
    j = sizes.index(d.batch_size)  # type: ignore[arg-type]
    a_lo, a_hi, m_lo, m_hi, c_lo, c_hi = bounds
    fewest, most = math.inf, 0
    outcomes: list[tuple[Verdict, bool, tuple[int, int, int, int, int, int]]] = [
        ("fine", True, (max(a_lo, j + 1), a_hi, max(m_lo, j + 1), m_hi, max(c_lo, j + 1), c_hi)),
        ("undecided", True, (a_lo, min(a_hi, j), max(m_lo, j + 1), m_hi, max(c_lo, j + 1), c_hi)),
        ("undecided", False, (a_lo, min(a_hi, j), m_lo, min(m_hi, j), max(c_lo, j + 1), c_hi)),
        ("degraded", False, (a_lo, min(a_hi, j), m_lo, min(m_hi, j), c_lo, min(c_hi, j))),
    ]
    for verdict, passed, b in outcomes:
        al, ah, ml, mh, cl, ch = b
        if not (al <= ah and ml <= mh and cl <= ch and al <= mh and max(ml, al) <= ch):
            continue  # no monotone outcome has this
        f, m = _tree(
            sizes, {**verdicts, d.batch_size: verdict}, {**passes, d.batch_size: passed}, b, step, resolution, start
        )  # type: ignore[dict-item]
        fewest, most = min(fewest, f), max(most, m)
    return int(fewest), most


@functools.lru_cache(maxsize=256)
def search_bounds(sizes: tuple[int, ...], step: float, resolution: float, start: int | None = None) -> tuple[int, int]:
    """(fewest, most) sizes an optimizer's search tests, over every outcome that is monotone in batch
    size (fine up to some size, undecided up to another, degraded above; means within the tolerance up
    to a size in the undecided band), by walking the search's decision tree. The searcher never tests
    more than the most (`sweeps.search`): it is also the cap a non-monotone outcome meets."""
    n = len(sizes)
    return _tree(sizes, {}, {}, (0, n, 0, n, 0, n), step, resolution, start)
