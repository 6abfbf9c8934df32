"""`sweeps submit | list | status | cancel | report`: the client of the HTTP service (--url or $SWEEPS_URL,
--token or $SWEEPS_TOKEN), registered on the app of cli/common.py."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sweeps.status import FINAL_SWEEP_STATUSES, SweepStatus

if TYPE_CHECKING:  # each command imports these where it needs them (the report models load scipy)
    from sweeps.progress import Progress as SweepProgress

from cli.common import (
    _GPU,
    _MFU,
    _PEAK,
    _is_study_file,
    _leaders,
    _print_cost,
    _print_report,
    _print_study,
    app,
    console,
    err,
)

PANEL = "Client of the service (--url or $SWEEPS_URL, --token or $SWEEPS_TOKEN)"  # where `--help` lists these
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


@app.command(rich_help_panel=PANEL)
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


@app.command("list", rich_help_panel=PANEL)
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


@app.command(rich_help_panel=PANEL)
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


@app.command(rich_help_panel=PANEL)
def cancel(sweep_id: str = typer.Argument(...), url: str = _URL, token: Optional[str] = _TOKEN) -> None:
    """Stop a sweep's Ray work; finished trials are kept and reported."""
    with _client(url, token) as client:
        s = _call(client, "POST", f"/sweeps/{sweep_id}/cancel").json()
    console.print(f"{s['id']}: {s['status']}{'' if s['status'] in _FINAL else ', cancelling'}")


@app.command(rich_help_panel=PANEL)
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
