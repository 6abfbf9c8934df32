"""A real sweep whose trials at one batch size run out of memory (issue 46, admission): each such trial ends
`failed` with the allocator's error, the cell stops after CELL_MEMORY_FAILURES of them instead of trying lr
after lr, the other cell is judged as usual, and the report says which cell stopped and why.

The memory runs out for real: the trial's process gets an address-space limit (RLIMIT_AS) a few MiB above
what it has mapped when training starts, so the allocator's first large request fails, as it does on a node
that is full; the limit is lifted when training ends, so the trial still reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import tiny_spec

from sweeps.driver import run_sweep
from sweeps.search import CELL_MEMORY_FAILURES
from sweeps.settings import runtime_from_env
from sweeps.spec import SweepSpec
from sweeps.stores import open_storage, sweep_studies

pytestmark = pytest.mark.slow


def short_of_memory_at(batch_size: int) -> Any:
    """The real trial function, with training at `batch_size` limited to what the process has mapped + 2 MiB."""

    def trial(config: dict[str, Any]) -> None:
        import resource

        import worker.loop
        from sweeps.trial import run_trial

        real = worker.loop.train

        def limited(cfg: Any, session: Any) -> Any:
            if cfg.batch_size != batch_size:
                return real(cfg, session)
            status = Path("/proc/self/status").read_text()
            mapped = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmSize:"))) * 1024
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (mapped + 2 * 2**20, hard))
            try:
                return real(cfg, session)
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

        worker.loop.train = limited
        try:
            run_trial(config)
        finally:
            worker.loop.train = real

    return trial


def test_a_cell_whose_trials_run_out_of_memory_stops_and_the_report_says_why(ray_session: str, tmp_path: Path) -> None:
    spec = SweepSpec.from_mapping(tiny_spec("oom", resources={"max_concurrent_trials": 1}))
    runtime = runtime_from_env(tmp_path)
    outcome = run_sweep(spec, runtime=runtime, trial_fn=short_of_memory_at(8))
    assert outcome.status == "succeeded"
    stopped = [w for w in outcome.report.warnings if w.startswith("adamw/bs8: stopped with no result")]
    assert len(stopped) == 1 and f"{CELL_MEMORY_FAILURES} of its trials ran out of memory" in stopped[0], (
        outcome.report.warnings
    )
    studies = {s.study_name.rsplit("/", 1)[-1]: s for s in sweep_studies(open_storage(runtime.optuna_storage), "oom")}
    failed = [t.user_attrs for t in studies["bs8"].get_trials(deepcopy=False)]
    # exactly the bound: no more of its lrs were tried once it stopped, and each says what the allocator said
    assert [a["status"] for a in failed] == ["failed"] * CELL_MEMORY_FAILURES, failed
    assert all(a["failure"] == "out_of_memory" and "memory" in a["error"].lower() for a in failed), failed
    # the cell that fits trained and is judged
    cells = {c.batch_size: c for c in outcome.report.optimizers["adamw"].cells}
    assert cells[4].val_loss_mean is not None and cells[8].best_lr is None
