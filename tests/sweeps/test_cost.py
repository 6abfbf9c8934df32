"""The price of a sweep before it runs (sweeps/cost.py) and the table behind it (worker/hardware.py):
exact arithmetic on a small spec, the parameter and FLOP counts against the real model, the loop's own
evaluation count and MFU peak, and the refusals of a bad GPU, MFU or peak."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from sweeps.cost import PriceConfig, evaluations_per_trial, price
from sweeps.spec import SweepSpec
from worker.config import CheckpointConfig, EvalConfig, ModelConfig, OptimizerConfig, ResourcesConfig, TrainConfig
from worker.hardware import ACCELERATORS, accelerator, device_accelerator, device_peak_flops
from worker.loop import train
from worker.model import build_model, count_params, flops_per_token
from worker.names import MODEL_PRESETS
from worker.session import LocalSession

H100 = 989e12  # dense bf16 FLOP/s of an H100 SXM (worker/hardware.py's source)


def spec(**overrides: Any) -> SweepSpec:
    """gpt2-nano (2 layers, d=64) at seq_len 32 and vocab 512: small enough to price by hand."""
    data: dict[str, Any] = {
        "name": "priced",
        "model": {"preset": "gpt2-nano", "seq_len": 32},
        "data": {"source": "hf:some/dataset", "vocab_size": 512},
        "optimizers": [{"name": "adamw"}, {"name": "merit"}],
        "batch_sizes": [4, 8],
        "token_budget": 3000,
        "lr": {"min": 1e-4, "max": 1e-2, "trials_per_batch_size": 3},
        "seeds": 2,
        "degradation": {"baseline": "adamw"},
        "eval_every_tokens": 1024,
        "eval_tokens": 100,
    }
    return SweepSpec.model_validate(data | overrides)


def test_the_price_of_a_small_spec_by_hand() -> None:
    cost = price(spec())
    # trials: 2 optimizers x (2 batch sizes x (3 search + 2 confirmation) + 1 search trial more at the
    # reference, batch size 4)
    assert (cost.trials.min, cost.trials.max, cost.search_trials) == (22, 22, 14)
    # token_budget 3000 rounded down to a multiple of lcm(4, 8) x 32 = 256: 11 x 256
    assert cost.trained_tokens == cost.tokens_per_trial == 2816
    assert cost.training_tokens.max == 22 * 2816 == 61_952
    assert cost.prunable_training_tokens == 14 * 2816 and cost.pruning
    # evaluations: batch 4 = 128 tokens/step, 22 steps, every round(1024/128) = 8 steps: after 8, 16, 22;
    # batch 8 = 256 tokens/step, 11 steps, every 4: after 4, 8, 11. 3 each, x 2 optimizers x 6 trials at
    # batch 4 (the reference's one more) and 5 at batch 8
    assert cost.evaluations.max == 2 * (6 * 3 + 5 * 3) == 66
    assert cost.tokens_per_evaluation == 4 * 32  # eval_tokens 100 in whole windows: ceil(100 / 32) = 4
    assert cost.evaluation_tokens.max == 66 * 128 == 8448
    # parameters: per layer 12 d^2 + 13 d, token and position embeddings, final LayerNorm
    per_layer = 12 * 64**2 + 13 * 64
    assert per_layer == 49_984
    assert cost.parameters == 2 * per_layer + 512 * 64 + 32 * 64 + 2 * 64 == 134_912
    assert cost.flop_parameters == 134_912 - 32 * 64 == 132_864  # without the position embeddings
    # 6N + 12 L T d and 2N + 4 L T d
    assert cost.training_flops_per_token == 6 * 132_864 + 12 * 2 * 32 * 64 == 846_336
    assert cost.evaluation_flops_per_token == 2 * 132_864 + 4 * 2 * 32 * 64 == 282_112
    assert cost.training_flops.max == 61_952 * 846_336 == 52_432_207_872
    assert cost.evaluation_flops.max == 8448 * 282_112 == 2_383_282_176
    assert cost.total_flops.max == 54_815_490_048
    assert (cost.gpu, cost.mfu, cost.peak_flops, cost.peak_from) == ("H100-SXM", 0.4, H100, "table")
    assert cost.gpu_hours.max == pytest.approx(54_815_490_048 / (0.4 * H100) / 3600, rel=1e-12)
    assert cost.gpu_hours.min == cost.gpu_hours.max
    assert any("upper bound" in n for n in cost.notes)


def test_adaptive_seeds_give_a_range() -> None:
    cost = price(spec(seeds={"min": 2, "max": 4, "step": 2}))
    assert (cost.trials.min, cost.trials.max) == (2 * (2 * (3 + 2) + 1), 2 * (2 * (3 + 4) + 1))  # 22, 30
    assert cost.trials.max == spec(seeds={"min": 2, "max": 4, "step": 2}).total_trials  # the spec's own count
    # 3 evaluations a trial at either batch size: 2 optimizers x (8 + 7) trials at most
    assert (cost.evaluations.min, cost.evaluations.max) == (66, 2 * 3 * (8 + 7))
    assert (cost.training_tokens.min, cost.training_tokens.max) == (22 * 2816, 30 * 2816)
    assert cost.gpu_hours.max / cost.gpu_hours.min == pytest.approx(
        (30 * 2816 * 846_336 + 90 * 128 * 282_112) / (22 * 2816 * 846_336 + 66 * 128 * 282_112)
    )
    assert any("adaptive seeds" in n for n in cost.notes)


def test_without_pruning_the_training_figures_are_exact() -> None:
    cost = price(spec(pruning={"enabled": False}))
    assert not cost.pruning and not any("upper bound" in n for n in cost.notes)


def test_gpu_hours_follow_the_gpu_the_mfu_and_a_given_peak() -> None:
    base = price(spec())
    a100 = price(spec(), PriceConfig(gpu="a100", mfu=0.5))
    assert a100.gpu == "A100" and a100.peak_flops == 312e12
    assert a100.gpu_hours.max == pytest.approx(base.gpu_hours.max * (0.4 * 989) / (0.5 * 312))
    given = price(spec(), PriceConfig(gpu="A10G", peak_tflops=70))  # a GPU the table lacks, with its peak
    assert (given.gpu, given.peak_flops, given.peak_from) == ("A10G", 70e12, "peak_tflops")
    assert given.gpu_hours.max == pytest.approx(base.total_flops.max / (0.4 * 70e12) / 3600)
    assert price(spec(), PriceConfig(peak_tflops=989)).gpu_hours.max == pytest.approx(base.gpu_hours.max)


@pytest.mark.parametrize(
    ("given", "field", "words"),
    [
        ({"gpu": "B9000"}, "gpu", ["unknown GPU 'B9000'", "H100-SXM", "A100", "L4"]),
        ({"gpu": "A10G"}, "gpu", ["unknown GPU 'A10G'", "peak_tflops"]),
        ({"gpu": ""}, "gpu", ["gpu must be a printable name"]),
        ({"mfu": 0}, "mfu", ["mfu must be in [0.001, 1]", "mfu=0"]),
        ({"mfu": 5e-324}, "mfu", ["mfu must be in [0.001, 1]", "mfu=5e-324"]),  # priced to infinity (null)
        ({"mfu": 1.5}, "mfu", ["mfu=1.5"]),
        ({"mfu": math.nan}, "mfu", ["finite"]),
        ({"peak_tflops": -1}, "peak_tflops", ["peak_tflops must be in [0.001, 100000]", "peak_tflops=-1"]),
        ({"peak_tflops": 1e9}, "peak_tflops", ["peak_tflops=1000000000"]),
        ({"colour": "red"}, "colour", ["Extra inputs"]),
    ],
)
def test_a_bad_price_config_is_refused_naming_the_value(given: dict[str, Any], field: str, words: list[str]) -> None:
    with pytest.raises(ValidationError) as info:
        PriceConfig(**given)
    (error,) = info.value.errors()
    assert error["loc"] == (field,)
    for w in words:
        assert w in error["msg"], error["msg"]


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
@pytest.mark.parametrize(("vocab", "seq_len"), [(50257, 1024), (4096, 128)])
def test_parameters_and_flops_match_the_model_that_trains(preset: str, vocab: int, seq_len: int) -> None:
    priced = price(
        spec(
            model={"preset": preset, "seq_len": seq_len},
            data={"source": "hf:x", "vocab_size": vocab},
            token_budget=8 * seq_len * 4,
        )
    )
    with torch.device("meta"):  # shapes without memory: gpt2-large is 3 GB of fp32 otherwise
        model = build_model(ModelConfig(preset=preset, seq_len=seq_len), vocab_size=vocab, seed=0)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert priced.parameters == model.num_parameters()  # tied LM head counted once
    assert priced.flop_parameters == count_params(model, non_embedding=True)
    # the loop's MFU and the price use one formula
    assert priced.training_flops_per_token == flops_per_token(model, seq_len)


def test_gpt2_small_and_medium_have_their_published_sizes() -> None:
    """124M and 355M at GPT-2's vocabulary and context, as the GPT-2 paper names them."""
    sizes = {p: ModelConfig(preset=p, seq_len=1024).parameters(50257) for p in ("gpt2-small", "gpt2-medium")}
    assert sizes == {"gpt2-small": 124_439_808, "gpt2-medium": 354_823_168}


