"""One GPT-2 training run, top to bottom: setup, data, model, optimizer, loop (lr, `train_step`,
`evaluate`, report, `save_checkpoint`). The same `train` runs on every path: a Ray Train worker
(`train_loop_per_worker`), a Tune function trainable (the light single-worker path) and plain Python
(tests, `make demo`).

Metrics are reported every `eval_interval_steps` with `tokens` (tokens seen, all workers) as the
step axis, so curves at different batch sizes line up. A NaN/inf or exploding loss, a NaN/inf
gradient norm or a NaN/inf val loss ends the run with status "diverged" at the tokens where it stopped
(its `val_loss` NaN, its other metrics the last eval's): a result, not an exception, also before the
first evaluation. Every report and the final result are built by `worker.session.run_result`.

A run is a function of its config: every random draw comes from a stream keyed on `cfg.seed`
(worker/seeds.py), and the held-out set is `cfg.evaluation.tokens` tokens whatever the resources (micro-batch
size, workers) are.

On CUDA the loop runs at the hardware's speed (benchmarks/train_throughput.py measures it against a bare
PyTorch loop): TF32 matmuls, bf16 autocast with `precision="bf16"`, torch's fused AdamW, SDPA attention
(flash-eligible: causal, no mask; the max-attention-logit probe runs at eval on its own probe batch only),
`torch.compile` of the model with `compile=True`, batches copied from pinned memory without blocking, one
host-device sync per optimizer step (the divergence check needs the loss before the optimizer steps), NCCL
for DDP (worker/launch.py) with DDP's own gradient bucketing. The same code runs on CPU, bf16 and compile
included.

Shapes: B = sequences, T = `cfg.model.seq_len` tokens, V = vocabulary. Losses are in nats per token.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from worker.config import TrainConfig, split_batch
from worker.data import TokenData, TrainBatches, prepare_data, train_sequences_available, val_batches, val_windows
from worker.model import attention_logit_probe, build_model, flops_per_token
from worker.noise_scale import NoiseScaleEMA
from worker.optim import OPTIMIZERS, build_optimizer, sampled_labels
from worker.schedule import lr_at
from worker.seeds import DROPOUT, SOPHIA_LABELS, derived_seed
from worker.session import Metrics, RayTrainSession, Session, run_result, scratch_dir

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "state.pt"
PROBE_WINDOWS = 8  # the max-attention-logit probe runs on the first 8 held-out sequences


@dataclass(frozen=True)
class Layout:
    """Where this rank runs and how it splits the global batch: cfg.batch_size = micro x accum x world_size."""

    device: torch.device
    rank: int
    world_size: int
    micro: int  # sequences per forward pass
    accum: int  # micro-batches per optimizer step, on each rank

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@dataclass
class RunState:
    """Where a run stands: what a checkpoint restores besides the model, the optimizer and the data order."""

    step: int = 0  # optimizer steps taken
    tokens: int = 0  # tokens seen, all workers (tokens, not steps)
    initial_loss: float | None = None  # the first step's train loss (nats per token): the divergence yardstick
    noise: NoiseScaleEMA = field(default_factory=NoiseScaleEMA)  # gradient noise scale B_simple, smoothed
    last: Metrics = field(default_factory=dict)  # the last eval's metrics: what a diverged run still reports


@dataclass(frozen=True)
class StepMetrics:
    """What one optimizer step measured."""

    train_loss: float  # mean over the global batch, nats per token
    grad_norm: float  # L2 norm of the global gradient before clipping; nan when the step diverged
    diverged: bool  # NaN/inf or exploding loss, or NaN/inf gradient norm: the optimizer did not step


@dataclass
class Window:
    """The steps since the last report: their mean train loss and their throughput."""

    steps: int = 0
    tokens: int = 0  # tokens, all workers
    loss_sum: float = 0.0  # sum of the steps' train losses, nats per token
    started: float | None = None  # perf_counter() when the window's first step began

    def start(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def add(self, step: StepMetrics, *, tokens: int) -> None:
        self.steps += 1
        self.tokens += tokens
        self.loss_sum += step.train_loss

    def seconds(self, device: torch.device) -> float:
        """Wall time from the first step's start to now, once the device has finished the steps' work (one
        sync per report, not per step): the steps and the loop's own work between them, no eval."""
        _synchronize(device)
        assert self.started is not None
        return time.perf_counter() - self.started


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    """Entry point for Ray Train's `TorchTrainer` (one call per worker; DDP over the group).

    Returns {"final": metrics, "history": reports}; Ray keeps rank 0's as `Result.return_value`.
    """
    session = RayTrainSession()
    final = train(TrainConfig.model_validate(config), session)
    return {"final": final, "history": session.history}


