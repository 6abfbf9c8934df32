"""Write deploy/requirements.lock: every dependency the image installs, pinned, with the sha256 of its file.

    .venv/bin/python deploy/lock_requirements.py      # after `make venv`; needs PyPI

The image (deploy/Dockerfile) installs the lock with `pip install --require-hashes --no-deps`, so a package
whose file on the index changed, or one nobody locked, fails the build instead of entering the image. The
versions are the ones this project's virtualenv resolved and is tested with: the dependency closure of
`batchsweep[dashboards,postgres]` and `boto3` (the MLflow server's S3 client), read from the installed
distributions' metadata. torch is left out: the image installs it first from PyTorch's own index by its
pin (its CUDA wheels are not on PyPI), and with it its nvidia-* and triton wheels. Each file is the one pip
picks for the image (CPython 3.11, manylinux up to glibc 2.36, x86_64; an sdist where a package has no
wheel), downloaded once to hash it (from the configured index: the same files as pypi.org's).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
LOCK = HERE / "requirements.lock"
ROOTS = ("batchsweep[dashboards,postgres]", "boto3")
NOT_LOCKED = re.compile(r"^(torch|triton|nvidia-.*)$")  # from PyTorch's index, with torch (module docstring)
# the image's platform: Debian bookworm's glibc 2.36 on x86_64 takes manylinux wheels up to 2_36, the newest first
# (as pip inside the image ranks them)
GLIBC_MINORS = range(36, 16, -1)
PLATFORM = [a for m in GLIBC_MINORS for a in ("--platform", f"manylinux_2_{m}_x86_64")] + ["--python-version", "3.11"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...] = ROOTS) -> dict[str, str]:
    """{canonical name: installed version} of every distribution `roots` need here, torch's family left out."""
    env = default_environment()
    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name, extras = canonical(req.name), frozenset(req.extras)
        if NOT_LOCKED.match(name) or (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            raise SystemExit(f"{req.name} is not installed: run `make venv` first") from None
        found[name] = dist.version
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({**env, "extra": e}) for e in extras | {""}):
                todo.append(sub)
    found.pop("batchsweep", None)  # the project itself: installed from its source, after the lock
    return found


def sha256_of(name: str, version: str, workdir: Path) -> str:
    """The sha256 of the file pip picks for the image (a wheel for it, else the sdist)."""
    dest = workdir / name
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), f"{name}=={version}"]
    done = subprocess.run([*base, "--only-binary=:all:", *PLATFORM], capture_output=True, text=True)
    if done.returncode != 0:  # no wheel for the image's platform: the sdist, which pip builds there
        subprocess.run([*base, "--no-binary=:all:"], check=True, capture_output=True, text=True)
    (file,) = list(dest.iterdir())
    return hashlib.sha256(file.read_bytes()).hexdigest()


def main() -> None:
    pins = closure()
    lines = [
        "# Written by deploy/lock_requirements.py (its docstring says how and why); do not edit by hand.",
        "# Installed by deploy/Dockerfile with `pip install --require-hashes --no-deps -r deploy/requirements.lock`.",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(pins):
            digest = sha256_of(name, pins[name], Path(tmp))
            lines.append(f"{name}=={pins[name]} \\\n    --hash=sha256:{digest}")
            print(f"{name}=={pins[name]}", file=sys.stderr)
    LOCK.write_text("\n".join(lines) + "\n")
    print(f"{LOCK}: {len(pins)} packages", file=sys.stderr)


if __name__ == "__main__":
    main()
