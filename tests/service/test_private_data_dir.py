"""The machine's other users reach nothing of the service's: `sweeps serve` on embedded defaults (its own
local Ray head, SQLite stores in the data dir) runs a real sweep; once Ray's folders, the stores,
mlartifacts/ and ray_results/ exist, `nobody` (setpriv) tries to read every file under the data dir, to
list every folder and to create a file in each: every attempt is refused. The data dir, made 0755 before
the service starts, is 0700 (tightened, and logged), and the service, its Ray head and every process below
the head run with a umask of 077."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from harness import ServiceProcess, free_port, tiny_spec
from svc_helpers import ALICE, TOKENS, auth, wait_until

from service.cluster.processes import descendants
from service.cluster.ray_head import MAX_TEMP_DIR_CHARS, LocalRayHead

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# one shell as nobody for every attempt (no Python: the venv's interpreter may be where nobody cannot
# reach); prints what it managed, one line each. Lines in: `f PATH` (a file to read), `d PATH` (a folder).
# `true`, not `:`: a failed redirection of a special builtin ends a POSIX shell
PROBE = r"""
while IFS= read -r line; do
  kind=${line%% *}; path=${line#* }
  if [ "$kind" = f ]; then
    { true < "$path"; } 2>/dev/null && echo "read $path"
  else
    ls -- "$path" >/dev/null 2>&1 && echo "listed $path"
    { true > "$path/.nobody-was-here"; } 2>/dev/null && echo "created a file in $path"
  fi
done
exit 0
"""
EMBEDDED = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "SWEEPS_OPTUNA_STORAGE", "SWEEPS_DATABASE_URL")


def as_nobody(files: list[Path], dirs: list[Path]) -> list[str]:
    """What `nobody` managed to do of reading `files` and listing and writing into `dirs`."""
    lines = "".join(f"f {p}\n" for p in files) + "".join(f"d {p}\n" for p in dirs)
    out = subprocess.run([*NOBODY, "sh", "-c", PROBE], input=lines, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def umask_of(pid: int) -> str | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # it ended meanwhile
        return None
    # a process that has exited and not yet been reaped (a zombie) has no Umask line
    return next((line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), None)


# only root can act as another user; CI and the project's machines run the suite as root
@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user (setpriv) needs root")
def test_other_users_reach_nothing_under_the_data_dir(tmp_path: Path, token_cache: Path) -> None:
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv is missing: this test needs util-linux's setpriv (apt-get install -y util-linux)")
    # a parent everyone may enter, so that only the data dir's own modes stand between nobody and the stores;
    # short, so that Ray's own folders (sessions, logs, sockets) are under <data dir>/ray/tmp
    parent = Path(tempfile.mkdtemp(prefix="bsp", dir="/tmp"))
    parent.chmod(0o755)
    data_dir = parent / "data"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)  # as `mkdir -p` under the usual umask of 022 makes it
    assert len(str(data_dir / "ray" / "tmp")) <= MAX_TEMP_DIR_CHARS
    port = free_port()
    svc = ServiceProcess(
        env={
            "SWEEPS_DATA_DIR": str(data_dir),
            "SWEEPS_TOKENS": TOKENS,
            "SWEEPS_POLL_INTERVAL_S": "0.5",
            "BATCHSWEEP_CACHE": str(token_cache),
            "PYTHONUNBUFFERED": "1",
        },
        log_path=tmp_path / "serve.log",
        port=port,
        command=[str(Path(sys.executable).parent / "sweeps"), "serve", "--host", "127.0.0.1", "--port", str(port)],
        unset=EMBEDDED,
    )
    try:
        svc.start(timeout_s=180)
        resp = httpx.post(f"{svc.url}/sweeps", json=tiny_spec("private"), headers=auth(ALICE), timeout=30)
        assert resp.status_code == 201, resp.text
        stores = [data_dir / name for name in ("service.db", "optuna.db", "mlflow.db")]
        # the first trial has a folder of its own: every store and every kind of folder exists
        wait_until(
            lambda: (
                all(p.exists() for p in stores)
                and (data_dir / "mlartifacts").is_dir()
                and any((data_dir / "ray_results").glob("*/*/"))
            ),
            timeout_s=180,
            interval_s=0.5,
            what=f"the sweep's stores and folders (service log: {svc.log_path})",
        )
        head = LocalRayHead(data_dir).read()
        assert head is not None and Path(head.temp_dir) == data_dir / "ray" / "tmp"
        assert list((data_dir / "ray" / "tmp").glob("session_*/logs")), "Ray's folders are under the data dir"

        files: list[Path] = []
        dirs: list[Path] = [data_dir]
        for root, dirnames, filenames in os.walk(data_dir):
            dirs += [Path(root, d) for d in dirnames if not Path(root, d).is_symlink()]
            files += [Path(root, f) for f in filenames if stat.S_ISREG(Path(root, f).lstat().st_mode)]
        assert set(stores) <= set(files)
        assert as_nobody([], [parent]) == [f"listed {parent}"]  # the probe works
        got = as_nobody(files, dirs)
        assert got == [], f"nobody did {len(got)} of {len(files) + 2 * len(dirs)} things, e.g.\n" + "\n".join(got[::8])
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        assert f"{data_dir} was mode 0755: tightened to 0700" in svc.tail(100_000)
        # what the service and its head create is their owner's alone, whatever the folder above allows
        for path in [*stores, data_dir / "mlartifacts", data_dir / "ray_results", data_dir / "ray"]:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path}: {stat.filemode(path.stat().st_mode)}"
        assert svc.proc is not None
        pids = [svc.proc.pid, head.pid, *descendants(head.pid)]
        umasks = {pid: umask_of(pid) for pid in pids}
        assert {u for u in umasks.values() if u is not None} == {"0077"}, umasks
        assert umasks[svc.proc.pid] == umasks[head.pid] == "0077"  # these two live on: never skipped
    finally:
        svc.stop()
        LocalRayHead(data_dir).stop()
        shutil.rmtree(parent, ignore_errors=True)
