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

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

if TYPE_CHECKING:  # each command imports these where it needs them (the report models load scipy)
    from sweeps.progress import DriverProgress

import cli.client  # noqa: F401  (registers the service client's commands on the app)
from cli.common import (
    _GPU,
    _MFU,
    _PEAK,
    _leaders,
    _print_cost,
    _print_report,
    _print_study,
    app,
    console,
    err,
)


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
            point = f", point {s.point:.0f} (sd x{math.exp(s.point_sd):.2f})" if s.point and s.point_sd else ""
            console.print(
                f"  {s.tokens:.3g} tokens{size}: [{s.largest_fine or '-'}, {s.smallest_degraded or '-'}){point}"
            )
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
