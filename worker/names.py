"""Names that callers validate against without importing torch (the service must not import torch)."""

from __future__ import annotations

# GPT-2 shapes by name. gpt2-nano/micro are CPU test sizes; the rest are the GPT-2 paper's models.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "gpt2-nano": {"n_layer": 2, "n_head": 2, "n_embd": 64},
    "gpt2-micro": {"n_layer": 4, "n_head": 4, "n_embd": 128},
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768},  # 124M
    "gpt2-medium": {"n_layer": 24, "n_head": 16, "n_embd": 1024},  # 355M
    "gpt2-large": {"n_layer": 36, "n_head": 20, "n_embd": 1280},  # 774M
}

# Keys of worker.optim.OPTIMIZERS (a test keeps the two in step).
OPTIMIZER_NAMES: tuple[str, ...] = ("adamw", "lamb", "lion", "merit", "sophia")
