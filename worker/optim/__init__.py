"""Optimizers: every optimizer a sweep can name, built the same way from an `OptimizerConfig`.

The registry is the torch-free table `worker.names.OPTIMIZERS` (the service validates specs against it);
each entry names its class as "module:Class", imported here:

    adamw   torch.optim.AdamW: fused=True on CUDA, else foreach=True, unless `extra` chooses
    lamb    pytorch_optimizer.Lamb (layer-wise trust ratio ||w|| / ||adam step||, ||w|| clamped at 10)
    lion    pytorch_optimizer.Lion (sign of an interpolated momentum; takes no eps)
    merit   MERIT (ours, worker.optim._merit): element-wise max-norm trust ratios
    sophia  SophiaG (ours, worker.optim._sophia): clipped Newton step with a Hessian-diagonal estimate
            refreshed by `update_hessian()` every `hessian_interval` steps (the training loop's job: a
            backward pass over the global batch on labels from `sampled_labels`)

Weight decay is set per parameter group by `build_optimizer` (matrices only), never by `extra`.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import torch

from worker.config import FieldErrors, OptimizerConfig, keyword_problems, unknown_optimizer_message
from worker.names import OPTIMIZERS
from worker.optim._merit import MERIT
from worker.optim._sophia import SophiaG, sampled_labels

logger = logging.getLogger(__name__)

__all__ = [
    "MERIT",
    "OPTIMIZERS",
    "SophiaG",
    "build_optimizer",
    "optimizer_class",
    "optimizer_keywords",
    "param_groups",
    "sampled_labels",
]


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The class of registry entry `name` (its `cls`, "module:Class")."""
    entry = OPTIMIZERS.get(name)
    if entry is None:
        raise ValueError(unknown_optimizer_message(name))
    module, _, attr = entry.cls.partition(":")
    return getattr(importlib.import_module(module), attr)


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


def optimizer_keywords(cfg: OptimizerConfig, *, device_type: str, tokens_per_step: int) -> dict[str, Any]:
    """The constructor keywords (beyond params and lr) `cfg` builds its optimizer with, for parameters on
    a `device_type` device: betas and eps from `cfg` or the registry entry's defaults, sophia's `bs` =
    `tokens_per_step`, `cfg.extra`, then the entry's `build_defaults` that apply and `extra` leaves unset."""
    entry = OPTIMIZERS.get(cfg.name)
    if entry is None:
        raise ValueError(unknown_optimizer_message(cfg.name))
    # OptimizerConfig checks these on entry; this catches a config made with model_construct
    problems = keyword_problems(cfg.name, cfg.eps, cfg.extra)
    if problems:
        raise FieldErrors(problems)

    kw: dict[str, Any] = {"betas": tuple(cfg.betas) if cfg.betas is not None else entry.default_betas}
    if entry.default_eps is not None:
        kw["eps"] = cfg.eps if cfg.eps is not None else entry.default_eps
    if entry.needs_hessian:
        if tokens_per_step <= 0:
            raise ValueError(f"tokens_per_step must be > 0, got tokens_per_step={tokens_per_step}")
        kw["bs"] = tokens_per_step
    kw.update(cfg.extra)
    for key, default in entry.build_defaults.items():
        if key in kw or (default.device is not None and default.device != device_type):
            continue
        if default.unless is not None and kw.get(default.unless):
            continue
        if any(chosen in cfg.extra for chosen in default.unless_chosen):
            continue
        kw[key] = default.value
    return kw


def build_optimizer(cfg: OptimizerConfig, model: torch.nn.Module, *, tokens_per_step: int) -> torch.optim.Optimizer:
    """The optimizer `cfg` names, over `model`'s trainable parameters in two weight-decay groups, with the
    keywords of `optimizer_keywords` for the device the model is on.

    lr is the peak lr (the training loop overwrites group["lr"] every step).
    """
    cls = optimizer_class(cfg.name)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    kw = optimizer_keywords(cfg, device_type=device.type, tokens_per_step=tokens_per_step)

    groups = param_groups(model, cfg.weight_decay)
    optimizer = cls(groups, lr=cfg.lr, **kw)
    logger.debug(
        "built %s: lr=%g, (weight_decay, tensors) per group %s, keywords=%s",
        cfg.name,
        cfg.lr,
        [(g["weight_decay"], len(g["params"])) for g in groups],
        kw,
    )
    return optimizer