def train(cfg: TrainConfig, session: Session) -> Metrics:
    """Train one run; returns the final metrics (with `status`: completed | diverged)."""
    # --- setup ---------------------------------------------------------------------------------
    started = time.perf_counter()
    last_checkpoint = started  # checkpoints.min_interval_s counts from here
    if cfg.resources.cpus_per_worker:
        torch.set_num_threads(cfg.resources.cpus_per_worker)
    micro, accum = split_batch(cfg.batch_size, session.world_size, cfg.resources.max_micro_batch)
    layout = Layout(_device(cfg, session.local_rank), session.world_rank, session.world_size, micro, accum)
    _configure_backends(layout.device)
    total_steps, eval_every = cfg.total_steps, cfg.eval_interval_steps
    warmup = cfg.warmup_total_steps  # steps
    seq_len = cfg.model.seq_len

    # --- data ------------------------------------------------------------------------------------
    data: TokenData = prepare_data(cfg.data)
    batches = TrainBatches(
        data, seq_len=seq_len, micro_batch=micro, rank=layout.rank, world_size=layout.world_size, seed=cfg.seed
    )
    held_out = val_windows(data, seq_len=seq_len, tokens=cfg.evaluation.tokens)  # (n,) window indices into val
    epochs_needed = cfg.token_budget / max(1, train_sequences_available(data, seq_len) * seq_len)
    if epochs_needed > 1 and layout.rank == 0:
        log.warning(
            "token_budget=%d needs %.2f epochs of %s: repeated data favours small batches",
            cfg.token_budget,
            epochs_needed,
            data.description,
        )

    # --- model and optimizer --------------------------------------------------------------------
    raw_model, model = build_models(cfg, vocab_size=data.vocab_size, layout=layout)
    optimizer = build_optimizer(cfg.optimizer, raw_model, tokens_per_step=cfg.tokens_per_step)
    params = [p for p in raw_model.parameters() if p.requires_grad]

    state = RunState(noise=NoiseScaleEMA(decay=cfg.evaluation.noise_scale_ema))
    with session.restored_checkpoint() as ckpt:
        if ckpt is not None:
            state = load_checkpoint(
                ckpt, model=raw_model, optimizer=optimizer, batches=batches, device=layout.device, noise=state.noise
            )
            log.info("resumed at step %d (%d tokens)", state.step, state.tokens)

    # --- loop ------------------------------------------------------------------------------------
    model.train()
    window = Window()
    report: Metrics = {}
    diverged = False
    while state.step < total_steps:
        window.start()
        lr = lr_at(
            state.step,
            peak_lr=cfg.optimizer.lr,
            total_steps=total_steps,
            warmup=warmup,
            min_lr_ratio=cfg.schedule.min_lr_ratio,
        )
        result = train_step(
            model,
            optimizer,
            batches,
            params,
            cfg=cfg,
            layout=layout,
            step=state.step,
            lr=lr,
            initial_loss=state.initial_loss,
            noise=state.noise,
        )
        if state.initial_loss is None:
            state.initial_loss = result.train_loss
        if result.diverged:
            diverged = True
            break
        state.step += 1
        state.tokens += cfg.tokens_per_step
        window.add(result, tokens=cfg.tokens_per_step)

        # --- eval and report -------------------------------------------------------------------
        done = state.step == total_steps
        if state.step % eval_every != 0 and not done:
            continue
        tokens_per_s = window.tokens / window.seconds(layout.device)  # all workers, per second of training
        evals = evaluate(raw_model, data, held_out, cfg=cfg, layout=layout)
        if not math.isfinite(evals["val_loss"]):
            diverged = True
            break
        state.last = {
            "tokens": state.tokens,
            "step": state.step,
            "train_loss": window.loss_sum / window.steps,  # mean over the window's steps
            "lr": lr,  # of the last step
            "grad_norm": result.grad_norm,  # of the last step
            "tokens_per_s": tokens_per_s,
            "epoch": batches.epoch,
            **evals,
            **speed_metrics(state, tokens_per_s, raw_model, seq_len=seq_len, device=layout.device),
        }
        window = Window()
        report = report_metrics(state, status="completed" if done else "running", started=started)
        every = cfg.checkpoint_every_evals
        due = bool(every) and (state.step // eval_every) % every == 0 and not done
        due = due and rank0_agrees(time.perf_counter() - last_checkpoint >= cfg.checkpoints.min_interval_s, layout)
        if due:
            with scratch_dir() as d:
                if layout.rank == 0:
                    save_checkpoint(d, model=raw_model, optimizer=optimizer, batches=batches, state=state)
                session.report(report, checkpoint_dir=d if layout.rank == 0 else None)
            last_checkpoint = time.perf_counter()
        else:
            session.report(report)

    if diverged:
        log.info("diverged at step %d (lr=%.3g)", state.step, cfg.optimizer.lr)
        report = report_metrics(state, status="diverged", started=started)
        session.report(report)
    elif layout.distributed:
        report = {**report, "ranks_in_sync": _ranks_in_sync(params)}
    return report


def build_models(cfg: TrainConfig, *, vocab_size: int, layout: Layout) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the model, what trains): DDP around it on several workers, compiled where asked; evaluation and
    checkpoints use the model itself."""
    raw_model = build_model(cfg.model, vocab_size=vocab_size, seed=cfg.seed).to(layout.device)
    model: torch.nn.Module = raw_model
    if layout.distributed:
        # gradient bucketing is DDP's own (25 MiB buckets, all-reduced while the backward pass goes on)
        model = torch.nn.parallel.DistributedDataParallel(
            raw_model, device_ids=[layout.device.index] if layout.device.type == "cuda" else None
        )
    if cfg.compile:
        # compiled on the first step (inductor; a graph per distinct input shape, and the training shape is
        # fixed); around DDP, so dynamo splits the graph at DDP's buckets and the all-reduces still overlap
        model = torch.compile(model)
    return raw_model, model


def speed_metrics(
    state: RunState, tokens_per_s: float, model: torch.nn.Module, *, seq_len: int, device: torch.device
) -> Metrics:
    """The gradient noise scale (B_simple, sequences) once estimated, and MFU where the device's peak is known."""
    out: Metrics = {}
    if state.noise.value is not None:
        out["noise_scale"] = state.noise.value
    peak = peak_flops(device)
    if peak:
        out["mfu"] = tokens_per_s * flops_per_token(model, seq_len) / peak
    return out


