"""What a cell runs next, from snapshots of the cells (`sweeps.search.state`) and the spec; pure, beside
`sweeps.plan` (the lrs) and `sweeps.batch_axis` (the sizes), whose rules it applies.

- `next_run`: a cell's next trial: a step of its lr search (`Ask`, after the design points to enqueue),
  else a probe below a diverged confirmation run, else a warm-up, confirmation or check run at its best lr
  (`Run`), else None.
- `grow`: one look at the verdicts when no cell has a run to give: more confirmation runs where a boundary
  verdict is within noise (adaptive confirmation), a check at a second lr where a cell is degraded, and,
  for a search of the batch axis, the next size (or a speculative one, or one dropped or needed again).
  It returns the changes in the order it decided them; each decision sees the ones before it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from optuna.trial import TrialState

from sweeps.analysis import Report, cells_to_check, cells_to_decide_ends, cells_to_extend
from sweeps.batch_axis import out_of_tolerance_twice, plan_for_reference
from sweeps.plan import cell_key, coarse_lrs, warm_start_lrs
from sweeps.search.state import CellState, Run, lr_of
from sweeps.spec import SweepSpec

Cells = Mapping[str, CellState]  # cell key -> its snapshot, in `cell_order`


@dataclass(frozen=True)
class Ask:
    """A search trial: Optuna's next (the first design point waiting, else TPE's draw), once `points`
    ((lr, design), the design points of this step) are enqueued."""

    points: tuple[tuple[float, str], ...] = ()


def next_run(cells: Cells, key: str, spec: SweepSpec) -> Ask | Run | None:
    """The next trial of cell `key`, or None: it waits (for another cell's search, or its own running
    step) or has nothing left."""
    cell = cells[key]
    if cell.abandoned or cell.stop_reason is not None:
        return None
    if cell.search_asked < cell.n_search and not cell.search_done:
        return _search_step(cells, cell, spec)
    if (probe := cell.probe_lr) is not None:
        # a confirmation run diverged with no completed search lr below it: a search trial just below
        return Ask(((probe, "probe"),))
    if not cell.search_done or (lr := cell.best_lr) is None:
        return None
    # first the other warm-ups at the best lr (seed 0, as the search), then the confirmation runs at the
    # best of them, then those of a check at the second lr
    if cell.warmups_wanted:
        return Run("warmup", 0, lr, cell.warmups_wanted[0])
    if cell.seeds_wanted:
        return Run("confirm", cell.seeds_wanted[0], lr, cell.best_warmup)
    if cell.checks_wanted and (second := cell.check_lr) is not None:
        return Run("confirm", cell.checks_wanted[0], second, cell.best_warmup)
    return None


def _search_step(cells: Cells, cell: CellState, spec: SweepSpec) -> Ask | None:
    previous = cells[cell.previous] if cell.previous is not None else None
    if previous is not None and not previous.search_done:
        return None  # the smaller batch's final best lr seeds this cell's search: wait for its search to end
    if not cell.read.all_trials:
        return Ask(_first_points(cells, cell, previous, spec))
    if any(t.state == TrialState.WAITING for t in cell.read.all_trials):
        return Ask()  # design points still queued
    kind, lr = cell.next_lr
    if kind == "wait":
        return None
    return Ask(((lr, kind),)) if kind in ("vertex", "step") else Ask()  # type: ignore[arg-type]


def _first_points(
    cells: Cells, cell: CellState, previous: CellState | None, spec: SweepSpec
) -> tuple[tuple[float, str], ...]:
    """The search's start: a bracket where the smaller batch's best lr scales to (up to the bounds, and
    towards a larger size's best lr where one was searched: a bisection), else three lrs over the range
    the spec gave."""
    if previous is not None and (best := previous.best) is not None:
        larger = cells[cell.following] if cell.following is not None else None
        upper = larger.best if larger is not None and larger.search_done else None
        lrs = warm_start_lrs(
            best.params["lr"],
            previous.batch_size,
            cell.batch_size,
            lr_min=cell.lr_min,
            lr_max=cell.lr_max,
            upper=(lr_of(upper), larger.batch_size) if upper and larger else None,
        )
        design = "bracket"
    else:
        lrs, design = coarse_lrs(spec.lr.min, spec.lr.max), "coarse"
    return tuple((lr, design) for lr in lrs[: cell.n_search])


# ---- growth ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoreSeeds:
    """The cell's confirmation runs raised to `n_seeds` (adaptive confirmation)."""

    key: str
    n_seeds: int
    note: str  # what moved, in words (the driver logs it)


@dataclass(frozen=True)
class Check:
    """The cell's degraded verdict is to be confirmed at its second lr."""

    key: str
    note: str


@dataclass(frozen=True)
class Abandon:
    """A speculative size's runs stop (`abandoned`), or go on again (not `abandoned`): `why` is its reason now."""

    key: str
    abandoned: bool
    why: str
    note: str


@dataclass(frozen=True)
class Open:
    """A new cell: the batch size the search of the batch axis tests next."""

    optimizer: str
    batch_size: int
    chosen: str
    why: str
    note: str


Change = MoreSeeds | Check | Abandon | Open


@dataclass
class Growth:
    """One look's changes, in the order decided, and per optimizer why its batch-axis search stopped (where
    this look found it stopped)."""

    changes: list[Change] = field(default_factory=list)
    done_why: dict[str, str] = field(default_factory=dict)


class _Look:
    """The cells as one look's changes so far leave them, and those changes."""

    def __init__(self, cells: Cells, spec: SweepSpec) -> None:
        self.cells, self.spec, self.growth = dict(cells), spec, Growth()

    def cell(self, optimizer: str, batch_size: int) -> CellState | None:
        return self.cells.get(cell_key(optimizer, batch_size))

    def change(self, change: Change, **plan: object) -> None:
        self.growth.changes.append(change)
        if not isinstance(change, Open):  # a new cell plays no part in the rest of a look
            self.cells[change.key] = self.cells[change.key].with_plan(**plan)

    def extend(self, cells: list[tuple[str, int]]) -> bool:
        """`seeds_step` more confirmation runs (up to `seeds_max`) for these cells; True when some got more."""
        spec, extended = self.spec, False
        for opt, bs in cells:
            cell = self.cell(opt, bs)
            if cell is not None and cell.n_seeds < spec.seeds_max:
                n = min(spec.seeds_max, cell.n_seeds + spec.seeds_step)
                self.change(
                    MoreSeeds(cell.key, n, f"{cell.key}: within noise at the boundary, {n} confirmation runs now"),
                    n_seeds=n,
                )
                extended = True
        return extended

    def check(self, cells: list[tuple[str, int]]) -> bool:
        """Confirm these cells' degraded verdicts at their second lr where one exists and `headroom` holds
        as many runs there as the cell has at its own lr (a check with fewer seeds would seldom be decided,
        and a degraded verdict needs both lrs decided); True when some cell will."""
        checked = False
        for opt, bs in cells:
            cell = self.cell(opt, bs)
            if cell is None or cell.check or (second := cell.check_lr) is None or cell.headroom < cell.n_seeds:
                continue
            note = f"{cell.key}: degraded at lr={cell.best_lr:.3g}, confirmed at lr={second:.3g} too"
            self.change(Check(cell.key, note), check=True)
            checked = True
        return checked


def grow(cells: Cells, spec: SweepSpec, report: Callable[[], Report]) -> Growth:
    """One look at the verdicts (see the module); `report()` gives the report of the cells as they are
    (built only where the look needs it)."""
    look = _Look(cells, spec)
    if spec.batch_search is None:
        # adaptive confirmation (`seeds: {min, max, step}`), once every cell has its runs: the verdicts
        # are the report's own (`cells_to_extend`, `cells_to_check`)
        if spec.seeds_max > spec.seeds_min and all(c.finished for c in cells.values()):
            r = report()
            look.extend(cells_to_extend(r, seeds_max=spec.seeds_max))
            look.check(cells_to_check(r))
    else:
        _BatchAxis(look, report()).decide()
    return look.growth


class _BatchAxis:
    """One look of the batch-axis search (sweeps/batch_axis.py) per optimizer whose cells have all
    finished: more seeds where its bracket has undecided sizes (adaptive confirmation, against the
    search's reference), else the next size the plan asks for. An optimizer still running may add the
    next step up speculatively while its largest size confirms (a free trial slot asked)."""

    def __init__(self, look: _Look, report: Report) -> None:
        spec = look.spec
        assert spec.batch_search is not None
        self.look, self.spec, self.search = look, spec, spec.batch_search
        self.against, self.ref_b, self.cap = self.search.against, spec.reference_batch_size, spec.sizes_per_optimizer[1]
        self.rows = {(o, c.batch_size): c for o, r in report.optimizers.items() for c in r.cells}
        refs = (self.against,)
        self.extend = cells_to_extend(report, seeds_max=spec.seeds_max, references=refs) if spec.seeds_step else []
        self.checks = cells_to_check(report, references=refs) if spec.seeds_step else []
        self.ends: list[tuple[str, int]] = []
        if spec.seeds_step and self.search.decide_ends:
            full = [(c.optimizer, c.batch_size) for c in look.cells.values() if c.n_seeds >= spec.seeds_max]
            self.ends = cells_to_decide_ends(report, seeds_max=spec.seeds_max, references=refs, full=full)

    def decide(self) -> None:
        for opt in self.spec.optimizer_names:
            self._drop_speculative(opt)
            if self._ref(opt).finished and all(c.finished for c in self._mine(opt)):
                self._next_size(opt)
            else:
                self._speculate(opt)

    def _mine(self, opt: str) -> list[CellState]:
        return [c for c in self.look.cells.values() if c.optimizer == opt]

    def _ref(self, opt: str) -> CellState:
        ref = self.look.cell(self.spec.degradation.baseline if self.against == "baseline" else opt, self.ref_b)
        assert ref is not None
        return ref

    def _decided(self, opt: str) -> dict[int, str | None]:
        """Batch size -> its verdict against the search's reference, once it and the reference finished."""
        ref = self._ref(opt)
        out: dict[int, str | None] = {}
        for c in self._mine(opt):
            if not c.abandoned:
                row = self.rows.get((c.optimizer, c.batch_size)) if c.finished and ref.finished else None
                out[c.batch_size] = getattr(row.verdict, self.against) if row is not None else None
        return out

    def _passes(self, opt: str) -> dict[int, bool | None]:
        """Batch size -> its mean within the tolerance of the search's reference (the report's
        degradation_free), for each of `opt`'s sizes not abandoned; None: not judged yet."""
        return {
            c.batch_size: getattr(row.degradation_free, self.against)
            if (row := self.rows.get((opt, c.batch_size))) is not None
            else None
            for c in self._mine(opt)
            if not c.abandoned
        }

    def _drop_speculative(self, opt: str) -> None:
        """A speculative size still running is not needed once a size below it is degraded, or is the second
        out of tolerance (`sweeps.batch_axis.out_of_tolerance_twice`: the search steps no higher)."""
        decided = self._decided(opt)
        twice = out_of_tolerance_twice(decided, self._passes(opt))  # type: ignore[arg-type]
        for c in self._mine(opt):
            if c.chosen == "speculative" and not c.abandoned and not c.finished:
                below = [
                    b for b, v in decided.items() if b < c.batch_size and (v == "degraded" or (twice and b == twice[1]))
                ]
                if below:
                    b = min(below)
                    said = "is degraded" if decided[b] == "degraded" else "is the second size out of tolerance"
                    note = f"{c.key}: speculative size not needed, {b} below it {said}"
                    why = f"{c.why}; not needed: {b} {said}"
                    self.look.change(Abandon(c.key, True, why, note), abandoned=True, why=why)

    def _next_size(self, opt: str) -> None:
        """Every size of `opt` finished: more seeds or a check where the verdicts ask, else the plan's next size."""
        look, search, ref = self.look, self.search, self._ref(opt)
        ours = [(o, b) for o, b in self.extend if o == opt or (o, b) == (ref.optimizer, self.ref_b)]
        if look.extend(ours) | look.check([(o, b) for o, b in self.checks if o == opt]):
            return
        d = plan_for_reference(
            self.spec.lattice,
            self._decided(opt),  # type: ignore[arg-type]
            step=search.step,
            resolution=search.resolution,
            passes=self._passes(opt),
            start=search.start_for(opt),
        )
        at_cap = d.kind == "test" and len(self._mine(opt)) >= self.cap
        ends = [(o, b) for o, b in self.ends if o == opt or (o, b) == (ref.optimizer, self.ref_b)]
        if (d.kind == "done" or at_cap) and look.extend(ends):
            return  # the search is done, its bracket's ends get runs first (`decide_ends`): their verdicts may move it
        if at_cap:
            look.growth.done_why[opt] = f"stopped at the cap of {self.cap} batch sizes; next would be {d.batch_size}"
        elif d.kind == "test" and (old := look.cell(opt, d.batch_size)) is not None:
            # a speculative size dropped before, needed after all: its runs go on
            why = f"{old.why}; needed after all: {d.why}"
            look.change(Abandon(old.key, False, why, ""), abandoned=False, why=why)
        elif d.kind == "test":
            look.change(
                Open(opt, d.batch_size, d.chosen, d.why, f"{opt}: batch size {d.batch_size} ({d.chosen}: {d.why})")
            )
        elif d.kind == "done":
            look.growth.done_why[opt] = d.why

    def _speculate(self, opt: str) -> None:
        """The largest sizes confirm and a trial slot is free: step up as if they end fine, where that is
        likely (every confirming size's search found an lr within the tolerance of the reference: the
        search's best is biased low, so a size above it will likely be degraded)."""
        mine, ref, search = self._mine(opt), self._ref(opt), self.search
        pending = [c for c in mine if not c.abandoned and not c.finished]
        if len(mine) >= self.cap or any(c.chosen == "speculative" for c in pending):
            return
        if not pending or not all(c.search_done for c in pending) or not ref.search_done:
            return
        ref_row = self.rows.get((ref.optimizer, self.ref_b))
        ref_loss = None if ref_row is None else ref_row.val_loss_mean or ref_row.search_best_val_loss
        likely = [getattr(self.rows.get((opt, c.batch_size)), "search_best_val_loss", None) for c in pending]
        tolerance = self.spec.degradation.tolerance
        if ref_loss is None or any(v is None or v > (1 + tolerance) * ref_loss for v in likely):
            return
        hopeful = {b: ("fine" if v is None else v) for b, v in self._decided(opt).items()}
        # the sizes confirming taken as fine and within tolerance, the others as judged: two sizes out of
        # tolerance end the way up here too
        passing = {b: (True if hopeful[b] == "fine" and p is None else p) for b, p in self._passes(opt).items()}
        d = plan_for_reference(
            self.spec.lattice,
            hopeful,  # type: ignore[arg-type]
            step=search.step,
            resolution=search.resolution,
            passes=passing,
            start=search.start_for(opt),
        )
        # a size with a cell already (one dropped before) is not opened again: its study has a trial running,
        # and only the plan's own next size takes a dropped one back (`_next_size`)
        if d.kind == "test" and d.chosen in ("step up", "predicted") and self.look.cell(opt, d.batch_size) is None:
            waiting = ", ".join(str(c.batch_size) for c in pending)
            move = f"x{search.step:g}" if d.chosen == "step up" else d.why  # or "the predicted boundary, N"
            why = f"{d.chosen} while {waiting} confirm(s): {move}"
            note = f"{opt}: batch size {d.batch_size} speculatively, while {waiting} confirm(s)"
            self.look.change(Open(opt, d.batch_size, "speculative", why, note))
