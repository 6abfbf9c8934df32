"""The default path of the README, for a minute or two, with the faults an on-call engineer sees.

`sweeps serve` exactly as the README runs it: no RAY_ADDRESS (the service starts its own local Ray
head), SQLite stores in the data dir. One sweep of a minute or two runs while the test

- churns the service's worker-thread pool (bursts of concurrent requests, then idle spells longer
  than anyio's idle-thread timeout, so threads come and go: a Ray head forked from one of them would
  be SIGKILLed when it exits); the API process's thread count is read after each burst and before the
  next, so the test sees the pool's threads exit, again and again, rather than assuming it,
- kills the API with SIGKILL and restarts it, then stops it with SIGTERM and restarts it (the sweep
  keeps running on the same head; the restarted service finds it),
- SIGKILLs the sweep's driver actor (relaunched under the same id, it resumes from Optuna),
- SIGKILLs a trial's worker process (Tune restarts the trial; it is never a search result).

Before the faults, once the stores and every kind of folder exist (Ray's, mlartifacts/, ray_results/), the
machine's other users reach nothing of the service's: `nobody` (setpriv) reads no file under the data dir,
lists no folder and creates a file in none; the data dir, made 0755 before the service starts, is 0700
(tightened, and logged), and the service, its Ray head and every process below the head run with a umask of
077.

Afterwards the sweep has succeeded, every planned trial is recorded exactly once in Optuna and in
MLflow, nothing is left RUNNING, and the report's trial counts are the planned ones. Processes are
found below the head's pid in /proc and stopped by pid; the head by `LocalRayHead.stop`.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from fault_helpers import AUTH, assert_private, assert_recorded_once, wait
from harness import ServiceProcess

from service.cluster.processes import alive, cmdline, descendants
from service.cluster.ray_head import MAX_TEMP_DIR_CHARS, LocalRayHead
from sweeps.spec import REFERENCE_EXTRA_TRIALS, cell_search_trials

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1200)]

# 2 optimizers at one batch size, the reference: 2 x (3 search + 1 more at the reference + 2 confirmation
# runs) = 12 trials of 24,576 tokens (3-12 s each, 2 at a time): the faults land after 2 and 5 finished
# trials, and about half of the sweep is left to run after the last one
SPEC = """
name: faults
model: {preset: gpt2-nano, seq_len: 32}
data: {source: builtin, vocab_size: 512}
optimizers: [{name: adamw}, {name: merit}]
batch_sizes: [4]
token_budget: 24576
eval_every_tokens: 6144
eval_tokens: 4096
lr: {min: 1.0e-3, max: 3.0e-2, trials_per_batch_size: 3}
seeds: 2
degradation: {tolerance: 0.05, baseline: adamw}
resources: {max_concurrent_trials: 2}
pruning: {enabled: false}
"""
PLANNED_SEARCH, PLANNED_SEEDS, CELLS = 3, 2, 2  # and one more search trial in each, at the reference
PLANNED_TRIALS = CELLS * (PLANNED_SEARCH + PLANNED_SEEDS + REFERENCE_EXTRA_TRIALS)  # 12


class Churn:
    """Bursts of concurrent requests, then idle spells longer than anyio's 10 s idle-thread timeout.
    `exits`: the bursts after which the API process had fewer threads by the next one (its pool's
    threads exited while idle), as (threads after the burst, threads before the next)."""

    def __init__(self, url: str, sweep_id: str, api_pid: Callable[[], int | None]) -> None:
        self.url, self.sweep_id, self.api_pid = url, sweep_id, api_pid
        self.stop = threading.Event()
        self.bursts = 0
        self.exits: list[tuple[int, int]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _threads(self) -> tuple[int | None, int | None]:
        pid = self.api_pid()
        try:
            return pid, psutil.Process(pid).num_threads() if pid else None
        except psutil.Error:
            return pid, None  # the API is being restarted by the test

    def _run(self) -> None:
        paths = ["/sweeps", f"/sweeps/{self.sweep_id}", f"/sweeps/{self.sweep_id}/report", "/healthz"]
        with httpx.Client(base_url=self.url, headers=AUTH, timeout=10) as client, ThreadPoolExecutor(24) as pool:

            def get(i: int) -> None:
                try:
                    client.get(paths[i % len(paths)])
                except httpx.TransportError:
                    pass  # the API is being restarted by the test

            while not self.stop.is_set():
                list(pool.map(get, range(96)))
                self.bursts += 1
                pid, after = self._threads()
                self.stop.wait(12)
                same_pid, before_next = self._threads()
                if same_pid == pid and after is not None and before_next is not None and before_next < after:
                    self.exits.append((after, before_next))

    def __enter__(self) -> Churn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def _processes_below(pid: int, marker: str) -> list[int]:
    return [p for p in descendants(pid) if any(marker in part for part in cmdline(p))]


@pytest.fixture
def open_parent() -> Iterator[Path]:
    """A folder everyone may enter, so that only the data dir's own modes stand between `nobody` and the stores;
    short, so that Ray's own folders (sessions, logs, sockets) are under <data dir>/ray/tmp."""
    parent = Path(tempfile.mkdtemp(prefix="bsp", dir="/tmp"))
    parent.chmod(0o755)
    try:
        yield parent
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_default_path_survives_restarts_and_killed_processes(
    open_parent: Path, serve: Callable[..., tuple[ServiceProcess, Path]]
) -> None:
    # open_parent first: set up before the service, removed after it stopped
    # acting as another user (setpriv) needs root: CI and the project's machines run the suite as root
    assert os.geteuid() == 0 and shutil.which("setpriv"), "this test needs root and util-linux's setpriv"
    data_dir = open_parent / "data"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)  # as `mkdir -p` under the usual umask of 022 makes it
    assert len(str(data_dir / "ray" / "tmp")) <= MAX_TEMP_DIR_CHARS
    svc, data_dir = serve(data_dir=data_dir)
    head = LocalRayHead(data_dir)
    first = head.running()
    assert first is not None, "sweeps serve with no RAY_ADDRESS must run its own Ray head"
    assert first.address.startswith("127.0.0.1:")
    assert Path(first.temp_dir) == data_dir / "ray" / "tmp" and list(Path(first.temp_dir).glob("session_*/logs"))
    assert f"{data_dir} was mode 0755: tightened to 0700" in svc.tail(100_000)

    client = httpx.Client(base_url=svc.url, headers=AUTH, timeout=30)
    created = client.post("/sweeps", content=SPEC, headers={"Content-Type": "application/yaml"})
    assert created.status_code == 201, created.text
    sweep_id = created.json()["id"]
    started = time.monotonic()

    def sweep() -> dict[str, Any]:
        return client.get(f"/sweeps/{sweep_id}").json()

    def trials_done(n: int) -> bool:
        return sweep()["progress"]["trials_done"] >= n

    with Churn(svc.url, sweep_id, lambda: svc.proc.pid if svc.proc else None) as churn:
        wait(lambda: trials_done(2), 240, "2 finished trials")
        # 0. every store and every kind of folder exists: the machine's other users reach none of them
        assert (data_dir / "mlartifacts").is_dir() and any((data_dir / "ray_results").glob("*/*/"))
        assert svc.proc is not None
        assert_private(data_dir, open_parent, svc.proc.pid, first.pid, descendants(first.pid))

        # 1. the API dies hard, and comes back: the sweep kept running on the same head
        os.killpg(svc.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        svc.proc.wait()  # type: ignore[union-attr]
        svc.proc = None
        svc.start(timeout_s=180)
        assert head.running() == first, "a restarted service must reuse its Ray head"
        s = sweep()
        assert (s["status"], s["driver_starts"]) == ("running", 1), s

        # 2. a graceful stop, and back
        svc.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert svc.proc.wait(timeout=60) is not None  # type: ignore[union-attr]
        svc.proc = None
        svc.start(timeout_s=180)
        assert head.running() == first
        wait(lambda: trials_done(5), 300, "5 finished trials")
        assert sweep()["driver_starts"] == 1

        # 3. the driver actor dies: relaunched under the same id, it resumes from Optuna
        drivers = _processes_below(first.pid, "SweepActor")
        assert len(drivers) == 1, drivers
        done_before = sweep()["progress"]["trials_done"]
        old_workers = set(_processes_below(first.pid, "ImplicitFunc"))  # they die with their driver
        os.kill(drivers[0], signal.SIGKILL)
        wait(lambda: sweep()["driver_starts"] == 2, 120, "the driver relaunched")
        s = wait(
            lambda: (x := sweep())["status"] == "running" and x["progress"]["trials_done"] >= done_before and x,
            180,
            "the resumed driver's progress",
        )
        assert s["progress"]["trials_done"] >= done_before  # finished trials were kept

        # 4. a trial's worker process dies: Tune restarts that trial. The worker must be one of the new
        # driver's trials, training now (its title names the method): one left over from the killed
        # driver may still be on its way out, and killing it would test nothing
        def training_now() -> list[int]:
            return [p for p in _processes_below(first.pid, "ImplicitFunc.train") if p not in old_workers]

        workers = wait(training_now, 180, "a trial of the relaunched driver, training")
        os.kill(workers[0], signal.SIGKILL)

        final = wait(lambda: (x := sweep())["status"] in ("succeeded", "failed", "cancelled") and x, 900, "the end")
        elapsed = time.monotonic() - started
        # the thread pool really was churned, repeatedly: its idle threads exited between bursts, twice or more
        # within one API process (the restarts above cut the count). Burst and idle spell go on after the sweep
        # where it ended first: what is checked is that the head outlives the threads, busy or not
        wait(lambda: churn.bursts >= 3 and len(churn.exits) >= 2, 120, f"2 exits of idle threads ({churn.exits})")
    assert final["status"] == "succeeded", final.get("error")
    assert churn.exits[0][0] > churn.exits[0][1], (churn.bursts, churn.exits, f"{elapsed:.0f} s")
    assert head.running() == first and alive(first.pid), "the head must outlive every thread and restart"
    s = sweep()
    assert s["progress"]["trials_done"] == s["progress"]["trials_total"] == PLANNED_TRIALS
    assert all(c["running"] == 0 for c in s["progress"]["cells"]), "a final sweep shows no running trials"

    # the report: every cell has exactly its planned trials
    report = client.get(f"/sweeps/{sweep_id}/report").json()
    cells = [c for opt in report["optimizers"].values() for c in opt["cells"]]
    assert len(cells) == CELLS
    for c in cells:
        assert c["trials"] == cell_search_trials(PLANNED_SEARCH, reference=True) + PLANNED_SEEDS, c
        assert sum(c["trial_status"].values()) == c["trials"], c
        # training never fails in this spec: a "failed" trial would be a killed worker counted as a result
        assert c["trial_status"]["failed"] == 0, c

    runs = assert_recorded_once(
        f"sqlite:///{data_dir / 'optuna.db'}", f"sqlite:///{data_dir / 'mlflow.db'}", sweep_id,
        cells=CELLS, search=PLANNED_SEARCH, seeds=PLANNED_SEEDS,
    )  # fmt: skip
    # the trial whose worker was killed was restarted by Tune, in its own run, and finished there
    restarted = [r for r in runs if int(r.data.tags.get("batchsweep.restarts", "0")) >= 1]
    assert len(restarted) >= 1
    assert all(r.data.tags["batchsweep.status"] in ("completed", "diverged") for r in restarted)
