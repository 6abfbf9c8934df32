"""Soak: many owners, many sweeps, faults throughout; nothing lost, nothing left running, nothing growing.

    python benchmarks/soak.py [--minutes 60] [--postgres] [--seed 0] [--keep DIR]

Starts `sweeps serve` as the README runs it (its own local Ray head, SQLite stores in a data dir of
its own; `--postgres`: a PostgreSQL server of its own for the service's store and Optuna), then for
`--minutes` drives it as a team would:

- 3 owners submit small real sweeps (gpt2-nano, built-in corpus) at random intervals, a third of them
  retried with the same `Idempotency-Key` (the same sweep must come back, `replayed`), some cancelled
  mid-way; each owner may run one sweep at a time (SWEEPS_MAX_CONCURRENT_PER_OWNER=1), so a submit
  often meets the limit: its 429 waits and tries again;
- 20 pollers read `GET /sweeps/{id}` of their owner's sweeps throughout (their latencies give p99);
- 5 event streams stay open throughout, 2 of them in cookie sessions (as a browser holds them: signed
  in at `POST /login`), reconnecting when a sweep ends or the API restarts;
- between the first and the last window, at random times: kill -9 of the API (restarted at once), of
  a sweep's driver actor, of a trial's worker process (processes found below the Ray head's pid).

It prints a line per window (5 minutes, or a sixth of a shorter run): sweeps by status, trials done,
the API's RSS and open file descriptors, the store's and Optuna's rows, live Ray actors and placement
groups, p99 of `GET /sweeps/{id}`. Then it stops submitting, waits for every sweep to be final, and
checks (the last line is the verdict; the exit status is 1 when any check fails):

- every submitted sweep is final, none failed (these specs cannot fail for a cause of their own, so a
  failure is a fault that was reported as a result);
- every sweep's trials are recorded once in Optuna and once in MLflow and the two agree, each trial
  identified by its Tune trial id (cell, role, seed and Optuna number must match; they do not identify
  it: the reference cell runs two search trials at seed 0), nothing is RUNNING in either; a succeeded
  sweep has every trial the product plans (`planned_trials`: `sweeps.spec.cell_search_trials` per
  cell, summing to the spec's `total_trials`, never a count of the soak's own);
- no driver actor of a final sweep is alive, and no placement group is left;
- the service's temporary folder (TMPDIR, a folder of the soak's own; Ray's sessions are in the data
  dir) holds at the end at most 10 % + 64 MiB more than at the window that ends the first third (the
  slack: files of a process killed -9 mid-write; a sweep's figures are ~5 MiB);
- the API's RSS and open file descriptors in the last window are within 10 % of their level in the window
  that ends the first third of the run (20 minutes of an hour), each window's level being its smallest
  reading of one every 5 s (the fds swing with the client connections open at an instant; a leak raises
  the floor) of an API process up 2 minutes at least (one read while it starts is far below its level; a
  window with a restart in it and no such reading gives way to the one before it), and p99 of
  `GET /sweeps/{id}` in the last window within
  1.5x of the first (faults are injected between those windows only, so the two measure the service,
  not a restart).

The HTTP API has no way to resubmit a cancelled sweep under its id; resuming is exercised by the
killed drivers (a relaunched driver resumes its sweep from Optuna). Processes are stopped by pid
(the service and its head, the PostgreSQL server): nothing else on the machine is touched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test harness's processes: one way to start each
from worker.local_ray import use_local_ray  # noqa: E402

use_local_ray()  # before anything imports ray: local Ray clusters on loopback only

from harness import ServiceProcess, create_database, postgres_server  # noqa: E402

from service.cluster.processes import cmdline, descendants, free_port  # noqa: E402
from service.cluster.ray_head import TEMP_PREFIX, LocalRayHead  # noqa: E402

OWNERS = {name: f"soak-{name}-token-0123456789" for name in ("alice", "bob", "carol")}
FINAL = ("succeeded", "failed", "cancelled")
# what the README's `sweeps serve` does not set: the embedded defaults stand
EMBEDDED = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "SWEEPS_OPTUNA_STORAGE", "SWEEPS_DATABASE_URL", "RAY_AUTH_TOKEN")
# the spec's lr.trials_per_batch_size and seeds. What a sweep of it runs is the product's to say
# (`planned_trials`): 1 search trial a cell, one more at the reference (2 of its 3 coarse lrs: a search
# that short never converges early, so a succeeded sweep ran every planned trial), 1 confirmation run.
TRIALS_PER_BATCH_SIZE, SEEDS = 1, 1


def spec(name: str) -> dict[str, Any]:
    """gpt2-nano on the built-in corpus, 2 batch sizes (search trials and confirmation runs as
    `planned_trials` counts them), one trial at a time."""
    return {
        "name": name,
        "model": {"preset": "gpt2-nano", "seq_len": 32},
        "data": {"source": "builtin"},
        "optimizers": [{"name": "adamw"}],
        "batch_sizes": [4, 8],
        "token_budget": 8192,
        "evaluation": {"every_tokens": 2048, "tokens": 4096},
        "lr": {"min": 1e-3, "max": 1e-2, "trials_per_batch_size": TRIALS_PER_BATCH_SIZE},
        "seeds": SEEDS,
        "degradation": {"tolerance": 0.05, "baseline": "adamw"},
        "resources": {"max_concurrent_trials": 1},
        "pruning": {"enabled": False},
    }


@dataclass
class Soak:
    svc: ServiceProcess
    data_dir: Path
    tmp_dir: Path  # the service's TMPDIR
    warm_s: float  # readings of an API process up this long (seconds) tell its level
    stop: threading.Event = field(default_factory=threading.Event)
    stop_submitting: threading.Event = field(default_factory=threading.Event)
    faults_on: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sweeps: dict[str, str] = field(default_factory=dict)  # id -> owner
    status: dict[str, str] = field(default_factory=dict)  # id -> its status as last read
    cancelled: set[str] = field(default_factory=set)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (time, seconds) of GET /sweeps/{id}
    # (time, RSS bytes, open fds, seconds the process had been up) of the API process, every RESOURCE_EVERY_S
    resources: list[tuple[float, int, int, float]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def client(self, owner: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.svc.url, headers={"Authorization": f"Bearer {OWNERS[owner]}"}, timeout=httpx.Timeout(30)
        )

    def ids_of(self, owner: str) -> list[str]:
        with self.lock:
            return [i for i, o in self.sweeps.items() if o == owner]

    def live_ids_of(self, owner: str) -> list[str]:
        with self.lock:
            return [i for i, o in self.sweeps.items() if o == owner and self.status.get(i) not in FINAL]

    def problem(self, text: str) -> None:
        text = " ".join(text.split())[:300]
        with self.lock:
            self.problems.append(text)
        print(f"  PROBLEM: {text}", flush=True)


# ---- the team ------------------------------------------------------------------------------------


def submitter(soak: Soak, owner: str, rng: random.Random) -> None:
    with soak.client(owner) as c:
        n = 0
        while not soak.stop_submitting.wait(rng.uniform(20, 70)):
            n += 1
            body = spec(f"soak-{owner}-{n}")
            key = f"{owner}-{n}-{rng.random():.6f}"
            try:
                r = c.post("/sweeps", json=body, headers={"Idempotency-Key": key})
                while r.status_code == 429 and not soak.stop_submitting.is_set():
                    soak.counts["submit 429"] += 1
                    time.sleep(5)
                    r = c.post("/sweeps", json=body, headers={"Idempotency-Key": key})
                if r.status_code != 201:
                    if r.status_code != 429:
                        soak.problem(f"submit of {owner} answered {r.status_code}: {r.text[:300]}")
                    continue
                sweep_id = r.json()["id"]
                with soak.lock:
                    soak.sweeps[sweep_id] = owner
                soak.counts["submitted"] += 1
                if rng.random() < 1 / 3:  # the client retries: the same sweep comes back
                    again = c.post("/sweeps", json=body, headers={"Idempotency-Key": key})
                    soak.counts["retried"] += 1
                    if again.status_code != 201 or again.json().get("id") != sweep_id or not again.json()["replayed"]:
                        soak.problem(f"a retried submit of {sweep_id} answered {again.status_code}: {again.text[:300]}")
                if rng.random() < 0.2:
                    threading.Thread(
                        target=canceller, args=(soak, owner, sweep_id, rng.uniform(5, 60)), daemon=True
                    ).start()
            except httpx.TransportError:
                soak.counts["submit during restart"] += 1  # the API was being restarted: tried again later


def canceller(soak: Soak, owner: str, sweep_id: str, after_s: float) -> None:
    if soak.stop.wait(after_s):
        return
    with soak.client(owner) as c:
        for _ in range(10):
            try:
                r = c.post(f"/sweeps/{sweep_id}/cancel")
            except httpx.TransportError:
                time.sleep(3)
                continue
            if r.status_code == 202:
                with soak.lock:
                    soak.cancelled.add(sweep_id)
                soak.counts["cancelled"] += 1
            elif r.status_code != 409:  # 409: it had finished already
                soak.problem(f"cancel of {sweep_id} answered {r.status_code}: {r.text[:300]}")
            return


def poller(soak: Soak, owner: str, rng: random.Random) -> None:
    with soak.client(owner) as c:
        while not soak.stop.wait(rng.uniform(0.5, 1.5)):
            ids = soak.ids_of(owner)
            if not ids:
                continue
            started = time.monotonic()
            try:
                r = c.get(f"/sweeps/{rng.choice(ids)}")
            except httpx.TransportError:
                soak.counts["poll during restart"] += 1
                continue
            took = time.monotonic() - started
            if r.status_code != 200:
                soak.problem(f"GET /sweeps/{{id}} answered {r.status_code}: {r.text[:300]}")
                continue
            with soak.lock:
                soak.latencies.append((time.monotonic(), took))
                soak.status[r.json()["id"]] = r.json()["status"]


def streamer(soak: Soak, owner: str, rng: random.Random, cookie: bool) -> None:
    """One event stream after another on the owner's running sweeps, in one session (a cookie from one
    sign-in, as a browser tab keeps it, or the bearer token)."""
    c = httpx.Client(base_url=soak.svc.url, timeout=httpx.Timeout(10, read=60))
    signed_in = False
    while not soak.stop.is_set():
        ids = soak.live_ids_of(owner)
        if not ids:
            soak.stop.wait(2)
            continue
        try:
            if cookie and not signed_in:  # the sign-in form, from the service's own origin
                r = c.post("/login", data={"token": OWNERS[owner], "next": "/"}, headers={"Origin": soak.svc.url})
                if r.status_code not in (200, 303):
                    soak.problem(f"sign-in of {owner} answered {r.status_code}")
                    soak.stop.wait(30)
                    continue
                signed_in = True
                soak.counts["signed in"] += 1
            elif not cookie:
                c.headers["Authorization"] = f"Bearer {OWNERS[owner]}"
            with c.stream("GET", f"/sweeps/{rng.choice(ids)}/events") as resp:
                if resp.status_code == 429:
                    soak.counts["stream 429"] += 1
                    soak.stop.wait(5)
                    continue
                if resp.status_code == 401 and cookie:
                    signed_in = False  # the session ended: sign in again
                    continue
                if resp.status_code != 200:
                    soak.problem(f"event stream answered {resp.status_code}")
                    continue
                soak.counts["streams opened"] += 1
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        soak.counts["events"] += 1
                    if soak.stop.is_set() or line == "event: end":
                        break
        except httpx.TransportError:
            soak.counts["stream cut"] += 1  # the API restarted: open it again
        soak.stop.wait(rng.uniform(1, 3))
    c.close()


# ---- faults ----------------------------------------------------------------------------------------


def below_head(soak: Soak, marker: str) -> list[int]:
    head = LocalRayHead(soak.data_dir).running()
    if head is None:
        return []
    return [p for p in descendants(head.pid) if any(marker in part for part in cmdline(p))]


def faults(soak: Soak, rng: random.Random, every_s: float) -> None:
    soak.faults_on.wait()
    while not soak.stop_submitting.wait(rng.uniform(0.5, 1.5) * every_s):
        if not soak.faults_on.is_set():
            continue
        kind = rng.choice(["api", "driver", "worker"])
        if kind == "api":
            proc = soak.svc.proc
            assert proc is not None
            os.killpg(proc.pid, signal.SIGKILL)  # the service's own process group: what it started
            proc.wait()
            soak.svc.proc = None
            soak.svc.start(timeout_s=180)
        else:
            pids = below_head(soak, "SweepActor" if kind == "driver" else "ImplicitFunc")
            if not pids:
                continue
            try:
                os.kill(rng.choice(pids), signal.SIGKILL)
            except ProcessLookupError:
                continue  # it ended on its own meanwhile
        soak.counts[f"killed {kind}"] += 1
        print(f"  {time.strftime('%H:%M:%S')} fault: kill -9 of the {kind}", flush=True)


# ---- measuring ---------------------------------------------------------------------------------------


RESOURCE_EVERY_S = 5.0
# A restarted API is read while it still starts: one window's floor was 141 MiB and 12 fds (a process
# seconds old) against ~330 MiB and ~45 fds of the one it replaced, which was at 330 MiB again 17 s after
# its start (sampled every 30 s). Only readings of a process up this long describe the service's level
# (or up a window, in a run shorter than 30 minutes: `--minutes 3` reads at 1 minute a process up 1).
WARM_S = 120.0


def api_resources(soak: Soak) -> tuple[int, int, float] | None:
    """RSS (bytes), open file descriptors and seconds up of the API process; None while it is down."""
    import psutil

    pid = soak.svc.proc.pid if soak.svc.proc else None
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return proc.memory_info().rss, proc.num_fds(), time.time() - proc.create_time()
    except psutil.Error:
        return None


def sampler(soak: Soak) -> None:
    """The API's RSS and fds every RESOURCE_EVERY_S. One reading says little: the fds include a socket per
    client connection open at that instant (25 clients, keep-alive or not, and the store's and Ray's), so
    single readings of one process swing by ~20. A leak raises the floor, so a window is judged by its
    smallest reading (and its largest is printed beside it), of the readings of a process up WARM_S."""
    while not soak.stop.wait(RESOURCE_EVERY_S):
        if (reading := api_resources(soak)) is not None:
            with soak.lock:
                soak.resources.append((time.monotonic(), *reading))


def table_rows(url: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
            return sum(conn.execute(sa.text(f'SELECT count(*) FROM "{t}"')).scalar_one() for t in tables)
    finally:
        engine.dispose()


def ray_state(soak: Soak) -> tuple[int | None, int | None]:
    """Alive actors and placement groups not removed, from the head's state API (None: not answered)."""
    head = LocalRayHead(soak.data_dir).running()
    if head is None:
        return None, None
    token_file = Path.home() / ".ray" / "auth_token"
    headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"} if token_file.exists() else {}
    out: list[int | None] = []
    for kind, alive in (("actors", "ALIVE"), ("placement_groups", "CREATED")):
        try:
            r = httpx.get(
                f"http://127.0.0.1:{head.dashboard_port}/api/v0/{kind}",
                params={"limit": 10000, "detail": "false"},
                headers=headers,
                timeout=30,
            )
            rows = r.json()["data"]["result"]["result"]
            out.append(sum(1 for row in rows if row.get("state") == alive))
        except (httpx.HTTPError, KeyError, ValueError):
            out.append(None)
    return out[0], out[1]


