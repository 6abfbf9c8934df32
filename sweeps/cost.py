"""What a sweep costs before it runs: trials, tokens, model FLOPs and GPU-hours.

`price(spec, PriceConfig(gpu="H100", mfu=0.4))` is what `POST /sweeps?dry_run=true` answers under
`cost`, and what `sweeps submit --dry-run` and `sweeps price` print. Every count comes from the spec's
own rules (`sweeps.spec.total_trials`, `SweepSpec.trained_tokens`, each cell's `TrainConfig`), the
FLOPs and the peaks from `worker.hardware` (the table the training loop's MFU uses too):

    training FLOPs   = trials x trained tokens per trial x (6 N + 12 L T d)
    evaluation FLOPs = evaluations x scored tokens per evaluation x (2 N + 4 L T d)
    GPU-hours        = (training + evaluation FLOPs) / (mfu x peak FLOP/s) / 3600

N: the model's parameters without the position embeddings (worker/hardware.py says why), at the
spec's `data.vocab_size`; L, T, d: layers, `seq_len`, width. Each figure is a range, `min` to `max`:
`max` with every cell at its most confirmation runs, `min` at its fewest (they differ only with
adaptive seeds), and both with every trial trained to its whole budget. A search of the batch axis
(`batch_sizes: {min, max, ...}`) tests from `SweepSpec.sizes_per_optimizer`'s fewest to its most
sizes per optimizer: `min` counts the fewest at the fewest runs, `max` the most at the most. That is an upper bound where
pruning is on: ASHA stops poor search trials early (confirmation runs never), so the search's share,
`prunable_training_tokens`, can cost less. Not counted: the attention probe's few sequences per
evaluation, Sophia's Hessian pass, data preparation (BPE training, tokenising) and idle GPUs.

Torch-free: the HTTP service imports it.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from sweeps.spec import SweepSpec, cell_search_trials, total_trials
from worker.config import TrainConfig
from worker.hardware import (
    DEFAULT_GPU,
    UnknownAccelerator,
    accelerator,
    forward_flops_per_token,
    training_flops_per_token,
)

__all__ = [
    "DEFAULT_MFU",
    "MAX_PEAK_TFLOPS",
    "MIN_MFU",
    "MIN_PEAK_TFLOPS",
    "FloatRange",
    "IntRange",
    "PriceConfig",
    "SweepCost",
    "evaluations_per_trial",
    "price",
]

DEFAULT_MFU = 0.4  # the project's target for GPT-2 small at bf16 on one GPU; DDP over many often gets less
MAX_PEAK_TFLOPS = 100_000.0  # per GPU: 100 PFLOP/s, far past any accelerator sold (a typo guard)
# below these the GPU-hours are no price but an overflow (mfu=5e-324 priced to infinity, sent as null)
MIN_PEAK_TFLOPS = 0.001  # 1 GFLOP/s
MIN_MFU = 0.001
MAX_GPU_NAME = 64  # characters of a GPU name


class PriceConfig(BaseModel):
    """The GPU a sweep is priced on: a name of worker.hardware's table (any other name needs
    peak_tflops), the MFU to assume, and optionally the GPU's dense bf16 peak in TFLOP/s (overrides
    the table's)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, validate_default=True)

    # peak_tflops before gpu: gpu's check reads it (a GPU the table does not hold is fine with a peak)
    mfu: float = DEFAULT_MFU
    peak_tflops: float | None = None
    gpu: str = Field(default=DEFAULT_GPU, max_length=MAX_GPU_NAME)

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: str, info: ValidationInfo) -> str:
        if any(not c.isprintable() for c in v) or not v.strip():
            raise ValueError(f"gpu must be a printable name, got gpu={v!r}")
        try:
            return accelerator(v).name  # the canonical name
        except UnknownAccelerator as exc:
            if info.data.get("peak_tflops") is not None:
                return v.strip()  # a label for the given peak
            raise ValueError(str(exc)) from None

    @field_validator("mfu")
    @classmethod
    def _mfu(cls, v: float) -> float:
        if not MIN_MFU <= v <= 1.0:
            raise ValueError(f"mfu must be in [{MIN_MFU:g}, 1] (a fraction of the GPU's peak), got mfu={v}")
        return v

    @field_validator("peak_tflops")
    @classmethod
    def _peak(cls, v: float | None) -> float | None:
        if v is not None and not MIN_PEAK_TFLOPS <= v <= MAX_PEAK_TFLOPS:
            raise ValueError(
                f"peak_tflops must be in [{MIN_PEAK_TFLOPS:g}, {MAX_PEAK_TFLOPS:g}] TFLOP/s per GPU, got peak_tflops={v}"
            )
        return v

    @property
    def peak_flops(self) -> float:
        """FLOP/s of one GPU at 100 % utilisation (dense bf16)."""
        return self.peak_tflops * 1e12 if self.peak_tflops is not None else accelerator(self.gpu).peak_flops