def report_metrics(state: RunState, *, status: str, started: float) -> Metrics:
    """Every report and the final result: `run_result` of the last eval's metrics and where the run stands."""
    return run_result(
        state.last, tokens=state.tokens, step=state.step, status=status, train_time_s=time.perf_counter() - started
    )


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: TrainBatches,
    params: list[torch.nn.Parameter],
    *,
    cfg: TrainConfig,
    layout: Layout,
    step: int,
    lr: float,
    initial_loss: float | None,
    noise: NoiseScaleEMA,
) -> StepMetrics:
    """Optimizer step `step` (0-based) at `lr`: accumulate `layout.accum` micro-batches (DDP all-reduces at
    the last), clip, step, and for Sophia-G refresh the Hessian. Updates `noise` when there is
    accumulation. A diverged loss (NaN/inf, or above cfg.evaluation.divergence_factor x `initial_loss`; the first
    step is its own yardstick) or a non-finite gradient norm returns before the optimizer steps.

    The device is asked for numbers once: loss, gradient norm and the noise-scale estimate come back in
    one read (a host-device sync on CUDA, which must precede the optimizer's step: it is the divergence
    check); everything else is queued without waiting."""
    # dropout masks (the global RNG) from (seed, rank, step): not from whatever ran before in this process,
    # and a resumed run draws what the uninterrupted one would
    torch.manual_seed(derived_seed(cfg.seed, DROPOUT, layout.rank, step))
    for group in optimizer.param_groups:
        group["lr"] = lr

    loss_sum = torch.zeros((), device=layout.device)  # nats per token, summed over micro-batches
    g_small_sq: torch.Tensor | None = None
    for micro_step in range(layout.accum):
        x, y = (_to_device(t, layout.device) for t in next(batches))  # (micro, T) token ids
        with _grad_sync(model, layout, micro_step):
            with _autocast(layout.device, cfg.precision):
                logits = model(x).logits  # (micro, T, V)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            (loss / layout.accum).backward()
        loss_sum += loss.detach()
        if micro_step == 0 and layout.accum > 1:
            # grads now hold one local micro-batch (no all-reduce yet): the small-batch estimate.
            # With accum == 1 the only gradient is the global one and B_simple is not measured.
            g_small_sq = _grad_sq_norm(params) * layout.accum**2

    mean_loss = loss_sum / (layout.accum * layout.world_size)
    if layout.distributed:
        dist.all_reduce(mean_loss)  # the mean over the global batch, on every rank
    # The global gradient's norm (the all-reduce is done once backward() returns), and clipping: both
    # queued on the device; a diverged step below never reaches the optimizer, so clipping first is harmless.
    if cfg.grad_clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    # the step's one read from the device: (loss, norm[, small-batch g^2]) as float64 on the host
    reads = [mean_loss.double(), norm.double()] + ([g_small_sq] if g_small_sq is not None else [])
    values = torch.stack(reads).tolist()
    train_loss, grad_norm = values[0], values[1]
    reference = train_loss if initial_loss is None else initial_loss
    exploded = not math.isfinite(train_loss) or train_loss > cfg.evaluation.divergence_factor * reference
    if exploded or not math.isfinite(grad_norm):  # an inf/NaN gradient would make every parameter NaN
        return StepMetrics(train_loss=train_loss, grad_norm=math.nan, diverged=True)

    if g_small_sq is not None:
        # sequences: a micro-batch on one worker vs the global batch
        noise.update(values[2], grad_norm**2, layout.micro, cfg.batch_size)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    entry = OPTIMIZERS[cfg.optimizer.name]
    if entry.needs_hessian and step % entry.hessian_interval == entry.hessian_interval - 1:
        _sophia_hessian_update(model, optimizer, batches, params, cfg=cfg, layout=layout, step=step)
    return StepMetrics(train_loss=train_loss, grad_norm=grad_norm, diverged=False)


