"""The memory one training worker needs at its peak, from the model's shape, the micro-batch and the
optimizer (torch-free: the service admits a spec by it before any trial starts, `sweeps.admission`).

Per worker, in bytes (N parameters, L layers, width d, T tokens a sequence, V the vocabulary, m the
micro-batch a forward pass trains on, M the evaluation's micro-batch:
`max_micro_batch`, or the held-out set's sequences where fewer):

    model      = (2 + s) x 4 N          fp32 weights, their gradients and s optimizer state tensors each
    activations = m T L x A d x b       saved for the backward pass and the backward's own buffers: A values
                                        of width d a token a layer, b bytes a value; A = 36, measured
                                        (Korthikanti et al. 2022, sec. 4.1, count ~17 for Megatron's fused
                                        kernels; transformers' GPT-2 keeps GELU's intermediates too, and
                                        SDPA no T x T probabilities)
    logits     = m T V x 4 x 4          the LM head's fp32 output, its log-softmax, their gradients
    evaluation = M T V x 4 x 2          no gradients, but the logits of a larger micro-batch
    runtime    = the interpreter with torch, transformers and Ray's worker (host); the CUDA context (GPU)

    peak       = model + runtime + max(activations + logits, evaluation)

On a GPU the model, activations and logits live on the device (`device_bytes`) and the host holds the
runtime and one copy of the weights, built there before they move (`host_bytes`); on CPU the host holds
it all. The CPU figures are checked against the measured peak resident memory of real trials
(tests/worker/test_memory.py); the GPU runtime figures are not measured here (no GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.config import TrainConfig, split_batch
from worker.names import OPTIMIZERS

GIB = 2**30
FP32 = 4  # bytes
ACTIVATION_VALUES = 36  # values of width d per token per layer (A above), fitted to measured peaks
LOGIT_COPIES = 4  # logits, log-softmax, their gradients: fp32 whatever the precision (the loss upcasts)
EVAL_LOGIT_COPIES = 2  # logits and log-softmax, no gradient
# Resident memory of a trial's process before its model exists: Python, torch, transformers and Ray, measured
# at 0.40 GiB on the CPU build (tests/worker/test_memory.py measures whole runs), plus Ray's worker runtime
HOST_RUNTIME_CPU = 0.5 * GIB
# With the CUDA build: its libraries mapped in (~1.5-2.5 GiB resident) and, on the device, the CUDA context
# and cuBLAS workspace (~0.5-1 GiB with torch 2.x). Not measured here: no GPU on the machine that built this.
HOST_RUNTIME_GPU = 3 * GIB
DEVICE_RUNTIME = 1 * GIB


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one worker of a run needs at its peak, by part (the module docstring's formulas)."""

    weights: int  # fp32
    gradients: int
    optimizer_state: int
    activations: int  # saved for backward, one micro-batch
    logits: int  # training logits, one micro-batch
    evaluation: int  # evaluation logits, one evaluation micro-batch
    runtime_host: int
    runtime_device: int  # 0 on CPU
    on_gpu: bool
    micro_batch: int

    @property
    def model(self) -> int:
        return self.weights + self.gradients + self.optimizer_state

    @property
    def working(self) -> int:
        """What the model and its batches take at the peak (training or evaluation, whichever is larger)."""
        return self.model + max(self.activations + self.logits, self.evaluation)

    @property
    def host_bytes(self) -> int:
        """Resident memory of the worker's process on its node."""
        if self.on_gpu:
            return self.runtime_host + self.weights
        return self.runtime_host + self.working

    @property
    def device_bytes(self) -> int:
        """Memory on the worker's GPU (0 on CPU)."""
        return self.runtime_device + self.working if self.on_gpu else 0

    def describe(self) -> str:
        """'~12.3 GiB: model 11.5 GiB (weights, gradients, optimizer state), activations 0.4 GiB, ...'."""
        where = "on the GPU" if self.on_gpu else "of host memory"
        total = self.device_bytes if self.on_gpu else self.host_bytes
        parts = [
            f"model {gib(self.model)} (weights, gradients, optimizer state)",
            f"activations and logits of a micro-batch of {self.micro_batch} {gib(self.activations + self.logits)}",
            f"evaluation logits {gib(self.evaluation)}",
            f"runtime {gib(self.runtime_device if self.on_gpu else self.runtime_host)}",
        ]
        return f"about {gib(total)} {where} per worker ({', '.join(parts)})"


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= 0.1 * GIB else f"{n / 2**20:.0f} MiB"


def state_tensors(optimizer: str, extra: dict[str, object] | None = None) -> int:
    """Tensors of each parameter's shape `optimizer` keeps: the registry's count, one more with amsgrad."""
    entry = OPTIMIZERS[optimizer]
    return entry.state_tensors + (1 if (extra or {}).get("amsgrad") else 0)


def estimate_memory(cfg: TrainConfig) -> MemoryEstimate:
    """The peak memory of one worker training `cfg` (module docstring)."""
    shape = cfg.model.shape()
    layers, width, seq = shape["n_layer"], shape["n_embd"], cfg.model.seq_len
    vocab = cfg.data.vocab_size
    n = cfg.model.parameters(vocab)
    micro, _ = split_batch(cfg.batch_size, cfg.resources.workers_per_trial, cfg.resources.max_micro_batch)
    # evaluation: micro-batches of max_micro_batch sequences, fewer where the held-out set is smaller
    eval_micro = min(cfg.resources.max_micro_batch, -(-cfg.evaluation.tokens // seq))
    value_bytes = 2 if cfg.precision == "bf16" else FP32
    on_gpu = cfg.resources.use_gpu
    return MemoryEstimate(
        weights=FP32 * n,
        gradients=FP32 * n,
        optimizer_state=state_tensors(cfg.optimizer.name, cfg.optimizer.extra) * FP32 * n,
        activations=micro * seq * layers * ACTIVATION_VALUES * width * value_bytes,
        logits=micro * seq * vocab * FP32 * LOGIT_COPIES,
        evaluation=eval_micro * seq * vocab * FP32 * EVAL_LOGIT_COPIES,
        runtime_host=int(HOST_RUNTIME_GPU if on_gpu else HOST_RUNTIME_CPU),
        runtime_device=DEVICE_RUNTIME if on_gpu else 0,
        on_gpu=on_gpu,
        micro_batch=micro,
    )
