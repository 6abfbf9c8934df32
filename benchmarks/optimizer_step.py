"""Time one optimizer step on GPT-2 parameter shapes (random weights and gradients), CPU or GPU.

    python benchmarks/optimizer_step.py [--preset gpt2-small] [--repeats 5] [--device cpu]

Every optimizer is timed in alternation with AdamW(foreach=True) and AdamW(fused=True) over the same
parameters, so its ratios to both are measured under the same machine load (this matters on shared CPUs).
Each row reports the median step time; a ratio is median(optimizer) / median(that AdamW's steps interleaved
with it). MERIT runs two ways: its blocked eager step (its default on CPU) and its compiled step
(`torch.compile`, its default on CUDA; see worker/optim/_merit.py). Before timing, every MERIT path and the authors' per-parameter MERIT (`worker.optim._merit_reference.AuthorsMERIT`, the one transcription, which
tests/worker/test_optim.py also uses) take one step from identical states and must agree (allclose, rtol
1e-5 / atol 1e-7). The compiled step's compilation happens in its warm-up step, untimed. The last line is
MERIT's default path against the target of its device: <= 1.5x AdamW(fused) on a GPU, where people
train; on CPU (tests and the demo's nano models, where the optimizer is a small share of a step) <= 1.5x
AdamW(foreach). A hand-fused C kernel once met a CPU target against AdamW(fused); that target served no
user and the kernel is gone.

Parameters are grouped as `worker.optim.build_optimizer` does: weight decay 0.1 on matrices, none on
vectors. Sophia-G's `update_hessian()` (every 10 steps in training) is not part of the timed step.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import pytorch_optimizer
import torch

from worker.names import MODEL_PRESETS
from worker.optim import MERIT, SophiaG
from worker.optim._merit_reference import AuthorsMERIT  # the authors' per-parameter update, the reference

VOCAB = 50257  # GPT-2's BPE vocabulary
N_POSITIONS = 1024  # GPT-2's context length


def gpt2_shapes(preset: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every GPT-2 parameter (HF layout: Conv1D weights are (in, out); lm_head is tied)."""
    shape = MODEL_PRESETS[preset]
    d, n_layer = shape["n_embd"], shape["n_layer"]
    out: list[tuple[str, tuple[int, ...]]] = [("wte", (VOCAB, d)), ("wpe", (N_POSITIONS, d))]
    for i in range(n_layer):
        out += [
            (f"h{i}.ln_1.w", (d,)),
            (f"h{i}.ln_1.b", (d,)),
            (f"h{i}.attn.c_attn.w", (d, 3 * d)),
            (f"h{i}.attn.c_attn.b", (3 * d,)),
            (f"h{i}.attn.c_proj.w", (d, d)),
            (f"h{i}.attn.c_proj.b", (d,)),
            (f"h{i}.ln_2.w", (d,)),
            (f"h{i}.ln_2.b", (d,)),
            (f"h{i}.mlp.c_fc.w", (d, 4 * d)),
            (f"h{i}.mlp.c_fc.b", (4 * d,)),
            (f"h{i}.mlp.c_proj.w", (4 * d, d)),
            (f"h{i}.mlp.c_proj.b", (d,)),
        ]
    out += [("ln_f.w", (d,)), ("ln_f.b", (d,))]
    return out