TMP_SLACK_BYTES = 64 * 2**20


def folder_bytes(path: Path) -> int:
    """Bytes of the files below `path`, but a Ray head's temp dir (there only when the data dir's path is
    too long for Ray's sockets): what the service's processes leave in their temporary folder."""
    total = 0
    for top, dirs, files in os.walk(path):
        if Path(top) == path:
            dirs[:] = [d for d in dirs if not d.startswith(TEMP_PREFIX)]
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:  # removed while we walked
                pass
    return total


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else math.nan


@dataclass
class Window:
    t: float
    rss: int | None  # the smallest reading of the window of a process up WARM_S (bytes); None: no such reading
    fds: int | None  # the same of the open fds
    fds_max: int
    tmp_bytes: int  # in the service's temporary folder at the window's end
    p99_s: float
    requests: int  # GET /sweeps/{id} answered in the window


def report_line(soak: Soak, started: float, since: float, urls: dict[str, str]) -> Window:
    by_status: Counter[str] = Counter()
    trials = 0
    for owner in OWNERS:
        try:
            with soak.client(owner) as c:
                page = c.get("/sweeps", params={"limit": 100}).json()
            for s in page["items"]:
                by_status[s["status"]] += 1
                trials += s["progress"]["trials_done"]
        except (httpx.HTTPError, KeyError, ValueError):
            by_status["?"] += 1
    actors, groups = ray_state(soak)
    with soak.lock:
        recent = [took for at, took in soak.latencies if at >= since]
        every = [(rss, fds, up) for at, rss, fds, up in soak.resources if at >= since]
    warm = [(rss, fds) for rss, fds, up in every if up >= soak.warm_s]
    rss = min((r for r, _ in warm), default=None)
    fds = min((f for _, f in warm), default=None)
    window = Window(
        time.monotonic() - started,
        rss,
        fds,
        max((f for _, f, _ in every), default=0),
        folder_bytes(soak.tmp_dir),
        p99(recent),
        len(recent),
    )
    level = "none warm" if rss is None else f"{rss / 2**20:.0f} MiB, fds {fds}"
    print(
        f"{window.t / 60:5.1f} min: sweeps {dict(sorted(by_status.items()))}, trials {trials}, API RSS "
        f"{level} (at most {window.fds_max}; {len(warm)} of {len(every)} readings warm), TMPDIR "
        f"{window.tmp_bytes / 2**20:.1f} MiB, rows store {table_rows(urls['store'])} optuna {table_rows(urls['optuna'])}, "
        f"Ray actors {actors} placement groups {groups}, p99 GET /sweeps/{{id}} {window.p99_s * 1e3:.0f} ms "
        f"({len(recent)} requests); {dict(sorted(soak.counts.items()))}",
        flush=True,
    )
    return window


