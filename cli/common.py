"""What every `sweeps` command shares: the Typer app, its consoles, and the tables and figures both the
commands that work offline (cli/main.py) and the service's client (cli/client.py) print."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from sweeps.status import RESULT_STATUSES

if TYPE_CHECKING:  # each command imports these where it needs them (the report models load scipy)
    from sweeps.analysis import Report
    from sweeps.progress import Progress as SweepProgress

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Batch-size sweeps: how large can the batch get?")
console = Console()
err = Console(stderr=True)

# the pricing options of `sweeps price` and `sweeps submit --dry-run`
_GPU = typer.Option(None, "--gpu", help="GPU to price on (default H100; see worker/hardware.py for the table)")
_MFU = typer.Option(None, "--mfu", help="model FLOPs utilisation to assume, in (0, 1] (default 0.4)")
_PEAK = typer.Option(None, "--peak-tflops", help="the GPU's dense bf16 peak in TFLOP/s (overrides the table)")


@app.callback()
def _entry() -> None:
    """Before any command: a Ray cluster this process starts or joins on this machine is on loopback only,
    with token auth (worker/local_ray.py; it must come before ray is imported)."""
    from worker.local_ray import use_local_ray

    use_local_ray()


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
    sweeps_and_target = [*(s for s, _ in rows), priced["target"]]
    if axes := [
        f"{s['name']} {s['batch_sizes'][0]}..{s['batch_sizes'][-1]}" for s in sweeps_and_target if s.get("batch_sizes")
    ]:
        console.print(f"batch sizes: {', '.join(axes)}")  # a search's lattice grows with a study's budget
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
