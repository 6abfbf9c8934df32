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

# Keywords `OptimizerConfig.extra` may set, per optimizer, with the kind of scalar each takes: the named
# constructor keywords of the optimizer's class (torch's AdamW, pytorch-optimizer's Lamb and Lion, our
# MERIT and SophiaG) minus EXTRA_RESERVED. A test (tests/worker/test_optim.py) checks the names against
# `inspect.signature` of the real classes and each kind against the real default. Kinds: "bool",
# "bool?" (a bool or null), "int", "float" (an int or a finite float).
OPTIMIZER_EXTRA: dict[str, dict[str, str]] = {
    "adamw": {
        "amsgrad": "bool",
        "maximize": "bool",
        "foreach": "bool?",
        "capturable": "bool",
        "differentiable": "bool",
        "fused": "bool?",
    },
    "lamb": {
        "weight_decouple": "bool",
        "fixed_decay": "bool",
        "rectify": "bool",
        "degenerated_to_sgd": "bool",
        "n_sma_threshold": "int",
        "grad_averaging": "bool",
        "max_grad_norm": "float",
        "adam": "bool",
        "pre_norm": "bool",
        "foreach": "bool?",
        "maximize": "bool",
    },
    "lion": {"weight_decouple": "bool", "fixed_decay": "bool", "foreach": "bool?", "maximize": "bool"},
    "merit": {},
    "sophia": {"rho": "float"},
}

# Constructor keywords that come from OptimizerConfig fields (lr, betas, eps, weight_decay), from the
# parameter groups (params) or from tokens_per_step (sophia's bs): never from `extra`.
EXTRA_RESERVED: frozenset[str] = frozenset({"params", "lr", "betas", "eps", "weight_decay", "bs"})

# Optimizers without an eps (registry entries with default_eps None): a configured eps is refused.
OPTIMIZERS_WITHOUT_EPS: frozenset[str] = frozenset({"lion", "sophia"})

# Tokens of the builtin corpus (worker/data.py), measured on CPython 3.11.7: (vocab_size up to, tokens
# train + val). More merges make fewer tokens; past ~17.7k the BPE runs out of merges (vocab 65535 gives
# a real vocabulary of 17,679), so the last count holds for every larger vocab_size. Validation compares
# sequence lengths against these counts without tokenising anything.
BUILTIN_CORPUS_TOKENS: tuple[tuple[int, int], ...] = ((257, 2_155_480), (4096, 601_474), (65535, 513_784))
