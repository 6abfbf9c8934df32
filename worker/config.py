"""Typed, validated configuration of one training run (no torch import: the service validates with it).

Everything a run needs travels as one `TrainConfig` (a plain dict on the wire, so Ray and Tune can
ship it). Each part validates itself on entry and names the bad value in its error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from worker.messages import excerpt
from worker.names import BUILTIN_CORPUS_TOKENS, EXTRA_RESERVED, MODEL_PRESETS, OPTIMIZERS
from worker.schedule import warmup_steps

# ---- upper bounds -------------------------------------------------------------------------------
# Every number that costs CPU or memory (in validation, in the service, on the cluster) is bounded, so
# no config can ask for more than any machine this runs on has. Generous for real runs: GPT-2 XL
# shapes, batch 65k, 8k-token sequences.
MAX_BATCH_SIZE = 65_536  # sequences in one global batch
MAX_MICRO_BATCH = 1_024  # sequences in one forward pass of one worker
MAX_WORKERS = 64  # data-parallel workers of one run
MAX_THREADS_PER_WORKER = 128  # torch threads (= CPUs asked of Ray) per worker
MAX_GPUS_PER_WORKER = 8  # GPUs asked of Ray per worker: the most one node usually has
MAX_SEQ_LEN = 8_192  # tokens per sequence (GPT-2's n_positions)
# model shape, field by field (GPT-2 XL: 48 layers, 25 heads, d=1600); MAX_PARAMETERS bounds them together
MAX_N_LAYER = 128
MAX_N_HEAD = 128
MAX_N_EMBD = 8_192
MAX_VOCAB_SIZE = 65_535  # tokens are stored as uint16
MAX_PARAMETERS = 2_000_000_000  # GPT-2 XL (1.6B at the largest vocab) fits
# n_layer x n_head x seq_len^2: the attention probabilities one sequence keeps for the backward pass
# (eager attention, fp32). 2^34 floats = 64 GiB per sequence: larger shapes cannot train on any GPU.
MAX_ATTENTION_SCORES = 2**34
# tokens scored per evaluation; the held-out split caps it anyway (OpenWebText's val holds 4.4M tokens)
MAX_EVAL_TOKENS = 100_000_000
# every token count of a run (budget, eval and checkpoint intervals, warm-up): 10^15 is ~70x the largest
# published pre-training runs, and keeps every count an exact float and far from overflow
MAX_TOKENS = 10**15
MAX_LR = 100.0  # a peak lr; the search's bounds (lr.max x lr.extend) included
MAX_PATH_CHARS = 4_096  # PATH_MAX on Linux


def _positive(v: float, info: ValidationInfo) -> float:
    if not v > 0:
        raise ValueError(f"{info.field_name} must be > 0, got {info.field_name}={v}")
    return v


# `Annotated[float, Positive]`: > 0, refused with a message that names the field and the value
# ("lr must be > 0, got lr=-1.0") where pydantic's gt=0 says "Input should be greater than 0"
Positive = AfterValidator(_positive)


class _Config(BaseModel):
    # allow_inf_nan=False: no float field takes inf or NaN (JSON's Infinity, YAML's .inf, "nan" strings)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @classmethod
    def of(cls, section: BaseModel) -> Self:
        """This section built from the fields it shares with `section` (a sweep spec's section on the same
        base, e.g. `ScheduleSpec` for `ScheduleConfig`), validated; the fields `section` lacks at their defaults."""
        shared = set(cls.model_fields) & set(type(section).model_fields)
        return cls.model_validate(section.model_dump(include=shared))


class ModelConfig(_Config):
    """GPT-2 shape: a preset by name, optionally overridden field by field."""

    preset: str | None = "gpt2-nano"
    n_layer: int | None = Field(default=None, gt=0, le=MAX_N_LAYER)
    n_head: int | None = Field(default=None, gt=0, le=MAX_N_HEAD)
    n_embd: int | None = Field(default=None, gt=0, le=MAX_N_EMBD)
    seq_len: int = Field(default=128, gt=1, le=MAX_SEQ_LEN)  # tokens per sequence (GPT-2's n_positions)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.preset is not None and self.preset not in MODEL_PRESETS:
            raise ValueError(
                f"unknown model preset {excerpt(self.preset)}; valid presets: {', '.join(sorted(MODEL_PRESETS))}"
            )
        if self.preset is None and None in (self.n_layer, self.n_head, self.n_embd):
            raise ValueError("without a preset, n_layer, n_head and n_embd are all required")
        shape = self.shape()
        if shape["n_embd"] % shape["n_head"]:
            raise ValueError(
                f"n_embd must be divisible by n_head, got n_embd={shape['n_embd']}, n_head={shape['n_head']}"
            )
        # preset x seq_len: the limits hold for the shape as trained, whichever fields set it
        params = self.parameters(MAX_VOCAB_SIZE)
        if params > MAX_PARAMETERS:
            raise ValueError(
                f"model has ~{params:,} parameters at the largest vocabulary ({shape}, seq_len={self.seq_len}); "
                f"the limit is {MAX_PARAMETERS:,}"
            )
        scores = shape["n_layer"] * shape["n_head"] * self.seq_len**2
        if scores > MAX_ATTENTION_SCORES:
            raise ValueError(
                f"n_layer x n_head x seq_len^2 = {shape['n_layer']} x {shape['n_head']} x {self.seq_len}^2 = "
                f"{scores:,} attention scores per sequence exceeds the limit {MAX_ATTENTION_SCORES:,} "
                f"(64 GiB of fp32 per sequence); use a smaller seq_len or model"
            )
        return self

    def parameters(self, vocab_size: int) -> int:
        """GPT-2's parameter count at this shape: 12 d^2 + 13 d per layer, token and position embeddings
        (the LM head is tied to the token embedding), the final LayerNorm."""
        shape = self.shape()
        d, layers = shape["n_embd"], shape["n_layer"]
        return layers * (12 * d * d + 13 * d) + (vocab_size + self.seq_len) * d + 2 * d

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
    source: str = Field(default="builtin", max_length=MAX_PATH_CHARS)
    # column of an HF dataset that holds the text
    text_field: str = Field(default="text", min_length=1, max_length=256)
    vocab_size: int = Field(default=4096, ge=257, le=MAX_VOCAB_SIZE)  # byte-level BPE; tokens stored as uint16
    val_fraction: float = Field(default=0.05, gt=0.0, lt=0.5)
    # default: $BATCHSWEEP_CACHE or ~/.cache/batchsweep
    cache_dir: str | None = Field(default=None, max_length=MAX_PATH_CHARS)

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if not v.strip():
            raise ValueError(f"data source must not be empty, got source={v!r}")
        if v.startswith("hf:") and len(v) <= 3:
            raise ValueError(f"hf: source needs a dataset name, got source={v!r}")
        return v

    @field_validator("source", "text_field", "cache_dir")
    @classmethod
    def _no_control_characters(cls, v: str | None, info: ValidationInfo) -> str | None:
        # a NUL byte ends a C string: the OS refuses such paths with ValueError, deep in whatever opens them
        if v is not None and any(ord(c) < 32 for c in v):
            raise ValueError(f"{info.field_name} must not contain NUL or other control characters, got {excerpt(v)}")
        return v


@dataclass(frozen=True)
class FieldProblem:
    """One refusal: `field` is a dotted path relative to where the validator sits ("" for the spot itself)."""

    field: str
    message: str
    value: Any = None


class FieldErrors(ValueError):
    """A validator's refusals, each naming its field. pydantic wraps it (the error's ctx["error"]);
    sweeps.spec.format_validation_error gives each problem its own entry; str() joins the messages."""

    def __init__(self, problems: list[FieldProblem] | FieldProblem):
        self.problems = [problems] if isinstance(problems, FieldProblem) else list(problems)
        super().__init__("; ".join(p.message for p in self.problems))


class OptimizerFields(_Config):
    """An optimizer from the registry (`worker.names.OPTIMIZERS`) and its hyper-parameters but the lr:
    what `OptimizerConfig` (one run) and a sweep's `OptimizerSpec` (the lr is searched) share."""

    name: str = "adamw"
    betas: tuple[float, float] | None = None  # None: the optimizer's own default
    weight_decay: float = Field(default=0.0, ge=0.0)  # on matrices only (worker.optim.param_groups)
    eps: float | None = Field(default=None, gt=0.0)  # None: the optimizer's own default
    extra: dict[str, Any] = Field(default_factory=dict)  # optimizer-specific keywords (e.g. sophia's rho)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v not in OPTIMIZERS:
            raise ValueError(unknown_optimizer_message(v))
        return v

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"betas must lie in [0, 1), got betas={list(v)}")
        return v

    @model_validator(mode="after")
    def _keywords(self) -> OptimizerFields:
        problems = keyword_problems(self.name, self.eps, self.extra)
        if problems:
            raise FieldErrors(problems)
        return self


