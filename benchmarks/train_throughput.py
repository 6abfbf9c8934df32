"""Training throughput: the project's loop (`worker.loop.train`, default metrics on) against a bare PyTorch
loop written here, on the same model, batch, sequence length and optimizer, in one run.

    python benchmarks/train_throughput.py [--preset gpt2-micro] [--seq-len 128] [--batch-size 16]
        [--max-micro-batch 8] [--steps 16] [--warmup 3] [--rounds 5] [--optimizer adamw]
        [--precision fp32|bf16] [--compile] [--device cpu|cuda] [--threads N]

The bare loop is what a training loop cannot do without: per optimizer step, `accum` micro-batches of
forward (under the same autocast), float32 cross-entropy and backward, gradient clipping at the same
`grad_clip`, the optimizer's step and `zero_grad`. Its batches are random windows of the same token
stream, gathered from memory; it reads no number back from the device. The model is the one
`worker.model.build_model` builds, with transformers' stock "sdpa" attention (no probe hook), compiled
when the loop's is; the optimizer is the one the loop builds (`worker.optim.build_optimizer`, whose
defaults depend on the model's device: fused AdamW on CUDA). Sophia-G is not compared: its Hessian pass is the loop's.

The loop runs with TrainConfig's defaults: loss, gradient norm, gradient noise scale (the default split
here has grad accumulation 2), lr schedule, divergence check, tokens/s, the max-attention-logit probe and
a checkpoint at each eval. Each step of each loop is timed, from its start to its end once the device has
finished its work (a sync in both loops); the loop's time between steps (bookkeeping, reports) counts,
the time inside `evaluate` and `save_checkpoint` (timed by wrapping them, and printed) does not:
evaluations and checkpoints come every `evaluation.every_tokens`, a setting (budget / 10 by default), not a
cost per step, and in a real run of millions of tokens per eval they are a small share (in this short one
they would be most of it). The first `warmup` steps of every run are not counted. After an untimed round
of both (a fresh process's first steps are 10x slower), rounds run both loops one after the other, each
with a fresh model, alternating which goes first; each side's tokens/s is the median over the rounds, and
the ratio the median of the rounds' ratios (on a shared 2-core machine one round's ratio moves by +-5 %
with the load, and more when another job starts).

MFU = tokens/s x FLOPs per token (`worker.model.flops_per_token`: 6N + 12 L T d) / the device's peak
(`worker.loop.peak_flops`: a known GPU, or $BATCHSWEEP_PEAK_TFLOPS); none on a CPU without that variable.

Targets: loop / bare >= 0.95 (on CPU with the defaults above, and on a GPU); GPT-2 small at bf16 on one
GPU >= 40 % MFU (`deploy/gpu_check.sh` runs `--preset gpt2-small --seq-len 1024 --precision bf16
--device cuda` and checks both). The last line is the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import worker.loop as loop
from worker.config import (
    DataConfig,
    EvalConfig,
    ModelConfig,
    OptimizerConfig,
    ResourcesConfig,
    TrainConfig,
    split_batch,
)
from worker.data import prepare_data
from worker.model import build_model, count_params, flops_per_token
from worker.names import MODEL_PRESETS, OPTIMIZERS
from worker.optim import build_optimizer, optimizer_keywords
from worker.session import LocalSession

TARGET_RATIO = 0.95  # loop / bare
# the bare loop has no Sophia-G Hessian pass (the loop's every 10th step), so sophia is not compared
BARE_OPTIMIZERS = [name for name, entry in OPTIMIZERS.items() if not entry.needs_hessian]
TARGET_MFU = 0.40  # GPT-2 small, bf16, one GPU


class StepClock:
    """Seconds per optimizer step of each loop, each step's clock stopped once the device has finished the
    step's work (a sync at the end of every step, in both loops; the project's loop syncs once a step anyway).
    What the loop does between steps (its bookkeeping, reports) counts toward the step before."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._begun: dict[str, float] = {}
        self.seconds: dict[str, list[float]] = {"loop": [], "bare": []}  # one per step, in order

    def begin(self, side: str) -> None:
        self._begun[side] = time.perf_counter()

    def end(self, side: str, excluded: float = 0.0) -> None:
        sync(self.device)
        self.seconds[side].append(time.perf_counter() - self._begun.pop(side) - excluded)