class FloatRange(BaseModel):
    """`min` at the fewest confirmation runs per cell, `max` at the most; equal without adaptive seeds."""

    model_config = ConfigDict(frozen=True)

    min: float
    max: float


class IntRange(BaseModel):
    """FloatRange for counts."""

    model_config = ConfigDict(frozen=True)

    min: int
    max: int


class SweepCost(BaseModel):
    """A sweep's price (module docstring: the formulas, and what is and is not counted)."""

    model_config = ConfigDict(frozen=True)

    trials: IntRange = Field(
        description="cells x (lr.trials_per_batch_size + schedule.warmup_search + seeds); a search of the batch "
        "axis: from its fewest "
        "cells at the fewest seeds to its most (the spec's total_trials)"
    )
    search_trials: int = Field(
        description="of the most, search trials: the lr search's (the ones pruning may stop early) and the other "
        "warm-ups' runs"
    )
    trained_tokens: int = Field(
        description="tokens every trial trains on: token_budget rounded down once (the spec's trained_tokens)"
    )
    tokens_per_trial: int = Field(description="the same as trained_tokens, under its first name (kept for readers)")
    training_tokens: IntRange = Field(description="trials x trained_tokens: every trial to its whole budget")
    prunable_training_tokens: int = Field(
        description="the search trials' share of training_tokens: what ASHA pruning can cut, when it is on"
    )
    pruning: bool = Field(description="pruning is on: the training figures are upper bounds")
    evaluations: IntRange = Field(
        description="evaluations of all trials (each every evaluation.every_tokens, and at the end)"
    )
    tokens_per_evaluation: int = Field(
        description="scored held-out tokens per evaluation: evaluation.tokens in whole seq_len windows "
        "(at most: a smaller validation split is scored whole)"
    )
    evaluation_tokens: IntRange
    parameters: int = Field(description="the model's parameters at data.vocab_size (GPT2LMHeadModel.num_parameters())")
    flop_parameters: int = Field(description="N of 6N: the parameters without the position embeddings")
    training_flops_per_token: int = Field(description="6 N + 12 L T d (PaLM appendix B)")
    evaluation_flops_per_token: int = Field(description="2 N + 4 L T d (forward only)")
    training_flops: IntRange
    evaluation_flops: IntRange
    total_flops: IntRange
    gpu: str = Field(description="the GPU priced on (worker/hardware.py's table)")
    peak_flops: float = Field(description="its peak dense bf16 FLOP/s (peak_tflops when given, else the table's)")
    peak_from: str = Field(description='"table" or "peak_tflops"')
    mfu: float = Field(description="the model FLOPs utilisation assumed")
    gpu_hours: FloatRange = Field(description="total_flops / (mfu x peak_flops) / 3600")
    notes: list[str] = Field(default_factory=list, description="what the figures assume, for people")


def evaluations_per_trial(cfg: TrainConfig) -> int:
    """Evaluations a trial runs when trained to its end: after every `eval_interval_steps`-th step and
    after the last (the training loop's rule in worker/loop.py; tests/sweeps/test_cost.py runs the loop
    to check it)."""
    steps, every = cfg.total_steps, cfg.eval_interval_steps
    return steps // every + (1 if steps % every else 0)