@pytest.mark.parametrize(("steps", "every"), [(7, 3), (6, 3), (5, 1), (4, 9)])
def test_evaluations_are_what_the_training_loop_runs(token_cache: Path, steps: int, every: int) -> None:
    cfg = TrainConfig(
        model=ModelConfig(preset="gpt2-nano", seq_len=32),
        optimizer=OptimizerConfig(name="adamw", lr=1e-3),
        evaluation=EvalConfig(every_tokens=8 * 32 * every, tokens=64),
        checkpoints=CheckpointConfig(every_tokens=0),
        resources=ResourcesConfig(max_micro_batch=8, cpus_per_worker=1),
        batch_size=8,
        token_budget=8 * 32 * steps,
    )
    session = LocalSession()
    train(cfg, session)
    assert len(session.reports) == evaluations_per_trial(cfg) == math.ceil(steps / min(every, steps))


def test_gpu_names_and_device_names() -> None:
    assert accelerator("h100").name == "H100-SXM" and accelerator("H100 pcie").name == "H100-PCIe"
    assert accelerator("h200_nvl").name == "H200-NVL" and accelerator("H200-SXM").name == "H200"
    names = {
        "NVIDIA H100 80GB HBM3": "H100-SXM",
        "NVIDIA H100 PCIe": "H100-PCIe",
        "NVIDIA H100 NVL": "H100-NVL",
        "NVIDIA H200": "H200",
        "NVIDIA H200 NVL": "H200-NVL",
        "NVIDIA A100-SXM4-80GB": "A100",
        "NVIDIA A100 80GB PCIe": "A100",
        "NVIDIA L4": "L4",
        "NVIDIA A10": "A10",
    }
    for device, name in names.items():
        found = device_accelerator(device)
        assert found is not None and found.name == name, device
    # not an A10 (less tensor throughput, no vendor figure), not an L4; unknown: no MFU rather than a wrong one
    for device in ("NVIDIA A10G", "NVIDIA L40S", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB"):
        assert device_peak_flops(device) is None, device
    # every peak is dense: below the H100's 989 TFLOP/s except the H100/H200 SXM themselves
    assert all(0 < a.peak_flops <= H100 for a in ACCELERATORS)


def test_the_loops_mfu_peak_is_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker import loop

    monkeypatch.delenv("BATCHSWEEP_PEAK_TFLOPS", raising=False)
    assert loop.peak_flops(torch.device("cpu")) is None
    # the device name is what a GPU machine would report (no GPU here): the loop reads the shared table
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert loop.peak_flops(torch.device("cuda", 0)) == accelerator("H100-PCIe").peak_flops == 756e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A10G")
    assert loop.peak_flops(torch.device("cuda", 0)) is None
    monkeypatch.setenv("BATCHSWEEP_PEAK_TFLOPS", "70")
    assert loop.peak_flops(torch.device("cuda", 0)) == 70e12