# ---- the end ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRecord:
    """One kept trial (a result, not a run cut short to be run again) as a store holds it. Its Tune
    trial id identifies it in both stores; cell, role and seed only describe it (a cell may run several
    trials of one role and seed: the reference's search trials are all seed 0)."""

    trial_id: str | None  # Tune's trial id: the searcher's Optuna user attr, the recorder's MLflow tag
    cell: str
    role: str
    seed: int
    number: int | None  # the Optuna trial number (MLflow names it for search trials only)


def planned_trials(body: dict[str, Any]) -> dict[tuple[str, str], int]:
    """(cell, role) -> the trials a sweep of `body` runs, by the product's own rule: each cell's
    `cell_search_trials` (one more at an optimizer's smallest batch size, the reference) and `seeds`
    confirmation runs, summing to the spec's `total_trials`. Only a fixed plan has a count to check (listed
    batch sizes, fixed seeds, no warm-up search); any other spec, or a plan that does not add up to
    `total_trials` (the product's two rules disagree), raises."""
    from sweeps.plan import cell_key
    from sweeps.spec import SweepSpec, cell_search_trials

    sweep = SweepSpec.model_validate(body)
    if sweep.batch_search is not None or sweep.seeds_min != sweep.seeds_max or sweep.schedule.warmup_search:
        raise ValueError("the soak counts the trials of a fixed plan: listed batch sizes, fixed seeds, one warm-up")
    reference = min(sweep.lattice)
    planned = {}
    for optimizer in sweep.optimizer_names:
        for b in sweep.lattice:
            cell = cell_key(optimizer, b)
            planned[(cell, "search")] = cell_search_trials(sweep.search_trials, reference=b == reference)
            planned[(cell, "confirm")] = sweep.seeds_min
    if sum(planned.values()) != sweep.total_trials:
        raise ValueError(f"the cells plan {sum(planned.values())} trials, total_trials {sweep.total_trials}: {planned}")
    return planned