class OptimizerConfig(OptimizerFields):
    """The optimizer of one run: `OptimizerFields` and the peak lr."""

    lr: Annotated[float, Positive] = 1e-3  # peak lr, reached after warm-up


def unknown_optimizer_message(name: str) -> str:
    return f"unknown optimizer {excerpt(name)}; valid optimizers: {', '.join(OPTIMIZERS)}"


def keyword_problems(name: str, eps: float | None, extra: dict[str, Any]) -> list[FieldProblem]:
    """What the constructor of the known optimizer `name` would refuse or misread: an eps where it takes
    none, and each entry of `extra` that is reserved, not one of its keywords (`OPTIMIZERS[name].extra`) or
    not a finite scalar of the keyword's kind. Checked at validation, so a typo fails the submit, not every
    trial of a sweep."""
    entry = OPTIMIZERS[name]
    problems: list[FieldProblem] = []
    if eps is not None and entry.default_eps is None:
        problems.append(FieldProblem("eps", f"optimizer {name!r} takes no eps, got eps={eps}; leave eps out", eps))
    valid = ", ".join(sorted(entry.extra)) or f"none ({name} takes no extra keywords)"
    for key, value in extra.items():
        if key in EXTRA_RESERVED:
            message = (
                f"extra[{key!r}] is not allowed for {name!r}: it comes from the optimizer config "
                f"(lr, betas, eps, weight_decay), the parameter groups or tokens_per_step (bs)"
            )
        elif key not in entry.extra:
            message = f"unknown extra keyword {excerpt(key)} for optimizer {name!r}; valid keywords: {valid}"
        elif not _is_kind(value, entry.extra[key]):
            message = f"extra[{key!r}] of {name!r} takes {_KIND_WORDS[entry.extra[key]]}, got {excerpt(value)}"
        else:
            continue
        problems.append(FieldProblem(f"extra.{key}", message, value))
    return problems


