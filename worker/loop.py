"""One GPT-2 training run, top to bottom: setup, data, model, optimizer, loop (lr, accumulate, step,
eval, report). The same function runs on every path: a Ray Train worker (`train_loop_per_worker`),
a Tune function trainable (the light single-worker path) and plain Python (tests, `make demo`).

Metrics are reported every `eval_interval_steps` with `tokens` (tokens seen, all workers) as the
step axis, so curves at different batch sizes line up. A NaN/inf or exploding loss ends the run
with status "diverged" and the last good metrics: a result, not an exception.

A run is a function of its config: every random draw comes from a stream keyed on `cfg.seed`
(worker/seeds.py), and the held-out set is `cfg.eval_tokens` tokens whatever the resources (micro-batch
size, workers) are.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from worker.config import TrainConfig, split_batch
from worker.data import TokenData, TrainBatches, prepare_data, train_sequences_available, val_batches, val_windows
from worker.model import attention_logit_probe, build_model, flops_per_token
from worker.noise_scale import NoiseScaleEMA
from worker.optim import OPTIMIZERS, build_optimizer, sampled_labels
from worker.schedule import lr_at, warmup_steps
from worker.seeds import DROPOUT, SOPHIA_LABELS, derived_seed
from worker.session import Metrics, RayTrainSession, Session, scratch_dir

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "state.pt"
PROBE_WINDOWS = 8  # the max-attention-logit probe runs on the first 8 held-out sequences


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
    if cfg.threads_per_worker:
        torch.set_num_threads(cfg.threads_per_worker)
    distributed = session.world_size > 1
    if cfg.use_gpu and torch.cuda.is_available():
        device = torch.device("cuda", session.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    def autocast() -> contextlib.AbstractContextManager[Any]:
        return (
            torch.autocast(device.type, dtype=torch.bfloat16) if cfg.precision == "bf16" else contextlib.nullcontext()
        )

    micro, accum = split_batch(cfg.batch_size, session.world_size, cfg.max_micro_batch)
    total_steps, eval_every = cfg.total_steps, cfg.eval_interval_steps
    warmup = warmup_steps(total_steps, cfg.warmup_fraction)
    seq_len = cfg.model.seq_len

    # --- data ------------------------------------------------------------------------------------
    data: TokenData = prepare_data(cfg.data)
    batches = TrainBatches(
        data,
        seq_len=seq_len,
        micro_batch=micro,
        rank=session.world_rank,
        world_size=session.world_size,
        seed=cfg.seed,
    )
    # the fixed held-out set, in windows of seq_len + 1 tokens; each rank scores every world_size-th one
    # and the sums are all-reduced, so every rank reports the loss over the whole set
    held_out = val_windows(data, seq_len=seq_len, tokens=cfg.eval_tokens)  # (n,) window indices
    my_held_out = held_out[session.world_rank :: session.world_size]
    epochs_needed = cfg.token_budget / max(1, train_sequences_available(data, seq_len) * seq_len)
    if epochs_needed > 1 and session.world_rank == 0:
        log.warning(
            "token_budget=%d needs %.2f epochs of %s: repeated data favours small batches",
            cfg.token_budget,
            epochs_needed,
            data.description,
        )

    # --- model and optimizer --------------------------------------------------------------------
    model = build_model(cfg.model, vocab_size=data.vocab_size, seed=cfg.seed).to(device)
    raw_model = model
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    entry = OPTIMIZERS[cfg.optimizer.name]
    optimizer = build_optimizer(cfg.optimizer, raw_model, tokens_per_step=cfg.tokens_per_step)
    params = [p for p in raw_model.parameters() if p.requires_grad]
    noise = NoiseScaleEMA(decay=cfg.noise_scale_ema)

    step, tokens, initial_loss = 0, 0, None
    last: Metrics = {}
    with session.restored_checkpoint() as ckpt:
        if ckpt is not None:
            state = torch.load(ckpt / CHECKPOINT_FILE, map_location=device, weights_only=False)
            raw_model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            batches.load_state_dict(state["batches"])
            step, tokens, initial_loss = state["step"], state["tokens"], state["initial_loss"]
            noise.g2, noise.trace = state["noise"]
            last = state["last"]
            log.info("resumed at step %d (%d tokens)", step, tokens)

    def evaluate() -> dict[str, float]:
        # mean loss per scored token of the held-out set; micro-batches of max_micro_batch bound memory only
        raw_model.eval()
        with torch.no_grad(), autocast():
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # nats, summed over this rank's tokens
            for x, y in val_batches(data, my_held_out, seq_len=seq_len, micro_batch=cfg.max_micro_batch):
                logits = raw_model(x.to(device)).logits  # (b, seq_len, vocab)
                per_token = F.cross_entropy(logits.flatten(0, 1).float(), y.to(device).flatten(), reduction="none")
                loss_sum += per_token.double().sum()
            if distributed:
                dist.all_reduce(loss_sum)
            out = {"val_loss": loss_sum.item() / (len(held_out) * seq_len)}
            if cfg.probe_attention:
                # fixed probe: the first PROBE_WINDOWS held-out sequences, on every rank (the max is per layer
                # over all of them, so the micro-batching does not change it)
                with attention_logit_probe() as per_layer:
                    for x, _ in val_batches(
                        data, held_out[:PROBE_WINDOWS], seq_len=seq_len, micro_batch=cfg.max_micro_batch
                    ):
                        raw_model(x.to(device))
                out |= {f"attn_logit_max/layer_{i}": v for i, v in sorted(per_layer.items())}
                out["attn_logit_max"] = max(per_layer.values())
        raw_model.train()
        return out

    # --- loop ------------------------------------------------------------------------------------
    model.train()
    status = "completed"
    window_tokens, window_time, window_loss, window_steps = 0, 0.0, 0.0, 0
    grad_norm = float("nan")
    labels_rng = torch.Generator(device=device)  # Sophia's label sampling, re-seeded at each Hessian pass
    while step < total_steps:
        t0 = time.perf_counter()
        # dropout masks (the global RNG) from (seed, rank, step): not from whatever ran before in this process,
        # and a resumed run draws what the uninterrupted one would
        torch.manual_seed(derived_seed(cfg.seed, DROPOUT, session.world_rank, step))
        lr = lr_at(
            step, peak_lr=cfg.optimizer.lr, total_steps=total_steps, warmup=warmup, min_lr_ratio=cfg.min_lr_ratio
        )
        for group in optimizer.param_groups:
            group["lr"] = lr

        loss_sum = torch.zeros((), device=device)
        g_small_sq: float | None = None
        for micro_step in range(accum):
            x, y = (t.to(device, non_blocking=True) for t in next(batches))  # (micro, seq_len)
            # DDP all-reduces only on the last micro-step of the accumulation
            sync = contextlib.nullcontext() if (not distributed or micro_step == accum - 1) else model.no_sync()
            with sync:
                with autocast():
                    logits = model(x).logits  # (micro, seq_len, vocab)
                    loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
                (loss / accum).backward()
            loss_sum += loss.detach()
            if micro_step == 0 and accum > 1:
                # grads now hold one local micro-batch (no all-reduce yet): the small-batch estimate.
                # With accum == 1 the only gradient is the global one and B_simple is not measured.
                g_small_sq = _grad_sq_norm(params) * accum**2

        train_loss = loss_sum.item() / accum
        if distributed:
            t = torch.tensor([train_loss], device=device)
            dist.all_reduce(t)
            train_loss = t.item() / session.world_size
        if initial_loss is None:
            initial_loss = train_loss
        if not math.isfinite(train_loss) or train_loss > cfg.divergence_factor * initial_loss:
            status = "diverged"
            break

        if cfg.grad_clip is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip).item()
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]).item()
        if g_small_sq is not None:
            # sequences: a micro-batch on one worker vs the global batch
            noise.update(g_small_sq, grad_norm**2, micro, cfg.batch_size)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        if entry.needs_hessian and step % entry.hessian_interval == entry.hessian_interval - 1:
            # Sophia-G's Gauss-Newton-Bartlett estimate, as the authors' train_sophiag.py runs it: the gradient
            # of the loss on labels sampled from the model's own softmax, over the whole global batch (every
            # micro-batch, each loss / accum, all-reduced at the last), so h is the estimate for the bs tokens
            # that `rho * bs * h` assumes; clipped like a training gradient before update_hessian(), as theirs.
            # The inputs are the next step's batch, fetched after this step, as theirs; they throw that batch
            # away, here the next step trains on it, so every optimizer trains on the same windows at the same
            # tokens (the pass never sees the data's labels, only the model's samples).
            labels_rng.manual_seed(derived_seed(cfg.seed, SOPHIA_LABELS, step))
            # one uniform per position of the global batch; this rank's sequences are every world_size-th
            # (TrainBatches deals windows round-robin), so the labels do not depend on the resources
            uniforms = torch.rand(cfg.batch_size, seq_len, generator=labels_rng, device=device)
            uniforms = uniforms[session.world_rank :: session.world_size]  # (micro * accum, seq_len)
            for micro_step, (x, _) in enumerate(batches.peek(accum)):
                x = x.to(device, non_blocking=True)  # (micro, seq_len)
                sync = contextlib.nullcontext() if (not distributed or micro_step == accum - 1) else model.no_sync()
                with sync:
                    with autocast():
                        logits = model(x).logits  # (micro, seq_len, vocab)
                    sampled = sampled_labels(logits, uniforms[micro_step * micro : (micro_step + 1) * micro])
                    (F.cross_entropy(logits.flatten(0, 1).float(), sampled.flatten()) / accum).backward()
            if cfg.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            optimizer.update_hessian()  # type: ignore[attr-defined]
            optimizer.zero_grad(set_to_none=True)

        step += 1
        tokens += cfg.tokens_per_step
        if device.type == "cuda":
            torch.cuda.synchronize()
        window_time += time.perf_counter() - t0
        window_tokens += cfg.tokens_per_step
        window_loss += train_loss
        window_steps += 1

        # --- eval and report -------------------------------------------------------------------
        if step % eval_every == 0 or step == total_steps:
            evals = evaluate()
            if not math.isfinite(evals["val_loss"]):
                status = "diverged"
                break
            tokens_per_s = window_tokens / window_time
            last = {
                "tokens": tokens,
                "step": step,
                "train_loss": window_loss / window_steps,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens_per_s": tokens_per_s,
                "epoch": batches.epoch,
                "train_time_s": time.perf_counter() - started,  # wall time of this run so far, setup included
                **evals,
            }
            if noise.value is not None:
                last["noise_scale"] = noise.value  # B_simple, sequences
            peak = _peak_flops(device)
            if peak:
                last["mfu"] = tokens_per_s * flops_per_token(raw_model, seq_len) / peak
            window_tokens, window_time, window_loss, window_steps = 0, 0.0, 0.0, 0
            done = step == total_steps
            metrics = {**last, "status": "completed" if done else "running", "done": done}
            every = cfg.checkpoint_every_evals
            if every and (step // eval_every) % every == 0 and not done:
                with scratch_dir() as d:
                    if session.world_rank == 0:
                        torch.save(
                            {
                                "model": raw_model.state_dict(),
                                "optimizer": optimizer.state_dict(),
                                "batches": batches.state_dict(),
                                "step": step,
                                "tokens": tokens,
                                "initial_loss": initial_loss,
                                "noise": (noise.g2, noise.trace),
                                "last": last,
                            },
                            d / CHECKPOINT_FILE,
                        )
                    session.report(metrics, checkpoint_dir=d if session.world_rank == 0 else None)
            else:
                session.report(metrics)

    if status == "diverged":
        final = {
            **last,
            "tokens": tokens,
            "step": step,
            "status": "diverged",
            "done": True,
            "train_time_s": time.perf_counter() - started,
        }
        log.info("diverged at step %d (lr=%.3g)", step, cfg.optimizer.lr)
        session.report(final)
        return final
    final = {**last, "status": "completed", "done": True}
    if distributed:
        final["ranks_in_sync"] = _ranks_in_sync(params)
    return final


def _ranks_in_sync(params: list[torch.Tensor]) -> bool:
    """DDP's promise, checked: every rank ends with the same weights (sum and sum of squares)."""
    with torch.no_grad():
        local = torch.stack([torch.stack([p.double().sum(), p.double().square().sum()]) for p in params]).flatten()
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


def _grad_sq_norm(params: list[torch.Tensor]) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    return float(sum(n.item() ** 2 for n in torch._foreach_norm(grads)))


def _peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s for MFU: $BATCHSWEEP_PEAK_TFLOPS, or a known GPU; None on CPU."""
    env = os.environ.get("BATCHSWEEP_PEAK_TFLOPS")
    if env:
        return float(env) * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}.items():
        if key in name:
            return tflops
    return None
