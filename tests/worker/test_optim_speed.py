"""MERIT and Sophia-G at the hardware's speed: the compiled MERIT step against the authors' code, which
path each device takes, and that the accelerator paths read nothing back from the device (no host sync).

The compiled step is real inductor (C++ on CPU): one compilation serves every test here (~10 s cold, ~2 s
from inductor's cache). Tests marked gpu need CUDA and skip elsewhere, saying so (deploy/gpu_check.sh runs
them: pytest -m gpu).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from worker.optim import MERIT, SophiaG
from worker.optim._merit_reference import AuthorsMERIT

_merit_module = importlib.import_module("worker.optim._merit")
_merit_cpu = importlib.import_module("worker.optim._merit_cpu")
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (deploy/gpu_check.sh runs it)")

GradFn = Callable[[torch.Size, torch.Generator, int], torch.Tensor]


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every test here on one torch thread (a test may set more itself)."""


def _gpt2_like_shapes(vocab: int = 97, n_pos: int = 16, d: int = 32) -> list[tuple[int, ...]]:
    layer = [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return [(vocab, d), (n_pos, d), *layer, *layer, (d,), (d,)]


def _small_grads(shape: torch.Size, gen: torch.Generator, step: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen) * 1e-3


def _zero_rows(shape: torch.Size, gen: torch.Generator, step: int) -> torch.Tensor:
    g = torch.randn(shape, generator=gen)
    if len(shape) >= 2:
        g[0] = 0.0  # u's row 0 is zero without decay: the mask path
    return g


def _nan_at_step_1(shape: torch.Size, gen: torch.Generator, step: int) -> torch.Tensor:
    g = torch.randn(shape, generator=gen) * 1e-3
    if step == 1:
        g.view(-1)[0] = float("nan")
    return g


def _compare(
    shapes: list[tuple[int, ...]],
    grads: GradFn,
    *,
    scale: float,
    device: torch.device,
    steps: int = 3,
    path: str = "compiled",
) -> MERIT:
    """`steps` steps of MERIT (its compiled step, or with path="fused" its CPU default: the fused C kernel)
    and the authors' from the same weights (decay 0.1 on matrices, as build_optimizer groups them); the
    weights must agree after every step (NaN where theirs is NaN)."""
    gen = torch.Generator().manual_seed(1)
    ours = [torch.nn.Parameter((torch.randn(s, generator=gen) * scale).to(device)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]

    def groups(params: list[torch.nn.Parameter]) -> list[dict]:
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    opt = MERIT(groups(ours), lr=1e-2, betas=(0.9, 0.999), eps=1e-6)
    opt._compiled = path == "compiled"
    authors = AuthorsMERIT(groups(theirs), lr=1e-2, betas=(0.9, 0.999), eps=1e-6)
    for step in range(steps):
        for a, b in zip(ours, theirs):
            a.grad = grads(a.shape, gen, step).to(device)
            b.grad = a.grad.clone()
        opt.step()
        authors.step()
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-7, equal_nan=True)
    if path == "compiled":
        assert _merit_module._compile_failed is None, _merit_module._compile_failed  # no silent eager fallback
    return opt


def test_compiled_merit_matches_the_authors_on_cpu() -> None:
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    # GPT-2-like shapes; zero gradient rows (mask) with weights far above 1 (clip); a NaN gradient
    _compare(_gpt2_like_shapes(), _small_grads, scale=0.02, device=torch.device("cpu"))
    _compare(_gpt2_like_shapes(), _zero_rows, scale=5.0, device=torch.device("cpu"))
    _compare([(6, 5), (5,)], _nan_at_step_1, scale=0.02, device=torch.device("cpu"), steps=2)
    # one graph for every 2-D shape and lr: dynamic shapes, floats as inputs (0 when a previous test compiled it)
    assert counters["stats"]["unique_graphs"] - graphs <= 1


# ------------------------------------------------------------------------------------------------
# the fused C kernel, MERIT's matrix step on CPU (worker/optim/_merit_cpu.c)

_ODD_SHAPES = [(7, 5), (1, 9), (9, 1), (33, 17)]  # rows that split unevenly over threads, 1-row, 1-column


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fused_cpu_kernel_matches_the_authors_on_any_thread_count(threads: int, kernel_calls: dict[str, int]) -> None:
    # each thread keeps its own column maxima, combined after the rows: 3 threads on 2 cores included
    torch.set_num_threads(threads)
    assert _merit_cpu.kernel() is not None, _merit_cpu.build_failed  # gcc is on this machine
    calls = kernel_calls
    shapes = _gpt2_like_shapes() + _ODD_SHAPES
    n_matrices = sum(len(s) == 2 for s in shapes)
    _compare(shapes, _small_grads, scale=0.02, device=torch.device("cpu"), path="fused")
    assert calls == {"pass1": 3 * n_matrices, "pass2": 3 * n_matrices}  # every matrix, every step
    _compare(shapes, _zero_rows, scale=5.0, device=torch.device("cpu"), path="fused")  # mask and clip
    calls.update(pass1=0, pass2=0)
    _compare([(6, 5), (5,)], _nan_at_step_1, scale=0.02, device=torch.device("cpu"), steps=2, path="fused")
    # the NaN step's matrix: pass 1 saw it, and torch took over from u for the norms and the update
    assert calls == {"pass1": 2, "pass2": 1}


def test_fused_cpu_kernel_is_built_once_then_loaded_from_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_merit_cpu.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(_merit_cpu, "_library", None)
    monkeypatch.setattr(_merit_cpu, "build_failed", None)
    assert _merit_cpu.kernel() is not None
    built = list(tmp_path.glob("batchsweep-kernels-*/merit_cpu-*.so"))
    assert len(built) == 1 and not list(tmp_path.glob("batchsweep-kernels-*/.*"))  # no partial file left

    def no_compiler(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("compiled again although the cache holds the library")

    monkeypatch.setattr(_merit_cpu.subprocess, "run", no_compiler)
    monkeypatch.setattr(_merit_cpu, "_library", None)
    assert _merit_cpu.kernel() is not None and _merit_cpu.build_failed is None


def test_without_a_c_compiler_merit_runs_eager_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_merit_cpu, "_compiler", lambda: None)
    monkeypatch.setattr(_merit_cpu, "_library", None)
    monkeypatch.setattr(_merit_cpu, "build_failed", None)
    with caplog.at_level(logging.WARNING, logger=_merit_cpu.__name__):
        _compare(_gpt2_like_shapes(), _small_grads, scale=0.02, device=torch.device("cpu"), path="fused")
    assert _merit_cpu.kernel() is None and "no C compiler" in (_merit_cpu.build_failed or "")
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1  # said once
    assert "running the eager step" in caplog.records[0].message


def test_a_cache_folder_someone_else_could_write_to_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_merit_cpu.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(_merit_cpu, "_library", None)
    monkeypatch.setattr(_merit_cpu, "build_failed", None)
    folder = tmp_path / f"batchsweep-kernels-{os.getuid()}"
    folder.mkdir()
    folder.chmod(0o777)  # as if made by another user for everyone (a planted library would be loaded)
    assert _merit_cpu.kernel() is None
    assert "is not this user's alone" in _merit_cpu.build_failed and "0o777" in _merit_cpu.build_failed
    assert list(folder.iterdir()) == []  # nothing built there, nothing loaded


def test_a_failed_build_says_what_the_compiler_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    monkeypatch.setattr(_merit_cpu, "SOURCE", bad)
    monkeypatch.setattr(_merit_cpu.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(_merit_cpu, "_library", None)
    monkeypatch.setattr(_merit_cpu, "build_failed", None)
    assert _merit_cpu.kernel() is None
    assert "exited 1" in _merit_cpu.build_failed and "error" in _merit_cpu.build_failed


def test_each_device_takes_its_path_and_the_cpu_tests_cover_the_accelerator_one() -> None:
    # tests/worker/test_optim.py runs MERIT with _host_checks=False ("no-host-checks") and Sophia-G with
    # _per_tensor=False against per-element references on CPU: those are the paths a CUDA device takes
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    merit = MERIT([torch.nn.Parameter(torch.zeros(2, 2))])
    assert merit._uses_host_checks(cpu) and not merit._uses_host_checks(cuda)
    assert merit._uses_compiled(cuda) and not merit._uses_compiled(cpu)
    # on CPU the fused kernel takes contiguous float32 matrices; anything else runs the eager step
    w = torch.zeros(4, 3)
    assert merit._uses_fused_cpu(w, w, w, w)
    assert not merit._uses_fused_cpu(w.double(), w.double(), w.double(), w.double())
    assert not merit._uses_fused_cpu(w.t(), w.t(), w.t(), w.t())  # a transposed view
    assert not merit._uses_fused_cpu(*[torch.zeros(2, 3, 4)] * 4)  # 3-D
    merit._fused_cpu = False
    assert not merit._uses_fused_cpu(w, w, w, w)
    sophia = SophiaG([torch.nn.Parameter(torch.zeros(2, 2))])
    assert sophia._uses_per_tensor(cpu) and not sophia._uses_per_tensor(cuda)


def test_the_accelerator_paths_read_nothing_back_from_the_device() -> None:
    # On the meta device a tensor has no data: any read back (.item(), .tolist(), a data-dependent branch)
    # raises. Off CPU MERIT's eager step and Sophia-G's step run there, so they read nothing: no host sync.
    def meta_params() -> list[torch.nn.Parameter]:
        params = [torch.nn.Parameter(torch.empty(s, device="meta")) for s in [(5, 7), (7,), (3, 4, 2)]]
        for p in params:
            p.grad = torch.empty_like(p)
        return params

    merit = MERIT(meta_params(), lr=1e-2, weight_decay=0.1)
    merit._compiled = False  # inductor cannot run on meta; the compiled path is checked on CUDA below
    merit.step()
    merit.step()
    sophia = SophiaG(meta_params(), lr=1e-2)
    sophia.update_hessian()
    sophia.step()
    # and the check can fail: the CPU path's host checks do read
    reading = MERIT(meta_params(), lr=1e-2)
    reading._compiled, reading._host_checks = False, True
    with pytest.raises(NotImplementedError, match="meta"):
        reading.step()


@pytest.mark.gpu
@cuda_only
def test_compiled_merit_matches_the_authors_on_cuda() -> None:
    cuda = torch.device("cuda")
    opt = _compare(_gpt2_like_shapes(), _small_grads, scale=0.02, device=cuda)
    assert opt._uses_compiled(cuda)
    _compare(_gpt2_like_shapes(), _zero_rows, scale=5.0, device=cuda)


@pytest.mark.gpu
@cuda_only
@pytest.mark.parametrize("name", ["merit", "merit-eager", "sophia"])
def test_optimizer_steps_issue_no_host_sync_on_cuda(name: str) -> None:
    cuda = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.02).to(cuda)) for s in _gpt2_like_shapes()]
    if name == "sophia":
        opt: torch.optim.Optimizer = SophiaG(params, lr=1e-3)
    else:
        opt = MERIT(params, lr=1e-3, weight_decay=0.1)
        opt._compiled = name == "merit"  # the default on CUDA, and the eager path with no host checks

    def grads() -> None:
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3

    grads()
    opt.step()  # the first step compiles (MERIT): autotuning may sync, and it happens once
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
    try:
        for _ in range(3):
            grads()
            if isinstance(opt, SophiaG):
                opt.update_hessian()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    assert all(torch.isfinite(p).all() for p in params)
    assert _merit_module._compile_failed is None