# how a message names each kind of worker.names.ExtraKind
_KIND_WORDS = {
    "bool": "a bool (true or false)",
    "optional_bool": "a bool or null",
    "int": "an int",
    "float": "a number (an int or a finite float)",
}


def _is_kind(value: Any, kind: str) -> bool:
    """Whether `value` is a scalar of `kind` (worker.names.ExtraKind); bools are not numbers here."""
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "optional_bool":
        return value is None or isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    raise ValueError(f"unknown kind {kind!r} in worker.names.OPTIMIZERS")


# fp32: float32 throughout; bf16: the forward passes under torch.autocast(bfloat16), losses in float32
PrecisionName = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)


def _precision(v: Any, info: ValidationInfo) -> Any:
    if v not in PRECISIONS:
        raise ValueError(f"{info.field_name} must be one of {', '.join(PRECISIONS)}, got {excerpt(v)}")
    return v


# a run's precision (TrainConfig and a sweep's spec): refused with a message naming the field and the value
Precision = Annotated[PrecisionName, BeforeValidator(_precision)]


def _strict_bool(v: Any, info: ValidationInfo) -> Any:
    if not isinstance(v, bool):
        raise ValueError(f"{info.field_name} must be true or false, got {excerpt(v)}")
    return v


# whether to torch.compile the model (inductor: Triton kernels on CUDA, C++ on CPU, which needs a C++
# compiler); the first step pays the compilation. A bool only: "yes" or 1 are refused, not read as true
Compile = Annotated[bool, BeforeValidator(_strict_bool)]


