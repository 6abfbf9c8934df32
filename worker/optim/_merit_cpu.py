"""MERIT's matrix step on CPU as one hand-fused C kernel (`_merit_cpu.c`), built on first use and cached.

Why by hand: inductor's code for this step (`torch.compile` of `_merit._matrix_update`) makes some eight
passes over each matrix and measured no faster than the eager ops; MERIT's step needs only two, pass 1
(moments, u and its four max-norm vectors) and pass 2 (ratio, clip, update), which no library fuses.

The library is compiled with the system's C compiler (gcc or cc: the one inductor needs too) with
`-O3 -march=native -fopenmp` into a per-user cache directory under the temporary directory (refused
unless this user owns it and nobody else may write to it), keyed by a hash of the source, the flags and
the machine, written atomically (several Ray workers may build at once). Where there is no compiler or the build fails, `kernel()` returns None once, logs why, and MERIT
runs its eager step. OpenMP: the library links libgomp.so.1, which is the copy torch already loaded
(one thread pool); it runs on `torch.get_num_threads()` threads.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("_merit_cpu.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fPIC", "-shared")

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
build_failed: str | None = None  # why the kernel is unavailable, once it is known to be

_i64, _f32, _int, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p


def _compiler() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def _build(compiler: str) -> Path:
    """The cached shared library for this source, flags and machine; built when absent."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), platform.machine().encode()])).hexdigest()
    cache = Path(tempfile.gettempdir()) / f"batchsweep-kernels-{os.getuid()}"
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    # a library is loaded from here: the folder must be this user's alone (the temporary directory is
    # shared, and another user could have made this folder first and left a library in it)
    info = cache.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise RuntimeError(
            f"{cache} is not this user's alone (owner uid {info.st_uid}, mode {oct(info.st_mode & 0o777)}); "
            "not loading a library from it"
        )
    target = cache / f"merit_cpu-{key[:16]}.so"
    if target.exists():
        return target
    partial = cache / f".{target.name}.{os.getpid()}.{threading.get_ident()}"
    result = subprocess.run(
        [compiler, *FLAGS, str(SOURCE), "-o", str(partial)], capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{compiler} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    os.replace(partial, target)  # atomic: a concurrent loader sees the whole file or none
    return target


def kernel() -> ctypes.CDLL | None:
    """The loaded library, or None where it cannot be built (the reason in `build_failed`, logged once)."""
    global _library, build_failed
    if _library is not None or build_failed is not None:
        return _library
    with _lock:
        if _library is None and build_failed is None:
            compiler = _compiler()
            try:
                if compiler is None:
                    raise RuntimeError("no C compiler (gcc or cc) on PATH")
                lib = ctypes.CDLL(str(_build(compiler)))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                build_failed = f"{type(exc).__name__}: {exc}"
                logger.warning("MERIT's fused CPU kernel is unavailable, running the eager step: %s", build_failed)
                return None
            lib.merit_pass1.restype = _int
            lib.merit_pass1.argtypes = [_i64, _i64, *[_ptr] * 5, *[_f32] * 4, *[_ptr] * 5, _int]
            lib.merit_pass2.restype = None
            lib.merit_pass2.argtypes = [_i64, _i64, *[_ptr] * 6, _int, _int, _f32, _int]
            _library = lib
    return _library


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernel applies: contiguous float32 matrices (2-D) on CPU."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors) and (
        tensors[0].dim() == 2
    )


def pass1(
    lib: ctypes.CDLL,
    w: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    wd: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Moments in place, u = m / (sqrt(v) + eps) + wd * w into `u`; returns the max-norm vectors (row |w|,
    row |u| shaped (R, 1), column |w|, column |u| shaped (1, C)), or None where a |w| or |u| is NaN or
    inf (then m, v and u are written, and the norms are the caller's to take)."""
    n_rows, n_cols = w.shape
    threads = torch.get_num_threads()
    row_w, row_u = w.new_empty((n_rows, 1)), w.new_empty((n_rows, 1))
    col_w, col_u = w.new_empty((1, n_cols)), w.new_empty((1, n_cols))
    partial = w.new_empty((threads, 2, n_cols))
    not_finite = lib.merit_pass1(
        n_rows, n_cols, w.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), u.data_ptr(),
        beta1, beta2, eps, wd,
        row_w.data_ptr(), row_u.data_ptr(), col_w.data_ptr(), col_u.data_ptr(), partial.data_ptr(), threads,
    )  # fmt: skip
    return None if not_finite else (row_w, row_u, col_w, col_u)


def pass2(
    lib: ctypes.CDLL,
    w: torch.Tensor,
    u: torch.Tensor,
    row_ratio: torch.Tensor,
    col_ratio: torch.Tensor,
    row_bad: torch.Tensor,
    col_bad: torch.Tensor,
    *,
    masked: bool,
    clip: bool,
    lr: float,
) -> None:
    """w -= lr * clamp(u * r, -1, 1) in place, r_ij = max(row_ratio_i, col_ratio_j), 1 where row i or
    column j is bad (bool vectors (R, 1), (1, C)) when `masked`; the clamp only when `clip`."""
    n_rows, n_cols = w.shape
    # every operand bound to a name: a temporary's memory would be freed before the call reads it
    row_ratio, col_ratio = row_ratio.contiguous(), col_ratio.contiguous()
    row_flag = row_bad.to(torch.uint8).contiguous()
    col_flag = col_bad.to(torch.float32).contiguous()  # floats: the column select vectorises
    lib.merit_pass2(
        n_rows, n_cols, w.data_ptr(), u.data_ptr(), row_ratio.data_ptr(), col_ratio.data_ptr(),
        row_flag.data_ptr(), col_flag.data_ptr(), int(masked), int(clip), lr, torch.get_num_threads(),
    )  # fmt: skip