def optuna_record(cell: str, trial: Any) -> TrialRecord:
    """An Optuna FrozenTrial of the cell's study."""
    from sweeps.layout import role_of

    attrs = trial.user_attrs
    trial_id = attrs.get("tune_trial_id")
    return TrialRecord(
        None if trial_id is None else str(trial_id),
        cell,
        str(role_of(attrs.get("role"))),
        int(attrs.get("seed", 0)),
        trial.number,
    )


def mlflow_record(tags: dict[str, str]) -> TrialRecord:
    """An MLflow trial run, from its tags (sweeps.layout.trial_tags)."""
    from sweeps.layout import Tag, role_of

    number = tags.get(Tag.optuna_number, "")
    return TrialRecord(
        tags.get(Tag.tune_trial_id),
        tags.get(Tag.cell, "?"),
        str(role_of(tags.get(Tag.role)) or "?"),
        int(tags.get(Tag.seed, 0)),
        int(number) if number.isdigit() else None,
    )


def compare_records(
    sweep_id: str,
    status: str,
    optuna: list[TrialRecord],
    mlflow: list[TrialRecord],
    planned: dict[tuple[str, str], int],
) -> list[str]:
    """The kept trials of one sweep in Optuna and in MLflow: each Tune trial once in each, the same trials
    in both with the same cell, role, seed and Optuna number, and every planned trial (`planned_trials`)
    of a succeeded sweep. The failed checks, in words."""
    out = []
    for store, records in (("Optuna", optuna), ("MLflow", mlflow)):
        if nameless := [r for r in records if r.trial_id is None]:
            out.append(f"{sweep_id}: {len(nameless)} trials without a Tune trial id in {store}: {nameless[:3]}")
        twice = {i: n for i, n in Counter(r.trial_id for r in records if r.trial_id).items() if n > 1}
        if twice:
            out.append(f"{sweep_id}: trials recorded more than once in {store}: {twice}")
    by_id = {store: {r.trial_id: r for r in records if r.trial_id} for store, records in (("o", optuna), ("m", mlflow))}
    only_o = sorted(by_id["o"].keys() - by_id["m"].keys())
    only_m = sorted(by_id["m"].keys() - by_id["o"].keys())
    if only_o or only_m:
        out.append(f"{sweep_id} ({status}): trials only in Optuna {only_o}, only in MLflow {only_m}")
    for trial_id in sorted(by_id["o"].keys() & by_id["m"].keys()):
        o, m = by_id["o"][trial_id], by_id["m"][trial_id]
        if (o.cell, o.role, o.seed) != (m.cell, m.role, m.seed) or m.number not in (None, o.number):
            out.append(f"{sweep_id}: trial {trial_id} is {o} in Optuna, {m} in MLflow")
    if status == "succeeded":
        got = Counter((r.cell, r.role) for r in optuna)
        if any(got[k] != planned.get(k, 0) for k in got.keys() | planned.keys()):
            out.append(f"{sweep_id}: succeeded with trials {dict(got)}, planned {planned}")
    return out


