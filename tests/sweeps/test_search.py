"""CellSearcher without Ray: Tune's calls (suggest, on_trial_result, on_trial_complete) made by hand
against a real Optuna storage (SQLite in tmp)."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from ray.tune.search import Searcher

from sweeps.plan import BRACKET_STEP
from sweeps.search import CellSearcher, collect_results
from sweeps.spec import SweepSpec
from sweeps.stores import open_storage

SPEC = """
name: unit
model: {preset: gpt2-nano, seq_len: 32}
optimizers: [{name: adamw}]
batch_sizes: [4, 16]
token_budget: 4096
lr: {min: 1.0e-3, max: 1.0e-1, trials_per_batch_size: 3}
seeds: 2
degradation: {tolerance: 0.05, baseline: adamw}
"""


def done(val: float | None, status: str = "completed", tokens: int = 4096) -> dict:
    out: dict = {"status": status, "tokens": tokens, "step": 10, "train_time_s": 1.0}
    if val is not None:
        out["val_loss"] = val
    return out


@pytest.fixture
def storage(tmp_path: Path) -> optuna.storages.BaseStorage:
    return open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")


def test_cells_search_then_confirm_with_warm_start_from_the_final_best(storage: optuna.storages.BaseStorage) -> None:
    s = CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage)
    a = s.suggest("t1")
    assert a["cell"] == "adamw/bs4" and a["role"] == "search" and a["seed"] == 0
    assert s.suggest("t2")["cell"] == "adamw/bs4"
    assert s.suggest("t3")["cell"] == "adamw/bs4"
    # the larger batch waits for the smaller one's whole search: its warm start is that search's final best
    assert s.suggest("t4") is None
    s.on_trial_result("t1", {"tokens": 2048, "val_loss": 5.0})
    s.on_trial_complete("t1", done(4.0))
    assert s.suggest("t4") is None  # a first result is not the final best
    s.on_trial_complete("t2", done(3.5))
    s.on_trial_complete("t3", done(None, status="diverged", tokens=1024))
    # bs4, the reference, searches one lr more (it has no warm start): a step from the coarse start's best
    extra = s.suggest("t3b")
    assert (extra["cell"], extra["role"], extra["seed"]) == ("adamw/bs4", "search", 0)
    assert s.suggest("t4") is None  # its result moves the search: nothing else to run meanwhile
    s.on_trial_complete("t3b", done(3.55))
    study4 = s.cells[0].study
    best_lr = study4.trials[1].params["lr"]  # t2's, the final best of bs4
    # bs4's search is over: its confirmation runs (seeds 1 and 2, never the search seed 0) use that lr
    confirm = [s.suggest("t4"), s.suggest("t5")]
    assert [(c["role"], c["seed"], c["cell"]) for c in confirm] == [
        ("confirm", 1, "adamw/bs4"),
        ("confirm", 2, "adamw/bs4"),
    ]
    assert all(c["lr"] == pytest.approx(best_lr) for c in confirm)
    # warm start: bs16's first lrs bracket bs4's final best sqrt(16/4)=2x scaled, 0.5 either side in ln lr
    b = s.suggest("t6")
    centre = min(2 * best_lr, 0.1)
    assert b["cell"] == "adamw/bs16" and b["lr"] == pytest.approx(centre)
    c = s.suggest("t7")
    assert c["cell"] == "adamw/bs16" and c["lr"] == pytest.approx(centre * math.exp(-0.5))
    # the bracket is the search's design: trained to the end, never stopped by ASHA
    assert b["prunable"] is False and c["prunable"] is False
    # the train config of a trial is the spec's, at this cell and lr, with checkpoints at every evaluation
    # (at most one per 300 s of training: the spec's default)
    assert c["train"]["batch_size"] == 16 and c["train"]["optimizer"]["lr"] == c["lr"]
    assert c["train"]["checkpoints"] == {"every_tokens": None, "min_interval_s": 300}
    # a diverged trial is a result: a bad lr (inf) that TPE learns from, not an error
    diverged = study4.trials[2]
    assert diverged.state == TrialState.COMPLETE and math.isinf(diverged.value)
    assert diverged.user_attrs["status"] == "diverged"
    s.on_trial_complete("t4", done(3.6))
    s.on_trial_complete("t5", done(3.62))
    assert s.states()["adamw/bs4"].finished
    progress = s.progress().cells[0]
    # what users see live says which number it is: the search's minimum, or the confirmations' mean
    assert progress.search_best_val_loss == 3.5
    assert progress.confirmed_val_loss_mean == pytest.approx(3.61) and progress.seeds_done == 2

    s.on_trial_complete("t6", done(3.8, status="running", tokens=2048))  # stopped by ASHA: pruned
    t6 = s.cells[1].study.trials[0]
    assert t6.state == TrialState.PRUNED and t6.intermediate_values == {2048: 3.8}
    s.on_trial_complete("t7", done(3.7))
    s.suggest("t8")
    s.on_trial_complete("t8", done(3.9))
    last = [s.suggest("t9"), s.suggest("t10")]
    assert [x["role"] for x in last] == ["confirm", "confirm"] and {x["cell"] for x in last} == {"adamw/bs16"}
    s.on_trial_complete("t9", done(3.75))
    s.on_trial_complete("t10", done(3.76))
    assert s.suggest("t11") == Searcher.FINISHED
    progress = s.progress()
    # 2 cells x (3 search + 2 confirmations), and the reference's one more search trial
    assert progress.trials_done == progress.trials_total == 11
    assert progress.cells_done == 2


def test_a_confirmation_run_stored_with_the_role_seed_reads_as_one(storage: optuna.storages.BaseStorage) -> None:
    """An Optuna trial whose user attr "role" is "seed" (the value the confirmation role has in the studies
    of sweeps recorded before it was "confirm") is a confirmation run to a resumed sweep: it counts, is
    not run again, and reaches the analysis with the role "confirm"."""
    spec = SweepSpec.from_yaml(SPEC)
    s = CellSearcher(spec, "unit", storage)
    for trial_id in ("t1", "t2", "t3"):
        s.suggest(trial_id)
    s.on_trial_complete("t1", done(4.0))
    s.on_trial_complete("t2", done(3.5))
    s.on_trial_complete("t3", done(None, status="diverged", tokens=1024))
    s.suggest("t3b")
    s.on_trial_complete("t3b", done(3.55))
    study = s.cells[0].study
    best_lr = study.trials[1].params["lr"]
    attrs = {"status": "completed", "tokens": 4096, "steps": 10, "curve": "[[4096, 3.52]]", "train_time_s": 1.0}
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": best_lr},
            distributions={"lr": s.distribution},
            value=3.52,
            state=TrialState.COMPLETE,
            user_attrs={"role": "seed", "seed": 1, "warmup": s.warmups[0], "tune_trial_id": "old", **attrs},
        )
    )
    resumed = CellSearcher(spec, "unit", storage)
    cell = resumed.states()["adamw/bs4"]
    assert len(cell.trials("confirm")) == 1 and cell.seeds_recorded(best_lr) == {1} and cell.confirmed == [3.52]
    assert cell.seeds_wanted == (2,)  # seed 1 is not run again
    (old,) = [r for r in collect_results(resumed)[0] if r.batch_size == 4 and r.seed == 1]
    assert (old.role, old.lr, old.val_loss) == ("confirm", best_lr, 3.52)


def test_a_suggest_reads_each_cells_trials_from_the_storage_once(
    storage: optuna.storages.BaseStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tune calls suggest again and again while slots are free, and with an RDB storage every read of a
    # cell's trials is SQL: one suggest that consults every cell (each a dozen ways) reads each study once,
    # and so does a progress
    spec = SweepSpec.from_yaml(SPEC.replace("batch_sizes: [4, 16]", "batch_sizes: [4, 8, 16, 32]"))
    s = CellSearcher(spec, "unit", storage)
    for i in range(3):  # bs4's three search trials
        assert s.suggest(f"t{i}")["cell"] == "adamw/bs4"
    reads: list[str] = []
    get_trials = optuna.Study.get_trials

    def counted(study: optuna.Study, *args: object, **kwargs: object) -> object:
        reads.append(study.study_name)
        return get_trials(study, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(optuna.Study, "get_trials", counted)
    assert s.suggest("t3") is None  # everything waits on bs4's search: every cell is consulted
    assert sorted(reads) == sorted(c.study.study_name for c in s.cells)
    reads.clear()
    s.progress()
    assert sorted(reads) == sorted(c.study.study_name for c in s.cells)
    monkeypatch.undo()
    # and a read ends with the call: what was written since is read by the next one
    s.on_trial_complete("t0", done(4.0))
    s.on_trial_complete("t1", done(3.5))
    s.on_trial_complete("t2", done(3.7))
    # (with the three results read, bs4 steps on: the reference searches one lr more; without them it waits)
    step = s.suggest("t4")
    assert step["role"] == "search" and step["cell"] == "adamw/bs4"


def test_a_snapshot_fits_the_best_trial_once_and_a_new_one_after_a_write(
    storage: optuna.storages.BaseStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sweeps.search.state as state

    s = CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage)
    for i in range(3):
        assert s.suggest(f"t{i}")["cell"] == "adamw/bs4"
    s.on_trial_complete("t0", done(4.0))
    s.on_trial_complete("t1", done(3.5))
    lr_of = {t.number: float(t.params["lr"]) for t in s.cells[0].study.trials}
    fits: list[int] = []
    pick = state.pick_stable
    monkeypatch.setattr(state, "pick_stable", lambda *a, **k: fits.append(1) or pick(*a, **k))
    cell = s.states()["adamw/bs4"]
    assert cell.best_lr == lr_of[1] and cell.best.number == 1 and cell.finished is False  # type: ignore[union-attr]
    assert cell.seeds_wanted == () and cell.search_done is False
    assert len(fits) == 1  # one fit for the snapshot, however often it is asked
    # a change of plan is a new snapshot over the same read: the fit is kept
    assert cell.with_plan(n_seeds=4).best_lr == lr_of[1] and len(fits) == 1
    s.on_trial_complete("t2", done(3.0))
    assert cell.best_lr == lr_of[1]  # a snapshot is what was read
    assert s.states()["adamw/bs4"].best_lr == lr_of[2] and len(fits) == 2


def test_search_and_analysis_pick_the_same_best_trial_on_an_exact_tie(storage: optuna.storages.BaseStorage) -> None:
    from sweeps.analysis import build_report
    from sweeps.driver import collect_results

    spec = SweepSpec.from_yaml(SPEC)
    s = CellSearcher(spec, "unit", storage)
    lrs = []
    for i in (1, 2, 3):
        lrs.append(s.suggest(f"t{i}")["lr"])
    for i in (1, 2, 3):  # t1 and the smaller-lr one of the others tie exactly at 3.5
        s.on_trial_complete(f"t{i}", done(3.5 if i != 3 else 4.0))
    tied = sorted(lrs[:2])
    extra = s.suggest("t3b")  # the reference's one more search trial (no warm start): worse than the tie
    assert extra["role"] == "search" and all(abs(math.log(extra["lr"] / lr)) > 0.1 for lr in lrs)
    s.on_trial_complete("t3b", done(4.0))
    confirm = s.suggest("t4")
    # the search sends the confirmation runs to the smaller lr of the tie, not to the first trial's
    assert confirm["role"] == "confirm" and confirm["lr"] == pytest.approx(tied[0])
    results, _ = collect_results(s)
    report = build_report(results, spec=spec)
    assert report.optimizers["adamw"].cells[0].best_lr == pytest.approx(tied[0])


def test_a_resumed_sweep_runs_its_lost_design_point_again_and_repeats_no_finished_lr(
    storage: optuna.storages.BaseStorage,
) -> None:
    spec = SweepSpec.from_yaml(SPEC)
    s = CellSearcher(spec, "unit", storage)
    coarse = [s.suggest("t1")["lr"], s.suggest("t2")["lr"]]  # t2 in flight when the driver dies
    s.on_trial_complete("t1", done(4.0))
    resumed = CellSearcher(spec, "unit", storage)
    again = [resumed.suggest("r1")["lr"], resumed.suggest("r2")["lr"]]
    # the third coarse point (still queued), then t2's lr: the design needs that point, lost to the crash
    assert again[1] == pytest.approx(coarse[1]) and again[0] not in coarse
    assert resumed.suggest("r3") is None  # the line search waits for its design points
    resumed.on_trial_complete("r1", done(3.9))
    resumed.on_trial_complete("r2", done(3.8))
    # three completed lrs, and no finished lr was run twice
    finished = [t.params["lr"] for t in resumed.states()["adamw/bs4"].trials("search")]
    assert len(finished) == len({round(math.log(lr), 9) for lr in finished}) == 3


def test_a_line_search_step_follows_its_bracket_and_converges_early(storage: optuna.storages.BaseStorage) -> None:
    spec = SweepSpec.from_yaml(SPEC.replace("trials_per_batch_size: 3", "trials_per_batch_size: 6"))
    s = CellSearcher(spec, "unit", storage)
    lrs = [s.suggest(f"t{i}")["lr"] for i in (1, 2, 3)]  # the coarse start: three lrs over [1e-3, 1e-1]
    assert lrs == pytest.approx([1e-3 * 100 ** (f / 6) for f in (1, 3, 5)])
    assert s.suggest("t4") is None  # the next step waits for them
    optimum = 1e-2 * math.exp(0.3)

    def loss(lr: float) -> float:
        return 3.0 + 0.05 * math.log(lr / optimum) ** 2

    for i, lr in zip((1, 2, 3), lrs, strict=True):
        s.on_trial_complete(f"t{i}", done(loss(lr)))
    step = s.suggest("t4")  # the parabola's vertex: an exact bowl puts it at the optimum
    assert step["role"] == "search" and step["lr"] == pytest.approx(optimum) and step["prunable"] is False
    s.on_trial_complete("t4", done(loss(step["lr"])))
    # the next vertex lands on a tried lr, but this is the reference (no warm start): converged only with a
    # tried lr within REFERENCE_NARROW of the best on both sides; the coarse lr above is 1.24 away, so one
    # step of BRACKET_STEP up first
    up = s.suggest("t5")
    assert up["role"] == "search" and up["lr"] == pytest.approx(optimum * math.exp(BRACKET_STEP))
    s.on_trial_complete("t5", done(loss(up["lr"])))
    # converged after 5 of its 7 trials (6 + the reference's one more), confirmation runs follow
    confirm = s.suggest("t6")
    assert confirm["role"] == "confirm" and confirm["lr"] == pytest.approx(optimum)
    cell = s.progress().cells[0]
    assert cell.search_done == cell.search_total == 5


def test_resume_counts_finished_trials_and_replaces_interrupted_ones(storage: optuna.storages.BaseStorage) -> None:
    spec = SweepSpec.from_yaml(SPEC)
    s = CellSearcher(spec, "unit", storage)
    first = s.suggest("t1")
    s.suggest("t2")  # in flight when the driver dies
    s.on_trial_complete("t1", done(4.0))

    resumed = CellSearcher(spec, "unit", storage)
    study = resumed.cells[0].study
    # the trial left RUNNING is closed as interrupted and does not count as finished
    assert study.trials[1].state == TrialState.FAIL and study.trials[1].user_attrs["status"] == "interrupted"
    assert resumed.states()["adamw/bs4"].search_finished == 1
    nxt = resumed.suggest("r1")
    assert nxt["cell"] == "adamw/bs4" and nxt["optuna_number"] == 2
    assert nxt["lr"] != pytest.approx(first["lr"])  # the resumed sampler does not start its draws again
    assert study.trials[0].params["lr"] == first["lr"]


def test_cancelled_trials_are_run_again_on_resume(storage: optuna.storages.BaseStorage) -> None:
    spec = SweepSpec.from_yaml(SPEC)
    s = CellSearcher(spec, "unit", storage)
    s.suggest("t1")
    s.cancelling = True
    s.on_trial_complete("t1", done(4.5, status="running", tokens=1024))
    assert s.cells[0].study.trials[0].user_attrs["status"] == "cancelled"
    assert CellSearcher(spec, "unit", storage).states()["adamw/bs4"].search_finished == 0


def test_a_cancel_that_tune_did_not_pass_on_ends_started_trials_with_their_id(
    storage: optuna.storages.BaseStorage,
) -> None:
    spec = SweepSpec.from_yaml(SPEC)
    s = CellSearcher(spec, "unit", storage)
    s.suggest("t1")
    s.suggest("t2")
    assert s.end_cancelled({"t1", "t2"}) == 0  # not cancelling: nothing to end
    s.cancelling = True
    # Tune stopped both without on_trial_complete; only t1 had started (it has an MLflow run)
    assert s.end_cancelled({"t1", "other"}) == 1
    by_id = {t.user_attrs.get("tune_trial_id"): t for t in s.cells[0].study.trials}
    assert by_id["t1"].state == TrialState.FAIL and by_id["t1"].user_attrs["status"] == "cancelled"
    assert "t2" not in by_id  # never started: no id, closed by close_running_trials as after a lost driver
    # t2 is still RUNNING; t1's coarse lr is asked again (one more WAITING trial, beside the third coarse lr)
    trials = s.cells[0].study.trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING, TrialState.WAITING]
    assert trials[-1].system_attrs["fixed_params"]["lr"] == by_id["t1"].params["lr"]  # an enqueued trial's lr
    assert s.end_cancelled({"t1"}) == 0  # ended once


def test_a_changed_spec_cannot_reuse_a_sweep_id(storage: optuna.storages.BaseStorage) -> None:
    CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage)
    changed = SweepSpec.from_yaml(SPEC.replace("token_budget: 4096", "token_budget: 8192"))
    with pytest.raises(ValueError, match="different spec"):
        CellSearcher(changed, "unit", storage)


def test_optuna_and_mlflow_records_share_one_status_rule() -> None:
    from sweeps.status import TrialStatus, trial_status

    # a diverged trial ending while the sweep is cancelled is a result in both records (before: the
    # searcher made it "cancelled" and re-ran it on resume, MLflow kept it "diverged")
    assert trial_status({"status": "diverged"}, False, cancelling=True) == TrialStatus.diverged
    assert trial_status({"status": "completed"}, False, cancelling=True) == TrialStatus.completed
    # cut short before its end: the cancel's doing while cancelling, else ASHA's
    assert trial_status({"status": "running"}, False, cancelling=True) == TrialStatus.cancelled
    assert trial_status({"status": "running"}, False) == TrialStatus.pruned
    # an error reaching Tune is the infrastructure's, whatever the sweep is doing
    assert trial_status({"status": "running"}, True, cancelling=True) == TrialStatus.interrupted


def test_a_diverged_trial_during_a_cancel_is_kept_as_a_result(storage: optuna.storages.BaseStorage) -> None:
    spec = SweepSpec.from_yaml(SPEC)
    s = CellSearcher(spec, "unit", storage)
    s.suggest("t1")
    s.cancelling = True
    s.on_trial_complete("t1", done(None, status="diverged", tokens=1024))
    t = s.cells[0].study.trials[0]
    assert t.user_attrs["status"] == "diverged" and math.isinf(t.value)
    assert CellSearcher(spec, "unit", storage).states()["adamw/bs4"].search_finished == 1  # not run again


def test_adaptive_confirmation_adds_runs_only_at_boundary_cells_within_noise(
    storage: optuna.storages.BaseStorage,
) -> None:
    spec = SweepSpec.from_yaml(SPEC.replace("seeds: 2", "seeds: {min: 2, max: 4, step: 2}"))
    # 2 cells x (3 search + 4 confirmation runs), and one more search trial at the reference
    assert (spec.seeds_min, spec.seeds_max, spec.noise_looks, spec.total_trials) == (2, 4, 2, 15)
    s = CellSearcher(spec, "unit", storage)
    asked = drive(s, {"adamw/bs4": [3.60, 3.50, 3.52, 3.53], "adamw/bs16": [3.55, 3.72, 3.57, 3.58]})
    # first look, 2 runs each: the paired differences by seed (3.55 - 1.05 x 3.60, 3.72 - 1.05 x 3.50)
    # = (-0.23, +0.045) disagree, and at 97.5% (Bonferroni over 2 looks) with 1 degree of freedom the
    # interval is about [-3.6, 3.4]: undecided, so bs16 and its reference get 2 more runs (seeds 3, 4)
    seeds = [(c, seed) for c, role, seed in asked if role == "confirm"]
    assert sorted(seeds) == [(c, k) for c in ("adamw/bs16", "adamw/bs4") for k in (1, 2, 3, 4)]
    assert s.progress().trials_total == 15 == len(asked)


def test_adaptive_confirmation_stops_where_the_pairing_already_decides(storage: optuna.storages.BaseStorage) -> None:
    spec = SweepSpec.from_yaml(SPEC.replace("seeds: 2", "seeds: {min: 2, max: 4, step: 2}"))
    # seed 2 is worse than seed 1 in both cells by the same 0.06: the pairs agree (d = -0.125, -0.118)
    asked = drive(CellSearcher(spec, "unit", storage), {"adamw/bs4": [3.50, 3.56], "adamw/bs16": [3.55, 3.62]})
    seeds = [seed for _, role, seed in asked if role == "confirm"]
    assert sorted(seeds) == [1, 1, 2, 2]  # decided (fine) at the first look: no runs added


def drive(s: CellSearcher, confirm: dict[str, list[float]]) -> list[tuple[str, str, int]]:
    """Run `s` to its end, sequentially: three search trials a cell and the reference's one more (the same
    losses every time), then the confirmation runs' losses of `confirm`, in the order asked; (cell, role,
    seed) of each trial."""
    losses = {"adamw/bs4": [4.0, 3.5, 3.9, 3.7], "adamw/bs16": [4.1, 3.6, 3.95]}
    runs = {cell: iter(values) for cell, values in confirm.items()}
    asked = []
    for i in range(40):
        config = s.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            return asked
        assert config is not None
        asked.append((config["cell"], config["role"], config["seed"]))
        value = next(runs[config["cell"]]) if config["role"] == "confirm" else losses[config["cell"]].pop(0)
        s.on_trial_complete(f"t{i}", done(value))
    raise AssertionError(f"the search did not finish in 40 trials: {asked}")


def test_the_stored_curve_ends_with_the_final_evaluation(storage: optuna.storages.BaseStorage) -> None:
    import json

    s = CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage)
    s.suggest("t1")
    s.on_trial_result("t1", {"tokens": 2048, "val_loss": 5.0})
    # Tune passes the final ("done") result to on_trial_complete only
    s.on_trial_complete("t1", done(4.0, tokens=4096))
    assert json.loads(s.cells[0].study.trials[0].user_attrs["curve"]) == [[2048, 5.0], [4096, 4.0]]


def test_every_cell_study_names_its_objective(storage: optuna.storages.BaseStorage) -> None:
    spec = SweepSpec.from_yaml(SPEC)
    CellSearcher(spec, "named", storage)
    CellSearcher(spec, "named", storage)  # a resumed sweep: loaded, still named once
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    assert names and all(optuna.load_study(study_name=n, storage=storage).metric_names == ["val_loss"] for n in names)
    # what optuna-dashboard shows of them, through its own API (its WSGI app on the same storage)
    import httpx
    from optuna_dashboard import wsgi

    with httpx.Client(transport=httpx.WSGITransport(app=wsgi(storage)), base_url="http://dashboard") as client:
        studies = client.get("/api/studies").json()["study_summaries"]
        assert sorted(s["study_name"] for s in studies) == sorted(names)
        for s in studies:
            assert client.get(f"/api/studies/{s['study_id']}").json()["objective_names"] == ["val_loss"]


def test_a_stored_spec_resumes_its_studies_after_an_upgrade_added_fields(storage: optuna.storages.BaseStorage) -> None:
    """The service stores each spec whole at submit; a field added to the spec since (here lr.extend and
    schedule.warmup_tokens/steps, with their defaults) must not make the relaunched driver refuse its own
    studies as another spec's."""
    import hashlib
    import json as json_

    from sweeps.search import spec_fingerprint

    stored = SweepSpec.from_yaml(SPEC).model_dump(mode="json")
    del stored["lr"]["extend"], stored["schedule"]["warmup_tokens"], stored["schedule"]["warmup_steps"]
    before = hashlib.sha256(json_.dumps(stored, sort_keys=True).encode()).hexdigest()[:16]  # as made then
    first = CellSearcher(SweepSpec.from_stored(stored), "upgraded", storage)
    for cell in first.cells:
        cell.study.set_user_attr("spec_fingerprint", before)
    again = CellSearcher(SweepSpec.from_stored(stored), "upgraded", storage)  # does not raise
    assert len(again.cells) == len(first.cells)
    assert spec_fingerprint(SweepSpec.from_stored(stored)) == before
    # another spec under the same id is still refused
    other = {**stored, "token_budget": stored["token_budget"] * 2}
    with pytest.raises(ValueError, match="different spec"):
        CellSearcher(SweepSpec.from_stored(other), "upgraded", storage)


