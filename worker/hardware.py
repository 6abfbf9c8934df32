"""Accelerators and the FLOPs a GPT-2 asks of them: one table, one formula (torch-free).

Two readers, so that a price and a measurement use the same numbers:

* the training loop's model FLOPs utilisation (`worker/loop.py`: the GPU it runs on, by the name
  `torch.cuda.get_device_name` gives, through `device_peak_flops`);
* the price of a sweep before it runs (`sweeps/cost.py`: a GPU the user names, through `accelerator`).

Peaks are dense bf16 tensor-core FLOP/s, without 2:4 structured sparsity: the vendors' headline
figures count sparsity and are twice these. A training step reaches a fraction of the peak, its model
FLOPs utilisation (MFU): PaLM's 540B run reached 46 %; this project's target for GPT-2 small at bf16
on one GPU is 40 %.

FLOPs per token follow PaLM (Chowdhery et al. 2022, appendix B), as nanoGPT's `estimate_mfu` does:
6N for the weight matmuls (2N forward, 4N backward: a multiply and an add per weight, per token) plus
12 L T d for attention (forward QK^T and attention x V cost 2 T d each per layer per token; the
backward twice that), with no discount for the causal mask. N counts every weight a token's forward
pass multiplies by: all parameters but the position embeddings, which are a lookup (the token
embedding is counted: tied to the LM head, it is a V x d matmul per token). Kaplan et al. 2020 count
attention as 2 L T d forward (6 L T d trained); PaLM's count is the one published MFU figures use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "ACCELERATORS",
    "DEFAULT_GPU",
    "Accelerator",
    "UnknownAccelerator",
    "accelerator",
    "accelerator_names",
    "device_accelerator",
    "device_peak_flops",
    "forward_flops_per_token",
    "training_flops_per_token",
]


@dataclass(frozen=True)
class Accelerator:
    name: str  # what a user types (any case) and what a price names
    peak_flops: float  # dense bf16 tensor-core FLOP/s (no sparsity)
    # tokens (upper case) that must all appear in `torch.cuda.get_device_name`, split on non-alphanumerics;
    # the match with the most tokens wins ("NVIDIA H100 PCIe" is the PCIe part, "NVIDIA H100 80GB HBM3" SXM)
    device_tokens: frozenset[str]
    source: str  # where the figure comes from
    # bytes of memory one GPU holds (the datasheet's GB, 10^9 bytes); None where one name covers several sizes
    memory_bytes: int | None = None


def _acc(name: str, tflops: float, tokens: str, source: str, memory_gb: int | None = None) -> Accelerator:
    return Accelerator(
        name, tflops * 1e12, frozenset(tokens.split()), source, memory_gb * 10**9 if memory_gb is not None else None
    )


# The vendors' figures "with sparsity" halved where that is how they publish them. An A10G (AWS's
# variant of the A10) is left out on purpose: NVIDIA publishes no figure for it and its tensor
# throughput is below the A10's, so it is not matched as an A10; pass peak_tflops for it.
ACCELERATORS: tuple[Accelerator, ...] = (
    _acc(
        "H100-SXM", 989, "H100", "NVIDIA Hopper architecture: BF16 tensor 989.4 TFLOPS dense, 1,979 with sparsity", 80
    ),
    _acc("H100-PCIe", 756, "H100 PCIE", "NVIDIA H100 PCIe datasheet: BF16 tensor 1,513 TFLOPS with sparsity", 80),
    _acc("H100-NVL", 835, "H100 NVL", "NVIDIA H100 NVL datasheet: BF16 tensor 1,671 TFLOPS with sparsity", 94),
    _acc(
        "H200",
        989,
        "H200",
        "NVIDIA H200 SXM: the H100 SXM's GH100 compute, BF16 tensor 1,979 TFLOPS with sparsity",
        141,
    ),
    _acc("H200-NVL", 835, "H200 NVL", "NVIDIA H200 NVL datasheet: BF16 tensor 1,671 TFLOPS with sparsity", 141),
    _acc(
        "A100",
        312,
        "A100",
        "NVIDIA A100 datasheet: BF16 tensor 312 TFLOPS dense (432 tensor cores x 256 FMA x 1.41 GHz x 2)",
    ),
    _acc("L4", 121, "L4", "NVIDIA L4 datasheet: BF16 tensor 242 TFLOPS with sparsity", 24),
    _acc("A10", 125, "A10", "NVIDIA A10 datasheet: BF16 tensor 125 TFLOPS dense, 250 with sparsity", 24),
)

# Names that mean a table entry: the plain H100 is the SXM part (DGX/HGX, the common cluster GPU).
_ALIASES = {"H100": "H100-SXM", "H200-SXM": "H200"}
DEFAULT_GPU = "H100"


class UnknownAccelerator(ValueError):
    """A GPU name the table does not hold; the message lists the names it does."""


def _key(name: str) -> str:
    """'h100 sxm', 'H100_SXM', 'h100-sxm' -> 'H100-SXM'."""
    return re.sub(r"[\s_]+", "-", name.strip()).upper()


_BY_KEY = {_key(a.name): a for a in ACCELERATORS} | {
    _key(alias): next(a for a in ACCELERATORS if a.name == target) for alias, target in _ALIASES.items()
}


def accelerator_names() -> list[str]:
    """The names `accelerator` takes (aliases included), in table order."""
    return [a.name for a in ACCELERATORS] + sorted(_ALIASES)


def accelerator(name: str) -> Accelerator:
    """The table entry named `name` (any case; spaces or underscores for dashes); `UnknownAccelerator` else."""
    found = _BY_KEY.get(_key(name)) if isinstance(name, str) else None
    if found is None:
        shown = name if isinstance(name, str) and len(name) <= 40 else f"{str(name)[:40]}..."
        raise UnknownAccelerator(
            f"unknown GPU {shown!r}; known GPUs: {', '.join(accelerator_names())} (or give peak_tflops)"
        )
    return found


def device_accelerator(device_name: str) -> Accelerator | None:
    """The table entry of a device named as `torch.cuda.get_device_name` names it, or None."""
    tokens = set(re.split(r"[^A-Z0-9]+", device_name.upper()))
    matches = [a for a in ACCELERATORS if a.device_tokens <= tokens]
    return max(matches, key=lambda a: len(a.device_tokens)) if matches else None


def device_peak_flops(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s of the named device; None for a device the table does not hold."""
    found = device_accelerator(device_name)
    return found.peak_flops if found else None


def training_flops_per_token(*, flop_parameters: int, n_layer: int, n_embd: int, seq_len: int) -> int:
    """FLOPs of one trained token (forward + backward): 6 N + 12 L T d (module docstring).

    `flop_parameters`: N, the parameters without the position embeddings; `seq_len`: T, the context
    length trained at (attention cost grows with it); `n_layer`, `n_embd`: L and d."""
    return 6 * flop_parameters + 12 * n_layer * seq_len * n_embd


def forward_flops_per_token(*, flop_parameters: int, n_layer: int, n_embd: int, seq_len: int) -> int:
    """FLOPs of one scored token (forward only, as at evaluation): 2 N + 4 L T d, a third of training's."""
    return 2 * flop_parameters + 4 * n_layer * seq_len * n_embd
