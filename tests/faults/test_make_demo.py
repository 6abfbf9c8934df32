"""`make demo` as the README runs it: `deploy/local_demo.sh` starts `sweeps serve` on embedded
defaults (its own Ray head), an MLflow UI, submits a sweep over HTTP and watches it to the answer.
A tiny spec keeps it to about a minute; BATCHSWEEP_DEMO_EXIT=1 stops it after the answer instead of
waiting for Ctrl-C. Afterwards nothing it started is left running: not the API, not the MLflow UI,
not the Ray head (`sweeps stop-head` by pid)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from service.cluster.processes import alive
from service.cluster.ray_head import LocalRayHead

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SPEC = """
name: demo-tiny
model: {preset: gpt2-nano, seq_len: 32}
data: {source: builtin, vocab_size: 512}
optimizers: [{name: adamw}, {name: merit}]
batch_sizes: [4, 8]
token_budget: 4096
eval_every_tokens: 1024
eval_tokens: 4096
lr: {min: 1.0e-3, max: 3.0e-2, trials_per_batch_size: 1}
seeds: 2
degradation: {tolerance: 0.05, baseline: adamw}
resources: {max_concurrent_trials: 2}
"""


def test_make_demo_runs_the_default_path_to_the_answer_and_stops_what_it_started(
    tmp_path: Path, token_cache: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    data_dir = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env |= {"SWEEPS_DATA_DIR": str(data_dir), "BATCHSWEEP_DEMO_EXIT": "1", "BATCHSWEEP_CACHE": str(token_cache)}
    out = subprocess.run(
        ["bash", "deploy/local_demo.sh", str(spec)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=540
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the answer was printed, for both optimizers, and where to browse the runs
    assert "largest degradation-free batch size" in out.stdout
    assert "adamw" in out.stdout and "merit" in out.stdout and "MLflow UI: http://127.0.0.1:" in out.stdout
    # and the one URL to open in a browser: a one-time sign-in link of the service it started
    links = re.findall(r"^   (http://127\.0\.0\.1:\d+/login/once\?code=[\w-]{40,})$", out.stdout, re.M)
    assert len(links) == 1, out.stdout[-3000:]
    api = re.search(r"== sweep API on (http://127\.0\.0\.1:\d+) ", out.stdout)
    assert api and links[0].startswith(api.group(1) + "/login/once?code="), out.stdout[-3000:]
    # it ran on the service's own head, and stopped it on the way out
    assert "stopped the local Ray head at 127.0.0.1:" in out.stdout
    log = (data_dir / "ray" / "head.log").read_text(errors="replace")
    assert "Ray runtime started" in log
    assert LocalRayHead(data_dir).running() is None
    api_log = (data_dir / "api.log").read_text(errors="replace")
    assert "sweep service ready" in api_log
    started = re.search(r"started a local Ray head at 127\.0\.0\.1:\d+ \(pid (\d+)", api_log)
    assert started, api_log[-2000:]
    assert not alive(int(started.group(1))), "the demo must stop the Ray head the service started"
    # nothing the demo started is left: every process whose command line names its data dir is gone
    leftovers = []
    for stat in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = stat.read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(data_dir) in cmd and alive(int(stat.parent.name)):
            leftovers.append(cmd.replace("\0", " ")[:200])
    assert leftovers == []