def check_records(soak: Soak, urls: dict[str, str], statuses: dict[str, str]) -> list[str]:
    """Per sweep: Optuna and MLflow hold the same trials once each (`compare_records`), nothing RUNNING;
    all planned ones when it succeeded."""
    import optuna
    from mlflow.tracking import MlflowClient

    from sweeps.layout import TRIAL_ROLES, Tag, role_of
    from sweeps.status import RERUN_STATUSES

    storage = optuna.storages.RDBStorage(urls["optuna"])
    client = MlflowClient(urls["mlflow"])
    names = optuna.get_all_study_names(storage)
    planned = planned_trials(spec("planned"))  # every sweep of the soak has this spec but its name
    out = []
    for sweep_id, status in statuses.items():
        optuna_trials: list[TrialRecord] = []
        for name in (n for n in names if n.startswith(f"{sweep_id}/")):
            study = optuna.load_study(study_name=name, storage=storage)
            # WAITING: a lost design point queued again for a resume (a cancelled sweep keeps it); a
            # succeeded sweep ran them all
            stuck = ("RUNNING", "WAITING") if status == "succeeded" else ("RUNNING",)
            running = [t.number for t in study.trials if t.state.name in stuck]
            if running:
                out.append(f"{name} ({status}): trials {running} still {'/'.join(stuck)} in Optuna")
            optuna_trials += [
                optuna_record(name.split("/", 1)[1], t)
                for t in study.trials
                if t.user_attrs.get("status") not in RERUN_STATUSES and t.state.name not in ("RUNNING", "WAITING")
            ]
        exp = client.get_experiment_by_name(sweep_id)
        runs = client.search_runs([exp.experiment_id], max_results=1000) if exp else []
        if [r.info.run_name for r in runs if r.info.status == "RUNNING"]:
            out.append(f"{sweep_id}: MLflow runs still RUNNING")
        mlflow_trials = [
            mlflow_record(r.data.tags)
            for r in runs
            if role_of(r.data.tags.get(Tag.role)) in TRIAL_ROLES and r.data.tags.get(Tag.status) not in RERUN_STATUSES
        ]
        out += compare_records(sweep_id, status, optuna_trials, mlflow_trials, planned)
    return out


