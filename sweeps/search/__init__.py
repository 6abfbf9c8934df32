"""The search: one Optuna study per cell (optimizer, batch size), all cells' trials in one Ray Tune run.

Why not `ray.tune.search.optuna.OptunaSearch`: it drives one study per searcher, hard-codes the
`NopPruner`, records ASHA-stopped trials as COMPLETE with their partial loss and cannot add the
confirmation runs a cell needs after its search. Running one Tuner per cell instead would leave trial
slots idle at every cell's tail. So `CellSearcher` talks to Optuna directly (ask/tell, TPE over log lr, the
studies in a persistent RDB storage) and multiplexes every cell through one Tuner, and
`PerCellASHA` prunes search trials against trials of their own cell only, at equal tokens seen.

A cell's search is a line search in ln lr, with TPE where it has nothing to go on
(`sweeps.plan.next_search_lr`): the smallest batch size starts from three lrs spread over the range
(`coarse_lrs`), every larger one from a bracket around the smaller batch's best lr sqrt-scaled
(`warm_start_lrs`, after that cell's search ended); then each step goes to the vertex of a parabola
through the best lr and its neighbours, or out past the best lr where it lacks a neighbour, one step
at a time, and the search ends when a step would land on a tried lr ("converged", at most
`trials_per_batch_size` trials). A spec with `schedule.warmup_search` then trains each other warm-up
at the best lr (role "warmup", seed 0), and the confirmation runs use the best warm-up
(`sweeps.analysis.pick_warmup`). These design trials run to the end; ASHA stops only TPE's
explorations. Measured on 200 simulated problems (benchmarks/search_efficiency.py, bowls family): with
2 seeds, 0.31 of the tokens of a 12-lr x 2-seed grid, right 0.86 of the time against its 0.84 (with
the default adaptive seeds 0.91 at 0.41; docs/researchers.md has both families).

The Optuna storage is the sweep's source of truth: a re-run of the same sweep id loads the studies,
counts finished trials (never run again), marks trials left RUNNING by an interruption as FAIL and
asks for replacements.

The parts, each importing only those before it:

- `state`: a cell read once from its study: `StudyRead` and the frozen snapshot `CellState`.
- `policy`: what a cell runs next, and what a look at the verdicts changes; pure over snapshots.
- `readout`: what the searcher shows: the trials for the analysis, the report, the live progress.
- `adapter`: `CellSearcher`, Ray Tune's `Searcher` over Optuna's storage.
"""

from sweeps.search.adapter import (
    GROWTH_PASSES,
    CellSearcher,
    InfrastructureFailures,
    collect_results,
    sampler_seed,
    spec_fingerprint,
)
from sweeps.search.state import (
    CELL_LOST_TRIALS,
    CELL_MEMORY_FAILURES,
    FINISHED_STATES,
    LOST_WITH_PROCESS,
    TRIAL_RETRIES,
    CellState,
    Run,
    StudyRead,
)

__all__ = [
    "CELL_LOST_TRIALS",
    "CELL_MEMORY_FAILURES",
    "FINISHED_STATES",
    "GROWTH_PASSES",
    "LOST_WITH_PROCESS",
    "TRIAL_RETRIES",
    "CellSearcher",
    "CellState",
    "InfrastructureFailures",
    "Run",
    "StudyRead",
    "collect_results",
    "sampler_seed",
    "spec_fingerprint",
]