def price(spec: SweepSpec, config: PriceConfig | None = None) -> SweepCost:
    """The price of `spec` on `config`'s GPU (default: PriceConfig(), an H100 at MFU 0.4)."""
    cfg = config or PriceConfig()
    n_opt, search = len(spec.optimizers), spec.search_trials
    fewest, most = spec.sizes_per_optimizer  # batch sizes per optimizer: the list's, or a search's bounds
    seeds = {"min": spec.seeds_min, "max": spec.seeds_max}
    trials = {"min": total_trials(n_opt, fewest, search, spec.seeds_min), "max": spec.total_trials}
    search_trials = total_trials(n_opt, most, search, 0)
    per_trial = spec.trained_tokens

    # evaluations: per batch size (its steps and eval interval), times that column's trials
    opt = spec.optimizers[0].name  # evaluations do not depend on the optimizer
    evals_at = {b: evaluations_per_trial(spec.train_config(opt, b, spec.lr.min, seed=0)) for b in spec.lattice}
    if spec.batch_search is None:
        reference = spec.reference_batch_size  # its cells may search REFERENCE_EXTRA_TRIALS more (cell_search_trials)
        evaluations = {
            k: sum(
                evals_at[b] * n_opt * (cell_search_trials(search, reference=b == reference) + s) for b in spec.lattice
            )
            for k, s in seeds.items()
        }
    else:  # which sizes a search tests is not known: the fewest evaluations of any, and the most
        evaluations = {
            "min": min(evals_at.values()) * trials["min"],
            "max": max(evals_at.values()) * trials["max"],
        }
    seq_len = spec.model.seq_len
    per_eval = math.ceil(spec.evaluation.tokens / seq_len) * seq_len  # worker.data.val_windows: whole windows

    shape = spec.model.shape()
    n_params = spec.model.parameters(spec.data.vocab_size)
    n_flop = n_params - seq_len * shape["n_embd"]  # the position embeddings are a lookup, not a matmul
    dims = {"flop_parameters": n_flop, "n_layer": shape["n_layer"], "n_embd": shape["n_embd"], "seq_len": seq_len}
    train_fpt, eval_fpt = training_flops_per_token(**dims), forward_flops_per_token(**dims)

    training_tokens = {k: t * per_trial for k, t in trials.items()}
    evaluation_tokens = {k: e * per_eval for k, e in evaluations.items()}
    training_flops = {k: t * train_fpt for k, t in training_tokens.items()}
    evaluation_flops = {k: t * eval_fpt for k, t in evaluation_tokens.items()}
    total = {k: training_flops[k] + evaluation_flops[k] for k in seeds}
    speed = cfg.mfu * cfg.peak_flops  # FLOP/s one GPU delivers
    hours = {k: total[k] / speed / 3600 for k in seeds}

    return SweepCost(
        trials=IntRange(**trials),
        search_trials=search_trials,
        trained_tokens=per_trial,
        tokens_per_trial=per_trial,
        training_tokens=IntRange(**training_tokens),
        # the warm-up runs at the best lr are the search's design, trained to the end like its steps
        prunable_training_tokens=total_trials(n_opt, most, spec.lr.trials_per_batch_size, 0) * per_trial,
        pruning=spec.pruning.enabled,
        evaluations=IntRange(**evaluations),
        tokens_per_evaluation=per_eval,
        evaluation_tokens=IntRange(**evaluation_tokens),
        parameters=n_params,
        flop_parameters=n_flop,
        training_flops_per_token=train_fpt,
        evaluation_flops_per_token=eval_fpt,
        training_flops=IntRange(**training_flops),
        evaluation_flops=IntRange(**evaluation_flops),
        total_flops=IntRange(**total),
        gpu=cfg.gpu,
        peak_flops=cfg.peak_flops,
        peak_from="peak_tflops" if cfg.peak_tflops is not None else "table",
        mfu=cfg.mfu,
        gpu_hours=FloatRange(**hours),
        notes=_notes(spec, cfg),
    )


def _search_notes(spec: SweepSpec) -> list[str]:
    if (search := spec.batch_search) is None:
        return []
    fewest, most = spec.sizes_per_optimizer
    return [
        f"a search of the batch axis: each optimizer tests {fewest} to {most} of the {len(spec.lattice)} lattice sizes "
        f"{spec.lattice[0]}..{spec.lattice[-1]} (resolution {search.resolution:g}, step x{search.step:g}); min: the "
        f"fewest sizes at the fewest confirmation runs, max: the most sizes any outcome that is monotone in batch "
        f"size can need (the search's cap) at the most runs"
    ]


def _notes(spec: SweepSpec, cfg: PriceConfig) -> list[str]:
    notes = _search_notes(spec) + [
        f"GPU-hours at MFU {cfg.mfu:g} of one {cfg.gpu}'s dense bf16 peak ({cfg.peak_flops / 1e12:g} TFLOP/s"
        f"{', given' if cfg.peak_tflops is not None else ''}); model FLOPs only, no idle or restarted GPUs"
    ]
    if spec.pruning.enabled:
        notes.append(
            "upper bound: every trial trained to its whole budget; ASHA pruning stops poor search trials "
            "early, so the search's share (prunable_training_tokens) can cost less; confirmation runs are never pruned"
        )
    if spec.seeds_min != spec.seeds_max:
        notes.append(
            f"adaptive seeds: min = {spec.seeds_min} confirmation runs per cell, max = {spec.seeds_max} at every cell "
            f"(only boundary cells within noise get more)"
        )
    # `precision` is a spec field another part of issue 13 adds; until then there is nothing to say
    if getattr(spec, "precision", "bf16") != "bf16":
        notes.append(f"the peaks are bf16; this spec trains at precision={spec.precision}, slower than priced")
    if spec.resources.gpus_per_worker == 0:
        notes.append("resources.gpus_per_worker is 0: this spec trains on CPUs, the GPU price is hypothetical")
    if "sophia" in spec.optimizer_names:
        notes.append("sophia's Hessian pass (sampled labels, every few steps) is not counted")
    return notes