def verdict(soak: Soak, windows: list[Window], urls: dict[str, str], drain_s: float) -> list[str]:
    failures = list(soak.problems)
    deadline = time.monotonic() + drain_s
    statuses: dict[str, str] = {}
    while True:
        statuses = {}
        for sweep_id, owner in list(soak.sweeps.items()):
            try:
                with soak.client(owner) as c:
                    statuses[sweep_id] = c.get(f"/sweeps/{sweep_id}").json()
            except (httpx.HTTPError, ValueError):
                statuses[sweep_id] = {"status": "?"}
        if all(s["status"] in FINAL for s in statuses.values()) or time.monotonic() > deadline:
            break
        time.sleep(5)
    for sweep_id, s in statuses.items():
        if s["status"] not in FINAL:
            failures.append(f"{sweep_id} is still {s['status']} {drain_s:.0f} s after the last submit")
        elif s["status"] == "failed":
            failures.append(f"{sweep_id} failed: {s.get('error')}")
    failures += check_records(soak, urls, {i: s["status"] for i, s in statuses.items() if s["status"] in FINAL})
    time.sleep(10)  # drivers of sweeps that just ended are on their way out
    drivers = below_head(soak, "SweepActor")
    if drivers:
        failures.append(f"driver actors alive after every sweep ended: pids {drivers}")
    actors, groups = ray_state(soak)
    if groups:
        failures.append(f"{groups} placement groups left after every sweep ended")
    third = max(1, len(windows) // 3)
    # the window ending the first third, or the nearest earlier one with warm readings (one with a restart
    # in it has none); the last window is fault-free and has them unless the API died on its own
    early = next((w for w in reversed(windows[:third]) if w.rss is not None), windows[third - 1])
    late = windows[-1]
    first = next((w for w in windows if w.requests >= 100), windows[0])  # the first with sweeps to read
    for what, a, b in (("RSS", early.rss, late.rss), ("open fds", early.fds, late.fds)):
        if a is None or b is None:
            failures.append(
                f"no reading of the API's {what} up {soak.warm_s:.0f} s at {early.t / 60:.0f} min or at the end"
            )
        elif b > 1.1 * a:
            failures.append(
                f"the API's {what} (the window's smallest reading) grew from {a} to {b} (> 10 %) between "
                f"{early.t / 60:.0f} min and the end"
            )
    tmp_end = folder_bytes(soak.tmp_dir)
    if tmp_end > 1.1 * early.tmp_bytes + TMP_SLACK_BYTES:
        failures.append(
            f"the service's temporary folder grew from {early.tmp_bytes / 2**20:.1f} MiB at {early.t / 60:.0f} min "
            f"to {tmp_end / 2**20:.1f} MiB at the end (> 10 % + {TMP_SLACK_BYTES // 2**20} MiB): files left behind"
        )
    if not windows[-1].p99_s <= 1.5 * first.p99_s:
        failures.append(
            f"p99 of GET /sweeps/{{id}} {windows[-1].p99_s * 1e3:.0f} ms in the last window > 1.5x "
            f"{first.p99_s * 1e3:.0f} ms in the first with sweeps to read ({first.t / 60:.1f} min)"
        )
    counts = Counter(s["status"] for s in statuses.values())
    print(
        f"final: sweeps {dict(counts)}, Ray actors {actors}, placement groups {groups}, "
        f"TMPDIR {tmp_end / 2**20:.1f} MiB",
        flush=True,
    )
    return failures


def stop_on_signals() -> None:
    """SIGTERM, and SIGINT even where the shell started the soak in the background (which ignores SIGINT
    in it), end the soak through its `finally`: the service, its Ray head and the PostgreSQL server it
    started are stopped, not left behind."""

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGINT, terminated)