@dataclass
class LoopSide:
    """worker.loop.train(cfg) on the clock: its train_step wrapped to stop the previous step's clock and start
    the next one's; evaluate and save_checkpoint timed (after a device sync) and left out of the step they
    follow."""

    cfg: TrainConfig
    clock: StepClock
    pending: float = 0.0  # seconds of evaluations and checkpoints since the running step began
    excluded: dict[str, float] = field(default_factory=lambda: {"evaluate": 0.0, "save_checkpoint": 0.0})
    calls: dict[str, int] = field(default_factory=lambda: {"evaluate": 0, "save_checkpoint": 0})

    def run(self) -> None:
        originals = {name: getattr(loop, name) for name in ("train_step", "evaluate", "save_checkpoint")}
        started = [False]

        def train_step(*args: Any, **kw: Any) -> Any:
            if started[0]:
                self._end_step()
            self.clock.begin("loop")
            started[0] = True
            return originals["train_step"](*args, **kw)

        def left_out(name: str) -> Callable[..., Any]:
            def timed(*args: Any, **kw: Any) -> Any:
                sync(self.clock.device)
                t0 = time.perf_counter()
                try:
                    return originals[name](*args, **kw)
                finally:
                    sync(self.clock.device)
                    self.pending += time.perf_counter() - t0
                    self.excluded[name] += time.perf_counter() - t0
                    self.calls[name] += 1

            return timed

        loop.train_step = train_step  # type: ignore[assignment]
        loop.evaluate = left_out("evaluate")  # type: ignore[assignment]
        loop.save_checkpoint = left_out("save_checkpoint")  # type: ignore[assignment]
        try:
            final = loop.train(self.cfg, LocalSession())
            self._end_step()  # the last step: to the end of train(), its final evaluation left out
        finally:
            for name, fn in originals.items():
                setattr(loop, name, fn)
        if final["status"] != "completed" or final["step"] != self.cfg.total_steps:
            raise RuntimeError(f"the loop did not complete its {self.cfg.total_steps} steps: {final}")

    def _end_step(self) -> None:
        self.clock.end("loop", excluded=self.pending)
        self.pending = 0.0


def bare_loop(cfg: TrainConfig, device: torch.device, clock: StepClock) -> None:
    """The bare PyTorch loop on cfg's model, data, batch split and optimizer, each step on the clock."""
    micro, accum = split_batch(cfg.batch_size, 1, cfg.resources.max_micro_batch)
    seq_len = cfg.model.seq_len
    data = prepare_data(cfg.data)
    stream = torch.from_numpy(np.asarray(data.train, dtype=np.int64))  # the train split, in memory
    n_windows = (len(stream) - 1) // (seq_len + 1)
    offsets = torch.arange(seq_len + 1)
    gen = torch.Generator().manual_seed(cfg.seed)

    model = build_model(cfg.model, vocab_size=data.vocab_size, seed=cfg.seed).to(device)
    model.set_attn_implementation("sdpa")  # transformers' own SDPA attention: no probe hook
    model.train()
    trained: torch.nn.Module = torch.compile(model) if cfg.compile else model
    optimizer = build_optimizer(cfg.optimizer, model, tokens_per_step=cfg.tokens_per_step)
    params = [p for p in model.parameters() if p.requires_grad]
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if cfg.precision == "bf16" else contextlib.nullcontext()
    )
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    for _ in range(cfg.total_steps):
        clock.begin("bare")
        for _ in range(accum):
            windows = torch.randint(n_windows, (micro,), generator=gen)
            rows = stream[windows[:, None] * (seq_len + 1) + offsets]  # (micro, T + 1)
            if device.type == "cuda":
                rows = rows.pin_memory().to(device, non_blocking=True)
            x, y = rows[:, :-1], rows[:, 1:]
            with autocast:
                logits = trained(x).logits  # (micro, T, V)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            (loss / accum).backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.end("bare")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_round(cfg: TrainConfig, device: torch.device, *, loop_first: bool) -> tuple[StepClock, LoopSide]:
    """One run of each loop, one after the other, each with a fresh model."""
    clock = StepClock(device)
    side = LoopSide(cfg, clock)
    runs = [side.run, lambda: bare_loop(cfg, device, clock)]
    for run in runs if loop_first else runs[::-1]:
        run()
    return clock, side


