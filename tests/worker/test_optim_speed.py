"""MERIT and Sophia-G at the hardware's speed: the compiled MERIT step against the authors' code, which
path each device takes, and that the accelerator paths read nothing back from the device (no host sync).

The compiled step is real inductor (C++ on CPU): one compilation serves every test here (~10 s cold, ~2 s
from inductor's cache). Tests marked gpu need CUDA and skip elsewhere, saying so (deploy/gpu_check.sh runs
them: pytest -m gpu).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch

from worker.optim import MERIT, SophiaG
from worker.optim._merit_reference import AuthorsMERIT

_merit_module = importlib.import_module("worker.optim._merit")
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
    """`steps` steps of MERIT (its compiled step, or with path="eager" its CPU default, the eager step)
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


@pytest.mark.compile
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
# the eager step, MERIT's matrix step on CPU, against the authors' on awkward shapes

_ODD_SHAPES = [(7, 5), (1, 9), (9, 1), (33, 17)]  # 1-row, 1-column, and shapes that split unevenly into blocks


@pytest.mark.parametrize("threads", [1, 2])
def test_eager_merit_matches_the_authors_on_cpu(threads: int) -> None:
    torch.set_num_threads(threads)
    shapes = _gpt2_like_shapes() + _ODD_SHAPES
    _compare(shapes, _small_grads, scale=0.02, device=torch.device("cpu"), path="eager")
    _compare(shapes, _zero_rows, scale=5.0, device=torch.device("cpu"), path="eager")  # mask and clip
    _compare([(6, 5), (5,)], _nan_at_step_1, scale=0.02, device=torch.device("cpu"), steps=2, path="eager")


def test_each_device_takes_its_path_and_the_cpu_tests_cover_the_accelerator_one() -> None:
    # tests/worker/test_optim.py runs MERIT with _host_checks=False ("no-host-checks") and Sophia-G with
    # _per_tensor=False against per-element references on CPU: those are the paths a CUDA device takes
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    merit = MERIT([torch.nn.Parameter(torch.zeros(2, 2))])
    assert merit._uses_host_checks(cpu) and not merit._uses_host_checks(cuda)
    assert merit._uses_compiled(cuda) and not merit._uses_compiled(cpu)
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