def main(argv: list[str] | None = None) -> int:
    stop_on_signals()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--postgres", action="store_true", help="the store and Optuna on a PostgreSQL server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="keep the data dir and logs here")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    planned = planned_trials(spec("planned"))  # the product's plan of each sweep: checked at the end
    root = Path(args.keep or tempfile.mkdtemp(prefix="soak-"))
    root.mkdir(parents=True, exist_ok=True)
    data_dir = root / "data"
    tmp_dir = root / "tmp"
    tmp_dir.mkdir(exist_ok=True)
    duration = args.minutes * 60
    window_s = min(300.0, duration / 6)
    env = {
        "SWEEPS_DATA_DIR": str(data_dir),
        "SWEEPS_TOKENS": ",".join(f"{o}={t}" for o, t in OWNERS.items()),
        "SWEEPS_DRIVER_RESTART_BACKOFF_S": "1",
        # one sweep at a time per owner: submits meet the limit (429) and wait, as a busy team's do
        "SWEEPS_MAX_CONCURRENT_PER_OWNER": "1",
        # the service's and its Ray processes' temporary files, measured: a long-lived service must not pile them up
        "TMPDIR": str(tmp_dir),
    }
    urls = {
        "store": f"sqlite:///{data_dir / 'service.db'}",
        "optuna": f"sqlite:///{data_dir / 'optuna.db'}",
        "mlflow": f"sqlite:///{data_dir / 'mlflow.db'}",
    }
    with postgres_server() if args.postgres else _nothing() as pg:
        if pg is not None:
            urls["store"] = create_database(pg.url, "soak_store")
            urls["optuna"] = create_database(pg.url, "soak_optuna")
            env |= {"SWEEPS_DATABASE_URL": urls["store"], "SWEEPS_OPTUNA_STORAGE": urls["optuna"]}
        port = free_port()
        command = [str(Path(sys.executable).parent / "sweeps"), "serve", "--host", "127.0.0.1", "--port", str(port)]
        unset = tuple(k for k in EMBEDDED if k not in env)
        svc = ServiceProcess(env=env, log_path=root / "api.log", port=port, command=command, unset=unset)
        svc.start(timeout_s=180)
        soak = Soak(svc, data_dir, tmp_dir, warm_s=min(WARM_S, window_s))
        print(
            f"soak: {args.minutes:g} min on {svc.url} ({'PostgreSQL' if pg else 'SQLite'} stores, data in {root}), "
            f"a line every {window_s / 60:.1f} min; each sweep plans {dict(planned)} trials",
            flush=True,
        )
        threads = [
            threading.Thread(target=submitter, args=(soak, o, random.Random(rng.random())), daemon=True) for o in OWNERS
        ]
        owners = list(OWNERS)
        threads += [
            threading.Thread(target=poller, args=(soak, owners[i % 3], random.Random(rng.random())), daemon=True)
            for i in range(20)
        ]
        threads += [
            threading.Thread(
                target=streamer, args=(soak, owners[i % 3], random.Random(rng.random()), i < 2), daemon=True
            )
            for i in range(5)
        ]
        threads.append(threading.Thread(target=faults, args=(soak, rng, max(60.0, window_s / 2)), daemon=True))
        threads.append(threading.Thread(target=sampler, args=(soak,), daemon=True))
        started = time.monotonic()
        windows: list[Window] = []
        failures: list[str] = []
        try:
            for t in threads:
                t.start()
            while (elapsed := time.monotonic() - started) < duration:
                since = time.monotonic()
                time.sleep(min(window_s, duration - elapsed))
                windows.append(report_line(soak, started, since, urls))
                # faults between the first and the last window: those two measure the service itself
                if len(windows) == 1:
                    soak.faults_on.set()
                if time.monotonic() - started >= duration - window_s - 1:
                    soak.faults_on.clear()
            soak.stop_submitting.set()
            failures = verdict(soak, windows, urls, drain_s=900)
        finally:
            soak.stop.set()
            soak.stop_submitting.set()
            svc.stop()
            LocalRayHead(data_dir).stop()  # the head `sweeps serve` started, by its pid
            if args.keep is None:
                shutil.rmtree(root, ignore_errors=True)
    for f in failures:
        print(f"  FAILED: {f}")
    counts = dict(sorted(soak.counts.items()))
    print(
        f"soak {'PASSED' if not failures else 'FAILED'}: {args.minutes:g} min, {len(soak.sweeps)} sweeps, "
        f"{len(failures)} failed checks; {json.dumps(counts)}"
    )
    return 1 if failures else 0


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
