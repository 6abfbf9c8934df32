"""Names and tables that callers validate against without importing torch (the service must not import
torch): the GPT-2 presets, the optimizer registry, the builtin corpus's token counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

# GPT-2 shapes by name. gpt2-nano/micro are CPU test sizes; the rest are the GPT-2 paper's models.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "gpt2-nano": {"n_layer": 2, "n_head": 2, "n_embd": 64},
    "gpt2-micro": {"n_layer": 4, "n_head": 4, "n_embd": 128},
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768},  # 124M
    "gpt2-medium": {"n_layer": 24, "n_head": 16, "n_embd": 1024},  # 355M
    "gpt2-large": {"n_layer": 36, "n_head": 20, "n_embd": 1280},  # 774M
}

# ---- optimizers -----------------------------------------------------------------------------------
# The registry: every optimizer a sweep can name, in one table. Torch-free, so the service validates
# specs against it; worker.optim imports each `cls` and builds the optimizer from an OptimizerConfig.

# The kinds of scalar an `extra` keyword takes: "bool", "optional_bool" (a bool or null), "int", "float" (an
# int or a finite float). worker.config checks values against them.
ExtraKind = Literal["bool", "optional_bool", "int", "float"]


def _extra(**keywords_by_kind: str) -> dict[str, ExtraKind]:
    """{keyword: kind} from kind="keyword keyword ...", e.g. _extra(bool="amsgrad maximize", float="rho")."""
    unknown = set(keywords_by_kind) - set(get_args(ExtraKind))
    if unknown:
        raise ValueError(f"unknown keyword kinds {sorted(unknown)}; valid kinds: {', '.join(get_args(ExtraKind))}")
    return {key: cast(ExtraKind, kind) for kind, keys in keywords_by_kind.items() for key in keys.split()}


@dataclass(frozen=True)
class KeywordDefault:
    """A constructor keyword build_optimizer passes unless `extra` sets it, or sets `unless` to true, or
    sets any keyword of `unless_chosen` at all; with `device`, only for parameters on that device type."""

    value: Any
    unless: str | None = None
    unless_chosen: tuple[str, ...] = ()
    device: str | None = None  # "cuda", "cpu": a torch.device's type


@dataclass(frozen=True)
class OptimizerEntry:
    """How to build one optimizer and what the training loop must do for it."""

    name: str
    cls: str  # "module:Class", imported by worker.optim (so this table needs no torch)
    default_betas: tuple[float, float]
    default_eps: float | None  # None: the class takes no eps (a configured eps is refused)
    # keywords `extra` may set, with their kinds: the class's named constructor keywords less EXTRA_RESERVED
    # (tests/worker/test_optim.py checks the names against `inspect.signature` and each kind against the
    # real default); the pytorch-optimizer classes swallow unknown keywords silently, so this list is the check
    extra: Mapping[str, ExtraKind] = field(default_factory=dict)
    build_defaults: Mapping[str, KeywordDefault] = field(default_factory=dict)
    needs_hessian: bool = False  # the loop calls optimizer.update_hessian() after a sampled-label backward,
    hessian_interval: int = 0  # every this many steps (0 when needs_hessian is False); `bs` = tokens per step
    # tensors of each parameter's shape the optimizer keeps (its memory: worker.memory); tests/worker/test_memory.py
    # counts them on the real classes
    state_tensors: int = 2


OPTIMIZERS: dict[str, OptimizerEntry] = {
    e.name: e
    for e in (
        OptimizerEntry(
            "adamw",
            "torch.optim:AdamW",
            default_betas=(0.9, 0.999),
            default_eps=1e-8,
            extra=_extra(bool="amsgrad maximize capturable differentiable", optional_bool="foreach fused"),
            # On CUDA torch's fused kernel (one pass over each tensor instead of a dozen foreach launches)
            # unless `extra` chooses an implementation; else foreach. torch refuses foreach=True with
            # fused=True: fused=True in `extra` wins. (Order matters: fused is decided first.)
            build_defaults={
                "fused": KeywordDefault(True, unless_chosen=("fused", "foreach"), device="cuda"),
                "foreach": KeywordDefault(True, unless="fused"),
            },
        ),
        # Library defaults kept: no bias correction, decoupled decay, ||w|| clamped at 10 in the trust ratio
        # ||w|| / ||adam step||. Its max_grad_norm=1.0 only acts with pre_norm=True (off by default), so Lamb
        # does NOT clip the gradient itself; the training loop's grad_clip is the only clipping, as for all.
        OptimizerEntry(
            "lamb",
            "pytorch_optimizer:Lamb",
            default_betas=(0.9, 0.999),
            default_eps=1e-6,
            extra=_extra(
                bool="weight_decouple fixed_decay rectify degenerated_to_sgd grad_averaging adam pre_norm maximize",
                optional_bool="foreach",
                int="n_sma_threshold",
                float="max_grad_norm",
            ),
        ),
        # the sign of an interpolated momentum
        OptimizerEntry(
            "lion",
            "pytorch_optimizer:Lion",
            default_betas=(0.9, 0.99),
            default_eps=None,
            extra=_extra(bool="weight_decouple fixed_decay maximize", optional_bool="foreach"),
            state_tensors=1,  # the momentum only
        ),
        # ours: element-wise max-norm trust ratios
        OptimizerEntry("merit", "worker.optim._merit:MERIT", default_betas=(0.9, 0.999), default_eps=1e-6),
        # ours: a clipped Newton step with a Hessian-diagonal estimate that `update_hessian()` refreshes
        OptimizerEntry(
            "sophia",
            "worker.optim._sophia:SophiaG",
            default_betas=(0.965, 0.99),
            default_eps=None,
            extra=_extra(float="rho"),
            needs_hessian=True,
            hessian_interval=10,
        ),
    )
}
OPTIMIZER_NAMES: tuple[str, ...] = tuple(OPTIMIZERS)

# Constructor keywords that come from OptimizerConfig fields (lr, betas, eps, weight_decay), from the
# parameter groups (params) or from tokens_per_step (sophia's bs): never from `extra`.
EXTRA_RESERVED: frozenset[str] = frozenset({"params", "lr", "betas", "eps", "weight_decay", "bs"})

# Tokens of the builtin corpus (worker/data.py), measured on CPython 3.11.7: (vocab_size up to, tokens
# train + val). More merges make fewer tokens; past ~17.7k the BPE runs out of merges (vocab 65535 gives
# a real vocabulary of 17,679), so the last count holds for every larger vocab_size. Validation compares
# sequence lengths against these counts without tokenising anything.
BUILTIN_CORPUS_TOKENS: tuple[tuple[int, int], ...] = ((257, 2_155_480), (4096, 601_474), (65535, 513_784))