def _sophia_hessian_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: TrainBatches,
    params: list[torch.nn.Parameter],
    *,
    cfg: TrainConfig,
    layout: Layout,
    step: int,
) -> None:
    """Sophia-G's Gauss-Newton-Bartlett estimate, as the authors' train_sophiag.py runs it: the gradient of
    the loss on labels sampled from the model's own softmax, over the whole global batch (every micro-batch,
    each loss / accum, all-reduced at the last), so h is the estimate for the bs tokens that `rho * bs * h`
    assumes; clipped like a training gradient before update_hessian(), as theirs.

    The inputs are the next step's batch, fetched after this step, as theirs; they throw that batch away,
    here the next step trains on it, so every optimizer trains on the same windows at the same tokens (the
    pass never sees the data's labels, only the model's samples)."""
    labels_rng = torch.Generator(device=layout.device).manual_seed(derived_seed(cfg.seed, SOPHIA_LABELS, step))
    # one uniform per position of the global batch; this rank's sequences are every world_size-th
    # (TrainBatches deals windows round-robin), so the labels do not depend on the resources
    uniforms = torch.rand(cfg.batch_size, cfg.model.seq_len, generator=labels_rng, device=layout.device)  # (B, T)
    uniforms = uniforms[layout.rank :: layout.world_size]  # (micro * accum, T)
    for micro_step, (x, _) in enumerate(batches.peek(layout.accum)):
        x = _to_device(x, layout.device)  # (micro, T)
        with _grad_sync(model, layout, micro_step):
            with _autocast(layout.device, cfg.precision):
                logits = model(x).logits  # (micro, T, V)
            sampled = sampled_labels(logits, uniforms[micro_step * layout.micro : (micro_step + 1) * layout.micro])
            (F.cross_entropy(logits.flatten(0, 1).float(), sampled.flatten()) / layout.accum).backward()
    if cfg.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    optimizer.update_hessian()  # type: ignore[attr-defined]
    optimizer.zero_grad(set_to_none=True)