OOM = {"status": "failed", "error": "OutOfMemoryError: CUDA out of memory", "failure": "out_of_memory"}


def test_a_cell_whose_trials_run_out_of_memory_stops_after_two_and_says_why(
    storage: optuna.storages.BaseStorage,
) -> None:
    s = CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage)
    first, second = s.suggest("t1"), s.suggest("t2")
    assert first["cell"] == second["cell"] == "adamw/bs4"
    s.on_trial_complete("t1", dict(OOM))
    assert s.states()["adamw/bs4"].stop_reason is None  # one: another lr may still run
    s.on_trial_complete("t2", dict(OOM))
    why = s.states()["adamw/bs4"].stop_reason
    assert why is not None and "2 of its trials ran out of memory" in why and "CUDA out of memory" in why
    assert s.states()["adamw/bs4"].finished
    third = s.suggest("t3")
    assert third is None or third["cell"] != "adamw/bs4"  # nothing more of the stopped cell
    assert s.progress().cells[0].stopped == why
    assert "adamw/bs4: stopped with no result: 2 of its trials ran out of memory" in " ".join(s.search_warnings())
    # read again from the storage (a resumed driver): still stopped
    again = CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage)
    assert again.states()["adamw/bs4"].stop_reason == why


def test_a_failure_that_is_not_memory_and_a_result_between_do_not_stop_a_cell(
    storage: optuna.storages.BaseStorage,
) -> None:
    s = CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage)
    s.suggest("t1"), s.suggest("t2"), s.suggest("t3")
    s.on_trial_complete("t1", dict(OOM))
    s.on_trial_complete("t2", done(3.5))  # a trial that trained: the count starts again
    s.on_trial_complete("t3", {"status": "failed", "error": "ValueError: bad keyword"})
    assert s.states()["adamw/bs4"].stop_reason is None


def test_a_cell_whose_trials_lose_their_process_every_start_stops_after_three(
    storage: optuna.storages.BaseStorage,
) -> None:
    s = CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage)
    for i in range(3):
        trial = s.suggest(f"t{i}")
        assert trial is not None and trial["cell"] == "adamw/bs4"
        assert s.states()["adamw/bs4"].stop_reason is None
        s.on_trial_complete(f"t{i}", None, error=True)  # Tune gave it up: its process died at every start
    assert "3 of its trials in a row lost their process" in (s.states()["adamw/bs4"].stop_reason or "")
    assert s.lost_trials == 3


def test_trials_lost_with_their_driver_never_stop_a_cell(storage: optuna.storages.BaseStorage) -> None:
    """A killed driver leaves its trials RUNNING; the next one closes them `interrupted` and runs them again,
    however often that happens (the soak kills drivers): they are not the cell's failures."""
    for i in range(4):
        s = CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage)  # closes the last one's running trials
        assert s.states()["adamw/bs4"].stop_reason is None
        assert s.suggest(f"t{i}") is not None
    assert CellSearcher(SweepSpec.from_yaml(SPEC), "unit", storage).states()["adamw/bs4"].stop_reason is None
