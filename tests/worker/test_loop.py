"""The training loop in-process (LocalSession): same code as on Ray, no cluster needed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from worker.config import ModelConfig, OptimizerConfig, TrainConfig
from worker.loop import train
from worker.session import LocalSession

TINY = dict(model=ModelConfig(preset="gpt2-nano", seq_len=32), max_micro_batch=4, threads_per_worker=1)


def cfg(**kw: object) -> TrainConfig:
    base: dict = dict(TINY, batch_size=8, token_budget=8 * 32 * 24, eval_every_tokens=8 * 32 * 6, eval_batches=2)
    base |= kw
    return TrainConfig(**base)


@pytest.fixture(autouse=True)
def _cache(token_cache: Path) -> None:
    """All loop tests share the session's token cache of the built-in corpus."""


def test_loss_goes_down_and_reports_line_up_on_tokens() -> None:
    session = LocalSession()
    final = train(cfg(optimizer=OptimizerConfig(name="adamw", lr=1e-2)), session)
    assert final["status"] == "completed"
    tokens = [r["tokens"] for r in session.reports]
    # reports every eval_every_tokens, step axis in tokens (4 evals of 6 steps x 256 tokens)
    assert tokens == [1536, 3072, 4608, 6144]
    assert session.reports[-1]["val_loss"] < session.reports[0]["val_loss"]
    assert session.reports[-1]["done"] is True and all(not r["done"] for r in session.reports[:-1])
    for key in (
        "train_loss",
        "lr",
        "tokens_per_s",
        "grad_norm",
        "attn_logit_max",
        "attn_logit_max/layer_0",
        "attn_logit_max/layer_1",
        "noise_scale",
        "train_time_s",
    ):
        assert key in final, key
    # accumulation 2 x micro 4: the noise scale is measured, and is a positive number of sequences
    assert final["noise_scale"] > 0


def test_same_seed_same_run_other_seed_other_run() -> None:
    a = train(cfg(token_budget=8 * 32 * 6, eval_every_tokens=8 * 32 * 6), LocalSession())
    b = train(cfg(token_budget=8 * 32 * 6, eval_every_tokens=8 * 32 * 6), LocalSession())
    c = train(cfg(token_budget=8 * 32 * 6, eval_every_tokens=8 * 32 * 6, seed=1), LocalSession())
    assert a["val_loss"] == b["val_loss"]
    assert a["val_loss"] != c["val_loss"]


def test_absurd_lr_is_reported_as_diverged_not_raised() -> None:
    session = LocalSession()
    final = train(cfg(optimizer=OptimizerConfig(name="adamw", lr=1e4), grad_clip=None), session)
    assert final["status"] == "diverged"
    assert final["done"] is True
    # the run stopped early: it did not spend its budget
    assert final["tokens"] < 8 * 32 * 24
    assert session.reports[-1]["status"] == "diverged"


@pytest.mark.parametrize("name", ["lamb", "lion", "merit", "sophia"])
def test_every_optimizer_trains_through_the_loop(name: str) -> None:
    lr = {"lamb": 1e-2, "lion": 1e-3, "merit": 1e-2, "sophia": 1e-3}[name]
    session = LocalSession()
    final = train(cfg(optimizer=OptimizerConfig(name=name, lr=lr)), session)
    assert final["status"] == "completed"
    assert session.reports[-1]["val_loss"] < session.reports[0]["val_loss"] + 0.05
    assert math.isfinite(final["val_loss"])


def test_resume_from_checkpoint_continues_instead_of_restarting(tmp_path: Path) -> None:
    full = LocalSession()
    expected = train(cfg(), full)

    first = LocalSession(checkpoint_root=tmp_path)
    c = cfg(checkpoint_every_evals=1)
    train(c, first)
    second_ckpt = first.checkpoints[1]  # saved after the 2nd eval (step 12)
    resumed = LocalSession(resume_from=second_ckpt)
    final = train(c, resumed)
    # the resumed run reports only what comes after the checkpoint ...
    assert [r["tokens"] for r in resumed.reports] == [4608, 6144]
    # ... and ends where the uninterrupted run ended (same data order, optimizer state, schedule)
    assert final["val_loss"] == pytest.approx(expected["val_loss"], rel=1e-5)


def test_attention_probe_matches_eager_attention() -> None:
    from worker.model import attention_logit_probe, build_model

    model = build_model(ModelConfig(preset="gpt2-nano", seq_len=16), vocab_size=300, seed=0)
    x = torch.randint(0, 300, (3, 16))
    with attention_logit_probe() as per_layer:
        model(x)
    # reference: the pre-softmax scores of eager attention, q.k/sqrt(d), causal max per layer
    expected = {}
    hidden = model.transformer.wte(x) + model.transformer.wpe(torch.arange(16))
    for i, block in enumerate(model.transformer.h):
        h = block.ln_1(hidden)
        q, k, _ = block.attn.c_attn(h).split(64, dim=2)
        q = q.view(3, 16, 2, 32).transpose(1, 2)
        k = k.view(3, 16, 2, 32).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(32)
        mask = torch.ones(16, 16, dtype=torch.bool).tril()
        expected[i] = scores.masked_fill(~mask, float("-inf")).amax().item()
        out = block(hidden)
        hidden = out[0] if isinstance(out, tuple) else out
    assert per_layer.keys() == expected.keys()
    for i in expected:
        assert per_layer[i] == pytest.approx(expected[i], rel=1e-5)
