"""`sweeps`: the project's console script.

  sweeps run SPEC.yaml [--id ID] [--report report.json]   run (or resume) a sweep on Ray, print the answer
  sweeps show report.json                                 print a report's answer as tables
  sweeps price SPEC.yaml [--gpu H100] [--mfu 0.4]         what a sweep costs (trials, tokens, FLOPs, GPU-hours), offline;
                                                          a study file: each scale's sweep beside the target's
  sweeps plots ID [--out DIR]                             (re)draw a recorded sweep's figures into its MLflow run
  sweeps law REPORT[@PARAMS]... --target-tokens N         the critical batch size as a law of the token budget (and
                                                          model size) from several sweeps' reports, and its prediction
  sweeps study STUDY.yaml [--out DIR]                     run a study's sweeps, smallest first, then `sweeps law` on them

Client of the HTTP service (--url or $SWEEPS_URL, --token or $SWEEPS_TOKEN):
  sweeps submit SPEC.yaml [--watch] [--dry-run]           submit; --watch follows the progress and prints the answer;
                                                          --dry-run validates and prints the cost (--gpu, --mfu);
                                                          a study file: priced scale by scale (--dry-run only)
  sweeps list [--status running]                          your sweeps, newest first
  sweeps status ID | cancel ID | report ID                one sweep
  sweeps serve [--host 127.0.0.1] [--port 8000]           start the service (and, with no RAY_ADDRESS, its Ray head)
  sweeps stop-head [--data-dir DIR]                        stop the local Ray head that `serve` started
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from sweeps.status import FINAL_SWEEP_STATUSES, RESULT_STATUSES, SweepStatus

if TYPE_CHECKING:  # each command imports these where it needs them (the report models load scipy)
    from sweeps.analysis import Report
    from sweeps.progress import DriverProgress
    from sweeps.progress import Progress as SweepProgress

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Batch-size sweeps: how large can the batch get?")
console = Console()
err = Console(stderr=True)


@app.callback()
def _entry() -> None:
    """Before any command: a Ray cluster this process starts or joins on this machine is on loopback only,
    with token auth (worker/local_ray.py; it must come before ray is imported)."""
    from worker.local_ray import use_local_ray

    use_local_ray()


def _load_spec(path: Path) -> Any:
    from pydantic import ValidationError

    from sweeps.spec import SpecError, SpecLoadError, SweepSpec, format_validation_error

    try:
        return SweepSpec.load(path)
    except ValidationError as exc:
        err.print(f"[red]invalid sweep spec {path}:[/]")
        for p in format_validation_error(exc):
            err.print(f"  [bold]{p['field']}[/]: {p['message']}")
        raise typer.Exit(2) from None
    except (SpecError, SpecLoadError, FileNotFoundError, ValueError) as exc:
        err.print(f"[red]invalid sweep spec {path}:[/] {exc}")
        raise typer.Exit(2) from None


def _batch_text(spec: Any) -> str:
    """The batch sizes as a person reads them: the list, or the search and its lattice."""
    if (search := spec.batch_search) is None:
        return str(spec.batch_sizes)
    return (
        f"searched in {search.min}..{search.max} to a ratio of {search.resolution:g} against the {search.against} "
        f"reference ({len(spec.lattice)} lattice sizes, {spec.sizes_per_optimizer[0]} to {spec.sizes_per_optimizer[1]} "
        f"tested per optimizer)"
    )


@app.command()
def run(
    spec_path: Path = typer.Argument(..., help="sweep spec, YAML or JSON"),
    sweep_id: Optional[str] = typer.Option(
        None, "--id", help="sweep id; the same id resumes (default: the spec's name)"
    ),
    report: Optional[Path] = typer.Option(None, "--report", help="write the report JSON here"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="default $SWEEPS_DATA_DIR or ./.batchsweep"),
) -> None:
    """Run a sweep on the current Ray cluster ($RAY_ADDRESS) or a fresh local one."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    spec = _load_spec(spec_path)
    from sweeps.settings import runtime_from_env

    outcome = _run_one(spec, sweep_id, runtime_from_env(data_dir), report)
    if report:
        console.print(f"report: {report}")
    console.print(
        f"runs and figures: MLflow experiment [bold]{outcome.sweep_id}[/] (id {outcome.experiment_id}); browse with"
    )
    console.print(f"  mlflow ui --backend-store-uri {outcome.tracking_uri}")