class ScheduleConfig(_Config):
    """The lr schedule: linear warm-up to the peak lr, then cosine decay to `min_lr_ratio` x peak. Warm-up is
    given one way: a fraction of the run's steps (`warmup_fraction`, the default), a number of tokens
    (`warmup_tokens`) or a number of steps (`warmup_steps`); worker.schedule.warmup_steps turns it into steps.
    A sweep's `ScheduleSpec` is this and the warm-ups its cells also try."""

    warmup_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)
    warmup_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    warmup_steps: int | None = Field(default=None, ge=0, le=10**9)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)  # cosine floor, as a fraction of peak lr

    @model_validator(mode="after")
    def _one_warmup(self) -> ScheduleConfig:
        # (a dumped config holds all three: None for the unused ones, and the fraction's default)
        given = [k for k in ("warmup_tokens", "warmup_steps") if getattr(self, k) is not None]
        if given and self.warmup_fraction != ScheduleConfig.model_fields["warmup_fraction"].default:
            given.insert(0, "warmup_fraction")
        if len(given) > 1:
            raise FieldErrors(
                FieldProblem(
                    given[1],
                    f"give warm-up one way: one of warmup_fraction, warmup_tokens, warmup_steps; got {', '.join(given)}",
                    {k: getattr(self, k) for k in given},
                )
            )
        return self

    @property
    def warmup_unit(self) -> Literal["fraction", "tokens", "steps"]:
        """The unit the warm-up is given in."""
        if self.warmup_tokens is not None:
            return "tokens"
        return "steps" if self.warmup_steps is not None else "fraction"

    @property
    def warmup(self) -> int | float:
        """The warm-up, in `warmup_unit`."""
        return {"fraction": self.warmup_fraction, "tokens": self.warmup_tokens, "steps": self.warmup_steps}[
            self.warmup_unit
        ]  # type: ignore[return-value]


class EvalFields(_Config):
    """When a run scores the held-out set, and how much of it: what a run's `EvalConfig` and a sweep's
    `evaluation` section share."""

    every_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)  # None: token_budget / 10
    # tokens scored per evaluation (all of val when it holds fewer), in whole windows of seq_len, rounded
    # up: the same held-out set whatever max_micro_batch and the workers are. 32,768 is all of the builtin
    # val split (~30k tokens at vocab 4096); there the difference of two trials' val losses has a standard
    # error of ~0.004 nats (7e-4 of the loss; 0.006 at 16k tokens), and gpt2-nano scores it in ~0.8 s on
    # one CPU core.
    tokens: Annotated[int, Positive] = Field(default=32_768, le=MAX_EVAL_TOKENS)


class EvalConfig(EvalFields):
    """How a run is measured and judged: `EvalFields`, the probes and the divergence rule."""

    probe_attention: bool = True  # max attention logit per layer, at evaluation only
    noise_scale_ema: float = Field(default=0.9, ge=0.0, lt=1.0)  # decay of B_simple's EMA (worker.noise_scale)
    divergence_factor: float = Field(default=3.0, gt=1.0)  # a train loss > factor x the first step's: diverged


class CheckpointConfig(_Config):
    """How often a run writes a checkpoint (model, optimizer state, data position, step) to its session:
    every `every_tokens` tokens, rounded to whole evaluations (`TrainConfig.checkpoint_every_evals`), and at
    least `min_interval_s` of training since the last one. A sweep's `checkpoints` section is this with
    a 300 s floor by default."""

    every_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)  # None: every evaluation; 0: none
    # each checkpoint stops training to write model + optimizer state (to S3, on a cluster): a time floor
    # bounds what they cost
    min_interval_s: float = Field(default=0.0, ge=0.0)


class ResourcesConfig(_Config):
    """What a run runs on: data-parallel workers, each with its GPUs and CPUs, and the micro-batch that
    bounds one forward pass. A sweep's `ResourcesSpec` is this (every trial one run) and its concurrency."""

    workers_per_trial: int = Field(default=1, ge=1, le=MAX_WORKERS)  # data-parallel workers of the run
    gpus_per_worker: float = Field(default=0.0, ge=0.0, le=MAX_GPUS_PER_WORKER)  # 0: CPU; fractions allowed (Ray)
    # CPUs asked of Ray per worker and its torch intra-op threads; None: the threads torch finds (1 CPU on Ray)
    cpus_per_worker: int | None = Field(default=None, ge=1, le=MAX_THREADS_PER_WORKER)
    # sequences per forward pass on one worker; the rest of the batch is gradient accumulation
    max_micro_batch: int = Field(default=32, ge=1, le=MAX_MICRO_BATCH)

    @property
    def use_gpu(self) -> bool:
        """Whether each worker trains on a GPU (one per worker: its local rank's)."""
        return self.gpus_per_worker > 0


