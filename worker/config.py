"""Typed, validated configuration of one training run (no torch import: the service validates with it).

Everything a run needs travels as one `TrainConfig` (a plain dict on the wire, so Ray and Tune can
ship it). Each part validates itself on entry and names the bad value in its error.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from worker.names import MODEL_PRESETS, OPTIMIZER_NAMES


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Config):
    """GPT-2 shape: a preset by name, optionally overridden field by field."""

    preset: str | None = "gpt2-nano"
    n_layer: int | None = Field(default=None, gt=0)
    n_head: int | None = Field(default=None, gt=0)
    n_embd: int | None = Field(default=None, gt=0)
    seq_len: int = Field(default=128, gt=1)  # tokens per sequence (GPT-2's n_positions)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.preset is not None and self.preset not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {self.preset!r}; valid presets: {', '.join(sorted(MODEL_PRESETS))}")
        if self.preset is None and None in (self.n_layer, self.n_head, self.n_embd):
            raise ValueError("without a preset, n_layer, n_head and n_embd are all required")
        shape = self.shape()
        if shape["n_embd"] % shape["n_head"]:
            raise ValueError(
                f"n_embd must be divisible by n_head, got n_embd={shape['n_embd']}, n_head={shape['n_head']}"
            )
        return self

    def shape(self) -> dict[str, int]:
        base = dict(MODEL_PRESETS[self.preset]) if self.preset else {}
        for key in ("n_layer", "n_head", "n_embd"):
            value = getattr(self, key)
            if value is not None:
                base[key] = value
        return base


class DataConfig(_Config):
    """Where the text comes from and how it becomes tokens."""

    # "builtin" | a local file or directory of .txt/.md files | "hf:<dataset>[:<config>]"
    # (a dataset name, or a path saved with `Dataset.save_to_disk`).
    source: str = "builtin"
    text_field: str = "text"  # column of an HF dataset that holds the text
    vocab_size: int = Field(default=4096, ge=257, le=65535)  # byte-level BPE; tokens stored as uint16
    val_fraction: float = Field(default=0.05, gt=0.0, lt=0.5)
    cache_dir: str | None = None  # default: $BATCHSWEEP_CACHE or ~/.cache/batchsweep

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if not v.strip():
            raise ValueError(f"data source must not be empty, got source={v!r}")
        if v.startswith("hf:") and len(v) <= 3:
            raise ValueError(f"hf: source needs a dataset name, got source={v!r}")
        return v


class OptimizerConfig(_Config):
    """An optimizer from the registry (`worker.optim.OPTIMIZERS`) and its hyper-parameters."""

    name: str = "adamw"
    lr: float = Field(default=1e-3)  # peak lr, reached after warm-up
    weight_decay: float = Field(default=0.0, ge=0.0)
    betas: tuple[float, float] | None = None  # None: the optimizer's own default
    eps: float | None = Field(default=None, gt=0.0)
    extra: dict[str, Any] = Field(default_factory=dict)  # optimizer-specific keywords (e.g. sophia's rho)

    @field_validator("lr")
    @classmethod
    def _lr(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"lr must be > 0, got lr={v}")
        return v

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"betas must lie in [0, 1), got betas={list(v)}")
        return v

    @model_validator(mode="after")
    def _known(self) -> OptimizerConfig:
        if self.name not in OPTIMIZER_NAMES:
            raise ValueError(f"unknown optimizer {self.name!r}; valid optimizers: {', '.join(OPTIMIZER_NAMES)}")
        return self


class TrainConfig(_Config):
    """One training run: model x data x optimizer at one global batch size and token budget."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)

    batch_size: int = Field(default=16, gt=0)  # global batch, in sequences, across all workers
    max_micro_batch: int = Field(default=32, gt=0)  # sequences per forward pass on one worker
    num_workers: int = Field(default=1, gt=0)
    use_gpu: bool = False
    threads_per_worker: int | None = Field(default=None, gt=0)  # torch intra-op threads; None: CPUs given

    token_budget: int = Field(default=200_000, gt=0)  # tokens, not steps
    warmup_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)  # cosine floor, as a fraction of peak lr
    grad_clip: float | None = Field(default=1.0, gt=0.0)

    eval_every_tokens: int | None = Field(default=None, gt=0)  # default: budget / 10
    eval_batches: int = Field(default=4, gt=0)  # fixed held-out batches of max_micro_batch sequences
    probe_attention: bool = True  # max attention logit per layer, at eval only
    noise_scale_ema: float = Field(default=0.9, ge=0.0, lt=1.0)
    divergence_factor: float = Field(default=3.0, gt=1.0)  # loss > factor x initial loss: diverged

    seed: int = 0
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16 autocast, GPU runs
    checkpoint_every_evals: int = Field(default=1, ge=0)  # 0: no checkpoints

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        split_batch(self.batch_size, self.num_workers, self.max_micro_batch)
        if self.total_steps < 1:
            raise ValueError(
                f"token_budget={self.token_budget} is smaller than one step at batch_size={self.batch_size} "
                f"x seq_len={self.model.seq_len} = {self.tokens_per_step} tokens"
            )
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.model.seq_len

    @property
    def total_steps(self) -> int:
        return self.token_budget // self.tokens_per_step

    @property
    def eval_interval_steps(self) -> int:
        every = self.eval_every_tokens or max(self.token_budget // 10, 1)
        return max(1, round(every / self.tokens_per_step))


def split_batch(batch_size: int, num_workers: int, max_micro_batch: int) -> tuple[int, int]:
    """Split a global batch into (micro_batch, grad_accum) per worker.

    global = micro_batch x grad_accum x num_workers, with the largest micro_batch <= max_micro_batch
    that divides the per-worker batch exactly.
    """
    if batch_size % num_workers:
        raise ValueError(
            f"batch_size={batch_size} cannot be split evenly over num_workers={num_workers}; "
            f"use a multiple of {num_workers}"
        )
    per_worker = batch_size // num_workers
    micro = max(d for d in range(1, min(per_worker, max_micro_batch) + 1) if per_worker % d == 0)
    return micro, per_worker // micro
