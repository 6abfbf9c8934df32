"""GPT-2 models built from a config (no hub weights), and the max-attention-logit probe.

The probe is the MERIT paper's failure signal: the largest pre-softmax attention score q.k/sqrt(d)
per layer. It runs through a custom attention function (registered once with transformers'
`AttentionInterface`) that records the causal max when a probe is active and otherwise only calls
the normal SDPA kernel, so training steps pay nothing but one global lookup per layer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AttentionInterface, GPT2Config, GPT2LMHeadModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from worker.config import ModelConfig
from worker.names import MODEL_PRESETS

__all__ = ["MODEL_PRESETS", "build_model", "attention_logit_probe", "count_params", "flops_per_token"]

log = logging.getLogger(__name__)

ATTN_IMPL = "batchsweep_sdpa_probe"
_recording: dict[int, float] | None = None  # layer index -> max logit, while a probe is active
_PROBE_CHUNK = 8  # (chunk, n_head, T, T) float32 scores at a time bounds the probe's memory


def _sdpa_with_logit_probe(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, n_head, T, head_dim)
    key: torch.Tensor,  # (B, n_head, T, head_dim)
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if _recording is not None:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        t_q, t_k = query.shape[-2], key.shape[-2]
        # causal: query i sees keys <= i (+ offset when keys are longer, i.e. with a cache)
        causal = torch.ones(t_q, t_k, dtype=torch.bool, device=query.device).tril(t_k - t_q)
        best = float("-inf")
        with torch.no_grad():
            for start in range(0, query.shape[0], _PROBE_CHUNK):
                q = query[start : start + _PROBE_CHUNK].float()
                k = key[start : start + _PROBE_CHUNK].float()
                scores = (q @ k.transpose(-1, -2)) * scale  # (chunk, n_head, T, T)
                best = max(best, scores.masked_fill(~causal, float("-inf")).amax().item())
        layer = int(getattr(module, "layer_idx", len(_recording)))
        _recording[layer] = max(best, _recording.get(layer, float("-inf")))
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


AttentionInterface.register(ATTN_IMPL, _sdpa_with_logit_probe)


@contextlib.contextmanager
def attention_logit_probe() -> Iterator[dict[int, float]]:
    """Within the block, forward passes record the max attention logit per layer into the dict."""
    global _recording
    found: dict[int, float] = {}
    previous, _recording = _recording, found
    try:
        yield found
    finally:
        _recording = previous


def build_model(cfg: ModelConfig, *, vocab_size: int, seed: int) -> GPT2LMHeadModel:
    """A freshly initialised GPT-2 (init fixed by `seed`) for `vocab_size` tokens and cfg.seq_len positions."""
    shape = cfg.shape()
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=cfg.seq_len,
        n_layer=shape["n_layer"],
        n_head=shape["n_head"],
        n_embd=shape["n_embd"],
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        use_cache=False,
        tie_word_embeddings=True,
        bos_token_id=None,  # our BPE has no GPT-2 ids; documents are separated in data.py
        eos_token_id=None,
    )
    config._attn_implementation = ATTN_IMPL
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    if model.config._attn_implementation != ATTN_IMPL:
        model.set_attn_implementation(ATTN_IMPL)
    return model


def count_params(model: torch.nn.Module, *, non_embedding: bool = False) -> int:
    n = sum(p.numel() for p in model.parameters())
    if non_embedding:
        n -= model.transformer.wpe.weight.numel()  # type: ignore[union-attr]
    return n


def flops_per_token(model: GPT2LMHeadModel, seq_len: int) -> float:
    """Training FLOPs per token, 6N + 12 L d T (PaLM appendix B), for MFU: worker/hardware.py's formula,
    the one a sweep's dry-run price uses."""
    from worker.hardware import training_flops_per_token

    cfg = model.config
    n = count_params(model, non_embedding=True)
    return float(training_flops_per_token(flop_parameters=n, n_layer=cfg.n_layer, n_embd=cfg.n_embd, seq_len=seq_len))