class TrainConfig(_Config):
    """One training run: model x data x optimizer at one global batch size and token budget, in sections as
    a sweep spec is (the spec embeds the same section classes: `SweepSpec.train_config` passes them on)."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)

    batch_size: int = Field(default=16, gt=0, le=MAX_BATCH_SIZE)  # global batch, in sequences, across all workers
    token_budget: int = Field(default=200_000, gt=0, le=MAX_TOKENS)  # tokens, not steps
    seed: int = 0
    grad_clip: float | None = Field(default=1.0, gt=0.0)  # global gradient norm; None: no clipping
    precision: Precision = "fp32"  # bf16 autocast works on CUDA and CPU alike
    compile: Compile = False

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        split_batch(self.batch_size, self.resources.workers_per_trial, self.resources.max_micro_batch)
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
    def warmup_total_steps(self) -> int:
        """Steps of the linear warm-up (worker.schedule.warmup_steps of this run's schedule)."""
        return warmup_steps(
            self.total_steps,
            self.schedule.warmup_fraction,
            tokens=self.schedule.warmup_tokens,
            steps=self.schedule.warmup_steps,
            tokens_per_step=self.tokens_per_step,
        )

    @property
    def eval_interval_steps(self) -> int:
        every = self.evaluation.every_tokens or max(self.token_budget // 10, 1)
        return max(1, round(every / self.tokens_per_step))

    @property
    def checkpoint_every_evals(self) -> int:
        """`checkpoints.every_tokens` in evaluations between checkpoints, rounded, at least 1 (0: none)."""
        every = self.checkpoints.every_tokens
        if every is None:
            return 1
        if every == 0:
            return 0
        return max(1, round(every / (self.eval_interval_steps * self.tokens_per_step)))


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
    # the first divisor counting down: at most min(per_worker, max_micro_batch) steps, which the caps
    # above bound (counting up over every candidate took seconds for batch sizes in the millions)
    micro = next(d for d in range(min(per_worker, max_micro_batch), 0, -1) if per_worker % d == 0)
    return micro, per_worker // micro


def corpus_shortfall(
    tokens: int, *, seq_len: int, micro_batch: int, num_workers: int, val_fraction: float, what: str
) -> str | None:
    """Why a corpus of at most `tokens` tokens cannot feed a run, or None when it may.

    Training reads non-overlapping windows of seq_len + 1 tokens and needs micro_batch x num_workers of
    them in the train split (worker.data.TrainBatches); evaluation needs one window in the val split
    (the last val_fraction of the stream). `what` names the corpus in the message.
    """
    window = seq_len + 1
    val = max(1, round(tokens * val_fraction))
    train = tokens - val
    need = micro_batch * num_workers * window
    if train < need:
        return (
            f"seq_len={seq_len}: one step needs micro-batch {micro_batch} x workers {num_workers} x (seq_len + 1) = "
            f"{need:,} training tokens, and {what} holds at most {max(train, 0):,}; use a smaller seq_len, "
            f"max_micro_batch or a larger corpus"
        )
    if val < window:
        return (
            f"seq_len={seq_len}: evaluation needs seq_len + 1 = {window:,} validation tokens, and {what} holds at most "
            f"{val:,} (val_fraction={val_fraction}); use a smaller seq_len, a larger val_fraction or corpus"
        )
    return None


def builtin_corpus_tokens(vocab_size: int) -> int:
    """Tokens of the builtin corpus at `vocab_size` (worker.names.BUILTIN_CORPUS_TOKENS; more merges, fewer
    tokens, so the count at the next tabulated vocab size is a lower bound)."""
    for up_to, tokens in BUILTIN_CORPUS_TOKENS:
        if vocab_size <= up_to:
            return tokens
    return BUILTIN_CORPUS_TOKENS[-1][1]