def evaluate(
    model: torch.nn.Module, data: TokenData, held_out: np.ndarray, *, cfg: TrainConfig, layout: Layout
) -> dict[str, float]:
    """The held-out loss (`val_loss`, mean nats per scored token of the whole `held_out` set) and, with
    cfg.evaluation.probe_attention, the max attention logit per layer on the fixed probe batch.

    Each rank scores every world_size-th window and the sums are all-reduced, so every rank reports the
    loss over the whole set; micro-batches of cfg.resources.max_micro_batch bound memory only. `held_out`: (n,) window
    indices into val (`val_windows`). `model`: the unwrapped model, not the DDP wrapper (no gradient sync)."""
    seq_len = cfg.model.seq_len
    model.eval()
    with torch.no_grad(), _autocast(layout.device, cfg.precision):
        loss_sum = torch.zeros((), dtype=torch.float64, device=layout.device)  # nats, summed over this rank's tokens
        mine = held_out[layout.rank :: layout.world_size]
        for x, y in val_batches(data, mine, seq_len=seq_len, micro_batch=cfg.resources.max_micro_batch):
            x, y = _to_device(x, layout.device), _to_device(y, layout.device)
            logits = model(x).logits  # (b, T, V)
            per_token = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none")
            loss_sum += per_token.double().sum()
        if layout.distributed:
            dist.all_reduce(loss_sum)
        out = {"val_loss": loss_sum.item() / (len(held_out) * seq_len)}
        if cfg.evaluation.probe_attention:
            # fixed probe: the first PROBE_WINDOWS held-out sequences, on every rank (the max is per layer
            # over all of them, so the micro-batching does not change it)
            with attention_logit_probe() as per_layer:
                for x, _ in val_batches(
                    data, held_out[:PROBE_WINDOWS], seq_len=seq_len, micro_batch=cfg.resources.max_micro_batch
                ):
                    model(_to_device(x, layout.device))
            out |= {f"attn_logit_max/layer_{i}": v for i, v in sorted(per_layer.items())}
            out["attn_logit_max"] = max(per_layer.values())
    model.train()
    return out


def rank0_agrees(flag: bool, layout: Layout) -> bool:
    """Rank 0's `flag` on every rank (a decision from its clock must be the same on all of them)."""
    if not layout.distributed:
        return flag
    t = torch.tensor([int(flag)], device=layout.device)
    torch.distributed.broadcast(t, src=0)
    return bool(t.item())  # a host sync, once per evaluation


def save_checkpoint(
    directory: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: TrainBatches,
    state: RunState,
) -> None:
    """Everything a resumed run needs to continue as the uninterrupted one would, in directory/state.pt."""
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "batches": batches.state_dict(),
            "step": state.step,
            "tokens": state.tokens,
            "initial_loss": state.initial_loss,
            "noise": (state.noise.g2, state.noise.trace),
            "last": state.last,
        },
        directory / CHECKPOINT_FILE,
    )


def load_checkpoint(
    directory: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: TrainBatches,
    device: torch.device,
    noise: NoiseScaleEMA,
) -> RunState:
    """Restore model, optimizer and data order in place from `save_checkpoint`'s file; returns the run's
    state, whose noise-scale EMA is `noise` (its decay is the config's) holding the saved estimates."""
    # weights_only: tensors and plain values only, so a file planted in the trial storage cannot run code
    saved = torch.load(directory / CHECKPOINT_FILE, map_location=device, weights_only=True)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    batches.load_state_dict(saved["batches"])
    noise.g2, noise.trace = saved["noise"]
    return RunState(
        step=saved["step"], tokens=saved["tokens"], initial_loss=saved["initial_loss"], noise=noise, last=saved["last"]
    )


def _device(cfg: TrainConfig, local_rank: int) -> torch.device:
    if cfg.resources.use_gpu and torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def _grad_sync(model: torch.nn.Module, layout: Layout, micro_step: int) -> contextlib.AbstractContextManager[Any]:
    """DDP all-reduces the gradients only on the last micro-batch of an accumulation."""
    if not layout.distributed or micro_step == layout.accum - 1:
        return contextlib.nullcontext()
    return model.no_sync()  # type: ignore[operator]


def _ranks_in_sync(params: list[torch.nn.Parameter]) -> bool:
    """DDP's promise, checked: every rank ends with the same weights (sum and sum of squares)."""
    with torch.no_grad():
        local = torch.stack([torch.stack([p.double().sum(), p.double().square().sum()]) for p in params]).flatten()
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


def _grad_sq_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Squared L2 norm of all gradients, a float64 scalar on their device (no host read)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.stack(torch._foreach_norm(grads)).double().square().sum()


def _configure_backends(device: torch.device) -> None:
    """On CUDA: float32 matmuls on TF32 tensor cores (cuBLAS and cuDNN; bf16 autocast covers the rest).
    Process-wide, as every run in a worker process wants it; nothing changes on CPU."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU batch on `device`: on CUDA copied from pinned (page-locked) memory without blocking, so the host
    goes on queueing work while the copy runs; on CPU the tensor itself."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s for MFU: $BATCHSWEEP_PEAK_TFLOPS, or a GPU of worker/hardware.py's table
    (the one the dry-run price uses); None on CPU and for a GPU the table does not hold."""
    from worker.hardware import device_peak_flops
    from worker.settings import WorkerSettings

    if (tflops := WorkerSettings().peak_tflops) is not None:
        return tflops * 1e12
    if device.type != "cuda":
        return None
    return device_peak_flops(torch.cuda.get_device_name(device))
