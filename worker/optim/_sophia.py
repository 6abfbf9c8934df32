"""Sophia-G (Liu et al. 2023, "Sophia: A Scalable Stochastic Second-order Optimizer").

Follows the authors' reference `SophiaG` element for element:

    update_hessian():  h = b2*h + (1-b2)*g*g          (every k steps, on a special backward pass)
    step():            w *= 1 - lr*wd
                       m = b1*m + (1-b1)*g
                       w -= lr * sign(m) * min(|m| / (rho * bs * h + 1e-15), 1)

`h` is the Gauss-Newton-Bartlett estimate of the Hessian diagonal only if the gradient seen by
`update_hessian()` comes from a backward pass on labels *sampled from the model's own logits* (not the
data's labels, `sampled_labels`), with the loss averaged over the same bs tokens a step trains on: the
training loop runs that pass over every micro-batch of the global batch, as the authors' train_sophiag.py
does. `bs` is the number of tokens per step (batch_size * seq_len): for a loss averaged over bs tokens
the GNB estimate is bs * g*g, hence `rho * bs * h` in the denominator (a pass over fewer tokens than bs
would make h too large by bs / its tokens). Before the first `update_hessian()` h is zero, so the ratio
clips at 1 and the step is lr * sign(m), as in the reference.

Vectorised: grouped `_foreach` ops, except the clipped step on CPU, which goes tensor by tensor through
one reused buffer (see `__init__`); both give the same numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

logger = logging.getLogger(__name__)


def sampled_labels(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Labels drawn from softmax(logits), one per position, by inverting the CDF at `uniforms`.

    logits (B, T, V), uniforms (B, T) in [0, 1) -> labels (B, T) int64. The distribution of the authors'
    `torch.distributions.Categorical(logits=logits).sample()`, but the randomness is an argument: a
    position's label depends on its own logits and uniform only, so the labels of a batch do not depend on
    how it is split into micro-batches or over workers (the caller draws the uniforms from a seeded
    generator, worker/seeds.py).
    """
    cdf = logits.detach().float().softmax(dim=-1).cumsum_(dim=-1)  # (B, T, V), rises to ~1
    # scaled by the float total (cdf[..., -1], ~1 up to rounding), so every uniform lands inside; right=True:
    # the first label whose cumulative mass exceeds the point, never one of zero probability
    points = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[..., -1:]  # (B, T, 1)
    return torch.searchsorted(cdf, points, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)


class SophiaG(torch.optim.Optimizer):
    """Sophia-G; state per parameter: "step" (int), "exp_avg", "hessian" (shape of the parameter).

    Args:
        params: parameters or parameter groups.
        lr: learning rate (the per-element step is at most lr, plus decoupled weight decay).
        betas: (b1, b2): decay of the gradient average and of the Hessian-diagonal average.
        rho: clipping scale; the per-element ratio is |m| / (rho * bs * h).
        weight_decay: decoupled decay, w *= 1 - lr * weight_decay each step.
        bs: tokens per optimizer step (batch_size * seq_len); the reference's default is 5120.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 2e-4,
        betas: tuple[float, float] = (0.965, 0.99),
        rho: float = 0.04,
        weight_decay: float = 0.1,
        bs: int = 5120,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got lr={lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got betas={list(betas)}")
        if not rho >= 0.0:
            raise ValueError(f"rho must be >= 0, got rho={rho}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got weight_decay={weight_decay}")
        if not bs > 0:
            raise ValueError(f"bs (tokens per step) must be > 0, got bs={bs}")
        defaults = {"lr": lr, "betas": tuple(betas), "rho": rho, "weight_decay": weight_decay, "bs": bs}
        super().__init__(params, defaults)
        # CPU: the clipped step goes tensor by tensor through one reused flat buffer (fresh
        # parameter-sized temporaries cost a page fault per 4 KiB there). Elsewhere: grouped _foreach
        # ops, whose temporaries the caching allocator recycles. None: decide by device; tests override.
        self._per_tensor: bool | None = None
        self._scratch: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_per_tensor", None)
        self.__dict__.setdefault("_scratch", {})

    def _state(self, p: torch.Tensor) -> dict[str, Any]:
        if p.grad is not None and p.grad.is_sparse:
            raise RuntimeError("SophiaG does not support sparse gradients")
        state = self.state[p]
        if len(state) == 0:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["hessian"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def update_hessian(self) -> None:
        """h = b2*h + (1-b2)*g*g from the gradients now in `.grad` (the sampled-label backward pass)."""
        for group in self.param_groups:
            beta2 = group["betas"][1]
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            hessians = [self._state(p)["hessian"] for p in params]
            torch._foreach_mul_(hessians, beta2)
            torch._foreach_addcmul_(hessians, grads, grads, value=1 - beta2)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            lr: float = group["lr"]
            beta1 = group["betas"][0]
            grads = [p.grad for p in params]
            states = [self._state(p) for p in params]
            for state in states:
                state["step"] += 1
            exp_avgs = [s["exp_avg"] for s in states]
            hessians = [s["hessian"] for s in states]

            if group["weight_decay"] != 0:
                torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            torch._foreach_mul_(exp_avgs, beta1)
            torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)

            # Reference: ratio = (|m| / (rho*bs*h + 1e-15)).clamp(max=1); w += -lr * sign(m) * ratio.
            # The denominator is > 0 (h is an average of squares), so sign(m) * min(|m|/d, 1) equals
            # clamp(m/d, -1, 1) exactly (IEEE division is sign-symmetric), which saves two passes.
            scale = group["rho"] * group["bs"]
            if self._uses_per_tensor(params[0].device):
                for p, m, h in zip(params, exp_avgs, hessians):
                    d = self._buffer(p)
                    torch.mul(h, scale, out=d)
                    d.add_(1e-15)
                    torch.div(m, d, out=d)
                    d.clamp_(-1.0, 1.0)
                    p.add_(d, alpha=-lr)
            else:
                denoms = torch._foreach_mul(hessians, scale)
                torch._foreach_add_(denoms, 1e-15)
                steps = torch._foreach_div(exp_avgs, denoms)
                torch._foreach_clamp_min_(steps, -1.0)
                torch._foreach_clamp_max_(steps, 1.0)
                torch._foreach_add_(params, steps, alpha=-lr)
        return loss

    def _uses_per_tensor(self, device: torch.device) -> bool:
        """Whether the clipped step on `device` goes tensor by tensor (`_per_tensor`, else on CPU); the
        grouped _foreach path reads nothing back, so it issues no host-device sync."""
        return device.type == "cpu" if self._per_tensor is None else self._per_tensor

    def _buffer(self, p: torch.Tensor) -> torch.Tensor:
        """A scratch view shaped like `p`, from a flat buffer grown to the largest parameter."""
        key = (p.device, p.dtype)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < p.numel():
            buf = torch.empty(p.numel(), dtype=p.dtype, device=p.device)
            self._scratch[key] = buf
        return buf[: p.numel()].view(p.shape)