def _run_one(spec: Any, sweep_id: str | None, runtime: Any, report: Path | None) -> Any:
    """One sweep on Ray with progress bars, its figures drawn, its report written to `report` and printed,
    and its wall time against its trials' training time; the `SweepOutcome`."""
    from dashboards.publish import publish_figures
    from sweeps.analysis import report_to_json
    from sweeps.driver import run_sweep

    console.print(
        f"[bold]{spec.name}[/]: {', '.join(spec.optimizer_names)} x batch {_batch_text(spec)}, "
        f"{'at most ' if spec.batch_search else ''}{spec.total_trials} trials of {spec.trained_tokens:,} tokens, "
        f"{spec.resources.max_concurrent_trials} at a time"
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as bars:
        trials = bars.add_task("trials", total=spec.total_trials)
        cells = bars.add_task("cells", total=len(spec.cells()) if spec.batch_search is None else None)
        best = bars.add_task("", total=None, start=False)

        def on_progress(p: DriverProgress) -> None:
            # a search of the batch axis adds cells as it decides: the totals grow with it
            bars.update(trials, completed=p.trials_done, total=max(p.trials_total, p.trials_done))
            bars.update(cells, completed=p.cells_done, total=p.cells_total)
            bars.update(best, description=_leaders(p))

        outcome = run_sweep(spec, sweep_id=sweep_id, runtime=runtime, on_progress=on_progress)
    with console.status("drawing the figures"):
        publish_figures(outcome.tracking_uri, outcome.sweep_id)
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(report_to_json(outcome.report))
    _print_report(outcome.report)
    ideal = sum(outcome.trial_train_time_s) / spec.resources.max_concurrent_trials
    console.print(
        f"status: [bold]{outcome.status}[/] in {outcome.wall_time_s:.0f} s "
        f"(trials' own training time / concurrency: {ideal:.0f} s)"
    )
    return outcome


@app.command()
def show(report_path: Path = typer.Argument(..., help="a report JSON written by `sweeps run --report`")) -> None:
    """Print a report's answer as tables."""
    try:
        report = json.loads(report_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        err.print(f"[red]cannot read report {report_path}:[/] {exc}")
        raise typer.Exit(2) from None
    _print_report(report)


@app.command()
def law(
    reports: list[str] = typer.Argument(
        ..., help="report JSONs of sweeps at several scales; PATH@PARAMS names a model size"
    ),
    target_tokens: float = typer.Option(..., "--target-tokens", help="the token budget to predict at"),
    target_params: Optional[float] = typer.Option(
        None, "--target-params", help="its model size, where the law has one"
    ),
    against: str = typer.Option("baseline", "--against", help="the reference of the brackets: self or baseline"),
) -> None:
    """Fit the largest degradation-free batch size as a power law in the token budget (and the model size, where
    the reports name two or more) from finished sweeps' brackets, per optimizer; predict it at the target with
    an interval, check the law on the largest scale left out, and give the lr the cells' best lrs imply there."""
    from sweeps.analysis import read_report

    _check_against(against)
    loaded = []
    for item in reports:
        path, _, size = item.partition("@")
        try:
            loaded.append((read_report(json.loads(Path(path).read_text())), float(size) if size else None))
        except (OSError, ValueError) as exc:  # json.JSONDecodeError and pydantic's ValidationError are ValueErrors
            err.print(f"[red]cannot read report {item}:[/] {str(exc)[:500]}")
            raise typer.Exit(2) from None
    from sweeps.law import study_laws

    _print_law(study_laws(loaded, target_tokens, target_params, against))


@app.command()
def study(
    study_path: Path = typer.Argument(..., help="a study file: a sweep spec with scales and a target (sweeps.study)"),
    out: Optional[Path] = typer.Option(
        None, "--out", help="the folder of the scales' reports (default ./<name>-reports); a scale with one is done"
    ),
    against: str = typer.Option("baseline", "--against", help="the reference of the brackets: self or baseline"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="default $SWEEPS_DATA_DIR or ./.batchsweep"),
) -> None:
    """Run a study's sweeps, smallest scale first, on the current Ray cluster ($RAY_ADDRESS) or a fresh local
    one, each as `sweeps run` does (its report in --out; run again, the study goes on from the first scale
    without one), then fit the law from their reports and predict at the target, as `sweeps law` does."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from dashboards.study import ConfirmationState, publish_study
    from sweeps.analysis import read_report
    from sweeps.layout import study_experiment
    from sweeps.settings import runtime_from_env
    from sweeps.study import fit_laws, transferred
    from sweeps.study_record import record_study

    _check_against(against)
    plan = _load_study(study_path)
    if plan is None:
        err.print(f"[red]{study_path} is not a study[/] (a study has scales and a target: sweeps/study.py)")
        raise typer.Exit(2)
    folder = out or Path(f"{plan.name}-reports")
    specs = plan.sweep_specs()
    target = plan.target_spec()
    runtime = runtime_from_env(data_dir)
    done: list[tuple[Any, Any]] = []
    for i, spec in enumerate(specs, 1):
        if plan.transfer:  # the batch-axis search starts where the smaller scales predict (sweeps.study)
            spec = transferred(spec, done)
        path = folder / f"{spec.name}.json"
        if path.exists():
            console.print(f"scale {i} of {len(specs)}: [bold]{spec.name}[/] done before ({path})")
        else:
            console.rule(f"scale {i} of {len(specs)}: {spec.model.preset or 'custom'}, {spec.trained_tokens:,} tokens")
            _run_one(spec, spec.name, runtime, path)
        done.append((spec, read_report(json.loads(path.read_text()))))
    console.rule(f"the law, predicted at {target.trained_tokens:,} tokens ({target.model.preset or 'custom'})")
    laws = fit_laws(target, done, against)  # in the model size too where the scales have two or more
    _print_law(laws)
    confirmations, confirming = [], None
    if plan.confirm:  # judged by the confirmation sweep, or not run (the note says why)
        confirmations, note = _confirm(plan, laws, runtime, folder)
        confirming = ConfirmationState("not_run" if note else "succeeded", note=note, judged=tuple(confirmations))
    scales = [(s.name, report) for s, report in done]
    run_id = record_study(runtime.tracking_uri, plan, scales, laws, confirmations)
    console.print(f"in MLflow: the study's run {run_id} ({study_experiment(plan.name)}), its sweeps nested under it")
    try:
        figure = publish_study(runtime.tracking_uri, run_id, laws, plan.name, confirming)
        console.print(f"  its figure: {', '.join(figure[:2])}")
    except Exception as exc:  # a figure is a view: the laws are printed and recorded already
        err.print(f"[yellow]the study's figure could not be drawn or logged: {exc}[/]")


def _check_against(against: str) -> None:
    if against not in ("self", "baseline"):
        err.print(f"[red]--against must be self or baseline, got {against!r}[/]")
        raise typer.Exit(2)


def _confirm(plan: Any, laws: list[Any], runtime: Any, folder: Path) -> tuple[list[Any], str | None]:
    """Predict, then confirm: the sweep at the target of the reference and the sizes around each prediction
    (`sweeps.study.confirm_spec`; its report in `folder` too, so a study run again does not train it again),
    each law judged against it (`sweeps.law.confirm_laws`), printed; or none and why not."""
    from sweeps.analysis import read_report
    from sweeps.law import confirm_laws
    from sweeps.study import confirm_spec

    spec = confirm_spec(plan, laws)
    if isinstance(spec, str):
        console.print(f"no confirmation at the target: {spec}")
        return [], spec
    path = folder / f"{spec.name}.json"
    sizes = ", ".join(map(str, spec.lattice))
    if path.exists():
        console.print(f"the confirmation at the target: [bold]{spec.name}[/] done before ({path})")
    else:
        console.rule(f"the confirmation at the target: batch sizes {sizes}, {spec.trained_tokens:,} tokens")
        _run_one(spec, spec.name, runtime, path)
    confirmations = confirm_laws(laws, read_report(json.loads(path.read_text())))
    for c in confirmations:
        lr = ""
        if c.lr_predicted is not None and c.lr_found is not None:
            lr = f"; lr {c.lr_found:.3g} found at {c.lr_at}, the lr law said {c.lr_predicted:.3g}"
        console.print(f"  {c.optimizer} against {c.against}: {c.says}{lr}")
    return confirmations, None


def _print_law(laws: list[Any]) -> None:
    """Per optimizer (`sweeps.law.study_laws`): the scales' brackets, the law, its prediction at the target,
    the leave-largest-out check and the lr law's lr there."""
    for law in laws:
        console.rule(f"[bold]{law.optimizer}[/] against {'itself' if law.against == 'self' else law.reference}")
        for s in law.scales:
            size = f", {s.params:.3g} params" if s.params else ""
            console.print(f"  {s.tokens:.3g} tokens{size}: [{s.largest_fine or '-'}, {s.smallest_degraded or '-'})")
        if law.no_law is not None:
            console.print(f"  no law: {law.no_law}")
            continue
        lo, hi = law.tokens_interval
        line = f"  B* ~ tokens^{law.tokens_exponent:.2f} (95% [{lo:.2f}, {hi:.2f}])"
        if law.params_exponent is not None and law.params_interval is not None:
            plo, phi = law.params_interval
            line += f" x params^{law.params_exponent:.2f} (95% [{plo:.2f}, {phi:.2f}])"
        console.print(line + f", scatter {law.sigma:.2f} in ln B*, from {law.fitted_scales} scales")
        if law.predicted is None:
            console.print("  the law has a model-size exponent: give --target-params to predict")
            continue
        p = law.predicted
        console.print(
            f"  at {law.target_tokens:.3g} tokens: B* {p.value:.0f} (95% prediction interval {p.low:.0f}-{p.high:.0f})"
        )
        if (check := law.check) is not None:
            verdict = "holds it" if check.held else f"misses by a factor {check.miss:.2f}"
            left = check.left_out
            console.print(
                f"  check: without {left.tokens:.3g} tokens the law predicts {check.predicted.value:.0f} "
                f"there; its bracket [{left.largest_fine}, {left.smallest_degraded}) {verdict}"
            )
        else:
            console.print(f"  check: {law.no_check}")
        if law.lr is not None:
            console.print(
                f"  lr there: {law.lr.value:.3g} (95% prediction interval {law.lr.low:.3g}-{law.lr.high:.3g})"
            )
        else:
            console.print(f"  lr: no law: {law.no_lr}")


_GPU = typer.Option(None, "--gpu", help="GPU to price on (default H100; see worker/hardware.py for the table)")
_MFU = typer.Option(None, "--mfu", help="model FLOPs utilisation to assume, in (0, 1] (default 0.4)")
_PEAK = typer.Option(None, "--peak-tflops", help="the GPU's dense bf16 peak in TFLOP/s (overrides the table)")


@app.command()
def price(
    spec_path: Path = typer.Argument(..., help="sweep spec, YAML or JSON"),
    gpu: Optional[str] = _GPU,
    mfu: Optional[float] = _MFU,
    peak_tflops: Optional[float] = _PEAK,
    as_json: bool = typer.Option(False, "--json", help="print the cost as JSON"),
) -> None:
    """What a sweep costs before it runs (no service needed): the dry run's cost, computed here. A study
    (`sweeps.study`: a spec with `scales` and `target`) is priced scale by scale, beside the target's sweep."""
    from pydantic import ValidationError

    from sweeps.cost import PriceConfig
    from sweeps.cost import price as price_of

    given = {k: v for k, v in {"gpu": gpu, "mfu": mfu, "peak_tflops": peak_tflops}.items() if v is not None}
    try:
        config = PriceConfig(**given)
    except ValidationError as exc:
        for e in exc.errors():
            err.print(f"[red]--{str(e['loc'][0]).replace('_', '-')}:[/] {e['msg'].removeprefix('Value error, ')}")
        raise typer.Exit(2) from None
    if (study := _load_study(spec_path)) is not None:
        _price_study(study, config, as_json)
        return
    spec = _load_spec(spec_path)
    cost = price_of(spec, config).model_dump(mode="json")
    if as_json:
        console.print_json(data=cost)
    else:
        _print_cost(spec.name, cost)


def _si(n: float) -> str:
    """7.77e12 -> '7.77T' (tokens, parameters): K, M, B, T."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:g}"


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 10 else f"{h:.3g}"


def _span(r: dict[str, float], fmt: Any) -> str:
    """A cost range as text: one value, or min - max (adaptive seeds)."""
    return fmt(r["max"]) if r["min"] == r["max"] else f"{fmt(r['min'])} - {fmt(r['max'])}"


def _is_study_file(path: Path, kind: str) -> bool:
    """`path` holds a study (it has `scales`), read as the service will read it; False where it does not parse
    (the service names what is wrong)."""
    from sweeps.spec import SpecLoadError, parse_document
    from sweeps.study import is_study

    try:
        return is_study(parse_document(path.read_text(encoding="utf-8"), "json" if kind.endswith("json") else "yaml"))
    except (OSError, UnicodeDecodeError, SpecLoadError):
        return False


def _load_study(path: Path) -> Any:
    """The study in `path`, or None when the file is a sweep spec (it has no `scales`); a bad study exits 2."""
    from pydantic import ValidationError

    from sweeps.spec import SpecLoadError, parse_document
    from sweeps.study import StudySpec, is_study

    try:
        data = parse_document(path.read_text(encoding="utf-8"), "json" if path.suffix.lower() == ".json" else "yaml")
    except (OSError, SpecLoadError):
        return None  # _load_spec reports it
    if not is_study(data):
        return None
    try:
        return StudySpec.model_validate(data)
    except ValidationError as exc:
        err.print(f"[red]invalid study {path}:[/]")
        for e in exc.errors():
            where = ".".join(map(str, e["loc"]))
            err.print(f"  [bold]{where or 'study'}[/]: {e['msg'].removeprefix('Value error, ')}")
        raise typer.Exit(2) from None


def _price_study(study: Any, config: Any, as_json: bool) -> None:
    from sweeps.study import price_study, sweep_prices

    cost = price_study(study, config)
    if as_json:
        console.print_json(cost.model_dump_json())
        return
    scales, target, confirmation = sweep_prices(study, cost)
    _print_study(
        study.name,
        {
            "sweeps": [s.model_dump(mode="json") for s in scales],
            "target": target.model_dump(mode="json"),
            "gpu_hours": cost.gpu_hours.model_dump(),
            "ratio": cost.ratio.model_dump(),
            "confirmation": confirmation.model_dump(mode="json") if confirmation is not None else None,
        },
    )


def _print_study(name: str, priced: dict[str, Any]) -> None:
    """A study's price (`POST /studies/dry-run`'s answer, or the same built here) as a table."""
    confirmation = priced.get("confirmation")  # its sweep comes from the fitted law: priced at the most it can train
    sweeps = f"{len(priced['sweeps'])} sweeps{' and its confirmation' if confirmation else ''}"
    table = Table(title=f"{name}: a study of {sweeps}, priced before it runs", title_justify="left")
    for column in ("sweep", "model", "tokens a trial", "trials", "GPU-hours"):
        table.add_column(column, justify="right" if column != "sweep" else "left")
    rows = [(s, "") for s in priced["sweeps"]] + ([(confirmation, " (confirmation, at most)")] if confirmation else [])
    for s, label in [*rows, (priced["target"], " (what the study replaces)")]:
        hours = _span(s["cost"]["gpu_hours"], _hours)
        trials = _span(s["cost"]["trials"], lambda n: f"{n:,}")
        table.add_row(s["name"] + label, s["model"], f"{s['trained_tokens']:.3g}", trials, hours)
    console.print(table)
    ratio = priced["ratio"]
    console.print(
        f"the scales: {_span(priced['gpu_hours'], _hours)} GPU-hours, "
        f"{ratio['max']:.2f} of the sweep at the target ({ratio['min']:.2f} at the fewest trials of each)"
    )
    if confirmation:
        console.print(
            f"confirmation (at most): {_hours(confirmation['cost']['gpu_hours']['max'])} GPU-hours more, the target's "
            "spec at the reference and the sizes its predictions can pick"
        )


def _print_cost(name: str, c: dict[str, Any]) -> None:
    """The dry run's `cost` (sweeps.cost.SweepCost as JSON) as a table."""
    hours = _span(c["gpu_hours"], _hours)
    table = Table(title=f"{name}: cost before it runs", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    peak = f"{c['peak_flops'] / 1e12:g} TFLOP/s dense bf16 ({'given' if c['peak_from'] == 'peak_tflops' else 'table'})"
    table.add_row("GPU", f"{c['gpu']}: {peak}, at MFU {c['mfu']:g}")
    table.add_row(
        "model",
        f"{_si(c['parameters'])} parameters ({_si(c['flop_parameters'])} in 6N); "
        f"{c['training_flops_per_token'] / 1e9:.3g} GFLOP per trained token (6N + 12 L T d)",
    )
    table.add_row("trials", f"{_span(c['trials'], str)} ({c['search_trials']} of them lr search)")
    table.add_row("tokens per trial", _si(c["trained_tokens"]))
    pruned = f"; pruning can cut up to {_si(c['prunable_training_tokens'])} of it" if c["pruning"] else ""
    table.add_row("training tokens", f"{_span(c['training_tokens'], _si)}{pruned}")
    table.add_row(
        "evaluation tokens", f"{_span(c['evaluation_tokens'], _si)} ({_span(c['evaluations'], str)} evaluations)"
    )
    table.add_row("model FLOPs", _span(c["total_flops"], lambda f: f"{f:.3g}"))
    table.add_row("GPU-hours", f"[bold]{hours}[/]" + (" (upper bound)" if c["pruning"] else ""))
    console.print(table)
    for note in c.get("notes", []):
        console.print(f"  [dim]{note}[/]")


@app.command()
def plots(
    sweep_id: str = typer.Argument(..., help="the sweep id (its MLflow experiment name)"),
    out: Optional[Path] = typer.Option(None, "--out", help="also keep the files in this folder"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="default $SWEEPS_DATA_DIR or ./.batchsweep"),
) -> None:
    """(Re)draw a recorded sweep's figures and log them to its MLflow summary run."""
    from dashboards import SweepDataError, publish
    from sweeps.settings import runtime_from_env

    runtime = runtime_from_env(data_dir)
    try:
        paths = publish(runtime.tracking_uri, sweep_id, out_dir=out)
    except SweepDataError as exc:
        err.print(f"[red]no figures for sweep {sweep_id!r}:[/] {exc}")
        raise typer.Exit(2) from None
    for path in paths:
        console.print(str(path))
    console.print(
        f"logged under figures/ of the summary run of MLflow experiment [bold]{sweep_id}[/] ({runtime.tracking_uri})"
    )


def _leaders(progress: SweepProgress) -> str:
    """The last cells' val loss so far: the confirmation runs' mean once there is one, else the
    search's minimum, marked as such (it is biased low)."""
    leaders = []
    for c in progress.cells:
        if c.confirmed_val_loss_mean is not None:
            leaders.append(f"{c.cell} {c.confirmed_val_loss_mean:.3f}")
        elif c.search_best_val_loss is not None:
            leaders.append(f"{c.cell} {c.search_best_val_loss:.3f} (search)")
    return "val loss so far: " + (", ".join(leaders[-4:]) or "-")


def _print_report(report: dict[str, Any] | Report) -> None:
    """The report's cells and answer as tables: a sweep's `Report`, or its JSON read through the model
    (`sweeps.analysis.read_report`: a newer writer's added top-level keys are left out); JSON that does not
    match is refused by name (exit 2), never half printed."""
    from pydantic import ValidationError

    from sweeps.analysis import describe_bracket, read_report
    from sweeps.report import describe_noise

    try:
        r = read_report(report)
    except ValidationError as exc:
        version = report.get("schema_version") if isinstance(report, dict) else None
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the report"
        err.print(
            f"[red]not a report of this version (schema_version {version!r}):[/] "
            f"{where}: {first['msg']} ({exc.error_count()} problems)"
        )
        raise typer.Exit(2) from None
    for name, opt in r.optimizers.items():
        t = Table(title=f"{name}", title_justify="left")
        for col in (
            "batch", "best lr", "val loss (mean of confirmations)", "95% CI", "seeds", "trials c/p/d/f", "lr at edge",
            "stable",
        ):  # fmt: skip
            t.add_column(col)
        searched = any(c.warmups_tried for c in opt.cells)  # schedule.warmup_search: each cell's winner
        if searched:
            t.add_column("warm-up")
        for c in opt.cells:
            lo, hi = c.val_loss_ci95
            warmup = [f"{c.warmup:g}" if c.warmup is not None else "-"] if searched else []
            t.add_row(
                str(c.batch_size),
                f"{c.best_lr:.2e}" if c.best_lr else "-",
                f"{c.val_loss_mean:.4f}" if c.val_loss_mean is not None else "-",
                f"[{lo:.4f}, {hi:.4f}]" if lo is not None and hi is not None else "-",
                str(c.seeds),
                "/".join(str(getattr(c.trial_status, k)) for k in RESULT_STATUSES),
                "yes" if c.lr_at_edge else "",
                {True: "yes", False: "[red]no[/]", None: "-"}[c.stable],
                *warmup,
            )
        console.print(t)
        for st in opt.search_steps:  # a search of the batch axis: the sizes in the order chosen
            seeds = f", {st.seeds_added} more seeds" if st.seeds_added else ""
            console.print(f"  {st.order}. bs={st.batch_size} {st.chosen}: {st.why}{seeds}")
        for c in opt.cells:
            if c.unstable_reason:
                console.print(f"[yellow]{name} bs={c.batch_size}:[/] {c.unstable_reason}")
    if r.warmup:
        console.print(f"warm-up: {r.warmup}")
    answer = Table(
        title=f"largest degradation-free batch size (tolerance {r.tolerance:.1%}, reference batch {r.reference_batch_size})"
        f": decided with 95% confidence, and the point estimate",
        title_justify="left",
    )
    for col in ("optimizer", "vs itself: decided", "estimate", f"vs {r.baseline}: decided", "estimate"):
        answer.add_column(col)
    for name, opt in r.optimizers.items():
        ans = opt.largest_degradation_free_batch_size
        answer.add_row(
            name,
            describe_bracket(opt.bracket.self),
            str(ans.self if ans.self is not None else "none"),
            describe_bracket(opt.bracket.baseline),
            str(ans.baseline if ans.baseline is not None else "none"),
        )
    console.print(answer)
    for name, opt in r.optimizers.items():  # where the seeds cannot tell the answer from its neighbour
        for ref, against in (("self", "itself"), ("baseline", r.baseline)):
            if (noise := describe_noise(opt, ref)) and not (ref == "baseline" and name == r.baseline):
                console.print(f"{name} vs {against}: {noise} (more seeds at those sizes would decide it)")
    if r.verdict_rule:
        console.print(f"[dim]{r.verdict_rule}[/]")
    for w in r.warnings:
        console.print(f"[yellow]warning:[/] {w}")


# --------------------------------------------------------------------------------------------------
# Client of the HTTP service (service/): submit, list, status, cancel, report; and serve to start it
# --------------------------------------------------------------------------------------------------

_URL = typer.Option("http://127.0.0.1:8000", "--url", envvar="SWEEPS_URL", help="service URL")
_TOKEN = typer.Option(None, "--token", envvar="SWEEPS_TOKEN", help="bearer token (see SWEEPS_TOKENS of the service)")
_FINAL = tuple(FINAL_SWEEP_STATUSES)


def _client(url: str, token: Optional[str]) -> Any:
    import httpx

    if not token:
        err.print("[red]no token:[/] pass --token or set SWEEPS_TOKEN")
        raise typer.Exit(2)
    return httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _call(client: Any, method: str, path: str, **kw: Any) -> Any:
    """The response of a successful call; an error answer is printed (code, message, fields) and exits."""
    import httpx

    try:
        resp = client.request(method, path, **kw)
    except httpx.TransportError as exc:
        err.print(f"[red]cannot reach the service at {client.base_url}:[/] {exc}")
        raise typer.Exit(3) from None
    if resp.is_success:
        return resp
    try:
        e = resp.json()["error"]
        err.print(f"[red]{resp.status_code} {e['code']}:[/] {e['message']}")
        for d in e.get("details", []):
            field, value = d.get("field") or "(spec)", json.dumps(d.get("value"))
            err.print(f"  [bold]{field}[/]: {d.get('message')} (value: {value})")
    except (ValueError, KeyError, TypeError):
        err.print(f"[red]{resp.status_code}:[/] {resp.text[:500]}")
    raise typer.Exit(2 if resp.status_code == 422 else 1)


def _progress_of(s: dict[str, Any]) -> SweepProgress:
    """The progress of a sweep's JSON (`GET /sweeps/{id}`, its events), read through the driver's model."""
    from sweeps.progress import Progress as SweepProgress

    return SweepProgress.model_validate(s["progress"])


def _progress_line(p: SweepProgress) -> str:
    return f"{p.trials_done}/{p.trials_total} trials, {p.cells_done}/{p.cells_total} cells"


@app.command()
def submit(
    spec_path: Path = typer.Argument(..., help="sweep spec, YAML or JSON"),
    watch: bool = typer.Option(False, "--watch", help="follow the progress, then print the answer"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="validate only and print the cost: nothing is stored or started"
    ),
    gpu: Optional[str] = _GPU,
    mfu: Optional[float] = _MFU,
    peak_tflops: Optional[float] = _PEAK,
    idempotency_key: Optional[str] = typer.Option(
        None, "--idempotency-key", help="a retry with the same key returns the same sweep"
    ),
    url: str = _URL,
    token: Optional[str] = _TOKEN,
) -> None:
    """Submit a sweep to the service; prints its id (with --watch: its progress and answer). A study file
    (sweeps/study.py) is priced by the service with --dry-run; `sweeps study` runs one."""
    pricing = {k: v for k, v in {"gpu": gpu, "mfu": mfu, "peak_tflops": peak_tflops}.items() if v is not None}
    if pricing and not dry_run:
        err.print("[red]--gpu, --mfu and --peak-tflops price a --dry-run;[/] add --dry-run")
        raise typer.Exit(2)
    try:
        body = spec_path.read_bytes()
    except OSError as exc:
        err.print(f"[red]cannot read {spec_path}:[/] {exc}")
        raise typer.Exit(2) from None
    kind = "application/json" if spec_path.suffix.lower() == ".json" else "application/yaml"
    headers = {"Content-Type": kind} | ({"Idempotency-Key": idempotency_key} if idempotency_key else {})
    if _is_study_file(spec_path, kind):
        if not dry_run:
            err.print(f"[red]{spec_path} is a study:[/] the service prices one (--dry-run); `sweeps study` runs it")
            raise typer.Exit(2)
        with _client(url, token) as client:
            out = _call(client, "POST", "/studies/dry-run", content=body, headers=headers, params=pricing).json()
        _print_study(out["study"]["name"], out)
        from service.verdicts import GpuHoursCaps

        caps = GpuHoursCaps.model_validate(out["caps"])
        console.print(caps.summary(), style=None if caps.passes else "red", markup=False)
        return
    with _client(url, token) as client:
        params = {"dry_run": "true", **pricing} if dry_run else None
        resp = _call(client, "POST", "/sweeps", content=body, headers=headers, params=params)
        out = resp.json()
        if dry_run:
            console.print(f"valid: [bold]{out['spec']['name']}[/], {out['cells']} cells, {out['total_trials']} trials")
            _print_cost(out["spec"]["name"], out["cost"])
            from service.verdicts import ClusterFit, GpuHoursCaps

            caps = GpuHoursCaps.model_validate(out["caps"])
            console.print(caps.summary(), style=None if caps.passes else "red", markup=False)
            if out.get("cluster") is not None:
                fit = ClusterFit.model_validate(out["cluster"])
                console.print(fit.summary(), style=None if fit.passes else "red", markup=False)
            return
        if not watch:
            console.print(out["id"])  # bare, for scripts: ID=$(sweeps submit spec.yaml)
        else:
            console.print(f"submitted [bold]{out['id']}[/]{' (replayed)' if out['replayed'] else ''}")
            _watch(client, out["id"])


@contextlib.contextmanager
def _progress_display() -> Iterator[Callable[[dict[str, Any]], None]]:
    """What --watch shows of each progress event: bars on a terminal; elsewhere (a log file, a pipe) one
    plain line whenever the progress changed, so `make demo > log` shows the sweep moving."""
    if not console.is_terminal:
        last: list[str] = [""]

        def line(s: dict[str, Any]) -> None:
            p = _progress_of(s)
            text = f"{s['status']}: {_progress_line(p)}; {_leaders(p)}"
            if text != last[0]:
                print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)
                last[0] = text

        yield line
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bars:
        trials = bars.add_task("trials", total=None)
        cells = bars.add_task("cells", total=None)
        best = bars.add_task("", total=None, start=False)

        def update(s: dict[str, Any]) -> None:
            p = _progress_of(s)
            bars.update(trials, total=p.trials_total, completed=p.trials_done, description=f"trials ({s['status']})")
            bars.update(cells, total=p.cells_total, completed=p.cells_done)
            bars.update(best, description=_leaders(p))

        yield update


def _watch(client: Any, sweep_id: str) -> None:
    """Progress from the event stream; reconnects if the service restarts meanwhile."""
    import httpx
    from httpx_sse import connect_sse

    final: dict[str, Any] | None = None
    with _progress_display() as show:
        failures = 0
        while final is None:
            try:
                # httpx-sse parses the stream (fields, multi-line data, comments) to the SSE spec
                with connect_sse(
                    client, "GET", f"/sweeps/{sweep_id}/events", timeout=httpx.Timeout(30, read=None)
                ) as source:
                    resp = source.response
                    if resp.status_code != 200:
                        resp.read()
                        _call(client, "GET", f"/sweeps/{sweep_id}")  # prints the error and exits
                    failures = 0
                    for sse in source.iter_sse():
                        if sse.event not in ("progress", "end"):
                            continue  # the `retry:` hint (and nameless events)
                        s = sse.json()
                        if s.get("progress"):
                            show(s)
                        if sse.event == "end":
                            final = s
                            break
            except httpx.TransportError as exc:
                failures += 1
                if failures > 30:
                    err.print(f"[red]lost the service:[/] {exc}")
                    raise typer.Exit(3) from None
                time.sleep(min(10.0, 0.5 * failures))  # the service may be restarting
    _print_final(client, final)


def _print_final(client: Any, s: dict[str, Any]) -> None:
    console.print(f"[bold]{s['id']}[/]: {s['status']} ({_progress_line(_progress_of(s))})")
    if s.get("error"):
        console.print(f"[red]error:[/] {s['error']}")
    if s["status"] in (SweepStatus.succeeded, SweepStatus.cancelled):
        report = client.get(f"/sweeps/{s['id']}/report")
        if report.is_success:
            _print_report(report.json())
    if s.get("mlflow_url"):
        console.print(f"MLflow: {s['mlflow_url']}")
    elif s.get("experiment_id"):
        console.print(f"MLflow experiment id {s['experiment_id']} (name {s['id']})")


@app.command("list")
def list_sweeps(
    status: Optional[list[str]] = typer.Option(None, "--status", help="only these statuses (repeat the flag)"),
    limit: int = typer.Option(20, "--limit", min=1, max=100),
    offset: int = typer.Option(0, "--offset", min=0),
    url: str = _URL,
    token: Optional[str] = _TOKEN,
) -> None:
    """Your sweeps, newest first."""
    with _client(url, token) as client:
        page = _call(client, "GET", "/sweeps", params={"status": status or [], "limit": limit, "offset": offset}).json()
    t = Table(title=f"sweeps {offset + 1}-{offset + len(page['items'])} of {page['total']}", title_justify="left")
    for col in ("id", "status", "trials", "cells", "created"):
        t.add_column(col)
    for s in page["items"]:
        p = _progress_of(s)
        t.add_row(
            s["id"],
            s["status"],
            f"{p.trials_done}/{p.trials_total}",
            f"{p.cells_done}/{p.cells_total}",
            s["created_at"][:19],
        )
    console.print(t)


def _done_of(done: int, total: int | None) -> str:
    """Runs done against those planned ("3/6"), or done alone ("3") where none are planned yet."""
    return str(done) if total is None else f"{done}/{total}"


@app.command()
def status(
    sweep_id: str = typer.Argument(...),
    as_json: bool = typer.Option(False, "--json", help="print the sweep JSON"),
    url: str = _URL,
    token: Optional[str] = _TOKEN,
) -> None:
    """A sweep's status and progress: per cell, trials done and the best val loss so far."""
    with _client(url, token) as client:
        s = _call(client, "GET", f"/sweeps/{sweep_id}").json()
    if as_json:
        console.print_json(data=s)
        return
    cancelling = " (cancel requested)" if s["cancel_requested"] and s["status"] not in _FINAL else ""
    progress = _progress_of(s)
    console.print(f"[bold]{s['id']}[/]: {s['status']}{cancelling}, {_progress_line(progress)}")
    console.print(f"created {s['created_at']}, started {s['started_at'] or '-'}, finished {s['finished_at'] or '-'}")
    t = Table()
    for col in ("cell", "search", "seeds", "best lr", "search best (biased low)", "confirmed mean", "done"):
        t.add_column(col)
    for c in progress.cells:
        t.add_row(
            c.cell,
            _done_of(c.search_done, c.search_total),
            _done_of(c.seeds_done, c.seeds_total),
            f"{c.best_lr:.2e}" if c.best_lr else "-",
            f"{c.search_best_val_loss:.4f}" if c.search_best_val_loss is not None else "-",
            f"{c.confirmed_val_loss_mean:.4f}" if c.confirmed_val_loss_mean is not None else "-",
            f"stopped: {c.stopped}" if c.stopped else "yes" if c.finished else "",
        )
    console.print(t)
    if s.get("error"):
        console.print(f"[red]error:[/] {s['error']}")
    if s.get("mlflow_url") or s.get("experiment_id"):
        console.print(f"MLflow: {s.get('mlflow_url') or 'experiment id ' + str(s['experiment_id'])}")


@app.command()
def cancel(sweep_id: str = typer.Argument(...), url: str = _URL, token: Optional[str] = _TOKEN) -> None:
    """Stop a sweep's Ray work; finished trials are kept and reported."""
    with _client(url, token) as client:
        s = _call(client, "POST", f"/sweeps/{sweep_id}/cancel").json()
    console.print(f"{s['id']}: {s['status']}{'' if s['status'] in _FINAL else ', cancelling'}")


@app.command()
def report(
    sweep_id: str = typer.Argument(...),
    out: Optional[Path] = typer.Option(None, "--out", help="also write the report JSON here"),
    as_json: bool = typer.Option(False, "--json", help="print the report JSON instead of tables"),
    url: str = _URL,
    token: Optional[str] = _TOKEN,
) -> None:
    """A finished sweep's answer (the service answers 409 while it runs)."""
    with _client(url, token) as client:
        rep = _call(client, "GET", f"/sweeps/{sweep_id}/report").json()
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rep, indent=2))
    if as_json:
        console.print_json(data=rep)
    else:
        _print_report(rep)


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, "--host", help="default $SWEEPS_HOST or 127.0.0.1"),
    port: Optional[int] = typer.Option(None, "--port", help="default $SWEEPS_PORT or 8000"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Start the HTTP service (settings from the environment: SWEEPS_*, RAY_ADDRESS, MLFLOW_TRACKING_URI).

    With no RAY_ADDRESS the service runs its own local Ray head (127.0.0.1 only, token auth, state
    under $SWEEPS_DATA_DIR/ray/) in a process group of its own: it outlives the service, so a restarted
    service finds its running sweeps again. Stop it with `sweeps stop-head` (same SWEEPS_DATA_DIR).
    The data dir is made 0700 (tightened where it is looser), and the service runs with a umask of 077.
    """
    from service.private import start_private
    from service.server import serve as run_server
    from service.settings import SettingsError, load_settings

    overrides: dict[str, Any] = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        for problem in exc.problems:
            err.print(f"[red]bad setting[/] {problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    start_private(settings, log_level)
    run_server(settings, log_level=log_level)


@app.command("stop-head")
def stop_head(
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="default $SWEEPS_DATA_DIR or ./.batchsweep"),
) -> None:
    """Stop the local Ray head that `sweeps serve` started for this data dir (its sweeps stop with it).

    Only that head and the processes below it are stopped, by process id: other Ray clusters on the
    machine are left alone.
    """
    from service.cluster.ray_head import LocalRayHead
    from service.settings import Settings

    root = data_dir.resolve() if data_dir else Settings().data_dir
    state = LocalRayHead(root).stop()
    if state is None:
        console.print(f"no local Ray head is running for {root}")
    else:
        console.print(f"stopped the local Ray head at {state.address} (pid {state.pid})")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