def mfu_text(tokens_per_s: float, flops: float, peak: float | None) -> str:
    return f"MFU {100 * tokens_per_s * flops / peak:.1f}%" if peak else "MFU n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-micro", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch, sequences")
    parser.add_argument("--max-micro-batch", type=int, default=8, help="default 8: grad accumulation 2")
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of each run")
    parser.add_argument("--rounds", type=int, default=5, help="loop and bare runs, alternating")
    parser.add_argument("--optimizer", default="adamw", choices=BARE_OPTIMIZERS)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--compile", action="store_true", help="torch.compile the model in both loops")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--evals", type=int, default=2, help="evaluations per loop run (timed, excluded)")
    parser.add_argument("--vocab-size", type=int, default=4096, help="the built-in corpus's BPE vocabulary")
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup must be in [0, --steps), got --warmup={args.warmup}, --steps={args.steps}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")

    tokens_per_step = args.batch_size * args.seq_len
    budget = args.steps * tokens_per_step
    cfg = TrainConfig(
        model=ModelConfig(preset=args.preset, seq_len=args.seq_len),
        data=DataConfig(vocab_size=args.vocab_size),
        optimizer=OptimizerConfig(name=args.optimizer, lr=args.lr),
        evaluation=EvalConfig(
            every_tokens=max(tokens_per_step, budget // max(1, args.evals)),
            tokens=8 * args.seq_len,  # the probe's 8 sequences
        ),
        resources=ResourcesConfig(
            gpus_per_worker=1 if device.type == "cuda" else 0,
            cpus_per_worker=torch.get_num_threads(),
            max_micro_batch=args.max_micro_batch,
        ),
        batch_size=args.batch_size,
        token_budget=budget,
        precision=args.precision,
        compile=args.compile,
    )
    micro, accum = split_batch(cfg.batch_size, 1, cfg.resources.max_micro_batch)
    data = prepare_data(cfg.data)
    model = build_model(cfg.model, vocab_size=data.vocab_size, seed=0)
    flops, n_params = flops_per_token(model, args.seq_len), count_params(model)
    keywords = optimizer_keywords(cfg.optimizer, device_type=device.type, tokens_per_step=tokens_per_step)
    kernel = next((k for k in ("fused", "foreach") if keywords.get(k)), None)  # AdamW's implementation
    del model
    peak = loop.peak_flops(device)
    device_name = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
    print(
        f"{args.preset}: {n_params / 1e6:.2f}M parameters, {flops / 1e6:.1f} MFLOP per token; seq_len {args.seq_len}, "
        f"batch {args.batch_size} (micro {micro} x accumulation {accum}), {args.optimizer}"
        f"{f' ({kernel})' if kernel else ''}, {args.precision}, compile {'on' if args.compile else 'off'}; "
        f"{device_name}, {torch.get_num_threads()} threads, torch {torch.__version__}; {args.steps} steps a run "
        f"({args.warmup} untimed), {args.rounds} rounds"
    )

    # one untimed round first: a fresh process's first steps are 10x slower (page faults on first touch of
    # memory, kernels' lazy set-up), for a whole run of this size
    run_round(cfg, device, loop_first=True)
    rates: dict[str, list[float]] = {"loop": [], "bare": []}  # tokens/s of each round's run
    excluded = {"evaluate": [0.0, 0], "save_checkpoint": [0.0, 0]}
    for r in range(args.rounds):
        # loop first, then bare first, ...: neither always runs right after the other's run
        clock, side = run_round(cfg, device, loop_first=r % 2 == 0)
        for name in excluded:
            excluded[name][0] += side.excluded[name]
            excluded[name][1] += side.calls[name]
        for who, seconds in clock.seconds.items():
            assert len(seconds) == args.steps, (who, len(seconds))
            rates[who].append(tokens_per_step * (args.steps - args.warmup) / sum(seconds[args.warmup :]))
        print(
            f"  round {r + 1}: loop {rates['loop'][-1]:,.0f} tokens/s, bare {rates['bare'][-1]:,.0f} tokens/s, "
            f"ratio {rates['loop'][-1] / rates['bare'][-1]:.3f}",
            flush=True,
        )

    loop_rate, bare_rate = statistics.median(rates["loop"]), statistics.median(rates["bare"])
    ratio = statistics.median(a / b for a, b in zip(rates["loop"], rates["bare"], strict=True))
    print(f"loop (worker.loop.train, default metrics): {loop_rate:,.0f} tokens/s, {mfu_text(loop_rate, flops, peak)}")
    print(f"bare PyTorch loop:                         {bare_rate:,.0f} tokens/s, {mfu_text(bare_rate, flops, peak)}")
    if not peak:
        print(f"MFU: no peak FLOP/s known for {device}; $BATCHSWEEP_PEAK_TFLOPS sets one")
    print(
        f"excluded from the loop's time: {excluded['evaluate'][1]} evaluations ({excluded['evaluate'][0]:.2f} s), "
        f"{excluded['save_checkpoint'][1]} checkpoints ({excluded['save_checkpoint'][0]:.2f} s)"
    )
    print(f"loop / bare = {ratio:.3f} (target >= {TARGET_RATIO})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