def make_params(preset: str, device: torch.device, seed: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    params = []
    for name, shape in gpt2_shapes(preset):
        if name.endswith(("ln_1.w", "ln_2.w", "ln_f.w")):
            init = torch.ones(shape)  # LayerNorm gains start at 1
        else:
            init = torch.randn(shape, generator=gen) * 0.02  # GPT-2's init std
        p = torch.nn.Parameter(init.to(device))
        p.grad = (torch.randn(shape, generator=gen) * 1e-3).to(device)
        params.append(p)
    return params


def groups(params: list[torch.nn.Parameter]) -> list[dict[str, Any]]:
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


MERIT_PATHS = ("eager", "compiled")  # the eager ops, torch.compile


def merit(param_groups: list[dict[str, Any]], *, path: str) -> MERIT:
    opt = MERIT(param_groups, lr=1e-3)
    opt._compiled = path == "compiled"
    return opt


def default_path(device: torch.device) -> str:
    """MERIT's own choice on `device`: compiled on CUDA, else eager."""
    opt = MERIT([torch.nn.Parameter(torch.zeros(1))])
    return "compiled" if opt._uses_compiled(device) else "eager"


FACTORIES: dict[str, Callable[[list[dict[str, Any]]], torch.optim.Optimizer]] = {
    "MERIT (eager)": lambda g: merit(g, path="eager"),
    "MERIT (compiled)": lambda g: merit(g, path="compiled"),
    "MERIT (authors)": lambda g: AuthorsMERIT(g, lr=1e-3),
    "Lion": lambda g: pytorch_optimizer.Lion(g, lr=1e-4),
    "LAMB": lambda g: pytorch_optimizer.Lamb(g, lr=1e-3),
    "Sophia-G": lambda g: SophiaG(g, lr=2e-4, bs=480 * 1024),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_step(opt: torch.optim.Optimizer, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    opt.step()
    sync(device)
    return (time.perf_counter() - start) * 1e3  # ms


def check_merit_matches_authors(preset: str, device: torch.device, *, path: str = "eager") -> float:
    """One step of ours (on `path`) and the authors' MERIT from identical states; returns the max abs
    difference."""
    ours, theirs = make_params(preset, device, seed=1), make_params(preset, device, seed=1)
    merit(groups(ours), path=path).step()
    AuthorsMERIT(groups(theirs), lr=1e-3).step()
    worst = 0.0
    for a, b in zip(ours, theirs):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-7):
            raise SystemExit(f"MERIT ({path}) and MERIT (authors) disagree on a {tuple(a.shape)} parameter")
        worst = max(worst, (a - b).abs().max().item())
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-small", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per optimizer (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per optimizer first")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--only", nargs="*", default=None, help=f"subset of {list(FACTORIES)}")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    n_params = sum(torch.Size(s).numel() for _, s in gpt2_shapes(args.preset))
    print(
        f"{args.preset}: {n_params / 1e6:.1f}M parameters, device={device}, torch {torch.__version__}, "
        f"threads={torch.get_num_threads()}, repeats={args.repeats}"
    )

    for path in MERIT_PATHS:
        diff = check_merit_matches_authors(args.preset, device, path=path)
        print(
            f"check: MERIT ({path}) == MERIT (authors) after one step "
            f"(allclose rtol 1e-5, atol 1e-7; max |diff| {diff:.2e})"
        )
    gc.collect()

    params = make_params(args.preset, device, seed=0)
    foreach = torch.optim.AdamW(groups(params), lr=1e-3, foreach=True)
    fused = torch.optim.AdamW(groups(params), lr=1e-3, fused=True)
    for _ in range(args.warmup):
        foreach.step()
        fused.step()
    foreach_all: list[float] = []
    fused_all: list[float] = []
    rows: list[tuple[str, float, float, float]] = []  # name, median ms, x foreach, x fused
    for name, factory in FACTORIES.items():
        if args.only is not None and name not in args.only:
            continue
        opt = factory(groups(params))
        for _ in range(args.warmup):
            opt.step()
        mine, base_foreach, base_fused = [], [], []
        for _ in range(args.repeats):  # alternate, so all three see the same load
            base_foreach.append(timed_step(foreach, device))
            base_fused.append(timed_step(fused, device))
            mine.append(timed_step(opt, device))
        foreach_all += base_foreach
        fused_all += base_fused
        ms = statistics.median(mine)
        rows.append((name, ms, ms / statistics.median(base_foreach), ms / statistics.median(base_fused)))
        print(f"  timed {name}", file=sys.stderr, flush=True)
        del opt
        gc.collect()

    print(f"\n{'optimizer':<18}{'step (ms)':>12}{'x AdamW(foreach)':>19}{'x AdamW(fused)':>17}")
    foreach_ms, fused_ms = statistics.median(foreach_all), statistics.median(fused_all)
    print(f"{'AdamW(foreach)':<18}{foreach_ms:>12.1f}{1.0:>18.2f}x{foreach_ms / fused_ms:>16.2f}x")
    print(f"{'AdamW(fused)':<18}{fused_ms:>12.1f}{fused_ms / foreach_ms:>18.2f}x{1.0:>16.2f}x")
    for name, ms, x_foreach, x_fused in rows:
        print(f"{name:<18}{ms:>12.1f}{x_foreach:>18.2f}x{x_fused:>16.2f}x")
    default = f"MERIT ({default_path(device)})"
    by_name = {name: (x_foreach, x_fused) for name, _, x_foreach, x_fused in rows}
    if default in by_name:
        x_foreach, x_fused = by_name[default]
        if device.type == "cuda":
            print(f"\nMERIT / AdamW(foreach) = {x_foreach:.2f}x")
            print(f"MERIT / AdamW(fused) = {x_fused:.2f}x ({default}, MERIT's default on cuda; target <= 1.5x)")
        else:
            print(f"\nMERIT / AdamW(fused) = {x_fused:.2f}x")
            print(f"MERIT / AdamW(foreach) = {x_foreach:.2f}x ({default}, MERIT's default on cpu; target <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
