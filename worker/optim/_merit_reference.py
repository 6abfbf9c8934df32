"""The MERIT authors' update (ICML 2025, arXiv 2508.20577, their public code), per parameter, transcribed.

This is the authors' per-parameter algorithm, loop and all, kept only as the reference that the vectorised
`worker.optim.MERIT` is tested (tests/worker/test_optim.py: the same parameters and gradients must give the
same weights, rtol 1e-5 / atol 1e-7) and benchmarked (benchmarks/optimizer_step.py: a "MERIT (authors)" row,
and the same check before timing) against. It is not in the optimizer registry and training never uses it;
keep it a transcription (their names, their order of operations), so a change to ours that departs from
theirs fails a test rather than redefining the reference.

Per parameter p with gradient g (Adam moments without bias correction, eps added to the root):
    u = m / (sqrt(v) + eps) + weight_decay * p
    matrices (dim >= 2): an element-wise trust ratio, the larger of its row's and its column's
        max|p| / max|u| (max-norms over dims 1 and 0), at least the tensor's max|p| / max|u|, and 1 where any
        of those row/column max-norms is 0
    vectors: one ratio, max|p| / max|u| (1 if either is 0)
    p -= lr * clip(u * ratio, -1, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class AuthorsMERIT(torch.optim.Optimizer):
    """The authors' MERIT.step, per parameter (their public code, transcribed): the reference, not for training."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                adam_step = exp_avg / exp_avg_sq.sqrt().add(group["eps"])
                if group["weight_decay"] != 0:
                    adam_step.add_(p, alpha=group["weight_decay"])
                if grad.dim() >= 2:
                    weight_abs = p.abs()
                    adam_abs = adam_step.abs()
                    weight_ratio = weight_abs.max() / adam_abs.max()
                    row_weight_norm = weight_abs.amax(dim=1, keepdim=True).expand_as(grad)
                    col_weight_norm = weight_abs.amax(dim=0, keepdim=True).expand_as(grad)
                    row_adam_norm = adam_abs.amax(dim=1, keepdim=True).expand_as(grad)
                    col_adam_norm = adam_abs.amax(dim=0, keepdim=True).expand_as(grad)
                    row_trust_ratio = row_weight_norm / row_adam_norm
                    col_trust_ratio = col_weight_norm / col_adam_norm
                    idx = (row_weight_norm == 0) | (row_adam_norm == 0) | (col_weight_norm == 0) | (col_adam_norm == 0)
                    trust_ratio = torch.max(col_trust_ratio, row_trust_ratio)
                    trust_ratio = trust_ratio.clamp(min=weight_ratio)
                    trust_ratio[idx] = 1
                    adam_step.mul_(trust_ratio)
                    adam_step = adam_step.sign() * adam_step.abs().clamp(None, 1)
                    p.add_(adam_step, alpha=-group["lr"])
                else:
                    weight_max = p.abs().max()
                    adam_max = adam_step.abs().max()
                    trust = 1 if (weight_max == 0 or adam_max == 0) else weight_max / adam_max
                    adam_step.mul_(trust)
                    adam_step = adam_step.sign() * adam_step.abs().clamp(None, 1)
                    p.add_(adam_step, alpha=-group["lr"])
