"""Optimizer registry: every optimizer a sweep can name, built the same way from an `OptimizerConfig`.

`OPTIMIZERS` is keyed exactly by `worker.names.OPTIMIZER_NAMES` (the service validates names against
that tuple without importing torch; a test keeps the two in step).

    adamw   torch.optim.AdamW, foreach=True unless `extra` asks for fused=True
    lamb    pytorch_optimizer.Lamb (layer-wise trust ratio ||w|| / ||adam step||, ||w|| clamped at 10)
    lion    pytorch_optimizer.Lion (sign of an interpolated momentum; takes no eps)
    merit   MERIT (ours, worker.optim._merit): element-wise max-norm trust ratios
    sophia  SophiaG (ours, worker.optim._sophia): clipped Newton step with a Hessian-diagonal estimate
            refreshed by `update_hessian()` every `hessian_interval` steps (the training loop's job: a
            backward pass over the global batch on labels from `sampled_labels`)

Weight decay is set per parameter group by `build_optimizer` (matrices only), never by the factories.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytorch_optimizer
import torch

from worker.config import OptimizerConfig, eps_message, extra_problems
from worker.names import EXTRA_RESERVED, OPTIMIZER_NAMES
from worker.optim._merit import MERIT
from worker.optim._sophia import SophiaG, sampled_labels

logger = logging.getLogger(__name__)

__all__ = ["MERIT", "OPTIMIZERS", "OptimizerEntry", "SophiaG", "build_optimizer", "param_groups", "sampled_labels"]

# factory(param_groups, lr, **keywords) -> optimizer
OptimizerFactory = Callable[..., torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerEntry:
    """How to build one optimizer and what the training loop must do for it."""

    name: str
    factory: OptimizerFactory
    default_betas: tuple[float, float]
    default_eps: float | None  # None: the optimizer takes no eps (a configured eps is an error)
    needs_hessian: bool = False  # the loop calls optimizer.update_hessian() after a sampled-label backward
    hessian_interval: int = 0  # steps between Hessian refreshes; 0 when needs_hessian is False


def _build_adamw(param_groups: list[dict[str, Any]], lr: float, **kw: Any) -> torch.optim.Optimizer:
    # foreach and fused are mutually exclusive in torch; fused=True in `extra` wins.
    if not kw.get("fused"):
        kw.setdefault("foreach", True)
    return torch.optim.AdamW(param_groups, lr=lr, **kw)


def _build_lamb(param_groups: list[dict[str, Any]], lr: float, **kw: Any) -> torch.optim.Optimizer:
    # Library defaults kept: no bias correction, decoupled decay, ||w|| clamped at 10 in the trust ratio.
    # Its max_grad_norm=1.0 only acts with pre_norm=True (off by default), so Lamb does NOT clip the
    # gradient itself; the training loop's grad_clip is the only clipping, as for every optimizer here.
    return pytorch_optimizer.Lamb(param_groups, lr=lr, **kw)


def _build_lion(param_groups: list[dict[str, Any]], lr: float, **kw: Any) -> torch.optim.Optimizer:
    return pytorch_optimizer.Lion(param_groups, lr=lr, **kw)


def _build_merit(param_groups: list[dict[str, Any]], lr: float, **kw: Any) -> torch.optim.Optimizer:
    return MERIT(param_groups, lr=lr, **kw)


def _build_sophia(param_groups: list[dict[str, Any]], lr: float, **kw: Any) -> torch.optim.Optimizer:
    return SophiaG(param_groups, lr=lr, **kw)


OPTIMIZERS: dict[str, OptimizerEntry] = {
    "adamw": OptimizerEntry("adamw", _build_adamw, default_betas=(0.9, 0.999), default_eps=1e-8),
    "lamb": OptimizerEntry("lamb", _build_lamb, default_betas=(0.9, 0.999), default_eps=1e-6),
    "lion": OptimizerEntry("lion", _build_lion, default_betas=(0.9, 0.99), default_eps=None),
    "merit": OptimizerEntry("merit", _build_merit, default_betas=(0.9, 0.999), default_eps=1e-6),
    "sophia": OptimizerEntry(
        "sophia", _build_sophia, default_betas=(0.965, 0.99), default_eps=None, needs_hessian=True, hessian_interval=10
    ),
}
assert tuple(OPTIMIZERS) == OPTIMIZER_NAMES, "worker.names.OPTIMIZER_NAMES and OPTIMIZERS disagree"

# The class behind each factory, whose named constructor keywords `extra` may set.
_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "lamb": pytorch_optimizer.Lamb,
    "lion": pytorch_optimizer.Lion,
    "merit": MERIT,
    "sophia": SophiaG,
}


def _extra_keywords(name: str) -> frozenset[str]:
    """Named constructor keywords of the class behind `name`, less those `extra` may never set: what
    worker.names.OPTIMIZER_EXTRA (the torch-free table `extra` is validated against) must list (a test)."""
    sig = inspect.signature(_CLASSES[name].__init__)
    named = {
        k
        for k, prm in sig.parameters.items()
        if k != "self" and prm.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return frozenset(named - EXTRA_RESERVED)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decay on trainable tensors with dim >= 2 (matrices, embeddings), none on the rest
    (biases, LayerNorm). `named_parameters()` yields a tied tensor (GPT-2's wte / lm_head) once."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    seen: set[int] = set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # An empty group is dropped (e.g. a bias-free model); some optimizers reject empty groups.
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    return groups


def build_optimizer(cfg: OptimizerConfig, model: torch.nn.Module, *, tokens_per_step: int) -> torch.optim.Optimizer:
    """The optimizer `cfg` names, over `model`'s trainable parameters in two weight-decay groups.

    lr is the peak lr (the training loop overwrites group["lr"] every step); betas and eps default to
    the registry entry's; `cfg.extra` adds optimizer-specific keywords (e.g. sophia's rho, adamw's
    fused); sophia's `bs` is `tokens_per_step`.
    """
    entry = OPTIMIZERS.get(cfg.name)
    if entry is None:
        raise ValueError(f"unknown optimizer {cfg.name!r}; valid optimizers: {', '.join(OPTIMIZERS)}")

    kw: dict[str, Any] = {"betas": tuple(cfg.betas) if cfg.betas is not None else entry.default_betas}
    if entry.default_eps is not None:
        kw["eps"] = cfg.eps if cfg.eps is not None else entry.default_eps
    elif cfg.eps is not None:
        raise ValueError(eps_message(cfg.name, cfg.eps))
    if entry.needs_hessian:
        if tokens_per_step <= 0:
            raise ValueError(f"tokens_per_step must be > 0, got tokens_per_step={tokens_per_step}")
        kw["bs"] = tokens_per_step

    # OptimizerConfig checks `extra` on entry; this catches a config made with model_construct
    problems = extra_problems(cfg.name, cfg.extra)
    if problems:
        raise ValueError(problems[0][1])
    kw.update(cfg.extra)

    groups = param_groups(model, cfg.weight_decay)
    optimizer = entry.factory(groups, cfg.lr, **kw)
    logger.debug(
        "built %s: lr=%g, (weight_decay, tensors) per group %s, keywords=%s",
        cfg.name,
        cfg.lr,
        [(g["weight_decay"], len(g["params"])) for g in groups],
        kw,
    )
    return optimizer
