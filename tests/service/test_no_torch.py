"""The service never imports torch (nor the sweep driver): it must start fast and stay small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from fastapi.testclient import TestClient
sys.path.insert(0, {helpers!r})
sys.path.insert(0, {tests!r})  # tests/harness.py, which svc_helpers uses
from svc_helpers import FakeLauncher, fast_settings, auth
from harness import tiny_spec
from service.app import create_app
import service.cluster.launcher, service.server, service.store.migrations

from pathlib import Path
app = create_app(fast_settings(Path({data!r})), launcher=FakeLauncher())
with TestClient(app) as client:
    assert client.get("/healthz").status_code == 200  # MLflow is imported by now
    assert client.post("/sweeps", json=tiny_spec(), headers=auth()).status_code == 201
    assert client.post("/sweeps?dry_run=true", json=tiny_spec(), headers=auth()).status_code == 200
heavy = sorted(m for m in ("torch", "transformers", "sweeps.driver", "sweeps.search", "sweeps.record",
                           "worker.loop", "worker.model", "worker.data") if m in sys.modules)
print("HEAVY", heavy)
"""


def test_service_imports_neither_torch_nor_the_driver(tmp_path: Path) -> None:
    here = Path(__file__).parent
    code = SCRIPT.format(helpers=str(here), tests=str(here.parent), data=str(tmp_path / "data"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # service -> sweeps -> worker, and only the torch-free parts of them
    assert "HEAVY []" in out.stdout, out.stdout
