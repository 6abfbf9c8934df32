"""MERIT: Maximum-normalized Element-wise Ratio (Luo et al., ICML 2025), vectorised.

The update is the authors' public optimizer, element for element:

    m = b1*m + (1-b1)*g ;  v = b2*v + (1-b2)*g*g          (no bias correction)
    u = m / (sqrt(v) + eps) ;  u += wd * w   (if wd != 0)   (decay joins the update before the ratios)
    matrices (dim >= 2):
        row_i = max_j|w_ij| / max_j|u_ij|   (amax over dim 1)
        col_j = max_i|w_ij| / max_i|u_ij|   (amax over dim 0)
        whole = max|w| / max|u|
        r_ij  = max(row_i, col_j) clamped below at whole;  r_ij = 1 where any of the four max-norms
                touching ij (row |w|, row |u|, col |w|, col |u|) is zero
    vectors (dim < 2): r = max|w| / max|u|  (1 if either is zero)
    w -= lr * clamp(u * r, -1, 1)

Tensors with more than two dims are reduced exactly as the authors do: over dim 1 for the "row" norm and
over dim 0 for the "column" norm (keepdim, so the remaining dims stay element-wise). GPT-2 has only 1-D
and 2-D parameters, so this only matters for other models.

Two ways through a matrix, one algorithm; both agree with the authors' code to float rounding
(tests/worker/test_optim.py and test_optim_speed.py) and benchmarks/optimizer_step.py times them:

    path                       where                                   step on GPT-2-small shapes (CPU)
    eager (blocked torch ops)  CPU; accelerators' fallback             180-230 ms: 3.3-5.6x AdamW(fused), ~0.5x foreach
    compiled (inductor)        CUDA (default)                          not measured on a GPU yet

The eager path, made fast without changing the algorithm (the final multiply-add is one fused op here,
two in the authors' code):

* No per-step allocations of parameter-sized tensors: |w|, |u|, u and the ratio matrix live in two
  scratch buffers the size of the largest matrix, reused for every matrix. (Fresh large tensors cost a
  page fault per 4 KiB on first touch; on CPU that is most of `AdamW(foreach=True)`'s time.)
* A matrix's first pass (moments, u, the four max-norm vectors) runs over blocks of ~0.5M elements of
  whole rows, so the six operands of a block stay in the last-level cache between the dozen ops that
  touch them. Column maxima are combined across blocks with an element-wise maximum.
* max|w| and max|u| of the whole matrix are the max of the row-max vectors (exact).
* The `whole` floor is folded into the small column-ratio vector before broadcasting:
  max(max(a, b), c) == max(a, max(b, c)), also under NaN propagation.
* The zero-norm mask is applied only when a batched check on the small vectors finds a zero norm
  (rare: a never-used embedding row or an all-zero gradient row with weight decay off).
* For unmasked elements |u_ij * r_ij| <= max|w| (each ratio is a max-norm of w over one of u, times an
  element no larger than that max-norm of u), so the clip is skipped when max|w| is below 1 by a margin
  covering rounding. With no mask and no clip, the update is one `addcmul_`.

On accelerators the data-dependent checks would each cost a host sync, so there the mask and the clip
always run (still exact) and matrices are processed whole.

Compiled (`_matrix_update` through `torch.compile`, inductor): the whole matrix step as one function of
pure tensor ops, which inductor fuses into a few kernels instead of ~20 launches. It never reads a number
back (no host sync), and one graph serves every 2-D shape and lr (dynamic shapes; floats are graph
inputs). Used on CUDA (not measured on a GPU yet: deploy/gpu_check.sh does); not on CPU, where inductor's
C++ makes some eight passes over each matrix (its column reductions walk the matrix with a stride) and
measured no faster than the eager path, at a compilation (~10 s cold, ~2 s cached) in every process.
`MERIT._compiled` overrides the choice (tests, the benchmark).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

logger = logging.getLogger(__name__)

# The compiled matrix step: built on first use (torch.compile is lazy too; this keeps the import of
# torch._dynamo off the CPU path), and None for good after a failed compilation (logged), which then runs
# eager: a missing Triton or compiler must not fail a training run that the eager path can do.
_compiled_update: Callable[..., None] | None = None
_compile_failed: str | None = None  # why the compilation failed, once it has


def _matrix_update(
    w: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    wd: float,
) -> None:
    """One MERIT step on a tensor of dim >= 2, in place on w (the parameter), m and v, as pure tensor ops
    (the form torch.compile fuses; also correct run eagerly). Same algorithm as `MERIT._matrix_step`."""
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    u = m / (v.sqrt() + eps)
    if wd != 0:
        u = u + wd * w
    abs_w, abs_u = w.abs(), u.abs()
    row_w, row_u = abs_w.amax(dim=1, keepdim=True), abs_u.amax(dim=1, keepdim=True)  # (R, 1, *rest)
    col_w, col_u = abs_w.amax(dim=0, keepdim=True), abs_u.amax(dim=0, keepdim=True)  # (1, C, *rest)
    whole = row_w.amax() / row_u.amax()
    ratio = torch.maximum(row_w / row_u, torch.clamp(col_w / col_u, min=whole))
    # 1 where a max-norm touching ij is zero; float flags, not bools: inductor's CPU code vectorises a
    # broadcast bool load ~7x slower
    bad = ((row_w == 0) | (row_u == 0)).to(w.dtype) + ((col_w == 0) | (col_u == 0)).to(w.dtype)
    ratio = torch.where(bad > 0, 1.0, ratio)
    w.sub_(lr * (u * ratio).clamp(-1.0, 1.0))


def _compiled_matrix_update() -> Callable[..., None] | None:
    global _compiled_update
    if _compiled_update is None and _compile_failed is None:
        _compiled_update = torch.compile(_matrix_update, dynamic=True, fullgraph=True)
    return _compiled_update


# Elements per first-pass block on CPU: 2 MiB per float32 operand; the six operands (w, g, m, v, u, |.|)
# fit a last-level cache with room to spare. Measured on GPT-2-small shapes (2-core EPYC, 32 MiB L3):
# ~10-15 % faster than whole matrices; 256K-2M elements all within noise of each other.
_CPU_BLOCK_ELEMS = 1 << 19


class MERIT(torch.optim.Optimizer):
    """MERIT optimizer; state per parameter: "step" (int), "exp_avg", "exp_avg_sq" (shape of the parameter).

    Args:
        params: parameters or parameter groups.
        lr: learning rate (the update is clipped to [-1, 1] per element, so lr bounds the step size).
        betas: decay of the first and second moment averages (no bias correction, as the authors).
        eps: added to sqrt(exp_avg_sq) in the denominator.
        weight_decay: coefficient of w added to the update before the trust ratios (the authors' L2-in-update
            form, not decoupled decay).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got lr={lr}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got eps={eps}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got betas={list(betas)}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got weight_decay={weight_decay}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})
        # Flat scratch buffers per (device, dtype), sized to the largest matrix; not optimizer state.
        self._scratch: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        # Decide per matrix on the host whether the mask and the clip are needed (and process CPU
        # matrices in cache-sized blocks). None: exactly on CPU, where reading a scalar is free; on
        # accelerators each read would be a sync. Tests set False to run the accelerator path on CPU.
        self._host_checks: bool | None = None
        # Matrices through the compiled `_matrix_update`. None: on CUDA (see the module docstring).
        self._compiled: bool | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_scratch", {})
        self.__dict__.setdefault("_host_checks", None)
        self.__dict__.setdefault("_compiled", None)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            matrices: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]] = []
            vectors: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]] = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("MERIT does not support sparse gradients")
                if torch.is_complex(p):
                    raise RuntimeError("MERIT does not support complex parameters")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                if p.numel() == 0:
                    continue  # nothing to update (and no max-norm to take)
                (matrices if p.dim() >= 2 else vectors).append((p, grad, state))

            for p, grad, state in matrices:
                if not self._compiled_step(p, grad, state["exp_avg"], state["exp_avg_sq"], group):
                    self._matrix_step(p, grad, state["exp_avg"], state["exp_avg_sq"], group)
            if vectors:
                self._vector_step(vectors, group)
        return loss

    # ----------------------------------------------------------------------------------------------
    # matrices

    def _uses_compiled(self, device: torch.device) -> bool:
        """Whether matrices on `device` take the compiled step: `_compiled`, else on CUDA."""
        return device.type == "cuda" if self._compiled is None else self._compiled

    def _uses_host_checks(self, device: torch.device) -> bool:
        """Whether the eager step on `device` reads the mask and clip decisions back (free on CPU only):
        `_host_checks`, else on CPU."""
        return device.type == "cpu" if self._host_checks is None else self._host_checks

    def _compiled_step(
        self, p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, group: dict
    ) -> bool:
        """The step of matrix `p` through the compiled `_matrix_update`, where it is used; False: not done.
        2-D only (every GPT-2 matrix): one graph for them all; another rank would compile another."""
        global _compile_failed
        update = _compiled_matrix_update() if p.dim() == 2 and self._uses_compiled(p.device) else None
        if update is None:
            return False
        beta1, beta2 = group["betas"]
        try:
            # p.detach(): the same storage, as a plain tensor (dynamo keeps a Parameter's shape static, which
            # would compile a graph per shape)
            w = p.detach()
            update(w, grad, exp_avg, exp_avg_sq, group["lr"], beta1, beta2, group["eps"], group["weight_decay"])
        except Exception as exc:  # compilation happens at the first call; then eager can do the step
            if _compile_failed is not None or not _is_compile_error(exc):
                raise
            _compile_failed = f"{type(exc).__name__}: {exc}"
            logger.warning("compiled MERIT step unavailable, running eager: %s", _compile_failed)
            return False
        return True

    def _buffers(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two scratch views shaped like `p` (u, and |w| / |u| / the ratio matrix in turn)."""
        key = (p.device, p.dtype)
        bufs = self._scratch.get(key)
        if bufs is None or bufs[0].numel() < p.numel():
            # Grows once to the largest matrix (GPT-2: the token embedding), then reused every step.
            bufs = (
                torch.empty(p.numel(), dtype=p.dtype, device=p.device),
                torch.empty(p.numel(), dtype=p.dtype, device=p.device),
            )
            self._scratch[key] = bufs
        return bufs[0][: p.numel()].view(p.shape), bufs[1][: p.numel()].view(p.shape)

    def _matrix_step(
        self,
        p: torch.Tensor,
        grad: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        group: dict[str, Any],
    ) -> None:
        lr: float = group["lr"]
        host_checks = self._uses_host_checks(p.device)

        # Blocks are slices along dim 0, so they need row-contiguous operands; anything else (a
        # transposed view, channels-last) is processed whole through contiguous copies.
        w = p if p.is_contiguous() else p.contiguous()
        g = grad.contiguous()
        m, v = exp_avg, exp_avg_sq
        if not (m.is_contiguous() and v.is_contiguous()):
            m, v = m.contiguous(), v.contiguous()
        u, scratch = self._buffers(w)
        n_rows = w.shape[0]
        row_elems = max(1, w[0].numel())
        rows_per_block = max(1, _CPU_BLOCK_ELEMS // row_elems) if p.device.type == "cpu" else n_rows
        blocks = [slice(i, min(n_rows, i + rows_per_block)) for i in range(0, n_rows, rows_per_block)]
        row_w, row_u, col_w, col_u = _first_pass(w, g, m, v, u, scratch, blocks, group)

        max_w = row_w.amax()  # == max|w|: the max of the row maxima
        whole = max_w / row_u.amax()
        # The authors' max(col, row).clamp(min=whole) == max(row, max(col, whole)): fold the floor into
        # the small column vector, before broadcasting (NaN propagates the same way through both).
        row_ratio = row_w / row_u
        col_ratio = torch.clamp(col_w / col_u, min=whole)
        row_bad = (row_w == 0) | (row_u == 0)
        col_bad = (col_w == 0) | (col_u == 0)

        if host_checks:
            # One host read per matrix (free on CPU): is any norm zero, and is max|w| safely below 1?
            any_bad, max_w_value = torch.stack([(row_bad.any() | col_bad.any()).to(max_w.dtype), max_w]).tolist()
            masked = any_bad != 0.0
            # |u_ij * r_ij| <= max|w| for unmasked elements; the margin covers the ~3 roundings of the
            # ratio and product. NaN max_w compares False, so it clips (and NaN stays NaN either way).
            limit = 1.0 / (1.0 + 8.0 * torch.finfo(w.dtype).eps)
            clip = masked or not (max_w_value <= limit)
        else:
            masked = clip = True  # no host sync on accelerators; both passes are exact no-ops when not needed

        for rows in blocks:
            wb, ub, rb = w[rows], u[rows], scratch[rows]
            torch.maximum(row_ratio[rows], col_ratio, out=rb)  # r_ij, broadcast from (R,1) and (1,C)
            if masked:
                rb.masked_fill_(row_bad[rows], 1.0)
                rb.masked_fill_(col_bad, 1.0)
            if clip:
                ub.mul_(rb).clamp_(-1.0, 1.0)  # == sign(x) * min(|x|, 1), also for +-inf and NaN
                wb.add_(ub, alpha=-lr)
            else:
                wb.addcmul_(ub, rb, value=-lr)

        if w is not p:
            p.copy_(w)
        if m is not exp_avg:
            exp_avg.copy_(m)
            exp_avg_sq.copy_(v)

    # ----------------------------------------------------------------------------------------------
    # vectors (biases, LayerNorm): small, so grouped _foreach ops with one scalar ratio per tensor

    def _vector_step(
        self, items: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]], group: dict[str, Any]
    ) -> None:
        lr: float = group["lr"]
        beta1, beta2 = group["betas"]
        eps: float = group["eps"]
        wd: float = group["weight_decay"]

        by_kind: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]] = {}
        for item in items:
            by_kind.setdefault((item[0].device, item[0].dtype), []).append(item)

        for same in by_kind.values():
            params = [p for p, _, _ in same]
            grads = [g for _, g, _ in same]
            exp_avgs = [s["exp_avg"] for _, _, s in same]
            exp_avg_sqs = [s["exp_avg_sq"] for _, _, s in same]

            torch._foreach_mul_(exp_avgs, beta1)
            torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
            updates = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_add_(updates, eps)
            updates = torch._foreach_div(exp_avgs, updates)
            if wd != 0:
                torch._foreach_add_(updates, params, alpha=wd)

            w_max = torch.stack(torch._foreach_norm(params, ord=float("inf")))  # (n_tensors,) max|w|
            u_max = torch.stack(torch._foreach_norm(updates, ord=float("inf")))
            ratios = torch.where((w_max == 0) | (u_max == 0), torch.ones_like(w_max), w_max / u_max)
            torch._foreach_mul_(updates, list(ratios.unbind()))
            torch._foreach_clamp_min_(updates, -1.0)
            torch._foreach_clamp_max_(updates, 1.0)
            torch._foreach_add_(params, updates, alpha=-lr)


def _first_pass(
    w: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    u: torch.Tensor,
    scratch: torch.Tensor,
    blocks: list[slice],
    group: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The eager first pass over `blocks` of rows: m, v and u = m / (sqrt(v) + eps) + wd*w in place (u into
    `u`); then the max-norm vectors of |w| and |u| (rows (R, 1, *rest), columns (1, C, *rest)), each
    block's while it is in cache."""
    beta1, beta2 = group["betas"]
    eps, wd = group["eps"], group["weight_decay"]
    row_w = w.new_empty((w.shape[0], 1, *w.shape[2:]))
    row_u = torch.empty_like(row_w)
    col_w: torch.Tensor | None = None
    col_u: torch.Tensor | None = None
    for rows in blocks:
        wb, ub, sb = w[rows], u[rows], scratch[rows]
        mb, vb, gb = m[rows], v[rows], g[rows]
        # Moments in the authors' op order (m and v come out bit-identical to theirs).
        mb.mul_(beta1).add_(gb, alpha=1 - beta1)
        vb.mul_(beta2).addcmul_(gb, gb, value=1 - beta2)
        torch.sqrt(vb, out=ub)
        ub.add_(eps)
        torch.div(mb, ub, out=ub)  # u = m / (sqrt(v) + eps)
        if wd != 0:
            ub.add_(wb, alpha=wd)
        # amax of |x| written into scratch: amax is a plain reduction, much faster than
        # vector_norm(ord=inf), and NaN propagates through both.
        torch.abs(wb, out=sb)
        torch.amax(sb, dim=1, keepdim=True, out=row_w[rows])
        block_col = sb.amax(dim=0, keepdim=True)
        col_w = block_col if col_w is None else torch.maximum(col_w, block_col, out=col_w)
        torch.abs(ub, out=sb)
        torch.amax(sb, dim=1, keepdim=True, out=row_u[rows])
        block_col = sb.amax(dim=0, keepdim=True)
        col_u = block_col if col_u is None else torch.maximum(col_u, block_col, out=col_u)
    assert col_w is not None and col_u is not None
    return row_w, row_u, col_w, col_u


def _is_compile_error(exc: Exception) -> bool:
    """Whether `exc` is torch.compile failing to build the kernels (no Triton, no C++ compiler, a dynamo
    limitation), as opposed to an error of the step itself, which must propagate."""
    import torch._dynamo.exc as dynamo_exc

    return isinstance(
        exc, (dynamo_exc.BackendCompilerFailed, dynamo_exc.Unsupported, dynamo_exc.InternalTorchDynamoError)
    )
